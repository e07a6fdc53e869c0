//! `sessions_spawn`: start a sub-agent run in an isolated child session; its result is announced
//! back to the requester.
//!
//! The tool checks the arguments (channel-delivery keys, agentId, model, thinking, attachments)
//! and hands the rest to the engine (`engine::spawn`: the admission checks in the order of
//! docs/BEHAVIOUR.md, sessions_spawn, then one transaction that reserves admission and creates
//! the child); it shapes the accepted answer.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use serde_json::json;

use super::args::Bounds;
use super::{Ctx, Output, ToolError, ToolSpec};
use crate::access::{Access, RunRow, RunStatus};
use crate::engine::spawn::BindingMode;
use crate::engine::spawn::{SpawnRequest, Spawned};
use crate::keys::AgentId;
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
    /// Kill the child's run after this many seconds (0 = no own limit; can only lower the operator's cap).
    #[schemars(range(min = 0))]
    run_timeout_seconds: Option<f64>,
    /// Bind the child to a new thread of your channel: its replies go there (your channel's
    /// deliverer must open threads; otherwise refused).
    thread: Option<bool>,
    /// run | session (default with thread=true; needs it): a session child stays for the thread's
    /// follow-up messages until idle for threadBindings.idleHours.
    mode: Option<SpawnMode>,
    /// delete | keep (default keep): what happens to the child session after its announce.
    cleanup: Option<Cleanup>,
    /// inherit (default) | require: require a sandboxed child.
    sandbox: Option<SandboxReq>,
    /// project | worktree | isolated: work in your project (your client's root, else the
    /// directory the server was started in), in a git worktree and branch of it of its own, or in
    /// the agent's own directory. Default: project for the agent CLIs of presets (claude, codex,
    /// gemini), isolated for other agents (agents.defaults.subagents.workspace).
    workspace: Option<WorkspaceReq>,
    /// Files for the child (off unless tools.sessions_spawn.attachments.enabled).
    attachments: Option<Vec<Attachment>>,
    /// Where the child should look for attachments (a hint only).
    attach_as: Option<AttachAs>,
    /// Pass the same key again to get the first spawn's answer instead of a second child.
    idempotency_key: Option<String>,
    /// Limits for the child and everything it spawns, reserved from what you have left (a
    /// dimension you leave out is shared with you). Over it, the child is stopped and announced
    /// `Status: budget exceeded`.
    budget: Option<BudgetParam>,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub struct BudgetParam {
    /// Input plus output tokens (a whole number, at least 1).
    #[schemars(range(min = 1))]
    tokens: Option<u64>,
    /// Cost in US dollars, as the agent reports it (more than 0).
    cost_usd: Option<f64>,
    /// Wall time of its runs, added up, in seconds (more than 0).
    runtime_seconds: Option<f64>,
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
pub enum WorkspaceReq {
    Project,
    Worktree,
    Isolated,
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
    /// Only as the final result of a spawn that ran as an MCP task: the child finished.
    Ok,
    /// Only as the final result of a spawn that ran as an MCP task: the child failed, timed out
    /// or was interrupted (isError: true).
    Error,
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
    /// Where the child works: {mode: "project", path} (your project), {mode: "worktree", path,
    /// branch} (its own worktree of your project) or {mode: "isolated"}.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub workspace: Option<Value>,
    /// Said when the child's work will not be real: no real agent is configured, so it runs the
    /// built-in echo agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub inbox: Option<Value>,
    /// Receipts of the written files: {count, totalBytes, files: [{name, bytes, sha256}], relDir}.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub attachments: Option<Value>,
    /// The thread the child answers in: {channel, to, threadId}.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub thread: Option<Value>,
    /// The child's budget: {limit: {tokens?, costUsd?, runtimeSeconds?}, clamped?: [dims cut to
    /// what was left], shared?: [dims it draws from your budget without a reservation]}.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub budget: Option<Value>,
    /// As a task's final result: the child's final reply.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
    /// As a task's final result: why the child did not finish.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The reply was cut to fit the answer budget: read it whole with sessions_history
    /// {sessionKey: childSessionKey, seq: replySeq}.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_seq: Option<i64>,
}

pub fn spec() -> ToolSpec {
    ToolSpec::of::<Params, SpawnOk>(
        ToolName::SessionsSpawn,
        "Spawn Sub-agent",
        "Start a sub-agent run in a new, isolated child session. Never blocks: the result \
         (Status/Result/Notes) is announced back to your session when the child finishes. \
         thread=true binds it to a new thread of your channel (mode \"session\": it stays for the \
         thread's follow-ups). Pass an \
         idempotencyKey when you may need to call again after a lost connection.",
        false,
    )
}

pub async fn run(ctx: &Ctx<'_>, args: Option<Map<String, Value>>) -> Output<SpawnOk> {
    spawn(ctx, args).await.into()
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

fn parse(ctx: &Ctx, args: Option<Map<String, Value>>) -> Result<SpawnRequest, ToolError> {
    if let Some(key) = args.as_ref().and_then(|a| DELIVERY_KEYS.iter().find(|k| a.contains_key(**k))) {
        return Err(ToolError::invalid(format!(
            "{key} is a channel-delivery argument; sessions_spawn does not deliver to channels (use sessions_send)"
        )));
    }
    let raw = Value::Object(args.clone().unwrap_or_default());
    let mut a = super::reader(ToolName::SessionsSpawn, args)?;
    let task = a.req_string("task", MAX_TASK_BYTES)?;
    let label = a.opt_string("label", 256)?;
    if label.as_ref().is_some_and(|l| l.chars().count() > 64) {
        return Err(ToolError::invalid("label is too long: at most 64 characters are allowed"));
    }
    let agent = match a.opt_string("agentId", 128)? {
        Some(id) => AgentId::parse(&id).map_err(|e| ToolError::invalid(format!("agentId: {e}")))?,
        None => crate::engine::host_agent(ctx.access.config(), &ctx.caller.agent, ctx.host.as_deref())
            .unwrap_or_else(|| ctx.caller.agent.clone()),
    };
    let model = a.opt_string("model", 256)?;
    if let Some(m) = &model {
        let allowlist = ctx.access.config().agent(&agent).and_then(|e| e.models.as_deref());
        check_model(m, allowlist)?;
    }
    let thinking = match a.opt_string("thinking", 32)? {
        Some(t) => Some(thinking_level(&t).map(String::from).ok_or_else(|| {
            ToolError::invalid(format!(
                "thinking {t:?} is not a level; allowed: off, minimal, low, medium, high, xhigh, adaptive"
            ))
        })?),
        None => None,
    };
    let run_timeout = a.opt_number("runTimeoutSeconds", Bounds { min: 0, max: u32::MAX as u64 })?;
    let thread = a.opt_bool("thread")?.unwrap_or(false);
    let mode = a.opt_choice("mode", &["run", "session"])?;
    // As the reference: mode defaults to "session" with a thread, and "session" needs one.
    let thread_mode = match (thread, mode) {
        (false, Some("session")) => {
            return Err(ToolError::invalid(
                "mode=\"session\" requires thread=true so the subagent can stay bound to a thread; pass thread: true (your channel must open threads) or use mode \"run\"",
            ));
        }
        (false, _) => None,
        (true, Some("run")) => Some(BindingMode::Run),
        (true, _) => Some(BindingMode::Session),
    };
    let cleanup_delete = a.opt_choice("cleanup", &["delete", "keep"])? == Some("delete");
    let require_sandbox = a.opt_choice("sandbox", &["inherit", "require"])? == Some("require");
    let workspace = match a.opt_choice("workspace", &["project", "worktree", "isolated"])? {
        Some("project") => Some(crate::config::WorkspaceMode::Project),
        Some("worktree") => Some(crate::config::WorkspaceMode::Worktree),
        Some(_) => Some(crate::config::WorkspaceMode::Isolated),
        None => None,
    };
    let limits = &ctx.access.config().tools.sessions_spawn.attachments;
    let attachments = match a.opt_value("attachments") {
        None => Vec::new(),
        Some(Value::Array(list)) if list.len() > MAX_ATTACHMENTS => {
            return Err(ToolError::invalid(format!(
                "attachments: at most {MAX_ATTACHMENTS} files, got {}",
                list.len()
            )));
        }
        Some(Value::Array(list)) => crate::engine::attachments::validate(&list, limits)?,
        Some(_) => {
            return Err(ToolError::invalid("attachments must be a list of {name, content, encoding?, mimeType?}"));
        }
    };
    let attach_as = a.opt_value("attachAs");
    let idempotency_key = a.opt_string("idempotencyKey", 256)?;
    let budget = a.opt_value("budget").map(|v| parse_budget(&v)).transpose()?;
    a.finish()?;
    Ok(SpawnRequest {
        task,
        label,
        agent,
        model,
        thinking,
        run_timeout,
        cleanup_delete,
        require_sandbox,
        workspace,
        client_project: ctx.project.clone(),
        attachments,
        idempotency_key,
        budget,
        thread: None,
        thread_mode,
        attach_as,
        raw,
    })
}

/// `budget`: an object of positive amounts, each field checked on its own so that the error names it.
fn parse_budget(v: &Value) -> Result<crate::config::Budget, ToolError> {
    const SHAPE: &str = "{tokens?, costUsd?, runtimeSeconds?}";
    let Some(fields) = v.as_object() else {
        return Err(ToolError::invalid(format!("budget must be an object {SHAPE}, got {v}")));
    };
    let mut b = crate::config::Budget::default();
    for (name, value) in fields {
        let Some(n) = value.as_f64() else {
            return Err(ToolError::invalid(format!("budget.{name} must be a number, got {value}")));
        };
        match name.as_str() {
            "tokens" => {
                let whole = value.as_u64().filter(|t| *t >= 1);
                b.tokens = Some(whole.ok_or_else(|| {
                    ToolError::invalid(format!(
                        "budget.tokens must be a whole number of tokens, at least 1, got {value}"
                    ))
                })?);
            }
            "costUsd" => b.cost_usd = Some(n),
            "runtimeSeconds" => b.runtime_seconds = Some(n),
            other => {
                return Err(ToolError::invalid(format!(
                    "budget.{other} is not a budget field; allowed: tokens, costUsd, runtimeSeconds"
                )));
            }
        }
    }
    b.validate("budget").map_err(ToolError::invalid)?;
    Ok(b)
}

async fn spawn(ctx: &Ctx<'_>, args: Option<Map<String, Value>>) -> Result<SpawnOk, ToolError> {
    let mut request = parse(ctx, args)?;
    let engine = ctx.engine();
    if let Some(mode) = request.thread_mode {
        request.thread = Some(engine.open_thread(ctx.caller, mode, request.label.as_deref(), &request.task).await?);
    }
    let thread = request.thread.clone();
    let accepted_spawn = match engine.spawn(ctx.caller, request) {
        Ok(a) => a,
        Err(e) => {
            if let Some(t) = &thread {
                engine.close_thread(t, &e.message).await;
            }
            return Err(e);
        }
    };
    if let Some(t) = thread.as_ref().filter(|_| accepted_spawn.replayed) {
        // The earlier spawn has its thread already; the one opened for this call is not used.
        engine.close_thread(t, "this spawn repeated an earlier one (the same idempotencyKey)").await;
    }
    let mut ok = accepted(ctx, accepted_spawn.spawned, accepted_spawn.inbox_after);
    ok.attachments = accepted_spawn.attachments;
    ok.warning = accepted_spawn.echo.then(|| crate::engine::ECHO_WARNING.to_string());
    ok.workspace = accepted_spawn.workspace;
    Ok(ok)
}

fn accepted(ctx: &Ctx, spawned: Spawned, inbox_after: i64) -> SpawnOk {
    let caller = ctx.caller;
    let me = ctx.access.scope(caller).display(&caller.key);
    let note = if caller.external {
        format!(
            "Runs in the background. To get its result, call subagents {{\"action\": \"wait\"}}: it returns as soon as the child finishes, with its Status/Result/Notes. It is also appended to your session {me} after seq {inbox_after} as a message from subagent_announce (sessions_history {{sessionKey: \"{me}\", afterSeq: {inbox_after}}}); do not poll."
        )
    } else {
        "Runs in the background. The completion (Status/Result/Notes) will arrive as your next message; do not poll. To have it within this turn, call subagents {\"action\": \"wait\"}."
            .to_string()
    };
    let mode = spawned.thread.as_ref().and_then(|t| t["mode"].as_str()).unwrap_or("run").to_string();
    let note = if mode == BindingMode::Session.as_str() {
        "thread-bound session stays active after this task; continue in-thread for follow-ups. Its result is also announced to you.".into()
    } else {
        note
    };
    let thread = spawned.thread.map(|mut t| {
        t.as_object_mut().map(|o| o.remove("mode"));
        t
    });
    SpawnOk {
        status: SpawnStatus::Accepted,
        run_id: spawned.run_id,
        child_session_key: spawned.child_key.to_string(),
        mode,
        queued: spawned.queued,
        note,
        workspace: None,
        warning: None,
        inbox: caller.external.then(|| json!({"sessionKey": me, "afterSeq": inbox_after})),
        attachments: None,
        thread,
        budget: spawned.budget,
        reply: None,
        error: None,
        reply_seq: None,
    }
}

/// The final result of a spawn that ran as an MCP task: the child's outcome. The announce still
/// reaches the requester's session as usual.
pub fn task_result(access: &Access, run: &RunRow, budget: usize) -> SpawnOk {
    let (status, error) = match run.status {
        RunStatus::Ok => (SpawnStatus::Ok, None),
        s => {
            let error = crate::sanitize::run_text(run.error.as_deref());
            (SpawnStatus::Error, Some(error.unwrap_or_else(|| format!("the child's run ended {s}"))))
        }
    };
    let mut ok = SpawnOk {
        status,
        run_id: run.run_id.clone(),
        child_session_key: run.session_key.to_string(),
        mode: "run".into(),
        queued: false,
        note: "The child's run has ended; its announce (Status/Result/Notes) also reaches your session.".into(),
        workspace: None,
        warning: crate::engine::is_echo(access.config(), &run.session_key.agent_id(&access.config().default_agent()))
            .then(|| crate::engine::ECHO_WARNING.to_string()),
        inbox: None,
        attachments: None,
        thread: None,
        budget: None,
        reply: if error.is_none() { crate::sanitize::run_text(run.reply.as_deref()) } else { None },
        error,
        reply_seq: None,
    };
    if super::fit_text_field(&mut ok, |a| a.reply.as_mut(), budget) {
        ok.reply_seq = access.reply_seq(&run.session_key, &run.run_id);
    }
    super::fit_text_field(&mut ok, |a| a.error.as_mut(), budget);
    ok
}
