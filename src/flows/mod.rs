//! Flows: what happens around runs. `run_turn` executes one claimed run and commits its outcome;
//! `after_run` takes the next step of its flow (DESIGN §7.2): the reply to an external requester's
//! inbox, the reply-back ping-pong between driven sessions, the announce step and its delivery to
//! the target's channel. Steps are queued runs: nothing blocks inside a run, and late replies get
//! the same steps as prompt ones (**Fix**). Every cross-session effect is a ledger row.
//!
//! The steps of a run are recorded as taken (`take_steps`) and are idempotent, so an owner that dies
//! between recording a run's end and taking its steps loses nothing: the next owner `catch_up`s.

pub mod attachments;
pub mod context;
mod deliver;
pub mod inject;
pub mod send;
pub mod spawn;

use std::sync::Arc;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::caller::{configured_sandbox, key_scope, sha256_hex};
use crate::config::RunnerKind;
use crate::keys::{self, SessionKey};
use crate::runner::mcp_config::{McpConfigFile, codex_overrides};
use crate::runner::template::CliTurn;
use crate::runner::{Hooks, Input, Launch, RunStatus, RunnerSpec, resolve_runner, sandbox};
use crate::runtime::Runtime;
use crate::store::{
    AnnounceKind, DeliveryKind, DeliveryMode, DeliveryStatus, Finished, NewDelivery, NewMessage, NewRun, RunMode,
    RunRow, SessionRow, StoreError, TokenRow, add_delivery, append_message, enqueue, set_delivery_status,
};
use context::{ANNOUNCE_INPUT, Parties, is_skip};

pub use deliver::deliver_due;

/// How a turn ended, as the flows need it.
#[derive(Debug, Clone)]
pub struct TurnResult {
    pub status: RunStatus,
    pub reply: Option<String>,
    pub silent: bool,
}

impl TurnResult {
    fn ok_reply(&self) -> Option<&str> {
        (self.status == RunStatus::Ok && !self.silent)
            .then_some(self.reply.as_deref())
            .flatten()
            .filter(|r| !r.trim().is_empty())
    }
}

