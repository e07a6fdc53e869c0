//! # sessions-mcp
//!
//! An MCP server that gives LLM agents a small set of session tools: `sessions_list`,
//! `sessions_history`, `sessions_send`, `sessions_spawn` and `agents_list`.
//!
//! ## Layout
//!
//! | module      | job |
//! |-------------|-----|
//! | [`cli`]     | the command line (`serve`, `daemon`, the operator's commands, `schemas`, hidden `dev`; `bench` with `--features bench`) |
//! | [`server`]  | the rmcp `ServerHandler` (per-caller `tools/list`, `tools/call`, resources, tasks over the runs table); `server::http`: streamable HTTP + bearer auth |
//! | [`caller`]  | who is calling: a [`caller::Caller`] from the transport credential, never from arguments |
//! | [`tools`]   | one file per tool; each parses its raw arguments and returns `{status, …}` |
//! | [`access`]  | the one façade every tool asks: loads facts from the store, asks `policy` |
//! | [`policy`]  | pure decisions: visibility, agent-to-agent, send policy, sub-agent tool sets |
//! | [`privacy`] | what the server writes is private to its user: the `077` umask, 0700 dirs, `doctor`'s mode check |
//! | [`keys`]    | session keys: parse, canonical and display forms, kind, chat type, channel |
//! | [`store`]   | the SQLite store (WAL, `synchronous=FULL`, versioned migrations) behind [`store::Store`] |
//! | [`safe_dirs`] | directories below an agent-writable workspace, opened through descriptors without following links |
//! | [`sanitize`]| what transcripts look like on the way out: redaction, cuts, fitting the answer budget |
//! | [`config`]  | the JSON5 config with the reference's key paths; every default in one place |
//! | [`schemas`] | the checked-in JSON schemas of the tools and the config |
//! | [`runtime`] | the runtime owner: lock election, the run queue, waits, the run socket, sweeps |
//! | [`flows`]   | what happens around runs: send, reply-back, announce, spawn, attachments, deliveries |
//! | [`runner`]  | one agent turn as a supervised subprocess: `jsonl/1`, or an agent CLI through its adapter (and the bubblewrap jail) |
//! | [`supervise`] | the per-run supervisor process (process group, parent death, run-id sweep) |
//! | [`agent`]   | the built-in scripted agent (`sessions-mcp agent`) |
//! | [`socket_client`] | `sessions-mcp connect` and agent callbacks over the owner's socket |
//! | [`import`], [`export`] | OpenClaw's store layout in and out |
//! | [`ops`]     | the operator's commands: import, export, ls, show, policy, prune, doctor |
//!
//! ## One tool call, end to end
//!
//! 1. `server::SessionsServer::call_tool` receives `tools/call` with the raw arguments; the
//!    caller was fixed when the transport was opened (`caller::resolve`).
//! 2. `tools::call` asks `access::Access::check_tool` whether this caller is offered the tool,
//!    then runs e.g. `tools::sessions_history::run`.
//! 3. The tool reads its arguments with `tools::args::ArgReader` (specific errors, aliases,
//!    clamping), then asks `Access::resolve`, which parses the key (`keys`), decides visibility
//!    from the key and the spawn tree (`policy`) *before* asking whether the session exists, and
//!    loads the row from the `store`.
//! 4. The tool reads messages from the `store`, passes them through `sanitize`, and returns
//!    `Output::Ok(…)` or `Output::Err(ToolError)`; `tools::call` turns that into
//!    `structuredContent` plus the same JSON as text, with `isError` set from the status.
//! 5. When the client declared the Tasks extension, `sessions_send` (with a wait) and
//!    `sessions_spawn` answer with a task instead (`server::tasks`): the task is the run, and
//!    `tasks/get` reads the run's row until it ends.

pub mod access;
pub mod agent;
#[cfg(feature = "bench")]
pub mod bench;
pub mod caller;
pub mod cli;
pub mod config;
pub mod dev;
pub mod export;
pub mod flows;
pub mod import;
pub mod keys;
pub mod ops;
pub mod policy;
pub mod privacy;
pub mod runner;
pub mod runtime;
pub mod safe_dirs;
pub mod sanitize;
pub mod schemas;
pub mod server;
pub mod socket_client;
pub mod store;
pub mod supervise;
pub mod tools;
