//! `sessions_list`: the sessions the caller may see, newest first, with optional last messages.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use super::args::Bounds;
use super::{Ctx, OkStatus, Output, ToolError, ToolSpec};
use crate::access::{ListPage, ListRequest, SessionRow, Transcript, transcript};
use crate::keys::{self, KeyScope, SessionKind};
use crate::policy::ToolName;
use crate::sanitize::{self, Flags};

pub const DEFAULT_LIMIT: u64 = 50;
pub const MAX_LIMIT: u64 = 200;
pub const MAX_MESSAGE_LIMIT: u64 = 20;

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub struct Params {
    /// Only these kinds: main, group, cron, hook, node, other.
    kinds: Option<Vec<SessionKind>>,
    /// Rows per page (at least 1, default 50, at most 200; larger values are clamped and reported in limitApplied).
    #[schemars(range(min = 1))]
    limit: Option<f64>,
    /// Only sessions updated in the last N minutes (at least 1).
    #[schemars(range(min = 1))]
    active_minutes: Option<f64>,
    /// Include each row's last N messages, tool results left out (0-20, default 0).
    #[schemars(range(min = 0))]
    message_limit: Option<f64>,
    /// Also list archived sessions (default false).
    include_archived: Option<bool>,
    /// Opaque cursor from a previous answer's nextCursor, with the same filters.
    cursor: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListOk {
    pub status: OkStatus,
    pub count: usize,
    pub sessions: Vec<ListRow>,
    /// The visibility that was applied (never how much it hid).
    pub scope: Scope,
    /// More visible rows matched than were returned; pass nextCursor to continue.
    pub has_more: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// Arguments that were clamped to their maximum: name → applied value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_applied: Option<Map<String, Value>>,
    /// Some rows' messages were left out to keep the answer within the budget
    /// (tools.sessions.maxResultBytes); rows that did not fit are on the next page instead.
    pub dropped_messages: bool,
    pub content_truncated: bool,
    pub content_redacted: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Scope {
    /// tools.sessions.visibility as configured.
    pub visibility: String,
    /// What applied to this caller (a sandboxed caller may be clamped to tree).
    pub effective: String,
    pub sandboxed: bool,
    pub note: String,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListRow {
    /// `main` for your own main session, else the canonical key.
    pub key: String,
    pub kind: SessionKind,
    pub channel: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// Last update, ms since the epoch.
    pub updated_at: i64,
    pub session_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_tokens: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_tokens: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking_level: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verbose_level: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_sent: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aborted_last_run: Option<bool>,
    /// The per-session send-policy override (allow | deny), when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub send_policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_channel: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_to: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub delivery_context: Option<Value>,
    /// The exported transcript file, when it exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transcript_path: Option<String>,
    /// Otherwise the transcript as an MCP resource.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transcript_uri: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Vec<serde_json::Map<String, Value>>>")]
    pub messages: Option<Vec<Value>>,
}

pub fn spec() -> ToolSpec {
    ToolSpec::of::<Params, ListOk>(
        ToolName::SessionsList,
        "Sessions",
        "List the sessions you may see (newest first) with optional filters and last messages. \
         Your own session is always listed. Use nextCursor to page on; `scope` says which \
         visibility applied.",
        true,
    )
}

pub fn run(ctx: &Ctx, args: Option<Map<String, Value>>) -> Output<ListOk> {
    list(ctx, args).into()
}

fn parse_kinds(raw: Option<Vec<String>>) -> Result<Option<Vec<SessionKind>>, ToolError> {
    let Some(raw) = raw else { return Ok(None) };
    let mut kinds = Vec::new();
    for k in raw {
        let lower = k.to_ascii_lowercase();
        let kind = SessionKind::parse(&lower).ok_or_else(|| {
            ToolError::invalid(format!("kinds: {k:?} is not a kind; allowed: main, group, cron, hook, node, other"))
        })?;
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    if kinds.is_empty() {
        return Err(ToolError::invalid("kinds must name at least one kind, or be omitted"));
    }
    Ok(Some(kinds))
}

fn list(ctx: &Ctx, args: Option<Map<String, Value>>) -> Result<ListOk, ToolError> {
    let mut a = super::reader(ToolName::SessionsList, args)?;
    let kinds = parse_kinds(a.opt_string_list("kinds", 16)?)?;
    let limit = a.opt_number("limit", Bounds { min: 1, max: MAX_LIMIT })?.unwrap_or(DEFAULT_LIMIT);
    let active_minutes = a.opt_number("activeMinutes", Bounds { min: 1, max: 10_000_000 })?;
    let message_limit = a.opt_number("messageLimit", Bounds { min: 0, max: MAX_MESSAGE_LIMIT })?.unwrap_or(0);
    let include_archived = a.opt_bool("includeArchived")?.unwrap_or(false);
    let cursor = a.opt_string("cursor", 1024)?;
    let clamped = a.finish()?;

    let req = ListRequest { kinds, limit: limit as usize, active_minutes, include_archived, cursor };
    let mut page = ctx.access.list(ctx.caller, &req)?;
    let scope = ctx.access.scope(ctx.caller);
    let state_dir_export = ctx.access.export_dir();
    let mut rows: Vec<ListRow> =
        page.rows.iter().map(|r| list_row(r, scope, ctx.caller.sandboxed, state_dir_export.as_deref())).collect();
    let mut flags = Flags::default();
    if message_limit > 0 {
        let all = ctx.access.last_messages(&page.rows, message_limit as usize)?;
        for (row, msgs) in rows.iter_mut().zip(all) {
            let mut out: Vec<Value> = msgs.iter().map(|m| m.to_json()).collect();
            out.iter_mut().for_each(|m| sanitize::sanitize_message(m, &mut flags));
            row.messages = Some(out);
        }
    }
    let rules = ctx.access.rules(ctx.caller);
    let note = scope_note(rules.effective, rules.configured, ctx.caller.sandboxed);
    let mut answer = ListOk {
        status: OkStatus::Ok,
        count: rows.len(),
        sessions: rows,
        scope: Scope {
            visibility: rules.configured.as_str().into(),
            effective: rules.effective.as_str().into(),
            sandboxed: ctx.caller.sandboxed,
            note,
        },
        has_more: page.has_more,
        next_cursor: page.next_cursor.clone(),
        limit_applied: super::limit_applied(clamped),
        dropped_messages: false,
        content_truncated: flags.content_truncated,
        content_redacted: flags.content_redacted,
    };
    fit_answer(&mut answer, &mut page, ctx.access.config().tools.sessions.max_result_bytes);
    Ok(answer)
}

fn scope_note(effective: crate::config::Visibility, configured: crate::config::Visibility, sandboxed: bool) -> String {
    use crate::config::Visibility::*;
    let what = match effective {
        OwnSession => "only your own session",
        Tree => "your session and the sessions it spawned",
        Agent => "every session of your agent",
        All => "every session of your agent, and other agents' sessions allowed by tools.agentToAgent",
    };
    if effective < configured && sandboxed {
        format!(
            "Showing {what}: a sandboxed session is limited to its tree (agents.defaults.sandbox.sessionToolsVisibility)."
        )
    } else {
        format!("Showing {what} (tools.sessions.visibility={}).", configured.as_str())
    }
}

/// Keeps the whole answer within `budget` bytes. Rows go first, from the end of the page (the
/// cursor then continues from the last row kept, so nothing is lost), down to the caller's own
/// row and one other. If those are still too large, their oldest messages go, from the oldest
/// row first (`droppedMessages`).
fn fit_answer(answer: &mut ListOk, page: &mut ListPage, budget: usize) {
    let mut size = super::json_len(&*answer);
    while size > budget {
        let Some(at) = page.drop_last_other() else { break };
        let row = answer.sessions.remove(at);
        size -= super::json_len(&row) + 1;
        if answer.next_cursor.is_none() {
            size += CURSOR_ROOM;
        }
        answer.has_more = true;
        answer.next_cursor = page.next_cursor.clone();
        answer.count = answer.sessions.len();
    }
    size = super::json_len(&*answer);
    for row in answer.sessions.iter_mut().rev() {
        let Some(msgs) = row.messages.as_mut() else { continue };
        while size > budget && !msgs.is_empty() {
            let m = msgs.remove(0);
            size -= super::json_len(&m) + usize::from(!msgs.is_empty());
            answer.dropped_messages = true;
        }
    }
    // `droppedMessages: true` is one byte shorter than false; nothing else changed size.
}

/// Bytes a `nextCursor` adds to an answer that had none.
const CURSOR_ROOM: usize = 160;

/// One row as the caller sees it. `lastTo` and `deliveryContext.to` are hidden from sandboxed callers.
pub fn list_row(r: &SessionRow, scope: &KeyScope, sandboxed: bool, export_dir: Option<&std::path::Path>) -> ListRow {
    let chat_type = keys::chat_type_of(&r.key, r.chat_type);
    let channel = keys::channel_of(&r.key, r.kind, chat_type, r.channel.as_deref(), r.last_channel.as_deref());
    let mut delivery_context = r.delivery_context.clone();
    if sandboxed && let Some(Value::Object(dc)) = delivery_context.as_mut() {
        dc.remove("to");
    }
    let (transcript_path, transcript_uri) = match transcript(r, export_dir) {
        Transcript::File(path) => (Some(path), None),
        Transcript::Resource(uri) => (None, Some(uri)),
    };
    ListRow {
        key: scope.display(&r.key),
        kind: r.kind,
        channel,
        label: r.label.clone(),
        // As the reference: a row without a display name of its own shows its label (`"calc"`).
        display_name: r.display_name.clone().or_else(|| r.label.clone()),
        updated_at: r.updated_at,
        session_id: r.session_id.clone(),
        model: r.model.clone(),
        context_tokens: r.context_tokens,
        total_tokens: (r.tokens_total > 0).then_some(r.tokens_total),
        thinking_level: r.thinking_level.clone(),
        verbose_level: r.verbose_level.clone(),
        system_sent: r.system_sent,
        aborted_last_run: r.aborted_last_run,
        send_policy: r.send_policy.map(|p| p.as_str().to_string()),
        last_channel: r.last_channel.clone(),
        last_to: if sandboxed { None } else { r.last_to.clone() },
        delivery_context,
        transcript_uri,
        transcript_path,
        messages: None,
    }
}
