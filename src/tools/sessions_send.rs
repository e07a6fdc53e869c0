//! `sessions_send`: send a message into another session and (optionally) wait for its reply.
//!
//! This build registers the tool with its full schema and validates its arguments; delivering
//! the message needs the agent runner, which has not landed yet, so a valid call answers
//! `{status: "error", error: "not available yet: …"}` and changes nothing.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use super::args::Bounds;
use super::{Ctx, Output, ToolError, ToolSpec};
use crate::policy::ToolName;

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
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SendOk {
    pub status: SendStatus,
    pub run_id: String,
    pub session_key: String,
    /// The target's final reply (ok only); null when it answered with a skip token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub silent: Option<bool>,
    /// The delivery as the ledger records it: {status, mode}.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Value>,
    /// With timeout: the run goes on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How to get the reply later.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// For external callers: where replies land ({sessionKey, afterSeq}).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inbox: Option<Value>,
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

pub async fn run(ctx: &Ctx<'_>, args: Option<Map<String, Value>>) -> Output<SendOk> {
    send(ctx, args).into()
}

fn send(ctx: &Ctx, args: Option<Map<String, Value>>) -> Result<SendOk, ToolError> {
    let mut a = super::reader(ToolName::SessionsSend, args)?;
    let session_key = a.opt_key("sessionKey", 4096)?;
    let label = a.opt_string("label", 256)?;
    let agent_id = a.opt_string("agentId", 128)?;
    let message = a.req_string("message", MAX_MESSAGE_BYTES)?;
    let _timeout = a.opt_number("timeoutSeconds", Bounds { min: 0, max: MAX_TIMEOUT_SECONDS })?;
    let _idempotency = a.opt_string("idempotencyKey", 256)?;
    a.finish()?;
    match (&session_key, &label) {
        (None, None) => return Err(ToolError::invalid("sessionKey or label required")),
        (Some(_), Some(_)) => return Err(ToolError::invalid("give sessionKey or label, not both")),
        _ => {}
    }
    if let Some(id) = &agent_id {
        crate::keys::AgentId::parse(id).map_err(|e| ToolError::invalid(format!("agentId: {e}")))?;
        if label.is_none() {
            return Err(ToolError::invalid("agentId is only used with label"));
        }
    }
    if let Some(raw) = &session_key {
        ctx.access.parse_ref(ctx.caller, "sessionKey", raw)?;
    }
    debug_assert!(!message.is_empty());
    ctx.access.check_can_act(ctx.caller)?;
    Err(ToolError::error(
        "not available yet: sessions_send needs the agent runner, which this version of sessions-mcp does not include; nothing was sent",
    ))
}
