//! `sessions_history`: one session's transcript, sanitised and paged within the answer budget
//! (`tools.sessions.maxResultBytes`). Four windows: the newest page; `afterSeq`, the inbox read
//! (oldest first, continue from the last `seq`); `beforeSeq`, reading backwards; and `seq` with
//! `fromChar`, one message's whole text in parts. Every answer says how to read on, so paging
//! in either direction returns every message exactly once.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::args::Bounds;
use super::{Ctx, OkStatus, Output, ToolError, ToolSpec};
use crate::access::{HistoryFrom, PendingInput, SessionRow};
use crate::policy::{Action, ToolName};
use crate::sanitize::{self, Flags};

pub const DEFAULT_LIMIT: u64 = 200;
pub const MAX_LIMIT: u64 = 1000;
const RUNS_SHOWN: usize = 20;

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub struct Params {
    /// The session: a key (`main`, `agent:<id>:…`, `discord:group:<id>`, …) or a sessionId.
    session_key: String,
    /// Messages to return (default 200, at least 1, at most 1000; larger values are clamped).
    /// An answer also stops at the byte budget; the page pointers say where to read on.
    #[schemars(range(min = 1))]
    limit: Option<f64>,
    /// Include tool results and silent messages (default false).
    include_tools: Option<bool>,
    /// Only messages with seq > afterSeq, oldest first: read what arrived since you last looked
    /// (at least 0; pass the answer's nextAfterSeq to read the next page).
    #[schemars(range(min = 0))]
    after_seq: Option<f64>,
    /// Only messages with seq < beforeSeq, the newest of them: read backwards (at least 0; pass
    /// the answer's nextBeforeSeq to read the page before). Not with afterSeq.
    #[schemars(range(min = 0))]
    before_seq: Option<f64>,
    /// Read one message whole, in parts: its seq (at least 0). Not with afterSeq or beforeSeq.
    #[schemars(range(min = 0))]
    seq: Option<f64>,
    /// With seq: the character to start from (at least 0, default 0); a cut message's
    /// `rest.fromChar` says where its shown text stopped.
    #[schemars(range(min = 0))]
    from_char: Option<f64>,
    /// Also return the session's last runs and their deliveries (default false).
    include_runs: Option<bool>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryOk {
    pub status: OkStatus,
    /// The session as you would name it (`main` for your own main session).
    pub session_key: String,
    /// Oldest first; each carries its `seq` (pending inputs carry `pending: true` and no seq).
    /// A message whose text was cut carries `rest: {fromChar, totalChars}`: call again with its
    /// seq and that fromChar to read on.
    #[schemars(with = "Vec<serde_json::Map<String, Value>>")]
    pub messages: Vec<Value>,
    /// More messages exist beyond this page (older without afterSeq, newer with it).
    pub has_more: bool,
    /// Newer messages than this page exist: pass this as afterSeq to read them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after_seq: Option<i64>,
    /// Older messages than this page exist: pass this as beforeSeq to read them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_before_seq: Option<i64>,
    /// droppedMessages || contentTruncated.
    pub truncated: bool,
    /// The page stopped at the byte budget (tools.sessions.maxResultBytes); the page pointers
    /// lead to the rest.
    pub dropped_messages: bool,
    /// A text was cut (at 4000 characters, or to fit the budget); its message's `rest` says
    /// where to read on.
    pub content_truncated: bool,
    /// A secret was masked.
    pub content_redacted: bool,
    /// Size of `messages` as JSON.
    pub bytes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_applied: Option<Map<String, Value>>,
    /// With includeRuns: the last runs, newest first, with their deliveries (as many of the last
    /// 20 as fit in half the budget).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Vec<serde_json::Map<String, Value>>>")]
    pub runs: Option<Vec<Value>>,
}

pub fn spec() -> ToolSpec {
    ToolSpec::of::<Params, HistoryOk>(
        ToolName::SessionsHistory,
        "Session History",
        "Fetch a session's messages (oldest first, each with its seq), the newest page by default. \
         To read replies and announcements that arrived in your own session, call it with \
         sessionKey \"main\" (or your session key) and afterSeq set to the last seq you have \
         seen. Answers are paged: nextAfterSeq / nextBeforeSeq say how to read on, and a cut \
         message's rest.fromChar (with its seq) how to read the rest of it.",
        true,
    )
}

pub fn run(ctx: &Ctx, args: Option<Map<String, Value>>) -> Output<HistoryOk> {
    history(ctx, args).into()
}

/// Which part of a transcript a call reads.
#[derive(Debug, Clone, Copy)]
enum Window {
    /// The newest messages, and the inputs still queued.
    Newest,
    After(i64),
    Before(i64),
    /// One message's text from a character on.
    One {
        seq: i64,
        from_char: usize,
    },
}

fn window(a: &mut super::args::ArgReader) -> Result<Window, ToolError> {
    let after = a.opt_seq("afterSeq")?;
    let before = a.opt_seq("beforeSeq")?;
    let seq = a.opt_seq("seq")?;
    let from_char = a.opt_seq("fromChar")?;
    match (after, before, seq, from_char) {
        (Some(_), Some(_), _, _) => Err(ToolError::invalid(
            "afterSeq and beforeSeq given together; pass afterSeq to read forwards or beforeSeq to read backwards",
        )),
        (Some(_), _, Some(_), _) | (_, Some(_), Some(_), _) => Err(ToolError::invalid(
            "seq reads one message and cannot be combined with afterSeq or beforeSeq; pass one of them",
        )),
        (_, _, None, Some(_)) => Err(ToolError::invalid("fromChar needs seq: the message to read from that character")),
        (_, _, Some(seq), from) => Ok(Window::One { seq, from_char: from.unwrap_or(0) as usize }),
        (Some(after), None, None, None) => Ok(Window::After(after)),
        (None, Some(before), None, None) => Ok(Window::Before(before)),
        (None, None, None, None) => Ok(Window::Newest),
    }
}

/// One page of transcript, before it is fitted.
struct Page {
    messages: Vec<Value>,
    has_more: bool,
    /// Text of a one-message read, whole, and where to start.
    part: Option<(String, usize)>,
}

fn read_page(
    ctx: &Ctx,
    row: &SessionRow,
    window: Window,
    limit: usize,
    tools: bool,
    flags: &mut Flags,
) -> Result<Page, ToolError> {
    let from = match window {
        Window::Newest => HistoryFrom::Newest,
        Window::After(after) => HistoryFrom::After(after),
        Window::Before(before) => HistoryFrom::Before(before),
        Window::One { seq, from_char } => return read_one(ctx, row, seq, from_char, flags),
    };
    let page = ctx.access.history(row, from, limit, tools)?;
    let mut messages: Vec<Value> = page.messages.iter().map(|m| m.to_json()).collect();
    if matches!(window, Window::Newest) {
        messages.extend(ctx.access.pending_inputs(row)?.into_iter().map(pending_message));
    }
    messages.iter_mut().for_each(|m| sanitize::sanitize_message(m, flags));
    Ok(Page { messages, has_more: page.has_more, part: None })
}

fn read_one(ctx: &Ctx, row: &SessionRow, seq: i64, from_char: usize, flags: &mut Flags) -> Result<Page, ToolError> {
    let Some(m) = ctx.access.message_at(row, seq)? else {
        return Err(ToolError::not_found(format!("seq: this session has no message with seq {seq}")));
    };
    let text = sanitize::whole_text(&m.content, flags);
    let total = text.chars().count();
    if from_char > total {
        return Err(ToolError::invalid(format!(
            "fromChar {from_char} is past the end of message {seq} ({total} characters); allowed: 0..{total}"
        )));
    }
    let mut message = m.to_json();
    sanitize::sanitize_message(&mut message, &mut Flags::default());
    Ok(Page { messages: vec![message], has_more: false, part: Some((text, from_char)) })
}

fn pending_message(p: PendingInput) -> Value {
    let mut m = json!({"role": "user", "pending": true, "runId": p.run_id, "timestamp": p.created_at,
                       "content": p.input.get("content").cloned().unwrap_or(Value::Null)});
    if let Some(prov) = p.provenance {
        m["provenance"] = prov;
    }
    m
}

fn history(ctx: &Ctx, args: Option<Map<String, Value>>) -> Result<HistoryOk, ToolError> {
    let mut a = super::reader(ToolName::SessionsHistory, args)?;
    let raw_key = a.req_key("sessionKey", 4096)?;
    let limit = a.opt_number("limit", Bounds { min: 1, max: MAX_LIMIT })?.unwrap_or(DEFAULT_LIMIT) as usize;
    let include_tools = a.opt_bool("includeTools")?.unwrap_or(false);
    let window = window(&mut a)?;
    let include_runs = a.opt_bool("includeRuns")?.unwrap_or(false);
    let clamped = a.finish()?;

    let target = ctx.access.resolve(ctx.caller, Action::History, "sessionKey", &raw_key)?;
    let mut flags = Flags::default();
    let page = match &target.row {
        None if matches!(window, Window::One { .. }) => {
            return Err(ToolError::not_found("seq: this session has no messages yet"));
        }
        None => Page { messages: Vec::new(), has_more: false, part: None },
        Some(row) => read_page(ctx, row, window, limit, include_tools, &mut flags)?,
    };
    let runs = match (&target.row, include_runs) {
        (Some(row), true) => Some(ctx.access.recent_runs(row, RUNS_SHOWN)?),
        (None, true) => Some(Vec::new()),
        _ => None,
    };
    let mut answer = HistoryOk {
        status: OkStatus::Ok,
        session_key: target.display,
        messages: Vec::new(),
        has_more: page.has_more,
        next_after_seq: None,
        next_before_seq: None,
        truncated: false,
        dropped_messages: false,
        content_truncated: false,
        content_redacted: false,
        bytes: 2,
        limit_applied: super::limit_applied(clamped),
        runs,
    };
    let budget = ctx.access.config().tools.sessions.max_result_bytes;
    fit_runs(&mut answer, budget / 2);
    // What the messages may take: the budget less the rest of the answer, with room for the
    // page pointers, flags and size that are only known once they are fitted.
    let room = budget.saturating_sub(super::json_len(&answer) + POINTERS_ROOM);
    let fitted = fit(page.messages, page.part, room, window);
    let dropped = fitted.dropped > 0 || fitted.oversized;
    answer.has_more |= fitted.dropped > 0;
    answer.truncated = dropped || flags.content_truncated || fitted.oversized;
    answer.dropped_messages = dropped;
    answer.content_truncated = flags.content_truncated || fitted.oversized;
    answer.content_redacted = flags.content_redacted;
    answer.bytes = fitted.bytes;
    answer.messages = fitted.messages;
    if target.key == ctx.caller.key {
        mark_announces_read(ctx, &answer.messages)?;
    }
    if let Some(row) = &target.row {
        set_pointers(ctx, row, include_tools, &mut answer)?;
    }
    Ok(answer)
}

/// Announces of the caller's children that this page showed it in its own inbox are consumed:
/// their delivery becomes `read` (what `subagents` list reports).
fn mark_announces_read(ctx: &Ctx, messages: &[Value]) -> Result<(), ToolError> {
    let announce = Value::from(crate::engine::chain::SourceTool::SubagentAnnounce.as_str());
    let runs: Vec<&str> = messages
        .iter()
        .filter(|m| m.pointer("/provenance/sourceTool") == Some(&announce))
        .filter_map(|m| m.get("runId").and_then(Value::as_str))
        .collect();
    ctx.access.mark_announces_read(&runs)
}

/// Bytes kept free for `nextAfterSeq`, `nextBeforeSeq`, `true` flags and `bytes`.
const POINTERS_ROOM: usize = 96;

fn fit(messages: Vec<Value>, part: Option<(String, usize)>, room: usize, window: Window) -> sanitize::Fitted {
    let Some((text, from)) = part else {
        return sanitize::fit_budget(messages, room, matches!(window, Window::After(_)));
    };
    let mut messages = messages;
    let total = text.chars().count();
    let part = sanitize::TextPart { from, limit: total, total };
    // The message alone, inside the array's brackets.
    sanitize::fit_text(&mut messages[0], &text, part, room.saturating_sub(2));
    let oversized = messages[0].get("rest").is_some();
    let bytes = super::json_len(&Value::Array(messages.clone()));
    sanitize::Fitted { messages, dropped: 0, bytes, oversized }
}

/// Keeps the runs within `room` bytes, dropping the oldest.
fn fit_runs(answer: &mut HistoryOk, room: usize) {
    let Some(runs) = answer.runs.as_mut() else { return };
    let mut size = super::json_len(&*runs);
    while size > room
        && let Some(oldest) = runs.pop()
    {
        size -= super::json_len(&oldest) + usize::from(!runs.is_empty());
    }
}

/// Which ways the page can be read on, from the first and last seq it holds.
fn set_pointers(ctx: &Ctx, row: &SessionRow, include_tools: bool, answer: &mut HistoryOk) -> Result<(), ToolError> {
    let seqs: Vec<i64> = answer.messages.iter().filter_map(|m| m.get("seq").and_then(Value::as_i64)).collect();
    let (Some(&first), Some(&last)) = (seqs.first(), seqs.last()) else { return Ok(()) };
    let (older, newer) = ctx.access.history_around(row, first, last, include_tools)?;
    answer.next_before_seq = older.then_some(first);
    answer.next_after_seq = newer.then_some(last);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window_of(args: Value) -> Result<Window, ToolError> {
        let mut a = crate::tools::reader(ToolName::SessionsHistory, args.as_object().cloned())?;
        window(&mut a)
    }

    #[test]
    fn windows_that_contradict_each_other_are_refused_by_name() {
        for (args, says) in [
            (json!({"afterSeq": 1, "beforeSeq": 9}), "afterSeq and beforeSeq"),
            (json!({"afterSeq": 1, "seq": 3}), "seq reads one message"),
            (json!({"beforeSeq": 1, "seq": 3}), "seq reads one message"),
            (json!({"fromChar": 10}), "fromChar needs seq"),
        ] {
            let e = window_of(args.clone()).expect_err("refused");
            assert!(e.message.contains(says), "{args}: {}", e.message);
        }
        assert!(matches!(window_of(json!({"seq": 3})), Ok(Window::One { seq: 3, from_char: 0 })));
        assert!(matches!(window_of(json!({"beforeSeq": 4})), Ok(Window::Before(4))));
        assert!(matches!(window_of(json!({})), Ok(Window::Newest)));
    }
}
