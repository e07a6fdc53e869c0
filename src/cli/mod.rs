//! The command line: `serve`, `install`, `schemas`, `bench`, the operator's commands (`operator`,
//! `token` in `tokens`), and the hidden `dev` helpers.

pub mod install;
pub mod operator;
pub mod postgres;
pub mod schemas;
pub mod seed;
pub mod tokens;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};

use crate::access::Access;
use crate::access::caller::{self, Credentials, IdentityError};
use crate::config::{self, Loaded};
use crate::engine::scheduler::{Role, Scheduler};
use crate::server::{self, DegradedServer, SessionsServer};
use crate::store::Store;

#[derive(Parser)]
#[command(name = "sessions-mcp", version, about = "An MCP server of session tools for LLM agents")]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where state and config live (every subcommand takes these).
#[derive(Args, Clone)]
pub struct Paths {
    /// State directory [env: SESSIONS_MCP_STATE_DIR; default: $XDG_DATA_HOME/sessions-mcp]
    #[arg(long, global = true)]
    state_dir: Option<PathBuf>,
    /// Config file (JSON5) [env: SESSIONS_MCP_CONFIG; default: <state-dir>/config.json5]
    #[arg(long, global = true)]
    config: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the session tools over MCP (stdio by default).
    Serve(ServeArgs),
    /// Register this server with an MCP host (claude-code, codex, gemini, claude-desktop) through
    /// the host's own CLI or config file; running it again changes nothing.
    Install(install::HostArgs),
    /// Remove what `install` registered with the host.
    Uninstall(install::HostArgs),
    /// Write the JSON schemas of the tools and the config to schemas/ (or check them).
    Schemas {
        /// Fail if the checked-in schemas differ from the generated ones.
        #[arg(long)]
        check: bool,
        /// Directory of the schemas.
        #[arg(long, default_value = "schemas")]
        dir: PathBuf,
        #[command(flatten)]
        paths: Paths,
    },
    /// Import an OpenClaw state directory (agents/*/sessions/sessions.json and transcripts).
    Import {
        /// The OpenClaw state directory (e.g. ~/.openclaw).
        dir: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        paths: Paths,
    },
    /// Export every session in OpenClaw's layout under <state-dir>/export/.
    Export {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        paths: Paths,
    },
    /// List every session (as sessions_list with visibility all, plus driver and archived).
    Ls {
        #[arg(long)]
        json: bool,
        /// List the open questions and approvals of runs instead (answer with `respond`).
        #[arg(long)]
        pending: bool,
        #[command(flatten)]
        paths: Paths,
    },
    /// Answer a run's open question or approval (see `ls --pending`); the first answer wins.
    Respond {
        request_id: String,
        /// allow|deny
        decision: String,
        /// The answer in words.
        text: Option<String>,
        #[command(flatten)]
        paths: Paths,
    },
    /// Show one session: its row, effective send policy, messages and runs.
    Show {
        /// A session key (any accepted form) or sessionId.
        key: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        paths: Paths,
    },
    /// Set a session's send-policy override: on (allow), off (deny) or inherit.
    Policy {
        key: String,
        /// on|off|inherit (aliases allow|deny, default|reset)
        mode: String,
        #[command(flatten)]
        paths: Paths,
    },
    /// Permanently remove deleted and archived sessions.
    Prune {
        /// Only those deleted/archived longer ago than this (30d, 12h, 90m, 45s, 2w).
        #[arg(long)]
        older_than: Option<String>,
        #[command(flatten)]
        paths: Paths,
    },
    /// Check the setup: resolved paths, config (one line per problem), store, file modes, runtime.
    Doctor {
        /// Make what group or other users may read in the state dir private to its owner.
        #[arg(long)]
        fix_modes: bool,
        /// Also check a PostgreSQL store: the connection, its schema and the clock skew
        /// [env: SESSIONS_MCP_STORE_URL]
        #[arg(long, value_name = "URL", env = "SESSIONS_MCP_STORE_URL", hide_env = true)]
        store_url: Option<String>,
        #[command(flatten)]
        paths: Paths,
    },
    /// Copy the SQLite store of the state dir into an empty PostgreSQL database, in one
    /// transaction, every table compared before it commits; the SQLite store is left as it is.
    /// Refused while a serve or daemon runs for the state dir.
    Migrate {
        /// The database: postgres://USER:PASSWORD@HOST:PORT/DATABASE [env: SESSIONS_MCP_STORE_URL,
        /// which keeps the password out of the process list]
        #[arg(long, value_name = "URL", env = "SESSIONS_MCP_STORE_URL", hide_env = true)]
        to: String,
        #[command(flatten)]
        paths: Paths,
    },
    /// Make, list and revoke the HTTP server's bearer tokens (operator: the dashboard and
    /// /metrics; client: /mcp as one session). Only their sha256 is kept, in the store; a change
    /// takes effect at once, without a restart.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Own the runtime (runs, deliveries, sweeps) without serving a client; outlives editors.
    Daemon {
        /// Run even if the state directory holds an OpenClaw store.
        #[arg(long)]
        force: bool,
        /// Also serve streamable HTTP on ADDR (`/mcp`, the dashboard `/ui`, `/metrics`, the
        /// channel bridges), as `serve --http` does.
        #[arg(long, value_name = "ADDR")]
        http: Option<String>,
        /// Allow a non-loopback HTTP bind without TLS.
        #[arg(long, requires = "http")]
        insecure_remote: bool,
        #[command(flatten)]
        paths: Paths,
    },
    /// Send TEXT into session KEY as its owner (a new chain), run it, and print the reply.
    /// `/send on|off|inherit` sets the session's send-policy override instead.
    Inject {
        key: String,
        text: String,
        /// Seconds to wait for the reply (0 = just queue it).
        #[arg(long, default_value_t = 120)]
        timeout: u64,
        /// Inject as this user of the key's channel (as its bridge would): the reply goes out
        /// through the channel's deliverer.
        #[arg(long)]
        sender: Option<String>,
        /// The sender's display name (with --sender).
        #[arg(long, requires = "sender")]
        sender_name: Option<String>,
        /// The channel's message id (with --sender): the same id twice is taken once.
        #[arg(long, requires = "sender")]
        message_id: Option<String>,
        #[command(flatten)]
        paths: Paths,
    },
    /// A stdio MCP proxy to the runtime owner's socket, with SESSIONS_MCP_TOKEN (for agents that
    /// only speak stdio MCP).
    Connect,
    /// The built-in scripted jsonl/1 agent (echoes without a script; adds no notes to a spawn's announce).
    Agent {
        /// A JSON script of rules (docs/AGENTS.md, The scripted agent).
        #[arg(long)]
        script: Option<PathBuf>,
    },
    /// Measure start-up, tool latency, sends, concurrency, memory and import on generated stores
    /// (whole processes over stdio and HTTP, and in-process); prints one table. Only in a build
    /// with `--features bench`.
    #[cfg(feature = "bench")]
    Bench {
        /// Small sizes, for CI (under a minute in a debug build).
        #[arg(long)]
        quick: bool,
        /// Only this group of rows.
        #[arg(long, value_enum)]
        only: Option<crate::bench::Group>,
        #[command(flatten)]
        paths: Paths,
    },
    /// Developer helpers (not pinned).
    #[command(hide = true, subcommand)]
    Dev(DevCommand),
}

