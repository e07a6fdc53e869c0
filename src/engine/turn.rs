//! One turn: `run_turn` executes one claimed run (the agent's input from the session's history
//! and the run's flow, the runner's launch, the streamed output) and commits its outcome; the
//! steps after it are `steps`.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::budget::RunMeter;
use super::context::{self, is_skip};
use super::flow::Flow;
use crate::config::RunnerKind;
use crate::config::configured_sandbox;
use crate::config::key_scope;
use crate::engine::scheduler::Scheduler;
use crate::keys::{self, SessionKey};
use crate::runner::mcp_config::{McpConfigFile, codex_overrides};
use crate::runner::template::CliTurn;
use crate::runner::{Hooks, Input, Launch, RunStatus, RunnerSpec, resolve_runner, sandbox};
use crate::store::sha256_hex;
use crate::store::{Finished, RunMode, RunRow, SessionRow, StoreError, TokenRow};

/// How a turn ended, as the flows need it.
#[derive(Debug, Clone)]
pub struct TurnResult {
    pub status: RunStatus,
    pub reply: Option<String>,
    pub silent: bool,
}

impl TurnResult {
    pub(super) fn ok_reply(&self) -> Option<&str> {
        (self.status == RunStatus::Ok && !self.silent)
            .then_some(self.reply.as_deref())
            .flatten()
            .filter(|r| !r.trim().is_empty())
    }
}

/// The channel of a session by the one channel rule.
pub fn channel_of_row(key: &SessionKey, row: Option<&SessionRow>, rt: &Scheduler) -> String {
    let scope = key_scope(&rt.config, &key.agent_id(&rt.config.default_agent()));
    let stored_chat = row.and_then(|r| r.chat_type);
    let kind = row.map_or_else(|| keys::kind_of(key, &scope, stored_chat), |r| r.kind);
    keys::channel_of(
        key,
        kind,
        keys::chat_type_of(key, stored_chat),
        row.and_then(|r| r.channel.as_deref()),
        row.and_then(|r| r.last_channel.as_deref()),
    )
}

fn env_for(run: &RunRow, spec: &crate::runner::RunnerSpec, token: &str, socket: &str) -> Vec<(String, String)> {
    let files = spec.files_dir.display().to_string();
    let home = if spec.home_inherit {
        std::env::var("HOME").unwrap_or_else(|_| files.clone())
    } else {
        format!("{files}/.sessions-home")
    };
    let mut env = vec![
        ("PATH".to_string(), std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into())),
        ("LANG".into(), "C.UTF-8".into()),
        ("LC_ALL".into(), "C.UTF-8".into()),
        ("TZ".into(), "UTC".into()),
        ("HOME".into(), home),
        ("TMPDIR".into(), format!("{files}/.tmp")),
        ("SESSIONS_MCP_RUN_ID".into(), run.run_id.clone()),
        ("SESSIONS_MCP_SESSION_KEY".into(), run.session_key.to_string()),
        ("SESSIONS_MCP_TOKEN".into(), token.to_string()),
        ("SESSIONS_MCP_SOCKET".into(), socket.to_string()),
    ];
    for name in &spec.passthrough {
        if let Ok(v) = std::env::var(name)
            && !name.starts_with("SESSIONS_MCP_")
            && name != "CLAUDECODE"
            && name != "CLAUDE_CODE_ENTRYPOINT"
        {
            env.push((name.clone(), v));
        }
    }
    env
}

/// The requester's project a spawned child works in, as its spawn recorded it (every run of the
/// child works there: its steers, completions and Notes too); None for an isolated workspace.
fn project_of(rt: &Scheduler, session: &SessionRow, run: &RunRow) -> Result<Option<PathBuf>, StoreError> {
    let Some(spawn_run) = session.spawn_run.as_deref() else { return Ok(None) };
    let extra =
        if spawn_run == run.run_id { run.extra.clone() } else { rt.store.run(spawn_run)?.and_then(|r| r.extra) };
    let flow = Flow::of(extra.as_ref());
    Ok(flow.as_ref().and_then(Flow::spawn).and_then(|s| s.project.as_deref()).map(PathBuf::from))
}

