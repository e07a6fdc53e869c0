//! `sessions-mcp-supervise`: the small program every run starts through (docs/RUNNER-PROTOCOL.md,
//! Supervision). Its whole code is src/runner/supervise.rs, compiled here on its own so this
//! binary links std, libc and clap and none of the server (no tokio, no SQLite, no rmcp): a
//! thousand concurrent runs carry a thousand of these.

#[path = "../runner/supervise.rs"]
mod supervise;

use clap::Parser;

fn main() -> std::process::ExitCode {
    supervise::run(&supervise::Args::parse())
}
