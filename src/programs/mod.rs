//! The side programs the one binary also is: the built-in scripted agent (`sessions-mcp agent`)
//! and the socket client agents and operators call the owner with (`sessions-mcp connect`).

pub mod connect;
pub mod scripted_agent;