#[derive(Args)]
struct ServeArgs {
    /// Serve over stdio (the default).
    #[arg(long)]
    stdio: bool,
    /// Serve streamable HTTP on ADDR.
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// Act as this session (an external session) [env: SESSIONS_MCP_SESSION; default: main].
    /// With --http (loopback only): the session of requests that send no Authorization header
    #[arg(long = "as", value_name = "KEY")]
    as_session: Option<String>,
    /// Allow a non-loopback HTTP bind without TLS.
    #[arg(long)]
    insecure_remote: bool,
    /// Serve even if the state directory holds an OpenClaw store.
    #[arg(long)]
    force: bool,
    /// When the server cannot start, exit 2 at once instead of first answering the client on stdin
    /// with the problem (degraded mode) [env: SESSIONS_MCP_STRICT]
    #[arg(long, env = "SESSIONS_MCP_STRICT", hide_env = true, value_parser = clap::builder::FalseyValueParser::new())]
    strict: bool,
    /// On a terminal, do not print the line that says what this is and how to stop it.
    #[arg(long, short)]
    quiet: bool,
    #[command(flatten)]
    paths: Paths,
}

impl ServeArgs {
    /// Whether a `serve` that cannot start exits at once (code 2, one line on stderr, as every
    /// command does) instead of first serving the degraded server over stdio.
    ///
    /// Hosts start `serve` with no flags of ours and stdin a pipe, and hide a server that exits
    /// at start, so degraded is the default. The exit code is 2 either way — after the client
    /// closes stdin — so a script still reads it, at once when its stdin is `/dev/null` or closed.
    /// Strict: `--strict` or `SESSIONS_MCP_STRICT=1` (a script that keeps stdin open), stdin a
    /// terminal (a person sees the line and gets the prompt back), or `--http` (no client on
    /// stdin; the terminal or service manager shows the line, and with no config to check tokens
    /// against, an HTTP client would be answered without being authenticated).
    fn strict(&self) -> bool {
        self.strict || self.http.is_some() || std::io::stdin().is_terminal()
    }
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Mint a token and print it once (only its sha256 is kept: it cannot be shown again).
    Create {
        /// An operator's token: every tree on the dashboard, its acts, /metrics.
        #[arg(long, required_unless_present = "client", conflicts_with = "client")]
        operator: bool,
        /// A client's token acting as session KEY on /mcp and the dashboard (as a
        /// server.tokens entry does).
        #[arg(long, value_name = "KEY")]
        client: Option<String>,
        /// A name to list and revoke it by (one live token per label).
        #[arg(long)]
        label: Option<String>,
        /// Print {id, kind, sessionKey, label, token} as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        paths: Paths,
    },
    /// List the minted tokens: id, kind, session, label, created, revoked, the hash's last 4
    /// characters (never a token).
    List {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        paths: Paths,
    },
    /// Revoke a minted token by its id or label: it stops working at once.
    Revoke {
        /// The id (`tok_…`, see `token list`) or the label.
        token: String,
        #[command(flatten)]
        paths: Paths,
    },
}

