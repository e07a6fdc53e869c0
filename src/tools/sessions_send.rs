//! `sessions_send`: send a message into another session and (optionally) wait for its reply.
//!
//! Checks in the documented order (DESIGN §5.3): parse and canonicalise → visibility → existence
//! → idempotency replay → send policy → loop guard → deadlock guard → enqueue. The reply-back,
//! announce step and deliveries happen in the runtime after the run, for late replies too.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::args::Bounds;
use super::{Ctx, Output, ToolError, ToolSpec};
use crate::access::caller::Caller;
use crate::access::{Access, Target};
use crate::engine::context::is_skip;
use crate::engine::scheduler::Waited;
use crate::engine::send::{SendPlan, Started};
use crate::policy::{Action, ToolName};
use crate::store::{RunRow, RunStatus};

pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 30;
pub const MAX_TIMEOUT_SECONDS: u64 = 600;

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub struct Params {
    /// The target session's key (or sessionId). Give this or `label`.
    session_key: Option<String>,
    /// The target session's label (visible sessions only). Give this or `sessionKey`.
    label: Option<String>,
    /// With `label`: the agent whose sessions to search.
    agent_id: Option<String>,
    /// The message (non-empty, at most 64 KiB).
    message: String,
    /// Seconds to wait for the reply (default 30, 0 = fire-and-forget, at most 600).
    #[schemars(range(min = 0))]
    timeout_seconds: Option<f64>,
    /// Pass the same key again to re-attach to the same run instead of sending twice (kept 24 h).
    idempotency_key: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SendStatus {
    Accepted,
    Ok,
    Timeout,
    /// The run failed (isError: true).
    Error,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SendOk {
    pub status: SendStatus,
    /// The run in the target (absent for a send to an external session's inbox).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    pub session_key: String,
    /// The target's final reply (ok only); null when it answered with a skip token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub silent: Option<bool>,
    /// The delivery as the ledger records it: {status, mode}.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub delivery: Option<Value>,
    /// With timeout or error: what happened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How to get the reply later.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// For external callers: where replies land ({sessionKey, afterSeq}).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub inbox: Option<Value>,
    /// The reply was cut to fit the answer budget: read it whole with sessions_history
    /// {sessionKey, seq: replySeq}.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_seq: Option<i64>,
}

impl SendOk {
    fn new(status: SendStatus, run_id: Option<String>, session_key: String) -> Self {
        SendOk {
            status,
            run_id,
            session_key,
            reply: None,
            silent: None,
            delivery: None,
            error: None,
            note: None,
            inbox: None,
            reply_seq: None,
        }
    }

    /// Cuts the reply or the error so the answer fits `budget`; a cut reply says where it is whole.
    fn fit(mut self, store: &crate::store::Store, session: &crate::keys::SessionKey, budget: usize) -> Self {
        if super::fit_text_field(&mut self, |a| a.reply.as_mut().and_then(Option::as_mut), budget) {
            self.reply_seq = self.run_id.as_deref().and_then(|run| store.reply_seq(session, run).ok().flatten());
        }
        super::fit_text_field(&mut self, |a| a.error.as_mut(), budget);
        self
    }
}

/// The final result of a send that ran as an MCP task: what a wait that saw the run end answers.
pub fn task_result(access: &Access, caller: &Caller, run: &RunRow) -> SendOk {
    let base = SendOk::new(SendStatus::Ok, Some(run.run_id.clone()), access.scope(caller).display(&run.session_key));
    finished(base, run, access.store.delivery_of(&run.run_id).ok().flatten()).fit(
        &access.store,
        &run.session_key,
        access.config.tools.sessions.max_result_bytes,
    )
}

pub fn spec() -> ToolSpec {
    ToolSpec::of::<Params, SendOk>(
        ToolName::SessionsSend,
        "Session Send",
        "Send a message into another session (by sessionKey or label) and wait up to \
         timeoutSeconds for its reply (0 = do not wait). Replies that come later arrive in your own \
         session: read them with sessions_history {sessionKey: \"main\", afterSeq: N}. Pass an \
         idempotencyKey when you may need to call again after a lost connection. When you are \
         asked to reply back and have nothing to add, answer exactly REPLY_SKIP.",
        false,
    )
}

/// Validated arguments.
struct Args {
    session_key: Option<String>,
    label: Option<String>,
    agent_id: Option<crate::keys::AgentId>,
    message: String,
    timeout: u64,
    idempotency_key: Option<String>,
}

fn parse(ctx: &Ctx, args: Option<Map<String, Value>>) -> Result<Args, ToolError> {
    let mut a = super::reader(ToolName::SessionsSend, args)?;
    let session_key = a.opt_key("sessionKey", 4096)?;
    let label = a.opt_string("label", 256)?;
    let agent_id = a.opt_string("agentId", 128)?;
    let message = a.req_string("message", MAX_MESSAGE_BYTES)?;
    let timeout =
        a.opt_number("timeoutSeconds", Bounds { min: 0, max: MAX_TIMEOUT_SECONDS })?.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    let idempotency_key = a.opt_string("idempotencyKey", 256)?;
    a.finish()?;
    match (&session_key, &label) {
        (None, None) => return Err(ToolError::invalid("sessionKey or label required")),
        (Some(_), Some(_)) => return Err(ToolError::invalid("give sessionKey or label, not both")),
        _ => {}
    }
    let agent_id = match agent_id {
        Some(id) if label.is_none() => {
            let _ = id;
            return Err(ToolError::invalid("agentId is only used with label"));
        }
        Some(id) => Some(crate::keys::AgentId::parse(&id).map_err(|e| ToolError::invalid(format!("agentId: {e}")))?),
        None => None,
    };
    if let Some(raw) = &session_key {
        ctx.access.parse_ref(ctx.caller, "sessionKey", raw)?;
    }
    Ok(Args { session_key, label, agent_id, message, timeout, idempotency_key })
}

pub async fn run(ctx: &Ctx<'_>, args: Option<Map<String, Value>>) -> Output<SendOk> {
    send(ctx, args).await.into()
}

async fn send(ctx: &Ctx<'_>, args: Option<Map<String, Value>>) -> Result<SendOk, ToolError> {
    let args = parse(ctx, args)?;
    let access = ctx.access;
    let caller = ctx.caller;
    let target: Target = match (&args.session_key, &args.label) {
        (Some(raw), _) => access.resolve(caller, Action::Send, "sessionKey", raw)?,
        (_, Some(label)) => access.resolve_label(caller, label, args.agent_id.as_ref())?,
        _ => unreachable!("parse requires one"),
    };
    access.check_can_act(caller)?;
    let inbox_after = if caller.external { Some(access.store.last_seq_of(&caller.key)?) } else { None };
    let args_hash = args_hash(&target, &args.message);
    if let Some(key) = &args.idempotency_key
        && let Some(hit) = access.store.idempotency(caller.key.as_str(), key)?
    {
        if hit.args_hash != args_hash {
            return Err(ToolError::invalid(format!(
                "idempotencyKey {key:?} reused with different arguments; use a new key for a new message"
            )));
        }
        let replay = Replay {
            run_id: hit.run_id,
            inbox: hit.result.and_then(|r| r.get("inbox").and_then(Value::as_bool)).unwrap_or(false),
        };
        return finish(ctx, runtime(ctx)?, &target, &args, replay, inbox_after).await;
    }
    let decision = access.send_decision(&target.key, target.row.as_ref());
    if !decision.allowed() {
        return Err(ToolError::forbidden(decision.refusal(access.config.session.send_policy.as_ref())));
    }
    let (chain_id, hop) = match &caller.run {
        Some(run) => (run.chain_id.clone().unwrap_or_else(|| run.run_id.clone()), run.hop + 1),
        None => (uuid::Uuid::new_v4().to_string(), 0),
    };
    let a2a = &access.config.session.agent_to_agent;
    if hop > i64::from(a2a.max_hops) {
        return Err(ToolError::forbidden(format!(
            "chain limit reached: maxHops={} (session.agentToAgent.maxHops)",
            a2a.max_hops
        )));
    }
    if caller.run.is_some() && access.store.chain_messages(&chain_id)? >= i64::from(a2a.max_chain_messages) {
        return Err(ToolError::forbidden(format!(
            "chain limit reached: maxChainMessages={} (session.agentToAgent.maxChainMessages)",
            a2a.max_chain_messages
        )));
    }
    let target_external = target.row.as_ref().is_some_and(|r| r.external);
    if args.timeout > 0 && !target_external {
        check_deadlock(ctx, &target)?;
    }
    let rt = runtime(ctx)?;
    if !target_external {
        let agent = target.key.agent_id(&access.config.default_agent());
        crate::runner::resolve_runner(&access.config, &agent, &rt.state_dir, &rt.runner.exe)
            .map_err(ToolError::invalid)?;
    }
    let plan = SendPlan {
        caller,
        caller_channel: caller_channel(ctx),
        target: &target.key,
        target_channel: crate::engine::channel_of_row(&target.key, target.row.as_ref(), rt),
        target_external,
        message: &args.message,
        chain_id,
        hop,
        max_turns: a2a.max_ping_pong_turns,
        idempotency: args.idempotency_key.as_deref().map(|k| (k, args_hash.as_str())),
    };
    let started = crate::engine::send::start(&access.store, &access.config, &plan)?;
    rt.wake();
    let replay = match started {
        Started::Run { run_id } => Replay { run_id: Some(run_id), inbox: false },
        Started::Inbox => Replay { run_id: None, inbox: true },
    };
    finish(ctx, rt, &target, &args, replay, inbox_after).await
}

/// The runtime, needed only from the first step that starts or waits for a run: every refusal
/// before it (visibility, existence, policy, guards) is the same for an in-process caller.
fn runtime<'a>(ctx: &Ctx<'a>) -> Result<&'a std::sync::Arc<crate::engine::scheduler::Runtime>, ToolError> {
    ctx.runtime
        .ok_or_else(|| ToolError::error("sessions_send needs the runtime, which this server was started without"))
}