/// The `system` text of a run, from its mode and flow state: a send's exchange tells each side
/// who it is talking to; a spawn's runs carry the sub-agent context.
fn system_for(run: &RunRow, flow: Option<&Flow>) -> Option<String> {
    let flow = flow?;
    if let Some(spawn) = flow.spawn() {
        return Some(spawn.system.clone());
    }
    let exchange = flow.exchange()?;
    let parties = &exchange.parties;
    match run.mode {
        RunMode::Send => Some(context::send_context(parties)),
        RunMode::Reply => {
            let you_are_requester = run.session_key.as_str() == parties.requester;
            Some(context::reply_context(parties, you_are_requester, exchange.turn, exchange.max))
        }
        RunMode::Announce => Some(context::announce_context(
            parties,
            &exchange.request,
            exchange.round_one.as_deref(),
            exchange.latest.as_deref(),
        )),
        _ => None,
    }
}

/// The agent's argv and stdin for a run, from its `request`: `jsonl` agents get the request line;
/// CLI adapters get their command template filled and the prompt rendered from the same request
/// (Claude Code also an MCP config file, removed when the returned guard drops; Codex the same
/// server as `-c` overrides before its arguments).
fn agent_input(
    spec: &RunnerSpec,
    run: &RunRow,
    session_id: &str,
    request: Value,
    env: &[(String, String)],
    exe: &str,
) -> Result<(Vec<String>, Input, Option<McpConfigFile>), String> {
    let resume = request.pointer("/resume/externalSessionId").and_then(Value::as_str).map(String::from);
    // sessionMode "always" on a fresh session: the CLI is handed a new id of our choosing.
    let external = resume.clone().unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let workdir = spec.workdir.display().to_string();
    let vars = [
        ("sessionKey", run.session_key.as_str()),
        ("sessionId", session_id),
        ("runId", &run.run_id),
        ("model", run.model.as_deref().unwrap_or("")),
        ("thinking", run.thinking.as_deref().unwrap_or("")),
        ("workdir", &workdir),
        ("externalSessionId", if spec.cli.is_some() { &external } else { resume.as_deref().unwrap_or("") }),
    ];
    let Some(cli) = &spec.cli else { return Ok((spec.argv(&vars), Input::Request(request), None)) };
    let mcp_config = (spec.kind == RunnerKind::ClaudeStreamJson)
        .then(|| McpConfigFile::write(&spec.files_dir.join(".tmp"), &run.run_id, exe, env))
        .transpose()
        .map_err(|e| format!("cannot write the MCP config file for Claude Code: {e}"))?;
    let extra = mcp_config.iter().flat_map(|f| ["--mcp-config".to_string(), f.path().display().to_string()]).collect();
    let history = request["messages"].as_array().filter(|_| resume.is_none()).map_or(&[][..], Vec::as_slice);
    let turn = CliTurn {
        resuming: resume.is_some(),
        model: run.model.as_deref(),
        thinking: run.thinking.as_deref(),
        system: request["system"].as_str(),
        history,
        input: &request["input"],
        extra,
    };
    let invocation = cli.invocation(&spec.args, &vars, turn);
    let args = match spec.kind {
        RunnerKind::CodexExecJson => codex_overrides(exe).into_iter().chain(invocation.args).collect(),
        _ => invocation.args,
    };
    Ok((args, Input::Prompt(invocation.stdin), mcp_config))
}