#[derive(Subcommand)]
enum DevCommand {
    /// Write sessions and messages straight through the store (a JSON spec, or generated).
    Seed(seed::SeedArgs),
    /// Print every session and message as normalised JSON (for comparing stores).
    Dump {
        #[command(flatten)]
        paths: Paths,
    },
    /// Print the store fingerprint (an ordered content hash of all tables).
    Fingerprint {
        #[command(flatten)]
        paths: Paths,
    },
}

/// Resolved state directory and config.
pub struct Env {
    pub state_dir: PathBuf,
    pub loaded: Loaded,
}

impl Paths {
    pub fn state_dir(&self) -> PathBuf {
        let dir = match (&self.state_dir, std::env::var_os("SESSIONS_MCP_STATE_DIR").filter(|v| !v.is_empty())) {
            (Some(d), _) => d.clone(),
            (None, Some(d)) => PathBuf::from(d),
            (None, None) => default_state_dir(),
        };
        // Absolute, so that paths stored or printed (transcriptPath) mean the same from anywhere.
        std::path::absolute(&dir).unwrap_or(dir)
    }

    /// The config file and whether it was named explicitly: `--config`, else
    /// `SESSIONS_MCP_CONFIG`, else `<stateDir>/config.json5` (missing = defaults).
    pub fn config_path(&self, state_dir: &Path) -> (PathBuf, bool) {
        let explicit = self
            .config
            .clone()
            .or_else(|| std::env::var_os("SESSIONS_MCP_CONFIG").filter(|v| !v.is_empty()).map(PathBuf::from));
        match explicit {
            Some(p) => (p, true),
            None => (state_dir.join("config.json5"), false),
        }
    }

    /// [`Paths::resolve`] with the agent CLIs discovery finds on PATH added: for the commands that
    /// run or show agents (serve, daemon, doctor, inject), not for every operator command.
    pub fn resolve_with_agents(&self) -> Result<Env, config::ConfigError> {
        let mut env = self.resolve()?;
        crate::runner::discover::apply(&mut env.loaded.config, &env.state_dir);
        Ok(env)
    }

