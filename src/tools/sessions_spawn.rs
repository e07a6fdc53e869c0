//! `sessions_spawn`: start a sub-agent run in an isolated child session; its result is announced
//! back to the requester.
//!
//! This build registers the tool with its full schema and validates its arguments; running a
//! child needs the agent runner, which has not landed yet, so a valid call answers
//! `{status: "error", error: "not available yet: …"}` and creates nothing.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use super::args::Bounds;
use super::{Ctx, Output, ToolError, ToolSpec};
use crate::policy::ToolName;

pub const MAX_TASK_BYTES: usize = 64 * 1024;
pub const MAX_ATTACHMENTS: usize = 50;
/// Channel-delivery keys the reference rejects on spawn; they belong to sessions_send.
const DELIVERY_KEYS: [&str; 5] = ["target", "channel", "to", "threadId", "replyTo"];

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub struct Params {
    /// What the sub-agent should do (required).
    task: String,
    /// A label for the child session (at most 64 characters; not unique).
    label: Option<String>,
    /// The agent to run the child (default: your own); see agents_list.
    agent_id: Option<String>,
    /// Model for the child (the agent's allowlist, or a plain model name).
    model: Option<String>,
    /// off | minimal | low | medium | high | xhigh | adaptive.
    thinking: Option<String>,
    /// Kill the child's run after this many seconds (can only lower the operator's cap).
    #[schemars(range(min = 0))]
    run_timeout_seconds: Option<f64>,
    /// Bind the child to a thread: not available in this version (always invalid).
    thread: Option<bool>,
    /// run (default) | session (needs thread=true, so unavailable in this version).
    mode: Option<SpawnMode>,
    /// delete | keep (default keep): what happens to the child session after its announce.
    cleanup: Option<Cleanup>,
    /// inherit (default) | require: require a sandboxed child.
    sandbox: Option<SandboxReq>,
    /// Files for the child (off unless tools.sessions_spawn.attachments.enabled).
    attachments: Option<Vec<Attachment>>,
    /// Where the child should look for attachments (a hint only).
    attach_as: Option<AttachAs>,
    /// Pass the same key again to get the first spawn's answer instead of a second child.
    idempotency_key: Option<String>,
}

#[derive(JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum SpawnMode {
    Run,
    Session,
}

#[derive(JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum Cleanup {
    Delete,
    Keep,
}

#[derive(JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum SandboxReq {
    Inherit,
    Require,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub struct Attachment {
    name: String,
    content: String,
    /// utf8 (default) | base64.
    encoding: Option<String>,
    mime_type: Option<String>,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub struct AttachAs {
    mount_path: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SpawnStatus {
    Accepted,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpawnOk {
    pub status: SpawnStatus,
    pub run_id: String,
    pub child_session_key: String,
    pub mode: String,
    /// The child waits for a free slot (agents.defaults.subagents.maxConcurrent).
    pub queued: bool,
    /// How the completion reaches you.
    pub note: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inbox: Option<Value>,
    /// Receipts of the written files: {count, totalBytes, files: [{name, bytes, sha256}], relDir}.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attachments: Option<Value>,
}

pub fn spec() -> ToolSpec {
    ToolSpec::of::<Params, SpawnOk>(
        ToolName::SessionsSpawn,
        "Spawn Sub-agent",
        "Start a sub-agent run in a new, isolated child session. Never blocks: the result \
         (Status/Result/Notes) is announced back to your session when the child finishes. \
         thread=true and mode=\"session\" are not available in this version. Pass an \
         idempotencyKey when you may need to call again after a lost connection.",
        false,
    )
}

pub async fn run(ctx: &Ctx<'_>, args: Option<Map<String, Value>>) -> Output<SpawnOk> {
    match spawn(ctx, args) {
        Ok(ok) => Output::Ok(ok),
        Err(e) => Output::Err(e),
    }
}

fn spawn(ctx: &Ctx, args: Option<Map<String, Value>>) -> Result<SpawnOk, ToolError> {
    if let Some(key) = args.as_ref().and_then(|a| DELIVERY_KEYS.iter().find(|k| a.contains_key(**k))) {
        return Err(ToolError::invalid(format!(
            "{key} is a channel-delivery argument; sessions_spawn does not deliver to channels (use sessions_send)"
        )));
    }
    let mut a = super::reader(ToolName::SessionsSpawn, args)?;
    a.req_string("task", MAX_TASK_BYTES)?;
    a.opt_string("label", 64)?;
    if let Some(id) = a.opt_string("agentId", 128)? {
        crate::keys::AgentId::parse(&id).map_err(|e| ToolError::invalid(format!("agentId: {e}")))?;
    }
    a.opt_string("model", 128)?;
    a.opt_string("thinking", 32)?;
    a.opt_number("runTimeoutSeconds", Bounds { min: 0, max: u32::MAX as u64 })?;
    if a.opt_bool("thread")? == Some(true) {
        return Err(ToolError::invalid(
            "thread=true needs a deliverer for the requester's channel that declares thread support (channels.<ch>.threads: true)",
        ));
    }
    for field in ["mode", "cleanup", "sandbox"] {
        a.opt_string(field, 32)?;
    }
    if let Some(list) = a.opt_value("attachments") {
        if !list.is_array() {
            return Err(ToolError::invalid("attachments must be a list of {name, content, encoding?, mimeType?}"));
        }
        if list.as_array().is_some_and(|l| l.len() > MAX_ATTACHMENTS) {
            return Err(ToolError::invalid(format!("attachments: at most {MAX_ATTACHMENTS} files")));
        }
    }
    a.opt_value("attachAs");
    a.opt_string("idempotencyKey", 256)?;
    a.finish()?;
    ctx.access.check_can_act(ctx.caller)?;
    Err(ToolError::error(
        "not available yet: sessions_spawn needs the agent runner, which this version of sessions-mcp does not include; nothing was created",
    ))
}