/// Executes one claimed run and commits its outcome.
pub async fn run_turn(
    rt: &Arc<Scheduler>,
    run: &RunRow,
    input_seq: i64,
    cancel: CancellationToken,
    on_delta: &(dyn Fn(&str) + Send + Sync),
    steers: tokio::sync::mpsc::UnboundedReceiver<crate::runner::Steer>,
    asks: tokio::sync::mpsc::UnboundedSender<crate::runner::InputRequest>,
) -> Result<TurnResult, StoreError> {
    let store = &rt.store;
    let config = &rt.config;
    let end = |status: RunStatus, error: String| -> Result<TurnResult, StoreError> {
        store.finish_run(&run.run_id, rt.owner_id.as_str(), &Finished::without_output(status, error))?;
        Ok(TurnResult { status, reply: None, silent: false })
    };
    let fail = |error: String| end(RunStatus::Error, error);
    let Some(session) = store.session_by_key(&run.session_key)? else {
        return fail(format!("session {} no longer exists", run.session_key));
    };
    let mut spec = match resolve_runner(config, &run.agent_id, &rt.state_dir, &rt.runner.exe) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    if let Some(ms) = run.timeout_ms.filter(|ms| *ms > 0) {
        spec.timeout = spec.timeout.min(std::time::Duration::from_millis(ms as u64));
    }
    if let Some(remote) = spec.remote.clone() {
        let ends = RemoteEnds { cancel, on_delta, steers, asks };
        return remote_turn(rt, run, &session, &spec, &remote, ends).await;
    }
    let sandboxed = session.sandboxed || configured_sandbox(config, &run.session_key);
    let workspace = spec.workdir.clone();
    if sandboxed {
        // Never unconfined: no jail, no run.
        if let Err(why) = sandbox::available() {
            return fail(format!("sandbox unavailable: {why}"));
        }
        spec.workdir = sandbox::session_workdir(&workspace, &session.session_id);
        spec.files_dir = spec.workdir.clone();
        if let Err(e) = sandbox::prepare_workdir(&workspace, &spec.workdir) {
            return fail(format!("sandbox unavailable: cannot prepare {}: {e}", spec.workdir.display()));
        }
    } else {
        for dir in [spec.files_dir.clone(), spec.files_dir.join(".tmp"), spec.files_dir.join(".sessions-home")] {
            if let Err(e) = std::fs::create_dir_all(&dir) {
                return fail(format!("cannot create the workdir {}: {e}", dir.display()));
            }
        }
        match project_of(rt, &session, run)? {
            Some(project) if project.is_dir() => spec.workdir = project,
            Some(project) => {
                return fail(format!("the requester's project {} is no longer a directory", project.display()));
            }
            None => {}
        }
    }
    if store.is_shared() && session.spawn_run.is_some() {
        // The spawn may have been taken by another node: its attachments are written here too
        // (only a spawned session has any, so no other run pays the round trip).
        let stored = store.stored_attachments(session.id)?;
        if let Err(e) = super::attachments::materialise(&workspace, &spec.workdir, &stored) {
            return fail(format!("cannot write the child's attachments into {}: {e}", spec.workdir.display()));
        }
    }
    let history = store.context_before(session.id, input_seq, 2000)?;
    let messages = context::fit_context(&history, spec.context_budget_bytes);
    let resume = spec.resume(session.external_session_id.as_deref(), session.aborted_last_run == Some(true));
    let totals_before = if resume.is_some() { store.cli_usage_total(session.id)? } else { None };
    let meter = match RunMeter::open(rt, &run.run_id, &session, totals_before.clone())? {
        Ok(meter) => meter,
        Err(exhausted) => return end(RunStatus::BudgetExceeded, exhausted),
    };
    let token = format!("smcp_run_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    store.insert_run_token(
        &sha256_hex(&token),
        &TokenRow {
            session_key: run.session_key.to_string(),
            run_id: Some(run.run_id.clone()),
            chain_id: run.chain_id.clone(),
            hop: run.hop,
            sandboxed,
        },
    )?;
    let host_socket = rt.state_dir.join("run/mcp.sock");
    let socket = if sandboxed { sandbox::SOCKET_INSIDE.to_string() } else { host_socket.display().to_string() };
    let env = env_for(run, &spec, &token, &socket);
    let workdir = spec.workdir.display().to_string();
    let flow = Flow::of(run.extra.as_ref());
    let request = context::request(context::RequestParts {
        run,
        session_id: &session.session_id,
        system: system_for(run, flow.as_ref()),
        attachments: flow.as_ref().and_then(Flow::spawn).and_then(|s| s.attachments.as_ref()),
        messages,
        resume,
        workdir: &workdir,
        socket: &socket,
        timeout_ms: spec.timeout.as_millis() as u64,
    });
    let exe = if sandboxed { sandbox::BIN_INSIDE.to_string() } else { rt.runner.exe.display().to_string() };
    let (argv, input, _mcp_config) = match agent_input(&spec, run, &session.session_id, request, &env, &exe) {
        Ok(parts) => parts,
        Err(e) => return fail(e),
    };
    let store_for_spawn = store.clone();
    let run_id = run.run_id.clone();
    let on_spawn = |pid: i32| {
        rt.agent_started(&run_id);
        let start = crate::engine::scheduler::process_start_time(i64::from(pid));
        let _ = store_for_spawn.set_supervisor(&run_id, i64::from(pid), start);
    };
    let launch = if sandboxed {
        let jail = sandbox::Jail {
            network_host: spec.network_host,
            workspace,
            workspace_rw: spec.workspace_rw,
            workdir: spec.workdir.clone(),
            socket: host_socket,
            exe: rt.runner.exe.clone(),
        };
        let (program, args) = jail.argv(&spec.command, &argv, &env);
        Launch { run_id: run.run_id.clone(), program, args, env, workdir: spec.workdir.clone(), uid_gid: None }
    } else {
        let workdir = spec.workdir.clone();
        Launch { run_id: run.run_id.clone(), program: spec.command.clone(), args: argv, env, workdir, uid_gid: None }
    };
    let on_usage = |usage: &Value| meter.on_usage(usage);
    let on_waiting = |waiting: bool| meter.on_waiting(waiting);
    let hooks = Hooks {
        on_spawn: &on_spawn,
        on_delta,
        on_input: Some(&asks),
        on_usage: Some(&on_usage),
        on_waiting: Some(&on_waiting),
    };
    if !rt.is_active(&run.run_id) {
        // Its node gave up on it while it was starting (and recorded its end): no agent for it.
        return Err(StoreError::NotRunning { run_id: run.run_id.clone(), status: "interrupted".into() });
    }
    let outcome = rt.runner.execute(&spec, &launch, &input, cancel, &hooks, Some(steers)).await;
    record(rt, run, outcome, &meter, totals_before.as_ref()).await
}

