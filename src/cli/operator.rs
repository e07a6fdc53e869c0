//! The operator's commands: `import`, `export`, `ls`, `show`, `policy`, `prune`, `doctor` (`migrate`
//! is in `cli::postgres`). Each
//! prints a human-readable table, or with `--json` the pinned JSON (docs/BEHAVIOUR.md, Operator
//! commands), and exits 0 on success, 1 when something failed, 2 on a usage or config problem.

use std::path::Path;
use std::process::ExitCode;

use serde_json::{Map, Value, json};

use crate::access::Access;
use crate::cli::Env;
use crate::config::Config;
use crate::config::key_scope;
use crate::engine::chain::ChannelUser;
use crate::engine::inject::{Injected, Origin};
use crate::keys::{self, SessionRef};
use crate::store::{SendPolicyOverride, SessionRow, SessionState, Store, now_ms};
use crate::tools::sessions_list::list_row;

fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).expect("JSON serialises"));
}

/// A command that failed: one line on stderr, exit code 1.
pub(super) fn failed(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("sessions-mcp: {message}");
    ExitCode::FAILURE
}

pub fn import(env: &Env, store: &Store, dir: &Path, as_json: bool) -> ExitCode {
    let started = std::time::Instant::now();
    let report = match crate::openclaw::import::import(dir, store, &env.loaded.config) {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let secs = started.elapsed().as_secs_f64();
    if as_json {
        let mut v = serde_json::to_value(&report).expect("report serialises");
        v["seconds"] = json!(secs);
        print_json(&v);
    } else {
        println!(
            "imported {} sessions ({} new), {} messages ({} already present) in {secs:.2}s",
            report.sessions_seen, report.sessions_created, report.messages_imported, report.messages_already_present
        );
        for note in &report.notes {
            println!("  {note}");
        }
    }
    ExitCode::SUCCESS
}

pub fn export(env: &Env, store: &Store, as_json: bool) -> ExitCode {
    match crate::openclaw::export::export(store, &env.state_dir) {
        Ok(report) if as_json => {
            print_json(&serde_json::to_value(&report).expect("report serialises"));
            ExitCode::SUCCESS
        }
        Ok(report) => {
            println!("exported {} sessions, {} messages to {}", report.sessions, report.messages, report.directory);
            for r in &report.refused {
                println!("  {r}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => failed(e),
    }
}

/// A session row as `sessions_list` shows it (visibility all, canonical key) plus driver and archived.
fn operator_row(row: &SessionRow, config: &Config, state_dir: &Path) -> Value {
    let scope = key_scope(config, &row.agent_id);
    let mut v =
        serde_json::to_value(list_row(row, &scope, false, Some(&crate::config::export_dir(state_dir)))).expect("row");
    v["key"] = json!(row.key.as_str());
    v["driver"] = json!(if row.external { "external" } else { "driven" });
    v["archived"] = json!(row.state == SessionState::Archived);
    if row.state == SessionState::Deleted {
        v["deleted"] = json!(true);
    }
    v
}

pub fn ls(env: &Env, store: &Store, as_json: bool) -> ExitCode {
    let (sessions, runs) = match (store.all_sessions(), store.run_counts()) {
        (Ok(s), Ok(r)) => (s, r),
        (Err(e), _) | (_, Err(e)) => return failed(e),
    };
    let mut sessions: Vec<&SessionRow> = sessions.iter().filter(|s| s.state != SessionState::Deleted).collect();
    sessions.sort_by_key(|s| std::cmp::Reverse((s.updated_at, s.id)));
    let rows: Vec<Value> = sessions.iter().map(|s| operator_row(s, &env.loaded.config, &env.state_dir)).collect();
    if as_json {
        let mut counts = Map::new();
        for status in ["queued", "running", "ok", "error", "timeout", "cancelled", "interrupted"] {
            counts.insert(status.into(), json!(runs.iter().find(|(s, _)| s == status).map_or(0, |(_, n)| *n)));
        }
        print_json(&json!({"sessions": rows, "runs": counts}));
        return ExitCode::SUCCESS;
    }
    println!("{:<58} {:<6} {:<9} {:<8} {:<24} LABEL", "KEY", "KIND", "CHANNEL", "DRIVER", "UPDATED");
    for r in &rows {
        let s = |k: &str| r[k].as_str().unwrap_or("").to_string();
        let archived = if r["archived"] == true { " (archived)" } else { "" };
        println!(
            "{:<58} {:<6} {:<9} {:<8} {:<24} {}{archived}",
            s("key"),
            s("kind"),
            s("channel"),
            s("driver"),
            crate::store::iso(r["updatedAt"].as_i64().unwrap_or(0)),
            s("label")
        );
    }
    ExitCode::SUCCESS
}

/// `ls --pending`: every open question and approval, oldest first.
pub fn pending(store: &Store, as_json: bool) -> ExitCode {
    let asks = match store.open_asks() {
        Ok(a) => a,
        Err(e) => return failed(e),
    };
    let rows: Vec<Value> = asks
        .iter()
        .map(|a| {
            json!({"requestId": a.id, "session": a.child.as_str(), "kind": a.kind.as_str(), "text": a.text,
                   "details": a.details, "askedOf": a.target.as_str(), "expiresAt": a.deadline_at,
                   "routes": a.routes})
        })
        .collect();
    if as_json {
        print_json(&json!({"pending": rows}));
        return ExitCode::SUCCESS;
    }
    println!("{:<36} {:<9} {:<58} TEXT", "REQUEST", "KIND", "SESSION");
    for a in &asks {
        println!("{:<36} {:<9} {:<58} {}", a.id, a.kind.as_str(), a.child.as_str(), a.text);
    }
    ExitCode::SUCCESS
}

/// `respond REQUEST allow|deny [TEXT]`: the operator answers an open ask.
pub fn respond(store: &Store, id: &str, decision: &str, text: Option<&str>) -> ExitCode {
    let decision = match decision.to_ascii_lowercase().as_str() {
        "allow" => crate::store::AskDecision::Allow,
        "deny" => crate::store::AskDecision::Deny,
        other => return super::fail(format!("decision {other:?} is not allowed; allowed: allow, deny")),
    };
    let answer =
        crate::store::Answer { decision, text, by: "operator", via: crate::store::AnsweredVia::Operator, host: None };
    match crate::engine::ask::close_in(store, id, crate::store::AskState::Answered, &answer) {
        Ok(true) => {
            println!("answered {id}: {}", decision.as_str());
            ExitCode::SUCCESS
        }
        Ok(false) => match store.ask(id) {
            Ok(Some(a)) => failed(format!("request {id} {}", crate::engine::ask::closed_how(&a))),
            Ok(None) => failed(format!("no request {id} (sessions-mcp ls --pending lists the open ones)")),
            Err(e) => failed(e),
        },
        Err(e) => failed(e),
    }
}

/// Resolves an operator's KEY (any key form, or a sessionId) to a stored row.
fn find(store: &Store, config: &Config, raw: &str) -> Result<SessionRow, String> {
    let scope = key_scope(config, &config.default_agent());
    let found = match keys::parse_ref(raw, &scope).map_err(|e| format!("{raw:?} {e}"))? {
        SessionRef::Key(k) => store.session_by_key(&k).map_err(|e| e.to_string())?,
        SessionRef::SessionId(id) => store.sessions_by_session_id(&id).map_err(|e| e.to_string())?.into_iter().next(),
    };
    found.ok_or_else(|| format!("no session {raw:?} in this store (see `sessions-mcp ls`)"))
}

pub fn show(env: &Env, store: &Store, raw: &str, as_json: bool) -> ExitCode {
    let config = &env.loaded.config;
    let row = match find(store, config, raw) {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let (messages, runs) = match (store.all_messages(row.id), store.recent_runs(row.id, 1000)) {
        (Ok(m), Ok(r)) => (m, r),
        (Err(e), _) | (_, Err(e)) => return failed(e),
    };
    let access = Access::new(store.clone(), std::sync::Arc::new(config.clone()));
    let decision = access.send_decision(&row.key, Some(&row));
    let budget = match store.budget_of(row.id) {
        Ok(b) => b,
        Err(e) => return failed(e),
    };
    if as_json {
        print_json(&json!({
            "session": operator_row(&row, config, &env.state_dir),
            "sendPolicyEffective": {"action": decision.action.as_str(), "rule": decision.rule, "source": decision.source},
            "budget": budget.as_ref().map(crate::policy::budget::Account::to_json),
            "messages": messages.iter().map(|m| m.to_json()).collect::<Vec<_>>(),
            "runs": runs,
        }));
        return ExitCode::SUCCESS;
    }
    let r = operator_row(&row, config, &env.state_dir);
    println!("session   {}", row.key);
    println!("sessionId {}", row.session_id);
    println!(
        "kind      {}   channel {}   driver {}",
        r["kind"].as_str().unwrap_or(""),
        r["channel"].as_str().unwrap_or(""),
        r["driver"].as_str().unwrap_or("")
    );
    let rule = decision.rule.map(|i| format!(" (rule {i})")).unwrap_or_default();
    println!("send      {}{rule} from {:?}", decision.action.as_str(), decision.source);
    if let Some(b) = &budget {
        let exceeded = b.exceeded.map(|d| format!("   exceeded ({})", d.as_str())).unwrap_or_default();
        println!(
            "budget    {}   reserved {}{exceeded}",
            b.spent_text().trim_start_matches("budget "),
            b.reserved.to_json(&b.limits)
        );
    }
    println!("messages  {}   runs {}", messages.len(), runs.len());
    for m in &messages {
        let text = crate::sanitize::preview(&m.content, 200);
        let silent = if m.silent { " (silent)" } else { "" };
        println!("  #{:<5} {:<10} {text}{silent}", m.seq, m.role);
    }
    ExitCode::SUCCESS
}

pub fn policy(env: &Env, store: &Store, raw: &str, mode: &str) -> ExitCode {
    let value = match mode.to_ascii_lowercase().as_str() {
        "on" | "allow" => Some(SendPolicyOverride::Allow),
        "off" | "deny" => Some(SendPolicyOverride::Deny),
        "inherit" | "default" | "reset" => None,
        other => {
            eprintln!(
                "sessions-mcp: policy mode {other:?} is not one of on|off|inherit (aliases allow|deny, default|reset)"
            );
            return ExitCode::from(2);
        }
    };
    let row = match find(store, &env.loaded.config, raw) {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    match store.set_send_policy(row.key.as_str(), value) {
        Ok(_) => {
            println!("send policy of {} set to {}", row.key, value.map_or("inherit", SendPolicyOverride::as_str));
            ExitCode::SUCCESS
        }
        Err(e) => failed(e),
    }
}

/// `30d`, `12h`, `90m`, `45s`, `2w` → milliseconds.
pub fn parse_duration_ms(s: &str) -> Option<i64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().ok()?;
    let unit_ms = match unit {
        "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        "w" => 604_800_000.0,
        _ => return None,
    };
    (n >= 0.0).then_some((n * unit_ms) as i64)
}

pub fn prune(store: &Store, older_than: Option<&str>) -> ExitCode {
    let age = match older_than.map(parse_duration_ms) {
        None => 0,
        Some(Some(ms)) => ms,
        Some(None) => {
            eprintln!("sessions-mcp: --older-than wants a duration like 30d, 12h, 90m, 45s or 2w");
            return ExitCode::from(2);
        }
    };
    match store.prune(now_ms() - age) {
        Ok(p) => {
            println!("pruned {} sessions ({} messages, {} runs)", p.sessions, p.messages, p.runs);
            ExitCode::SUCCESS
        }
        Err(e) => failed(e),
    }
}

/// One line per agent runner: its command, and whether it can be started.
fn check_runners(env: &Env) -> usize {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut agents = env.loaded.config.configured_agents();
    if !agents.iter().any(|a| a.as_str() == "main") {
        agents.insert(0, crate::keys::AgentId::main());
    }
    // Every run starts through the supervisor: without it nothing runs.
    let supervisor = crate::runner::Runner::at(exe.clone()).supervisor;
    let mut problems = 0;
    if supervisor.is_file() {
        println!("supervisor: {}", supervisor.display());
    } else {
        println!(
            "supervisor problem: {} is missing: every run would fail to start (it is installed beside sessions-mcp)",
            supervisor.display()
        );
        problems += 1;
    }
    for agent in agents {
        problems += check_runner(env, &agent, &exe);
    }
    problems
}

/// One agent's runner as it applies (its preset expanded under its own keys), the version of its
/// CLI, and what keeps it from working. Returns the number of problems.
fn check_runner(env: &Env, agent: &crate::keys::AgentId, exe: &Path) -> usize {
    let config = &env.loaded.config;
    let spec = match crate::runner::resolve_runner(config, agent, &env.state_dir, exe) {
        Ok(spec) => spec,
        Err(e) => {
            println!("runner {agent}: none ({e})");
            return 0;
        }
    };
    if spec.echo {
        println!("runner {agent}: the built-in echo agent (preset echo): {}", crate::runner::ECHO_WARNING);
        return 0;
    }
    if spec.command == exe.display().to_string() {
        let args = spec.args.iter().skip(1).cloned().collect::<Vec<_>>().join(" ");
        println!("runner {agent}: the built-in agent (sessions-mcp agent {args})");
        return 0;
    }
    let Ok(path) = which::which(&spec.command) else {
        println!("runner problem: {agent}: command {:?} not found or not executable", spec.command);
        return 1;
    };
    let shown = crate::runner::agent_runner(config, agent, crate::runner::LoginCheck::Wait);
    let origin =
        if config.agent(agent).is_some_and(|a| a.discovered.is_some()) { "discovered on PATH" } else { "configured" };
    let version = crate::runner::discover::version(&path, &env.state_dir);
    let version = if version.is_empty() { "no version given".to_string() } else { version };
    println!("runner {agent}: preset {} ({origin}), {} ({}; {version})", shown.runner, spec.command, path.display());
    println!(
        "runner {agent} expanded: kind {}, args {:?}, home {}, passthrough {:?}",
        serde_json::to_value(spec.kind).unwrap_or_default().as_str().unwrap_or_default(),
        spec.args,
        if spec.home_inherit { "inherit" } else { "isolated" },
        spec.passthrough
    );
    let login = match shown.login {
        Some(login) if !shown.available => {
            println!("runner problem: {agent}: {login}");
            1
        }
        Some(login) => {
            println!("runner {agent} login: {login}");
            0
        }
        None => 0,
    };
    login
        + match crate::runner::missing_adapter_flags(&spec) {
            Some(why) => {
                println!("runner problem: {agent}: {why}");
                1
            }
            None => 0,
        }
}

/// When some agent's sessions run sandboxed, bubblewrap must be able to start a jail.
fn check_sandbox(env: &Env) -> usize {
    let config = &env.loaded.config;
    let sandboxing = config.agents.defaults.sandbox.mode != crate::config::SandboxMode::Off
        || config.configured_agents().iter().any(|a| config.sandbox_mode(a) != crate::config::SandboxMode::Off);
    match (crate::runner::sandbox::available(), sandboxing) {
        (Ok(()), _) => {
            println!("sandbox: bubblewrap can start jails");
            0
        }
        (Err(why), true) => {
            println!("sandbox problem: sandboxed sessions are configured but {why}");
            1
        }
        (Err(why), false) => {
            println!("sandbox: unavailable ({why}); no agent is sandboxed, so nothing needs it");
            0
        }
    }
}

/// Reports what other local users may read in the state dir (one line each, the first 20);
/// `fix` makes it private. Returns the number of problems left.
fn check_modes(state_dir: &Path, fix: bool) -> usize {
    let report = match crate::privacy::check_modes(state_dir, fix) {
        Ok(r) => r,
        Err(e) => {
            println!("modes problem: cannot read {}: {e}", state_dir.display());
            return 1;
        }
    };
    for (path, mode) in report.shared.iter().take(20) {
        println!("modes problem: {} is {mode:04o}: other local users may read it", path.display());
    }
    if report.shared.len() > 20 {
        println!("modes problem: … and {} more", report.shared.len() - 20);
    }
    match (report.shared.len(), report.fixed) {
        (0, _) => {
            println!("modes: private to the owner");
            0
        }
        (n, fixed) if fix => {
            println!("modes: made {fixed} of {n} private");
            n - fixed
        }
        (n, _) => {
            println!("modes: {n} shared; run `sessions-mcp doctor --fix-modes` to make them private");
            1
        }
    }
}

/// Resolved paths, config problems (one line each), the store, file modes, the runtime.
pub fn doctor(paths: &crate::cli::Paths, fix_modes: bool, store_url: Option<&str>) -> ExitCode {
    let mut problems = 0;
    let state_dir = paths.state_dir();
    println!("state dir: {}{}", state_dir.display(), if state_dir.is_dir() { "" } else { " (does not exist yet)" });
    let (config_path, explicit) = paths.config_path(&state_dir);
    match std::fs::read_to_string(&config_path) {
        Ok(text) => {
            println!("config: {}", config_path.display());
            let found = crate::config::problems(&text);
            for p in &found {
                println!("config problem: {p}");
            }
            problems += found.len();
            if found.is_empty()
                && let Ok((_, ignored)) = crate::config::parse(&text)
            {
                for path in ignored {
                    println!("config note: {path} is an OpenClaw key that sessions-mcp accepts but does not implement");
                }
            }
        }
        Err(_) if !explicit => println!("config: {} (not present: all defaults)", config_path.display()),
        Err(e) => {
            println!("config problem: {}: {e}", config_path.display());
            problems += 1;
        }
    }
    let store_path = Store::path_in(&state_dir);
    if store_path.exists() {
        match Store::open(&store_path).and_then(|s| Ok((s.all_sessions()?.len(), s.run_counts()?))) {
            Ok((n, runs)) => println!(
                "store: {} ({n} sessions, {} runs)",
                store_path.display(),
                runs.iter().map(|r| r.1).sum::<i64>()
            ),
            Err(e) => {
                println!("store problem: {e}");
                problems += 1;
            }
        }
    } else {
        println!("store: {} (created on first use)", store_path.display());
    }
    if let Some(url) = store_url {
        problems += crate::cli::postgres::doctor(url);
    }
    if state_dir.is_dir() {
        problems += check_modes(&state_dir, fix_modes);
    }
    if let Ok(env) = paths.resolve_with_agents() {
        problems += check_runners(&env);
        problems += check_sandbox(&env);
    }
    let daemon_runs = crate::engine::scheduler::daemon_running(&state_dir);
    println!(
        "daemon: {}",
        if daemon_runs {
            "running"
        } else {
            "not running (runs end when the last serve exits; start `sessions-mcp daemon` for work that must outlive the editor)"
        }
    );
    if problems == 0 {
        println!("ok");
        ExitCode::SUCCESS
    } else {
        println!("{problems} problem(s)");
        ExitCode::FAILURE
    }
}

/// Every session (operator row without store-local fields) and its messages, one JSON per line,
/// sorted by key: two stores with the same sessions and messages dump the same text.
pub fn dump(env: &Env, store: &Store) -> ExitCode {
    let mut sessions = match store.all_sessions() {
        Ok(s) => s,
        Err(e) => return failed(e),
    };
    sessions.sort_by(|a, b| a.key.cmp(&b.key));
    for s in &sessions {
        let mut row = operator_row(s, &env.loaded.config, &env.state_dir);
        if let Some(o) = row.as_object_mut() {
            o.remove("transcriptPath");
            o.remove("transcriptUri");
        }
        let messages = match store.all_messages(s.id) {
            Ok(m) => m,
            Err(e) => return failed(e),
        };
        row["messages"] = messages.iter().map(|m| m.to_json()).collect();
        println!("{row}");
    }
    ExitCode::SUCCESS
}

/// `/send on|off|inherit` (aliases allow|deny, default|reset): the owner's policy command.
fn send_command(text: &str) -> Option<Option<&'static str>> {
    let t = text.trim();
    let rest = t.strip_prefix("/send").or_else(|| t.strip_prefix("/SEND"))?;
    if !rest.is_empty() && !rest.starts_with(char::is_whitespace) {
        return None;
    }
    Some(match rest.trim().to_ascii_lowercase().as_str() {
        "on" | "allow" => Some("allow"),
        "off" | "deny" => Some("deny"),
        "inherit" | "default" | "reset" => Some("inherit"),
        _ => None,
    })
}

/// `sessions-mcp inject KEY TEXT`: the owner's message into a session (a new chain). An external
/// session gets it in its inbox; a driven one runs it, and the reply is printed.
/// `--sender` of `inject`: the message is a channel user's, on the key's own channel.
pub struct InjectSender {
    pub id: String,
    pub name: Option<String>,
    pub message_id: Option<String>,
}

fn channel_user(key: &keys::SessionKey, s: InjectSender) -> Result<Origin, String> {
    let channel = keys::channel_in_key(key)
        .ok_or_else(|| format!("--sender needs a channel session key (agent:<id>:<channel>:group:<id>…), got {key}"))?;
    let user = ChannelUser {
        channel: channel.to_string(),
        sender_id: s.id,
        sender_name: s.name,
        thread_id: None,
        message_id: s.message_id,
    };
    crate::engine::inject::channel_origin(key, user, None)
}

pub async fn inject(
    paths: crate::cli::Paths,
    raw_key: String,
    text: String,
    timeout: u64,
    sender: Option<InjectSender>,
) -> ExitCode {
    let env = match paths.resolve_with_agents() {
        Ok(env) => env,
        Err(e) => return crate::cli::fail(e),
    };
    let store = match env.open_store() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let config = std::sync::Arc::new(env.loaded.config.clone());
    let key = match keys::parse_ref(&raw_key, &key_scope(&config, &config.default_agent())) {
        Ok(SessionRef::Key(k)) => k,
        _ => return crate::cli::fail(format!("{raw_key:?} is not a session key")),
    };
    if let Some(mode) = send_command(&text) {
        return match mode {
            Some(m) => policy(&env, &store, key.as_str(), m),
            None => {
                eprintln!("Usage: /send on|off|inherit");
                ExitCode::from(2)
            }
        };
    }
    let origin = match sender {
        None => Origin::Operator,
        Some(s) => match channel_user(&key, s) {
            Ok(origin) => origin,
            Err(e) => return crate::cli::fail(e),
        },
    };
    match crate::engine::inject::start(&store, &config, &env.state_dir, &key, &text, &origin) {
        Err(e) => failed(e),
        Ok(Injected::Appended) => {
            println!("appended to the external session {key}'s inbox");
            ExitCode::SUCCESS
        }
        Ok(Injected::Duplicate(run)) => {
            println!("message already received (run {})", run.unwrap_or_default());
            ExitCode::SUCCESS
        }
        Ok(Injected::Queued(run_id)) if timeout == 0 => {
            println!("queued run {run_id}");
            ExitCode::SUCCESS
        }
        Ok(Injected::Queued(run_id)) => {
            let rt = match crate::engine::scheduler::Scheduler::start(
                store,
                config,
                &env.state_dir,
                crate::engine::scheduler::Role::Serve,
                crate::server::http::owner_socket(),
            ) {
                Ok(rt) => rt,
                Err(e) => return crate::cli::fail(e),
            };
            rt.wake();
            let waited = rt.wait(&run_id, std::time::Duration::from_secs(timeout), &Default::default()).await;
            // The reply's delivery to a channel is a step after the run: see it through before
            // this short-lived owner lets go (a retried delivery is left for the next owner).
            if let Err(e) = crate::engine::settle_run(&rt, &run_id, std::time::Duration::from_secs(30)).await {
                tracing::warn!(run = %run_id, error = %e, "the reply's delivery is left for the next owner");
            }
            rt.shutdown(false).await;
            match waited {
                Ok(crate::engine::scheduler::Waited::Finished(run)) if run.status == crate::store::RunStatus::Ok => {
                    println!("{}", run.reply.unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Ok(crate::engine::scheduler::Waited::Finished(run)) => {
                    failed(format!("run {run_id} ended {}: {}", run.status, run.error.unwrap_or_default()))
                }
                Ok(_) => failed(format!("run {run_id} did not finish within {timeout}s; it goes on")),
                Err(e) => failed(e),
            }
        }
    }
}