/// The run a call attaches to (a new one, or the first one for a replayed idempotency key).
struct Replay {
    run_id: Option<String>,
    inbox: bool,
}

fn caller_channel(ctx: &Ctx) -> String {
    if ctx.caller.external {
        return "webchat".into();
    }
    let row = ctx.access.store.session_by_key(&ctx.caller.key).ok().flatten();
    ctx.runtime.map_or_else(|| "unknown".into(), |rt| crate::engine::channel_of_row(&ctx.caller.key, row.as_ref(), rt))
}

/// A wait is refused at once when it would close a cycle (DESIGN §7.1).
fn check_deadlock(ctx: &Ctx, target: &Target) -> Result<(), ToolError> {
    let Some(run) = &ctx.caller.run else { return Ok(()) };
    let refuse = || {
        ToolError::invalid(format!(
            "would deadlock: {} cannot answer while run {} waits on it; send with timeoutSeconds: 0",
            target.display, run.run_id
        ))
    };
    if target.key == ctx.caller.key {
        return Err(refuse());
    }
    let store = &ctx.access.store;
    let (Some(caller_row), Some(target_row)) = (store.session_by_key(&ctx.caller.key)?, target.row.as_ref()) else {
        return Ok(());
    };
    if store.wait_would_deadlock(caller_row.id, target_row.id)? { Err(refuse()) } else { Ok(()) }
}