/// What a remote turn is driven by and reports to.
struct RemoteEnds<'a> {
    cancel: CancellationToken,
    on_delta: &'a (dyn Fn(&str) + Send + Sync),
    steers: tokio::sync::mpsc::UnboundedReceiver<crate::runner::Steer>,
    asks: tokio::sync::mpsc::UnboundedSender<crate::runner::InputRequest>,
}

/// A run that was left running when this server stopped: its remote task goes on, and the next
/// owner follows it ([`crate::store::Orphan::resumed`]).
pub const HANDED_OVER: &str = "handed over: its remote task goes on and the next owner follows it";

/// One turn of a remote agent (`runner.kind: "a2a"`): an A2A task instead of a process. The
/// task's id is stored as soon as it is known; a run that has one (recovery took it over) only
/// follows it.
async fn remote_turn(
    rt: &Arc<Scheduler>,
    run: &RunRow,
    session: &SessionRow,
    spec: &RunnerSpec,
    remote: &crate::config::remote::RemoteAgent,
    ends: RemoteEnds<'_>,
) -> Result<TurnResult, StoreError> {
    let meter = match RunMeter::open(rt, &run.run_id, session, None)? {
        Ok(meter) => meter,
        Err(exhausted) => {
            rt.store.finish_run(
                &run.run_id,
                rt.owner_id.as_str(),
                &Finished::without_output(RunStatus::BudgetExceeded, exhausted.clone()),
            )?;
            return Ok(TurnResult { status: RunStatus::BudgetExceeded, reply: None, silent: false });
        }
    };
    // No process to wait for: the turn has started once it calls the peer.
    rt.agent_started(&run.run_id);
    let on_task = |task: &str| {
        if let Err(e) = rt.store.set_remote_task(&run.run_id, task) {
            tracing::error!(run = %run.run_id, task, error = %e, "cannot record the remote task: a restart would interrupt this run");
        }
    };
    let on_usage = |usage: &Value| meter.on_usage(usage);
    let on_waiting = |waiting: bool| meter.on_waiting(waiting);
    let hooks = Hooks {
        on_spawn: &|_| {},
        on_delta: ends.on_delta,
        on_input: Some(&ends.asks),
        on_usage: Some(&on_usage),
        on_waiting: Some(&on_waiting),
    };
    let turn = crate::runner::a2a::RemoteTurn {
        agent: remote,
        run_id: &run.run_id,
        text: crate::runner::protocol::content_text(run.input.get("content").unwrap_or(&Value::Null)),
        context_id: session.external_session_id.clone(),
        started_task: run.remote_task_id.clone(),
        timeout: spec.timeout,
        cancel_grace: spec.cancel_grace,
        max_output_bytes: spec.max_stdout_bytes,
        hand_over: &|| rt.shutting_down(),
    };
    let outcome = crate::runner::a2a::execute(turn, ends.cancel, &hooks, &on_task, Some(ends.steers)).await;
    if outcome.status == RunStatus::Interrupted {
        return Err(StoreError::NotRunning { run_id: run.run_id.clone(), status: HANDED_OVER.into() });
    }
    record(rt, run, outcome, &meter, None).await
}

