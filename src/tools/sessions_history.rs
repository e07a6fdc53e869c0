//! `sessions_history`: one session's transcript, sanitised and kept under 80 KiB; with
//! `afterSeq` it is the inbox read (oldest first, continue from the last `seq`).

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::args::Bounds;
use super::{Ctx, OkStatus, Output, ToolError, ToolSpec};
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
    /// Messages to return (at least 1, default 200, at most 1000; larger values are clamped).
    #[schemars(range(min = 1))]
    limit: Option<f64>,
    /// Include tool results and silent messages (default false).
    include_tools: Option<bool>,
    /// Only messages with seq > afterSeq (0 or more), oldest first: read what arrived since you last looked.
    #[schemars(range(min = 0))]
    after_seq: Option<f64>,
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
    #[schemars(with = "Vec<serde_json::Map<String, Value>>")]
    pub messages: Vec<Value>,
    /// More messages exist beyond this page (older without afterSeq, newer with it).
    pub has_more: bool,
    /// droppedMessages || contentTruncated.
    pub truncated: bool,
    /// Messages were left out to stay under 80 KiB.
    pub dropped_messages: bool,
    /// A text was cut at 4000 characters, or an oversized message replaced.
    pub content_truncated: bool,
    /// A secret was masked.
    pub content_redacted: bool,
    /// Size of `messages` as JSON.
    pub bytes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_applied: Option<Map<String, Value>>,
    /// With includeRuns: the last runs, newest first, with their deliveries.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Vec<serde_json::Map<String, Value>>>")]
    pub runs: Option<Vec<Value>>,
}

pub fn spec() -> ToolSpec {
    ToolSpec::of::<Params, HistoryOk>(
        ToolName::SessionsHistory,
        "Session History",
        "Fetch a session's messages (oldest first, each with its seq). To read replies and \
         announcements that arrived in your own session, call it with sessionKey \"main\" (or your \
         session key) and afterSeq set to the last seq you have seen.",
        true,
    )
}

pub fn run(ctx: &Ctx, args: Option<Map<String, Value>>) -> Output<HistoryOk> {
    history(ctx, args).into()
}

fn history(ctx: &Ctx, args: Option<Map<String, Value>>) -> Result<HistoryOk, ToolError> {
    let mut a = super::reader(ToolName::SessionsHistory, args)?;
    let raw_key = a.req_key("sessionKey", 4096)?;
    let limit = a.opt_number("limit", Bounds { min: 1, max: MAX_LIMIT })?.unwrap_or(DEFAULT_LIMIT) as usize;
    let include_tools = a.opt_bool("includeTools")?.unwrap_or(false);
    let after_seq = a.opt_seq("afterSeq")?;
    let include_runs = a.opt_bool("includeRuns")?.unwrap_or(false);
    let clamped = a.finish()?;

    let target = ctx.access.resolve(ctx.caller, Action::History, "sessionKey", &raw_key)?;
    let store = &ctx.access.store;
    let (rows, has_more, pending) = match &target.row {
        None => (Vec::new(), false, Vec::new()),
        Some(row) => {
            let page = match after_seq {
                Some(after) => store.history_after(row.id, after, limit, include_tools)?,
                None => store.history_tail(row.id, limit, include_tools)?,
            };
            let pending = if after_seq.is_none() { store.pending_inputs(row.id)? } else { Vec::new() };
            (page.messages, page.has_more, pending)
        }
    };
    let mut flags = Flags::default();
    let mut messages: Vec<Value> = rows.iter().map(|m| m.to_json()).collect();
    messages.extend(pending.into_iter().map(|p| {
        let (run_id, input, provenance, created) = (p.run_id, p.input, p.provenance, p.created_at);
        let mut m = json!({"role": "user", "pending": true, "runId": run_id, "timestamp": created,
                           "content": input.get("content").cloned().unwrap_or(Value::Null)});
        if let Some(p) = provenance {
            m["provenance"] = p;
        }
        m
    }));
    messages.iter_mut().for_each(|m| sanitize::sanitize_message(m, &mut flags));
    let fitted = sanitize::fit_budget(messages, sanitize::BUDGET_BYTES, after_seq.is_some());
    let dropped = fitted.dropped > 0 || fitted.oversized;
    let content_truncated = flags.content_truncated || fitted.oversized;
    let runs = match (&target.row, include_runs) {
        (Some(row), true) => Some(store.recent_runs(row.id, RUNS_SHOWN)?),
        (None, true) => Some(Vec::new()),
        _ => None,
    };
    Ok(HistoryOk {
        status: OkStatus::Ok,
        session_key: target.display,
        messages: fitted.messages,
        has_more: has_more || fitted.dropped > 0,
        truncated: dropped || content_truncated,
        dropped_messages: dropped,
        content_truncated,
        content_redacted: flags.content_redacted,
        bytes: fitted.bytes,
        limit_applied: super::limit_applied(clamped),
        runs,
    })
}
