//! # sessions-mcp
//!
//! An MCP server that gives LLM agents a small set of session tools: `sessions_list`,
//! `sessions_history`, `sessions_send`, `sessions_spawn`, `subagents` and `agents_list`.
//!
//! ## Layout, by layer
//!
//! Each layer uses only the layers below it; no module imports one above it (the test
//! `architecture` holds this).
//!
//! | layer | module | job |
//! |-------|--------|-----|
//! | programs | [`cli`] | the command line: `serve`, `daemon`, the operator's commands (`cli::operator`), `schemas`, the hidden `dev` seeder (`cli::seed`); `bench` with `--features bench` |
//! | | [`programs`] | the side programs the binary also is: the scripted agent, `connect` |
//! | | [`openclaw`] | OpenClaw's store layout in (`import`) and out (`export`) |
//! | | `bench` | the benchmark harness behind `sessions-mcp bench` and the criterion benches; only with `--features bench` |
//! | | `bin` | `src/bin/sessions-mcp-supervise.rs`: the small program every run starts through, a binary of its own whose only code is `runner/supervise.rs` (so it links none of the server) |
//! | serving | [`server`] | the rmcp `ServerHandler` (per-caller `tools/list`, `tools/call`, resources, tasks, MCP Apps views), streamable HTTP + bearer auth, legacy SSE, the owner's run socket |
//! | tools | [`tools`] | one file per tool: parse the arguments, ask access, call the engine, shape the answer |
//! | engine | [`engine`] | the runs: the scheduler (owner election, queue, waits, sweeps), one turn, the steps after it, send, spawn, deliveries, inject |
//! | façade | [`access`] | who is calling ([`access::caller`]) and what they may see and do: loads facts from the store, asks `policy`; the tools' error type |
//! | rooms | [`policy`] | pure decisions: visibility, agent-to-agent, send policy, sub-agent tool sets (no I/O) |
//! | | [`runner`] | one agent turn as a supervised subprocess: `jsonl/1`, or an agent CLI through its adapter (and the bubblewrap jail); the per-run supervisor; discovery of the agent CLIs on PATH; a remote agent's turn as an A2A task (`runner::a2a`) |
//! | | [`store`] | the durable store behind [`store::Store`]: the SQLite file (WAL, `synchronous=FULL`, versioned migrations) or PostgreSQL (`store::postgres`: its own migrations, one writer at a time across processes, change notifications, every node claiming runs under leases, copying a SQLite store into it); every operation written once against `store::sql::Sql`; the only module that speaks SQL |
//! | | [`sanitize`] | what transcripts look like on the way out: redaction, cuts, fitting the answer budget |
//! | base | [`config`] | the JSON5 config with the reference's key paths; every default in one place; the runner presets (`claude`, `codex`, `echo`) and the agents discovery adds |
//! | | [`keys`] | session keys: parse, canonical and display forms, kind, chat type, channel |
//! | | [`schemas`] | the JSON Schema dialect of everything published |
//! | | [`metrics`] | `/metrics`: process histograms (runs, tool calls) and the store's counts, in the Prometheus format |
//! | | [`pem`] | the PEM certificates and keys TLS reads: the HTTP server's, the PostgreSQL client's |
//! | | [`privacy`], [`safe_dirs`] | the `077` umask and 0700 dirs; directories below an agent-writable workspace, opened through descriptors |

//! ## One tool call, end to end
//!
//! 1. `server::SessionsServer::call_tool` receives `tools/call` with the raw arguments; the
//!    caller was fixed when the transport was opened (`access::caller::resolve`).
//! 2. `tools::call` asks `access::Access::check_tool` whether this caller is offered the tool,
//!    then runs e.g. `tools::sessions_history::run`.
//! 3. The tool reads its arguments with `tools::args::ArgReader` (specific errors, aliases,
//!    clamping), then asks `Access::resolve`, which parses the key (`keys`), decides visibility
//!    from the key and the spawn tree (`policy`) *before* asking whether the session exists, and
//!    loads the row from the `store`.
//! 4. A read tool reads the visible session's messages through access (`Access::history`, …),
//!    passes them through `sanitize`, and returns `Output::Ok(…)` or `Output::Err(ToolError)`;
//!    `tools::call` turns that into `structuredContent` plus the same JSON as text, with
//!    `isError` set from the status, within the answer budget.
//! 5. `sessions_send` and `sessions_spawn` call the engine instead (`tools::Ctx::engine`):
//!    `engine::Engine::send` / `spawn` do the admission (idempotency replay, send policy, chain
//!    limits, the spawn caps, a spawn's budget reserved by `engine::budget` under
//!    `policy::budget`'s rules) and commit the run in one `store::Tx`; the scheduler claims and
//!    runs it (`engine::scheduler`, `engine::turn`, whose budget meter counts usage live and
//!    stops a run over its budget), and its steps (`engine::steps`) carry the reply back. `Engine::await_reply` waits for it when the caller asked to; `subagents` waits for,
//!    cancels and steers children through `Engine::wait_subagents` / `cancel_subagent` /
//!    `steer_subagent`.
//! 6. When the client declared the Tasks extension, `sessions_send` (with a wait) and
//!    `sessions_spawn` answer with a task instead (`server::tasks`): the task is the run, and
//!    `tasks/get` reads the run's row until it ends.

pub mod access;
#[cfg(feature = "bench")]
pub mod bench;
pub mod cli;
pub mod config;
pub mod engine;
pub mod keys;
pub mod metrics;
pub mod openclaw;
pub mod pem;
pub mod policy;
pub mod privacy;
pub mod programs;
pub mod runner;
pub mod safe_dirs;
pub mod sanitize;
pub mod schemas;
pub mod server;
pub mod store;
pub mod tools;
