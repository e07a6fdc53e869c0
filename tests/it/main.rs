//! The integration tests, one binary (as ripgrep and Codex do): the library links once, not once
//! per file. One module per area; each starts the real binary or drives the library in-process
//! through `common`. Run one area with `cargo test --test it <module>::`.

mod a2a_inbound;
mod a2a_outbound;
mod agents;
mod answer_budget_props;
mod asks;
// The layer order and the invariants of docs/ARCHITECTURE.md, read from src/.
mod approvals;
mod architecture;
mod asking;
mod attachments;
mod bad_inputs;
mod bridges;
mod budgets;
mod callbacks;
mod claude_code;
mod client_configs;
mod codex_cli;
mod common;
mod daemon;
mod dashboard;
mod dashboard_browser;
mod degraded;
mod faults;
mod federation;
mod first_use;
mod fuzz_regressions;
mod gemini_cli;
mod http;
mod import_export;
mod install;
mod load;
mod mcp_apps;
mod metrics;
mod nodes;
mod orchestration;
mod packaging;
mod postgres;
mod python_sdk;
mod readme;
mod real_model;
mod resources;
mod runs;
mod sandbox;
mod send_stdio;
mod spawn_stdio;
mod steering;
mod subagents;
mod tasks;
mod text_agent;
mod tokens;
mod tools_stdio;
mod usage;
mod visibility_props;
