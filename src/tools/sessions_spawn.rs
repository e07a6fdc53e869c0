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
    spawn(ctx, args).into()
}

/// Thinking levels and the reference's aliases.
pub fn thinking_level(raw: &str) -> Option<&'static str> {
    Some(match raw.trim().to_ascii_lowercase().as_str() {
        "off" | "none" | "disabled" => "off",
        "minimal" | "min" => "minimal",
        "low" => "low",
        "medium" | "med" | "mid" => "medium",
        "high" | "max" => "high",
        "xhigh" | "x-high" | "extra-high" | "ultra" => "xhigh",
        "adaptive" | "auto" => "adaptive",
        _ => return None,
    })
}

/// A model name is substituted into argv: never an option, and only safe characters (or the
/// agent's allowlist when it has one).
pub fn check_model(model: &str, allowlist: Option<&[String]>) -> Result<(), ToolError> {
    if model.starts_with('-') {
        return Err(ToolError::invalid(format!("model {model:?} must not start with '-'")));
    }
    match allowlist {
        Some(list) if !list.iter().any(|m| m == model) => Err(ToolError::invalid(format!(
            "model {model:?} is not allowed for this agent; allowed: {}",
            list.join(", ")
        ))),
        Some(_) => Ok(()),
        None => {
            let b = model.as_bytes();
            let ok = !b.is_empty()
                && b.len() <= 128
                && b[0].is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || b"._:/@-".contains(c));
            if ok {
                Ok(())
            } else {
                Err(ToolError::invalid(format!(
                    "model {model:?} is not a valid model name: use ^[A-Za-z0-9][A-Za-z0-9._:/@-]{{0,127}}$"
                )))
            }
        }
    }
}

fn one_of(a: &mut super::args::ArgReader, field: &str, allowed: &[&str]) -> Result<Option<String>, ToolError> {
    match a.opt_string(field, 64)? {
        Some(v) if allowed.contains(&v.to_ascii_lowercase().as_str()) => Ok(Some(v.to_ascii_lowercase())),
        Some(v) => Err(ToolError::invalid(format!("{field} {v:?} is not allowed; allowed: {}", allowed.join(", ")))),
        None => Ok(None),
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
    let agent = match a.opt_string("agentId", 128)? {
        Some(id) => crate::keys::AgentId::parse(&id).map_err(|e| ToolError::invalid(format!("agentId: {e}")))?,
        None => ctx.caller.agent.clone(),
    };
    if let Some(model) = a.opt_string("model", 256)? {
        let allowlist = ctx.access.config.agent(&agent).and_then(|e| e.models.as_deref());
        check_model(&model, allowlist)?;
    }
    if let Some(t) = a.opt_string("thinking", 32)? {
        thinking_level(&t).ok_or_else(|| {
            ToolError::invalid(format!(
                "thinking {t:?} is not a level; allowed: off, minimal, low, medium, high, xhigh, adaptive"
            ))
        })?;
    }
    a.opt_number("runTimeoutSeconds", Bounds { min: 0, max: u32::MAX as u64 })?;
    let thread = a.opt_bool("thread")?.unwrap_or(false);
    let mode = one_of(&mut a, "mode", &["run", "session"])?;
    if thread {
        return Err(ToolError::invalid(
            "thread=true needs a deliverer for the requester's channel that declares thread support (channels.<ch>.threads: true)",
        ));
    }
    if mode.as_deref() == Some("session") {
        return Err(ToolError::invalid(
            "mode=\"session\" requires thread=true, which is not available in this version; use mode \"run\"",
        ));
    }
    one_of(&mut a, "cleanup", &["delete", "keep"])?;
    one_of(&mut a, "sandbox", &["inherit", "require"])?;
    let attachments = match a.opt_value("attachments") {
        None => 0,
        Some(Value::Array(list)) if list.len() > MAX_ATTACHMENTS => {
            return Err(ToolError::invalid(format!(
                "attachments: at most {MAX_ATTACHMENTS} files, got {}",
                list.len()
            )));
        }
        Some(Value::Array(list)) => {
            for (i, item) in list.iter().enumerate() {
                let named = item.get("name").and_then(Value::as_str).is_some_and(|n| !n.trim().is_empty());
                if !named || !item.get("content").is_some_and(Value::is_string) {
                    return Err(ToolError::invalid(format!(
                        "attachments[{i}] needs a non-empty name and a string content"
                    )));
                }
            }
            list.len()
        }
        Some(_) => {
            return Err(ToolError::invalid("attachments must be a list of {name, content, encoding?, mimeType?}"));
        }
    };
    a.opt_value("attachAs");
    a.opt_string("idempotencyKey", 256)?;
    a.finish()?;
    if attachments > 0 && !ctx.access.config.tools.sessions_spawn.attachments.enabled {
        return Err(ToolError::forbidden(
            "attachments are disabled; the operator can enable them with tools.sessions_spawn.attachments.enabled=true",
        ));
    }
    ctx.access.check_can_act(ctx.caller)?;
    Err(ToolError::error(
        "not available yet: sessions_spawn needs the agent runner, which this version of sessions-mcp does not include; nothing was created",
    ))
}