/// Commits a turn's outcome: its status under the budget's and the runtime's say, its messages
/// and usage.
async fn record(
    rt: &Arc<Scheduler>,
    run: &RunRow,
    outcome: crate::runner::Outcome,
    meter: &RunMeter,
    totals_before: Option<&Value>,
) -> Result<TurnResult, StoreError> {
    let store = &rt.store;
    crate::engine::steer::settled_for(rt, &run.run_id).await;
    let (status, error) = match outcome.status {
        RunStatus::Cancelled if rt.shutting_down() => (RunStatus::Interrupted, outcome.error),
        RunStatus::Cancelled if rt.was_fenced(&run.run_id) => (RunStatus::Interrupted, Some(rt.fenced_why())),
        s => meter.outcome(s, outcome.error),
    };
    let mut usage = outcome.usage;
    let cli_usage_total = usage
        .as_mut()
        .filter(|u| u.get("cumulative") == Some(&Value::Bool(true)))
        .map(|total| turn_usage(total, totals_before));
    let silent = outcome.reply.as_deref().is_some_and(is_skip);
    let mut messages = outcome.messages;
    for m in &mut messages {
        m.chain_id = run.chain_id.clone();
        m.model = m.model.clone().or(outcome.model.clone());
        if m.role == "assistant" && is_skip(&crate::runner::protocol::content_text(&m.content)) {
            m.silent = true;
        }
    }
    if let (Some(last), Some(usage)) = (messages.iter_mut().rev().find(|m| m.role == "assistant"), &usage) {
        last.usage = Some(usage.clone());
        last.stop_reason = outcome.stop_reason.clone();
    }
    let finished = Finished {
        status,
        reply: outcome.reply.clone(),
        messages,
        cost: usage.as_ref().and_then(|u| u.get("costUsd")).and_then(Value::as_f64),
        usage,
        model: outcome.model,
        error,
        exit_status: outcome.exit_status,
        external_session_id: outcome.external_session_id,
        cli_usage_total,
    };
    store.finish_run(&run.run_id, rt.owner_id.as_str(), &finished)?;
    Ok(TurnResult { status, reply: outcome.reply, silent })
}

/// Turns a CLI's running usage totals into this turn's usage, in place, and returns the totals.
/// `before` is what the CLI session's previous turn reported (none for a new CLI session).
pub(super) fn turn_usage(usage: &mut Value, before: Option<&Value>) -> Value {
    let obj = usage.as_object_mut().expect("a usage event is an object");
    obj.remove("cumulative");
    let total = Value::Object(obj.clone());
    for field in ["inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens"] {
        let count = |v: &Value| v.get(field).and_then(Value::as_i64).unwrap_or(0);
        let earlier = before.map_or(0, count);
        obj.insert(field.into(), (count(&total) - earlier).max(0).into());
    }
    total
}

#[cfg(test)]
mod tests {
    use super::turn_usage;
    use serde_json::json;

    #[test]
    fn a_resumed_turn_counts_its_own_tokens_from_a_clis_running_totals() {
        let mut usage = json!({"type": "usage", "inputTokens": 126, "outputTokens": 21, "cacheReadTokens": 5,
            "cacheWriteTokens": 0, "cumulative": true});
        let before = json!({"type": "usage", "inputTokens": 84, "outputTokens": 14, "cacheReadTokens": 9,
            "cacheWriteTokens": 0});
        let total = turn_usage(&mut usage, Some(&before));
        assert_eq!(
            usage,
            json!({"type": "usage", "inputTokens": 42, "outputTokens": 7, "cacheReadTokens": 0,
            "cacheWriteTokens": 0}),
            "a total below the previous one (a new thread) counts 0, never less"
        );
        assert_eq!(total["inputTokens"], 126, "the totals are kept for the next turn");
        let mut first = json!({"inputTokens": 42, "outputTokens": 7, "cumulative": true});
        turn_usage(&mut first, None);
        assert_eq!(first["inputTokens"], 42, "a new CLI session's first turn is its total");
    }
}