    /// Loads the config (see [`Paths::config_path`]).
    pub fn resolve(&self) -> Result<Env, config::ConfigError> {
        let state_dir = self.state_dir();
        let (path, explicit) = self.config_path(&state_dir);
        let loaded = config::load(&path, explicit)?;
        for path in &loaded.ignored_reference_paths {
            tracing::warn!(path, "config: reference key accepted but not implemented by sessions-mcp");
        }
        Ok(Env { state_dir, loaded })
    }
}

fn default_state_dir() -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    if cfg!(target_os = "macos") {
        return home.join("Library/Application Support/sessions-mcp");
    }
    match std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d).join("sessions-mcp"),
        None => home.join(".local/share/sessions-mcp"),
    }
}

/// A usage or configuration problem: one line on stderr, exit code 2.
pub fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("sessions-mcp: {message}");
    ExitCode::from(2)
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // The agent logs nothing of its own: stderr belongs to the run.
    if !matches!(cli.command, Command::Agent { .. } | Command::Connect) {
        // Before any thread: the umask is process-wide. Agents get the user's back (supervise).
        crate::privacy::keep_created_files_private();
        init_tracing();
    }
    match cli.command {
        Command::Serve(args) => block_on(serve(args)),
        Command::Install(args) => install::install(&args),
        Command::Uninstall(args) => install::uninstall(&args),
        Command::Schemas { check, dir, .. } => schemas::run(&dir, check),
        Command::Import { dir, json, paths } => {
            with_store(&paths, |env, store| operator::import(env, store, &dir, json))
        }
        Command::Export { json, paths } => with_store(&paths, |env, store| operator::export(env, store, json)),
        Command::Ls { json, pending: false, paths } => with_store(&paths, |env, store| operator::ls(env, store, json)),
        Command::Ls { json, pending: true, paths } => with_store(&paths, |_, store| operator::pending(store, json)),
        Command::Respond { request_id, decision, text, paths } => {
            with_store(&paths, |_, store| operator::respond(store, &request_id, &decision, text.as_deref()))
        }
        Command::Show { key, json, paths } => with_store(&paths, |env, store| operator::show(env, store, &key, json)),
        Command::Policy { key, mode, paths } => {
            with_store(&paths, |env, store| operator::policy(env, store, &key, &mode))
        }
        Command::Prune { older_than, paths } => {
            with_store(&paths, |_, store| operator::prune(store, older_than.as_deref()))
        }
        Command::Doctor { fix_modes, store_url, paths } => {
            operator::doctor(&paths, fix_modes, store_url.as_deref().filter(|u| !u.trim().is_empty()))
        }
        Command::Migrate { to, paths } => postgres::migrate(&paths, &to),
        Command::Token(TokenCommand::Create { operator: _, client, label, json, paths }) => {
            with_store(&paths, |env, store| tokens::create(env, store, client.as_deref(), label.as_deref(), json))
        }
        Command::Token(TokenCommand::List { json, paths }) => with_store(&paths, |_, store| tokens::list(store, json)),
        Command::Token(TokenCommand::Revoke { token, paths }) => {
            with_store(&paths, |_, store| tokens::revoke(store, &token))
        }
        Command::Daemon { force, http, insecure_remote, paths } => {
            block_on(daemon(paths, force, http.as_deref(), insecure_remote))
        }
        Command::Inject { key, text, timeout, sender, sender_name, message_id, paths } => {
            let sender = sender.map(|id| operator::InjectSender { id, name: sender_name, message_id });
            block_on(operator::inject(paths, key, text, timeout, sender))
        }
        Command::Agent { script } => crate::programs::scripted_agent::run(script.as_deref()),
        Command::Connect => block_on(crate::programs::connect::connect()),
        #[cfg(feature = "bench")]
        Command::Bench { quick, only, .. } => block_on(crate::bench::run(quick, only)),
        Command::Dev(DevCommand::Seed(args)) => seed::seed(&args),
        Command::Dev(DevCommand::Dump { paths }) => with_store(&paths, operator::dump),
        Command::Dev(DevCommand::Fingerprint { paths }) => {
            match open_store(&paths.state_dir(), env_store_url().as_deref()) {
                Ok(store) => match store.fingerprint() {
                    Ok(f) => {
                        println!("{f}");
                        ExitCode::SUCCESS
                    }
                    Err(e) => fail(e),
                },
                Err(code) => code,
            }
        }
    }
}