/// The channel of a session by the one channel rule.
pub fn channel_of_row(key: &SessionKey, row: Option<&SessionRow>, rt: &Runtime) -> String {
    let scope = key_scope(&rt.access.config, &key.agent_id(&rt.access.config.default_agent()));
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
    let workdir = spec.workdir.display().to_string();
    let home = if spec.home_inherit {
        std::env::var("HOME").unwrap_or_else(|_| workdir.clone())
    } else {
        format!("{workdir}/.sessions-home")
    };
    let mut env = vec![
        ("PATH".to_string(), std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into())),
        ("LANG".into(), "C.UTF-8".into()),
        ("LC_ALL".into(), "C.UTF-8".into()),
        ("TZ".into(), "UTC".into()),
        ("HOME".into(), home),
        ("TMPDIR".into(), format!("{workdir}/.tmp")),
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

/// The `system` text of a run, from its mode and flow state.
fn system_for(rt: &Runtime, run: &RunRow) -> Option<String> {
    let flow = run.extra.as_ref()?;
    let parties = parties_of(flow)?;
    match run.mode {
        RunMode::Send => Some(context::send_context(&parties)),
        RunMode::Reply => {
            let turn = flow.get("turn").and_then(Value::as_u64).unwrap_or(1) as u32;
            let max = flow.get("max").and_then(Value::as_u64).unwrap_or(1) as u32;
            let you_are_requester = run.session_key.as_str() == parties.requester;
            Some(context::reply_context(&parties, you_are_requester, turn, max))
        }
        RunMode::Announce => {
            let s = |k: &str| flow.get(k).and_then(Value::as_str);
            Some(context::announce_context(&parties, s("request").unwrap_or(""), s("roundOne"), s("latest")))
        }
        _ => {
            let _ = rt;
            None
        }
    }
}

fn parties_of(flow: &Value) -> Option<Parties> {
    let p = flow.get("parties")?;
    let s = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or("unknown").to_string();
    Some(Parties {
        requester: s("requester"),
        requester_channel: s("requesterChannel"),
        target: s("target"),
        target_channel: s("targetChannel"),
    })
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
        .then(|| McpConfigFile::write(&spec.workdir.join(".tmp"), &run.run_id, exe, env))
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
    rt: &Arc<Runtime>,
    run: &RunRow,
    input_seq: i64,
    cancel: CancellationToken,
    on_delta: &(dyn Fn(&str) + Send + Sync),
) -> Result<TurnResult, StoreError> {
    let store = &rt.access.store;
    let config = &rt.access.config;
    let fail = |error: String| -> Result<TurnResult, StoreError> {
        let f = Finished {
            status: RunStatus::Error,
            reply: None,
            messages: vec![],
            usage: None,
            cost: None,
            model: None,
            error: Some(error),
            exit_status: None,
            external_session_id: None,
            cli_usage_total: None,
        };
        store.finish_run(&run.run_id, &f)?;
        Ok(TurnResult { status: RunStatus::Error, reply: None, silent: false })
    };
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
    let sandboxed = session.sandboxed || configured_sandbox(config, &run.session_key);
    let workspace = spec.workdir.clone();
    if sandboxed {
        // Never unconfined: no jail, no run.
        if let Err(why) = sandbox::available() {
            return fail(format!("sandbox unavailable: {why}"));
        }
        spec.workdir = sandbox::session_workdir(&workspace, &session.session_id);
        if let Err(e) = sandbox::prepare_workdir(&workspace, &spec.workdir) {
            return fail(format!("sandbox unavailable: cannot prepare {}: {e}", spec.workdir.display()));
        }
    } else {
        for dir in [spec.workdir.clone(), spec.workdir.join(".tmp"), spec.workdir.join(".sessions-home")] {
            if let Err(e) = std::fs::create_dir_all(&dir) {
                return fail(format!("cannot create the workdir {}: {e}", dir.display()));
            }
        }
    }
    let history = store.context_before(session.id, input_seq, 2000)?;
    let messages = context::fit_context(&history, spec.context_budget_bytes);
    let resume = spec.resume(session.external_session_id.as_deref(), session.aborted_last_run == Some(true));
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
    let request = context::request(context::RequestParts {
        run,
        session_id: &session.session_id,
        system: system_for(rt, run),
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
    let on_spawn = move |pid: i32| {
        let start = crate::runtime::process_start_time(i64::from(pid));
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
    let outcome = rt.runner.execute(&spec, &launch, &input, cancel, &Hooks { on_spawn: &on_spawn, on_delta }).await;
    let status = match outcome.status {
        RunStatus::Cancelled if rt.shutting_down() => RunStatus::Interrupted,
        s => s,
    };
    let mut usage = outcome.usage;
    let cli_usage_total = match usage.as_mut().filter(|u| u.get("cumulative") == Some(&Value::Bool(true))) {
        Some(total) => {
            let before = if resume.is_some() { store.cli_usage_total(session.id)? } else { None };
            Some(turn_usage(total, before.as_ref()))
        }
        None => None,
    };
    let silent = outcome.reply.as_deref().is_some_and(is_skip);
    let mut messages = outcome.messages;
    for m in &mut messages {
        m.chain_id = run.chain_id.clone();
        m.model = m.model.clone().or(outcome.model.clone());
        if m.role == "assistant" && is_skip(&crate::agent::content_text(&m.content)) {
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
        error: outcome.error,
        exit_status: outcome.exit_status,
        external_session_id: outcome.external_session_id,
        cli_usage_total,
    };
    store.finish_run(&run.run_id, &finished)?;
    Ok(TurnResult { status, reply: outcome.reply, silent })
}

/// Turns a CLI's running usage totals into this turn's usage, in place, and returns the totals.
/// `before` is what the CLI session's previous turn reported (none for a new CLI session).
fn turn_usage(usage: &mut Value, before: Option<&Value>) -> Value {
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

/// Takes the steps after a run's end and records them as taken. Every step is idempotent (derived
/// run ids, one delivery per run and kind, final delivery statuses stay final), so taking them
/// again — after an owner died between recording the end and taking the steps — adds nothing.
pub fn take_steps(rt: &Runtime, run: &RunRow, result: &TurnResult) {
    if let Err(e) = after_run(rt, run, result).and_then(|()| rt.access.store.steps_taken(&run.run_id)) {
        tracing::error!(run = %run.run_id, error = %e, "a flow step failed; the next owner takes it again");
    }
}

/// Takes the steps of runs that ended at least `min_age_ms` ago and never got them (their owner
/// died first, or a step failed), e.g. runs that recovery just marked `interrupted`: an
/// interrupted child still announces (`Status: interrupted`).
pub fn catch_up(rt: &Runtime, min_age_ms: i64) {
    let runs = match rt.access.store.runs_with_steps_pending(min_age_ms) {
        Ok(runs) => runs,
        Err(e) => return tracing::error!(error = %e, "reading runs whose steps are pending failed"),
    };
    for run in runs {
        let silent = run.reply.as_deref().is_some_and(is_skip);
        let result = TurnResult { status: run.status, reply: run.reply.clone(), silent };
        tracing::info!(run = %run.run_id, status = %run.status, "taking the steps a dead owner left");
        take_steps(rt, &run, &result);
    }
}

/// The next step after a run ended.
fn after_run(rt: &Runtime, run: &RunRow, result: &TurnResult) -> Result<(), StoreError> {
    match run.mode {
        RunMode::Send | RunMode::Reply => reply_back(rt, run, result),
        RunMode::Announce if run.announce_kind == Some(AnnounceKind::Subagent) => {
            spawn::after_child_run(rt, run, result)
        }
        RunMode::Announce => announce_delivery(rt, run, result),
        RunMode::Spawn => spawn::after_child_run(rt, run, result),
        RunMode::Completion => {
            completion_delivery(rt, run, result).and_then(|_| spawn::after_child_run(rt, run, result))
        }
        RunMode::Inject => Ok(()),
    }
}

/// The id of the run that step `step` of run `run_id` queues: the same every time the step is
/// taken, so that taking it again queues nothing new.
pub fn step_id(run_id: &str, step: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{run_id}/{step}").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes).into_uuid().to_string()
}

/// The flow state a step carries from run to run.
fn flow_of(run: &RunRow) -> Value {
    run.extra.clone().unwrap_or_else(|| json!({}))
}

/// After a send's primary run or a reply step: hand the reply to the other side.
fn reply_back(rt: &Runtime, run: &RunRow, result: &TurnResult) -> Result<(), StoreError> {
    let store = &rt.access.store;
    let mut flow = flow_of(run);
    let Some(requester) = run.requester_key.clone() else { return Ok(()) };
    let target =
        SessionKey::from_canonical(flow.get("target").and_then(Value::as_str).unwrap_or(run.session_key.as_str()));
    let reply = result.ok_reply().map(String::from);
    let turn = flow.get("turn").and_then(Value::as_u64).unwrap_or(0);
    let max = u64::from(rt.access.config.session.agent_to_agent.max_ping_pong_turns);
    if run.mode == RunMode::Send {
        flow["roundOne"] = json!(reply);
    }
    flow["latest"] = json!(reply.clone().or(flow.get("latest").and_then(Value::as_str).map(String::from)));
    // The reply goes to the other side of the exchange: a run's requester is always the side
    // whose message was its input.
    let other = requester.clone();
    let other_row = store.session_by_key(&other)?;
    let delivery_id: Option<i64> = store.pending_delivery(&run.run_id)?;
    let Some(text) = reply else {
        if let Some(id) = delivery_id {
            let (status, why) = if result.silent {
                (DeliveryStatus::Skipped, "silent: the reply was a skip token".to_string())
            } else {
                (DeliveryStatus::Failed, format!("the run ended {}", result.status))
            };
            store.write(|tx| set_delivery_status(tx, id, status, Some(&why)).map_err(StoreError::from))?;
        }
        if result.status == RunStatus::Ok && run.session_key != requester {
            return queue_announce(rt, run, &target, &flow);
        }
        return Ok(());
    };
    let external = other_row.as_ref().is_some_and(|r| r.external);
    if other == run.session_key {
        // A send to oneself: no ping-pong, only the announce step.
        return queue_announce(rt, run, &target, &flow);
    }
    if external {
        append_inbox(rt, &other, run, &text, delivery_id)?;
        return queue_announce(rt, run, &target, &flow);
    }
    if turn >= max || !rt.access.send_decision(&other, other_row.as_ref()).allowed() {
        if let Some(id) = delivery_id {
            let why =
                if turn >= max { "ping-pong limit reached (session.agentToAgent.maxPingPongTurns)" } else { "policy" };
            store.write(|tx| {
                set_delivery_status(tx, id, DeliveryStatus::Skipped, Some(why)).map_err(StoreError::from)
            })?;
        }
        return queue_announce(rt, run, &target, &flow);
    }
    if chain_full(rt, run)? {
        return Ok(());
    }
    // The other side answers in its own session: turn k+1.
    let mut next = flow.clone();
    next["turn"] = json!(turn + 1);
    next["max"] = json!(max);
    let other_id = other_row.as_ref().map(|r| r.id).ok_or_else(|| StoreError::Corrupt(format!("{other} vanished")))?;
    let provenance = json!({"kind": "inter_session", "sourceSessionKey": run.session_key.as_str(),
        "sourceChannel": channel_of_row(&run.session_key, None, rt), "sourceTool": "sessions_send", "chainId": run.chain_id});
    let step = NewRun {
        run_id: step_id(&run.run_id, "reply"),
        session: other_id,
        mode: RunMode::Reply,
        input: json!({"role": "user", "content": text}),
        provenance: Some(provenance),
        requester_key: Some(run.session_key.clone()),
        chain_id: run.chain_id.clone(),
        hop: run.hop,
        announce_kind: None,
        model: None,
        thinking: None,
        timeout_ms: None,
        extra: Some(next),
    };
    store.write(|tx| -> Result<(), StoreError> {
        enqueue(tx, &step)?;
        if let Some(id) = delivery_id {
            set_delivery_status(tx, id, DeliveryStatus::Delivered, None)?;
        }
        add_delivery(
            tx,
            &NewDelivery {
                run_id: &step.run_id,
                kind: DeliveryKind::Reply,
                mode: DeliveryMode::Inbox,
                status: DeliveryStatus::Queued,
                target_key: run.session_key.as_str(),
                channel: None,
                last_error: None,
            },
        )?;
        Ok(())
    })?;
    rt.wake();
    Ok(())
}

/// Whether the chain has reached `session.agentToAgent.maxChainMessages` (steps stop there).
fn chain_full(rt: &Runtime, run: &RunRow) -> Result<bool, StoreError> {
    let Some(chain) = &run.chain_id else { return Ok(false) };
    let n = rt.access.store.chain_messages(chain)?;
    Ok(n >= i64::from(rt.access.config.session.agent_to_agent.max_chain_messages))
}

/// Appends `text` to an external session (its inbox) as an inter-session message, handing over
/// the run's pending reply delivery in the same transaction: once delivered, never appended again.
fn append_inbox(
    rt: &Runtime,
    to: &SessionKey,
    run: &RunRow,
    text: &str,
    delivery: Option<i64>,
) -> Result<(), StoreError> {
    let Some(delivery) = delivery else { return Ok(()) };
    let from = &run.session_key;
    let provenance = json!({"kind": "inter_session", "sourceSessionKey": from.as_str(),
        "sourceChannel": channel_of_row(from, None, rt), "sourceTool": "sessions_send", "chainId": run.chain_id});
    rt.access.store.write(|tx| -> Result<(), StoreError> {
        if !set_delivery_status(tx, delivery, DeliveryStatus::Delivered, None)? {
            return Ok(());
        }
        let id: i64 = crate::store::session_id(tx, to)?;
        append_message(
            tx,
            id,
            &NewMessage {
                role: "user".into(),
                content: json!([{"type": "text", "text": text}]),
                run_id: Some(run.run_id.clone()),
                provenance: Some(provenance),
                chain_id: run.chain_id.clone(),
                ..Default::default()
            },
        )?;
        Ok(())
    })
}

/// Queues the announce step in the target, once per exchange.
fn queue_announce(rt: &Runtime, run: &RunRow, target: &SessionKey, flow: &Value) -> Result<(), StoreError> {
    let store = &rt.access.store;
    let Some(row) = store.session_by_key(target)? else { return Ok(()) };
    if row.external || !rt.access.send_decision(target, Some(&row)).allowed() || chain_full(rt, run)? {
        return Ok(());
    }
    let requester = flow.get("requester").and_then(Value::as_str).map(SessionKey::from_canonical);
    let step = NewRun {
        run_id: step_id(&run.run_id, "announce"),
        session: row.id,
        mode: RunMode::Announce,
        input: json!({"role": "user", "content": ANNOUNCE_INPUT}),
        provenance: Some(
            json!({"kind": "inter_session", "sourceSessionKey": requester.as_ref().map(SessionKey::as_str),
            "sourceChannel": flow.pointer("/parties/requesterChannel"), "sourceTool": "sessions_send", "chainId": run.chain_id}),
        ),
        requester_key: requester,
        chain_id: run.chain_id.clone(),
        hop: run.hop,
        announce_kind: Some(AnnounceKind::AgentToAgent),
        model: None,
        thinking: None,
        timeout_ms: None,
        extra: Some(flow.clone()),
    };
    store.write(|tx| enqueue(tx, &step).map_err(StoreError::from))?;
    rt.wake();
    Ok(())
}

/// After the announce step: deliver its reply to the target's channel, unless it stays silent.
fn announce_delivery(rt: &Runtime, run: &RunRow, result: &TurnResult) -> Result<(), StoreError> {
    to_channel(rt, run, result, DeliveryKind::Announce)
}

/// After a completion run in a driven requester: its reply goes to the requester's channel.
fn completion_delivery(rt: &Runtime, run: &RunRow, result: &TurnResult) -> Result<(), StoreError> {
    to_channel(rt, run, result, DeliveryKind::Completion)
}

/// Delivers a run's reply to its session's channel, under the send policy.
fn to_channel(rt: &Runtime, run: &RunRow, result: &TurnResult, kind: DeliveryKind) -> Result<(), StoreError> {
    let row = rt.access.store.session_by_key(&run.session_key)?;
    let channel = channel_of_row(&run.session_key, row.as_ref(), rt);
    let Some(text) = result.ok_reply().map(String::from) else {
        let why = if result.silent { "silent: the reply was a skip token" } else { "the run produced no reply" };
        return deliver::record(rt, run, kind, &channel, DeliveryStatus::Skipped, Some(why), None);
    };
    let decision = rt.access.send_decision(&run.session_key, row.as_ref());
    if !decision.allowed() {
        let why = match decision.rule {
            Some(i) => format!("policy: rule {i}"),
            None => "policy".to_string(),
        };
        return deliver::record(rt, run, kind, &channel, DeliveryStatus::Skipped, Some(&why), None);
    }
    deliver::channel_delivery(rt, run, row.as_ref(), &channel, &text, kind)
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