fn args_hash(target: &Target, message: &str) -> String {
    hex::encode(Sha256::digest(format!("{}\u{0}{message}", target.key).as_bytes()))
}

/// Waits (if asked) and shapes the answer.
async fn finish(
    ctx: &Ctx<'_>,
    rt: &std::sync::Arc<crate::engine::scheduler::Runtime>,
    target: &Target,
    args: &Args,
    replay: Replay,
    inbox_after: Option<i64>,
) -> Result<SendOk, ToolError> {
    let inbox = inbox_after
        .map(|seq| json!({"sessionKey": ctx.access.scope(ctx.caller).display(&ctx.caller.key), "afterSeq": seq}));
    let base = |status, run_id: Option<String>| SendOk {
        inbox: inbox.clone(),
        ..SendOk::new(status, run_id, target.display.clone())
    };
    let Some(run_id) = replay.run_id.filter(|_| !replay.inbox) else {
        let mut ok = base(SendStatus::Accepted, None);
        ok.delivery = Some(json!({"status": "delivered", "mode": "inbox"}));
        ok.note = Some(format!(
            "{} is an external session (an MCP client, not an agent this server runs): the message was appended to its session; no reply will come from this send.",
            target.display
        ));
        return Ok(ok);
    };
    let delivery = || ctx.access.store.delivery_of(&run_id).ok().flatten();
    let later = later_note(ctx, target);
    if args.timeout == 0 {
        let mut ok = base(SendStatus::Accepted, Some(run_id.clone()));
        ok.delivery = delivery();
        ok.note = Some(later);
        return Ok(ok);
    }
    if let Some(own) = &ctx.caller.run {
        let _ = ctx.access.store.set_waiting(&own.run_id, Some(&run_id));
    }
    let forward = forward_progress(ctx, rt, &run_id);
    let waited = rt.wait(&run_id, Duration::from_secs(args.timeout), &ctx.cancel).await;
    forward.abort();
    if let Some(own) = &ctx.caller.run {
        let _ = ctx.access.store.set_waiting(&own.run_id, None);
    }
    match waited? {
        Waited::Finished(run) => Ok(finished(base(SendStatus::Ok, Some(run_id.clone())), &run, delivery()).fit(
            &ctx.access.store,
            &run.session_key,
            ctx.access.config.tools.sessions.max_result_bytes,
        )),
        Waited::TimedOut => {
            let mut t = base(SendStatus::Timeout, Some(run_id.clone()));
            t.error = Some(format!("timed out waiting {}s for the reply; the run goes on", args.timeout));
            t.note = Some(later);
            t.delivery = delivery();
            Ok(t)
        }
        Waited::Cancelled => {
            let mut t = base(SendStatus::Timeout, Some(run_id.clone()));
            t.error = Some("the wait was cancelled by the client; the run goes on".into());
            t.note = Some(later);
            Ok(t)
        }
    }
}