/// Runs an async command on a multi-thread runtime. Only the commands that need one build it:
/// `agent` starts with every scripted turn and should not pay for worker threads it never uses
/// (the supervisor is a binary of its own, `sessions-mcp-supervise`).
fn block_on(command: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let code = runtime.block_on(command);
    // Do not wait for blocking threads (stdin readers sit in read(2) until EOF): we are done.
    runtime.shutdown_background();
    code
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).init();
}

/// Loads the config and opens the store, then runs `f`; problems exit 2 with one line.
fn with_store(paths: &Paths, f: impl FnOnce(&Env, &Store) -> ExitCode) -> ExitCode {
    let env = match paths.resolve() {
        Ok(env) => env,
        Err(e) => return fail(format!("{e} (run `sessions-mcp doctor` for details)")),
    };
    match env.open_store() {
        Ok(store) => f(&env, &store),
        Err(code) => code,
    }
}

/// Opens the store of `state_dir`, in PostgreSQL when `url` names a database.
pub fn open_store(state_dir: &Path, url: Option<&str>) -> Result<Store, ExitCode> {
    Store::open_in(state_dir, url).map_err(fail)
}

impl Env {
    /// The PostgreSQL URL this environment serves from (`store.url`, or the environment's).
    pub fn store_url(&self) -> Option<String> {
        self.loaded.config.store.effective_url()
    }

    pub fn open_store(&self) -> Result<Store, ExitCode> {
        open_store(&self.state_dir, self.store_url().as_deref())
    }
}

/// The PostgreSQL URL of a command that reads no configuration file: the environment's.
pub fn env_store_url() -> Option<String> {
    crate::config::StoreConfig::default().effective_url()
}

/// An OpenClaw state dir (agents/*/sessions/sessions.json) is not ours to serve.
pub fn holds_reference_store(dir: &Path) -> bool {
    let Ok(agents) = std::fs::read_dir(dir.join("agents")) else { return false };
    agents.flatten().any(|a| a.path().join("sessions/sessions.json").is_file())
}

async fn serve(args: ServeArgs) -> ExitCode {
    let strict = args.strict();
    let env = match args.paths.resolve_with_agents() {
        Ok(env) => env,
        Err(e) => return cannot_start(format!("{e} (run `sessions-mcp doctor` for details)"), strict).await,
    };
    if holds_reference_store(&env.state_dir) && !args.force {
        let problem = format!(
            "{} holds an OpenClaw store (agents/*/sessions/sessions.json); import it with `sessions-mcp import` into another state dir, or pass --force",
            env.state_dir.display()
        );
        return cannot_start(problem, strict).await;
    }
    let store = match Store::open_in(&env.state_dir, env.store_url().as_deref()) {
        Ok(s) => s,
        Err(e) => return cannot_start(e.to_string(), strict).await,
    };
    if let Some(addr) = &args.http {
        return serve_http(env, store, addr, args.insecure_remote, args.as_session.as_deref(), Role::Serve).await;
    }
    let creds = Credentials {
        token: std::env::var("SESSIONS_MCP_TOKEN").ok(),
        as_session: args.as_session.or_else(|| std::env::var("SESSIONS_MCP_SESSION").ok().filter(|s| !s.is_empty())),
        inside_run: std::env::var_os("SESSIONS_MCP_RUN_ID").is_some_and(|v| !v.is_empty()),
    };
    let config = Arc::new(env.loaded.config);
    let caller = match caller::resolve(&creds, &config, &store) {
        Ok(c) => c,
        // The store failed: that says nothing about the caller.
        Err(IdentityError::Store(e)) => return cannot_start(e.to_string(), strict).await,
        // A refused token or `--as` is never degraded: no answer goes to an unvouched caller.
        Err(e) => return fail(e),
    };
    let access = Access::new(store.clone(), config.clone());
    let banner = (std::io::stdin().is_terminal() && !args.quiet).then(|| terminal_banner(&env.state_dir, &config));
    let runtime =
        match Scheduler::start(store, config, &env.state_dir, Role::Serve, crate::server::http::owner_socket()) {
            Ok(rt) => rt,
            Err(e) => return cannot_start(e, strict).await,
        };
    tracing::info!(session = %caller.key, "serving over stdio");
    if let Some(line) = banner {
        eprintln!("{line}");
    }
    let server = SessionsServer::new(access, caller, Some(runtime.clone()));
    let signal = terminate_signal();
    tokio::pin!(signal);
    tokio::select! {
        result = server::serve_stdio(server) => {
            if let Err(e) = result {
                tracing::error!(error = %e, "stdio transport failed");
            }
            // The client is gone; an owner finishes what is queued or running first — unless
            // the host sends SIGTERM meanwhile (hosts do, soon after closing stdin).
            tokio::select! {
                _ = runtime.drain() => {}
                _ = &mut signal => runtime.shutdown(true).await,
            }
        }
        _ = &mut signal => runtime.shutdown(true).await,
    }
    ExitCode::SUCCESS
}

