//! OpenClaw's store layout, in (`sessions-mcp import`) and out (`sessions-mcp export`).

pub mod export;
pub mod import;