fn finished(mut out: SendOk, run: &RunRow, delivery: Option<Value>) -> SendOk {
    out.delivery = delivery;
    if run.status == RunStatus::Ok {
        let silent = run.reply.as_deref().is_some_and(is_skip);
        out.reply = Some(if silent { None } else { crate::sanitize::run_text(run.reply.as_deref()) });
        if silent {
            out.silent = Some(true);
        }
    } else {
        out.status = SendStatus::Error;
        out.error = Some(match run.status {
            RunStatus::Interrupted => "interrupted: the run was interrupted before it finished".to_string(),
            s => crate::sanitize::run_text(run.error.as_deref()).unwrap_or_else(|| format!("the run ended {s}")),
        });
    }
    out
}

/// How a caller gets a reply that comes after the call returned.
fn later_note(ctx: &Ctx, target: &Target) -> String {
    if ctx.caller.external {
        let me = ctx.access.scope(ctx.caller).display(&ctx.caller.key);
        format!(
            "The reply of {} will be appended to your session {me}; read it with sessions_history {{sessionKey: \"{me}\", afterSeq: <inbox.afterSeq>}}.",
            target.display
        )
    } else {
        "The reply will come back to your session as a reply step; do not poll.".to_string()
    }
}

/// Forwards the run's streamed text as MCP progress while the caller waits (this process only).
/// The run may not be claimed yet: subscribe as soon as it is.
fn forward_progress(
    ctx: &Ctx,
    rt: &std::sync::Arc<crate::engine::scheduler::Runtime>,
    run_id: &str,
) -> tokio::task::JoinHandle<()> {
    let Some(progress) = ctx.progress.clone() else {
        return tokio::spawn(async {});
    };
    let (rt, run_id) = (rt.clone(), run_id.to_string());
    tokio::spawn(async move {
        let mut pause = Duration::from_millis(10);
        let mut rx = loop {
            if let Some(rx) = rt.subscribe(&run_id) {
                break rx;
            }
            if rt.access.store.run(&run_id).ok().flatten().is_none_or(|r| r.is_finished()) {
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        };
        let mut n = 0.0;
        while let Ok(text) = rx.recv().await {
            n += 1.0;
            progress(n, text);
        }
    })
}