/// The one line `serve` prints when a person starts it on a terminal (a host starts it with stdin
/// a pipe and never sees it): what it is, what it serves from, which agents it found, how to stop it.
fn terminal_banner(state_dir: &Path, config: &config::Config) -> String {
    let store = match config.store.effective_url().as_deref().map(crate::store::postgres::PgTarget::parse) {
        Some(Ok(target)) => format!("PostgreSQL {target}"),
        Some(Err(_)) | None => format!("SQLite {}", Store::path_in(state_dir).display()),
    };
    let found: Vec<&str> = config.agents.discovered.iter().map(|a| a.id.as_str()).collect();
    let agents = if crate::runner::discover::setting(config) == config::Discovery::Off {
        "agent discovery off".to_string()
    } else if found.is_empty() {
        "agent CLIs found on PATH: none".to_string()
    } else {
        format!("agent CLIs found on PATH: {}", found.join(", "))
    };
    format!(
        "sessions-mcp: an MCP server on stdio, waiting for a client to speak JSON-RPC on stdin (hosts start it themselves; register it with `sessions-mcp install <host>`); state dir {}, store {store}; {agents}; Ctrl-C stops it",
        state_dir.display()
    )
}

/// `serve` cannot start, and `problem` says why and what to do. Strict (see [`ServeArgs::strict`]),
/// it exits 2 with that line. Otherwise the line is logged and the degraded server answers the
/// client on stdin with it until stdin closes (or SIGTERM); the exit code is 2 all the same.
async fn cannot_start(problem: String, strict: bool) -> ExitCode {
    if strict {
        return fail(problem);
    }
    let server = DegradedServer::new(&problem);
    tracing::error!("{}", server.message());
    tokio::select! {
        result = server::serve_stdio(server) => {
            if let Err(e) = result {
                tracing::error!(error = %e, "stdio transport failed");
            }
        }
        _ = terminate_signal() => {}
    }
    ExitCode::from(2)
}

