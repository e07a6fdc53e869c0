//! `sessions_send`: send a message into another session and (optionally) wait for its reply.
//!
//! The tool parses and canonicalises, asks access (visibility, then existence; may the caller
//! act), and hands the rest to the engine (`engine::send`: idempotency replay, send policy, chain
//! limits, deadlock guard, enqueue, the wait); it shapes what the send came to.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::args::Bounds;
use super::{Ctx, Output, ToolError, ToolSpec};
use crate::access::caller::Caller;
use crate::access::{Access, RunRow, RunStatus, Target};
use crate::engine::context::is_skip;
use crate::engine::send::{SendOutcome, SendRequest};
use crate::policy::{Action, ToolName};

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
    fn fit(mut self, access: &Access, session: &crate::keys::SessionKey, budget: usize) -> Self {
        if super::fit_text_field(&mut self, |a| a.reply.as_mut().and_then(Option::as_mut), budget) {
            self.reply_seq = self.run_id.as_deref().and_then(|run| access.reply_seq(session, run));
        }
        super::fit_text_field(&mut self, |a| a.error.as_mut(), budget);
        self
    }
}

/// The final result of a send that ran as an MCP task: what a wait that saw the run end answers.
pub fn task_result(access: &Access, caller: &Caller, run: &RunRow) -> SendOk {
    let base = SendOk::new(SendStatus::Ok, Some(run.run_id.clone()), access.scope(caller).display(&run.session_key));
    finished(base, run, access.delivery_of(&run.run_id)).fit(
        access,
        &run.session_key,
        access.config().tools.sessions.max_result_bytes,
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
    /// The target as parsed (once) from `sessionKey`.
    session_key: Option<crate::keys::SessionRef>,
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
    let session_key = match session_key {
        Some(raw) => Some(ctx.access.parse_ref(ctx.caller, "sessionKey", &raw)?),
        None => None,
    };
    Ok(Args { session_key, label, agent_id, message, timeout, idempotency_key })
}

pub async fn run(ctx: &Ctx<'_>, args: Option<Map<String, Value>>) -> Output<SendOk> {
    send(ctx, args).await.into()
}

async fn send(ctx: &Ctx<'_>, args: Option<Map<String, Value>>) -> Result<SendOk, ToolError> {
    let args = parse(ctx, args)?;
    let (access, caller) = (ctx.access, ctx.caller);
    let target: Target = match (&args.session_key, &args.label) {
        (Some(reference), _) => access.resolve_ref(caller, Action::Send, reference.clone())?,
        (_, Some(label)) => access.resolve_label(caller, label, args.agent_id.as_ref())?,
        _ => unreachable!("parse requires one"),
    };
    let engine = ctx.engine();
    let request = SendRequest {
        target: &target,
        message: &args.message,
        timeout: args.timeout,
        idempotency_key: args.idempotency_key.as_deref(),
    };
    let started = engine.send(caller, &request)?;
    let outcome = engine.await_reply(caller, &started, args.timeout, &ctx.cancel, ctx.progress.clone()).await?;
    Ok(answer(ctx, &target, args.timeout, started.inbox_after, outcome))
}

/// Shapes what the send came to.
fn answer(ctx: &Ctx, target: &Target, timeout: u64, inbox_after: Option<i64>, outcome: SendOutcome) -> SendOk {
    let access = ctx.access;
    let inbox = inbox_after
        .map(|seq| json!({"sessionKey": access.scope(ctx.caller).display(&ctx.caller.key), "afterSeq": seq}));
    let base = |status, run_id: &str| SendOk {
        inbox: inbox.clone(),
        ..SendOk::new(status, Some(run_id.to_string()), target.display.clone())
    };
    match outcome {
        SendOutcome::Inbox => {
            let mut ok =
                SendOk { inbox: inbox.clone(), ..SendOk::new(SendStatus::Accepted, None, target.display.clone()) };
            ok.delivery = Some(json!({"status": "delivered", "mode": "inbox"}));
            ok.note = Some(format!(
                "{} is an external session (an MCP client, not an agent this server runs): the message was appended to its session; no reply will come from this send.",
                target.display
            ));
            ok
        }
        SendOutcome::Accepted { run_id } => {
            let mut ok = base(SendStatus::Accepted, &run_id);
            ok.delivery = access.delivery_of(&run_id);
            ok.note = Some(later_note(ctx, target));
            ok
        }
        SendOutcome::Finished { run } => finished(
            base(SendStatus::Ok, &run.run_id),
            &run,
            access.delivery_of(&run.run_id),
        )
        .fit(access, &run.session_key, access.config().tools.sessions.max_result_bytes),
        SendOutcome::TimedOut { run_id } => {
            let mut t = base(SendStatus::Timeout, &run_id);
            t.error = Some(format!("timed out waiting {timeout}s for the reply; the run goes on"));
            t.note = Some(later_note(ctx, target));
            t.delivery = access.delivery_of(&run_id);
            t
        }
        SendOutcome::Cancelled { run_id } => {
            let mut t = base(SendStatus::Timeout, &run_id);
            t.error = Some("the wait was cancelled by the client; the run goes on".into());
            t.note = Some(later_note(ctx, target));
            t
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