/// `serve --http ADDR`: streamable HTTP at `/mcp` (both protocol eras), `/health`, bearer tokens.
/// Loopback unless told otherwise; a non-loopback bind needs `server.allowedHosts` and TLS or
/// `--insecure-remote`. stdin is ignored; SIGTERM shuts down gracefully.
/// Streamable HTTP on `addr`, owning the runtime as `role` (`serve --http`, `daemon --http`).
async fn serve_http(
    env: Env,
    store: Store,
    addr: &str,
    insecure_remote: bool,
    as_session: Option<&str>,
    role: Role,
) -> ExitCode {
    let config = Arc::new(env.loaded.config);
    let addrs: Vec<std::net::SocketAddr> = match tokio::net::lookup_host(addr).await {
        Ok(a) => a.collect(),
        Err(e) => return fail(format!("--http {addr:?}: not an address to listen on ({e}); use e.g. 127.0.0.1:8765")),
    };
    let Some(sock) = addrs.first().copied() else { return fail(format!("--http {addr:?} resolves to nothing")) };
    let tls = match &config.server.tls {
        Some(t) => match server::http::tls_acceptor(Path::new(&t.cert), Path::new(&t.key)) {
            Ok(a) => Some(a),
            Err(e) => return fail(e),
        },
        None => None,
    };
    if !sock.ip().is_loopback() && config.server.metrics_public {
        return fail(format!(
            "--http {sock}: server.metricsPublic serves /metrics without a token, so only on a loopback bind; use server.operatorTokens instead"
        ));
    }
    if !sock.ip().is_loopback() {
        let loopback_only =
            config.server.allowed_hosts.iter().all(|h| matches!(h.as_str(), "localhost" | "127.0.0.1" | "::1"));
        if loopback_only {
            return fail(format!(
                "--http {sock}: a non-loopback bind needs server.allowedHosts listing the host names clients use (now only loopback names)"
            ));
        }
        if tls.is_none() && !insecure_remote {
            return fail(format!(
                "--http {sock}: a non-loopback bind needs TLS (server.tls {{cert, key}}) or --insecure-remote"
            ));
        }
        if tls.is_none() {
            tracing::warn!(%sock, "serving plain HTTP on a non-loopback address (--insecure-remote): tokens cross the network in clear text");
        }
    }
    let listener = match tokio::net::TcpListener::bind(sock).await {
        Ok(l) => l,
        Err(e) => return fail(format!("--http {sock}: cannot listen: {e}")),
    };
    let access = Access::new(store.clone(), config.clone());
    let runtime = match Scheduler::start(
        store.clone(),
        config.clone(),
        &env.state_dir,
        role,
        crate::server::http::owner_socket(),
    ) {
        Ok(rt) => rt,
        Err(e) => return fail(e),
    };
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut options = server::http::HttpOptions::tcp(&config);
    if let Some(raw) = as_session {
        // The local operator's shortcut, as on stdio: loopback only, never with requireToken.
        if !sock.ip().is_loopback() || config.security.require_token {
            return fail("--as with --http needs a loopback address and security.requireToken=false");
        }
        let creds = Credentials { token: None, as_session: Some(raw.to_string()), inside_run: false };
        match caller::resolve(&creds, &config, &store) {
            Ok(c) => options.anonymous = Some(c),
            Err(e) => return fail(e),
        }
    }
    let router = server::http::router(access, Some(runtime.clone()), cancel.clone(), &options);
    let limits = server::http::TcpLimits {
        header_timeout: std::time::Duration::from_secs(config.server.header_timeout_seconds.max(1)),
        idle_timeout: std::time::Duration::from_secs(config.server.idle_timeout_seconds.max(1)),
        max_connections: config.server.max_connections as usize,
        max_connections_per_peer: config.server.max_connections_per_peer as usize,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    eprintln!("sessions-mcp: listening on {scheme}://{}/mcp", listener.local_addr().map_or(sock, |a| a));
    if let Some(line) = server::a2a::banner(&config) {
        eprintln!("sessions-mcp: {line}");
    }
    let serving = tokio::spawn(server::http::serve_tcp(listener, router, limits, tls, cancel.clone()));
    terminate_signal().await;
    cancel.cancel();
    let _ = serving.await;
    runtime.shutdown(true).await;
    ExitCode::SUCCESS
}

/// SIGTERM or SIGINT.
pub async fn terminate_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

async fn daemon(paths: Paths, force: bool, http: Option<&str>, insecure_remote: bool) -> ExitCode {
    let env = match paths.resolve_with_agents() {
        Ok(env) => env,
        Err(e) => return fail(format!("{e} (run `sessions-mcp doctor` for details)")),
    };
    if holds_reference_store(&env.state_dir) && !force {
        return fail(format!("{} holds an OpenClaw store; pass --force to use it anyway", env.state_dir.display()));
    }
    let store = match env.open_store() {
        Ok(s) => s,
        Err(code) => return code,
    };
    if let Some(addr) = http {
        eprintln!("sessions-mcp daemon: running for {}", env.state_dir.display());
        return serve_http(env, store, addr, insecure_remote, None, Role::Daemon).await;
    }
    let runtime = match Scheduler::start(
        store,
        Arc::new(env.loaded.config),
        &env.state_dir,
        Role::Daemon,
        crate::server::http::owner_socket(),
    ) {
        Ok(rt) => rt,
        Err(e) => return fail(e),
    };
    eprintln!("sessions-mcp daemon: running for {}", env.state_dir.display());
    terminate_signal().await;
    runtime.shutdown(true).await;
    ExitCode::SUCCESS
}
