//! `subagents`: see, wait for and cancel the sub-agents the caller started, in one tool with an
//! `action` (so that the set stays small).
//!
//! - `list`: the caller's spawned tree, newest first, paged within the answer budget, with each
//!   child's run state, announce state, times, tokens, cost and last activity, and totals.
//! - `wait`: returns as soon as one (`until: "any"`) or all of the children finished, with each
//!   finished child's outcome inline (the announce's Status / Result / Notes / Stats), which
//!   marks that announce `read`; on timeout `status: "timeout"` with what still runs.
//! - `cancel`: stops a child's work (and with `cascade` its descendants'), answers how it ended.
//! - `steer`: a message for a running child: into its running turn when its agent can take it,
//!   else as its next turn (`targetDisposition: "steered" | "queued"`).
//!
//! The tool resolves every key among the caller's descendants (`Access::subagent`): any other key
//! is answered exactly as one that does not exist.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use super::args::{ArgReader, Bounds};
use super::{Ctx, Output, ToolError, ToolSpec};
use crate::access::{AnnounceState, AnsweredVia, AskDecision, AskRow, Child, RunState, SessionRow};
use crate::engine::ask::{Pending, Responded};
use crate::engine::steer::{Disposition, SteerRequest};
use crate::engine::subagents::{CancelOutcome, Until, WaitOutcome};
use crate::policy::Answerer;
use crate::policy::ToolName;
use crate::policy::budget::Account;
use crate::sanitize::json_len;

pub const DEFAULT_LIMIT: u64 = 20;
pub const MAX_LIMIT: u64 = 100;
pub const DEFAULT_WAIT_SECONDS: u64 = 30;
pub const MAX_WAIT_SECONDS: u64 = 600;
/// Children one wait may name.
pub const MAX_WAIT_CHILDREN: usize = 50;
/// Characters of a child's last message in `lastActivity`.
const ACTIVITY_CHARS: usize = 160;

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub struct Params {
    /// list | wait | cancel | steer | respond (required).
    action: Action,
    /// list: rows per page (1-100, default 20; larger values are clamped and reported in limitApplied).
    #[schemars(range(min = 1))]
    limit: Option<f64>,
    /// list: the nextCursor of a previous list answer.
    cursor: Option<String>,
    /// wait: the children to wait for (at most 50; default: your direct children whose outcome you have not read yet).
    child_session_keys: Option<Vec<String>>,
    /// wait: any (default: return when one of them finished) | all (when all of them finished).
    until: Option<WaitUntil>,
    /// wait: how long to wait, in seconds (default 30, 0 = look once and return, at most 600).
    #[schemars(range(min = 0))]
    timeout_seconds: Option<f64>,
    /// cancel, steer: the sub-agent (its session key).
    child_session_key: Option<String>,
    /// cancel: also cancel its own sub-agents (default true).
    cascade: Option<bool>,
    /// steer: what to tell the running sub-agent (non-empty, at most 64 KiB).
    message: Option<String>,
    /// steer: pass the same key again to get the first steer's answer instead of steering twice.
    idempotency_key: Option<String>,
    /// respond: the requestId of a sub-agent's open question or approval (from list, wait or your session).
    request_id: Option<String>,
    /// respond: allow | deny.
    decision: Option<RespondDecision>,
    /// respond: your answer in words (a question's answer; why you deny).
    text: Option<String>,
}

#[derive(JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
enum RespondDecision {
    Allow,
    Deny,
}

#[derive(JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
enum Action {
    List,
    Wait,
    Cancel,
    Steer,
    Respond,
}

#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WaitUntil {
    Any,
    All,
}

/// Which arguments each action takes; any other is refused naming the action.
const ARGS: [(&str, &[&str]); 5] = [
    ("list", &["limit", "cursor"]),
    ("wait", &["childSessionKeys", "until", "timeoutSeconds"]),
    ("cancel", &["childSessionKey", "cascade"]),
    ("steer", &["childSessionKey", "message", "idempotencyKey"]),
    ("respond", &["requestId", "decision", "text"]),
];

/// A `subagents` answer: one shape per action.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum SubagentsOk {
    List(ListOk),
    Wait(WaitOk),
    Cancel(CancelOk),
    Steer(SteerOk),
    Respond(RespondOk),
}

#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ListAction {
    List,
}

#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WaitAction {
    Wait,
}

#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CancelAction {
    Cancel,
}

#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SteerAction {
    Steer,
}

#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RespondAction {
    Respond,
}

/// A sub-agent's open question or approval.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    /// Pass it to subagents {action: "respond"}.
    pub request_id: String,
    pub child_session_key: String,
    /// approval | question.
    pub kind: String,
    pub text: String,
    /// The choices it offers, when it offers some.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<Vec<String>>,
    /// What it is about (for an approval: the tool and its input).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub details: Option<Value>,
    /// When it is answered by agents.defaults.subagents.approvals.onTimeout, ms since the epoch.
    pub expires_at: i64,
    /// Who it waits for: "you" (answer it with respond) or "person" (an approval a person decides
    /// — at your host, or the operator — or that policy keeps from you: tell the user, and wait).
    pub waits_for: WaitsFor,
    /// For an approval: why it waits for whom it waits for (which person is asked, or why you may
    /// answer: no person was asked, the host answered by itself, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// Who an open request waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WaitsFor {
    /// You may answer it (subagents respond).
    You,
    /// A person decides it; do not answer it.
    Person,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RespondOk {
    pub status: ListStatus,
    pub action: RespondAction,
    pub request_id: String,
    pub child_session_key: String,
    /// allow | deny.
    pub decision: String,
    pub note: String,
}

#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ListStatus {
    Ok,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListOk {
    pub status: ListStatus,
    pub action: ListAction,
    pub count: usize,
    /// Your descendants (children, their children, …), newest first.
    pub children: Vec<ChildRow>,
    /// Over your whole tree, not only this page.
    pub totals: Totals,
    /// Your own budget, which your children's budgets are reserved from: {limit, spent, reserved,
    /// remaining, exceeded?, unmetered?} over its limited dimensions (tokens, costUsd,
    /// runtimeSeconds). Absent when you have none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub budget: Option<Value>,
    /// More children than returned; pass nextCursor to continue.
    pub has_more: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// Arguments that were clamped to their maximum: name → applied value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_applied: Option<Map<String, Value>>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChildRow {
    pub session_key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The session that spawned it.
    pub parent: String,
    /// 1 for your own children, 2 for theirs, …
    pub depth: i64,
    pub agent_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub run_state: RunState,
    /// Where its announce is, apart from its run state.
    pub announce: AnnounceState,
    /// Its spawn run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// ms since the epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<i64>,
    /// From its start to its end, or to now while it is unfinished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_ms: Option<i64>,
    pub tokens: Tokens,
    /// Estimated cost so far, in USD, when its agent reports one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// The start of its last message (redacted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_activity: Option<String>,
    /// Its questions and approvals waiting for an answer (answer with action "respond").
    pub pending_requests: Vec<Request>,
    /// Its own budget: {limit, spent, reserved, remaining, exceeded?, unmetered?}. Absent when it
    /// has none (it then shares its parent's, if any).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub budget: Option<Value>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tokens {
    pub input: i64,
    pub output: i64,
    pub total: i64,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    pub children: i64,
    /// Children whose work has not been announced yet.
    pub unfinished: i64,
    pub tokens: Tokens,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
}

#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WaitStatus {
    /// The condition held.
    Ok,
    /// The timeout passed first (not an error): `unfinished` still runs.
    Timeout,
    /// A sub-agent asks something: answer the `requests` that wait for you with action
    /// "respond"; tell the user of those that wait for a person; then wait again.
    Attention,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaitOk {
    pub status: WaitStatus,
    pub action: WaitAction,
    pub until: WaitUntil,
    /// The children that finished, each with its outcome; returning it marked its announce read.
    pub finished: Vec<Finished>,
    /// The children still at work.
    pub unfinished: Vec<Unfinished>,
    /// Questions and approvals from your tree that wait for your answer.
    pub requests: Vec<Request>,
    pub waited_ms: u64,
    pub note: String,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Finished {
    pub child_session_key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub run_state: RunState,
    pub announce: AnnounceState,
    /// What its announce carried: Status / Result / Notes / Stats.
    pub outcome: String,
    /// The outcome was cut to fit the answer budget: its transcript has it whole
    /// (sessions_history {sessionKey: childSessionKey}).
    pub outcome_truncated: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Unfinished {
    pub child_session_key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub run_state: RunState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_ms: Option<i64>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CancelOk {
    pub status: ListStatus,
    pub action: CancelAction,
    pub child_session_key: String,
    /// After the cancel: `cancelled`, or what it had ended with; `running` while it still stops.
    pub run_state: RunState,
    pub announce: AnnounceState,
    /// The sessions whose unfinished work this call stopped (the child first, then its descendants).
    pub cancelled: Vec<String>,
    /// It had ended before: nothing changed (cancelling again is safe).
    pub already_ended: bool,
    pub note: String,
}

/// Where a steer went (the reference's `targetDisposition`).
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TargetDisposition {
    /// Into the running turn: the agent acts on it now; the message is in its transcript.
    Steered,
    /// Its agent cannot take it mid-turn (or nothing runs): it is the child's next turn.
    Queued,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SteerOk {
    pub status: ListStatus,
    pub action: SteerAction,
    pub child_session_key: String,
    pub target_disposition: TargetDisposition,
    /// The run that took it, or the run it became.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    pub note: String,
}

pub fn spec() -> ToolSpec {
    ToolSpec::of::<Params, SubagentsOk>(
        ToolName::Subagents,
        "Sub-agents",
        "Manage the sub-agents you started with sessions_spawn. action \"list\": your tree with each \
         child's runState, announce state, runtime, tokens and cost. action \"wait\": block until \
         one (until \"any\") or all of your children finished and get their outcomes \
         (Status/Result/Notes) inline — use this instead of polling sessions_history. action \
         \"cancel\": stop a child (cascade: its sub-agents too). action \"steer\": add instructions \
         to a running child (into its current turn when its agent supports it, else its next turn). \
         action \"respond\": answer a child's question or approval (wait returns status \"attention\" with them).",
        false,
    )
}

pub async fn run(ctx: &Ctx<'_>, args: Option<Map<String, Value>>) -> Output<SubagentsOk> {
    act(ctx, args).await.into()
}

async fn act(ctx: &Ctx<'_>, args: Option<Map<String, Value>>) -> Result<SubagentsOk, ToolError> {
    let mut a = super::reader(ToolName::Subagents, args)?;
    let action = a.req_choice("action", &ARGS.map(|(name, _)| name))?;
    let takes = ARGS.iter().find(|(name, _)| *name == action).map(|(_, takes)| *takes).unwrap_or_default();
    if let Some(other) = ARGS.iter().flat_map(|(_, names)| names.iter()).find(|n| a.has(n) && !takes.contains(n)) {
        return Err(ToolError::invalid(format!(
            "{other} is not an argument of action {action:?}; it takes: {}",
            if takes.is_empty() { "nothing else".to_string() } else { takes.join(", ") }
        )));
    }
    match action {
        "list" => list(ctx, a).map(SubagentsOk::List),
        "wait" => wait(ctx, a).await.map(SubagentsOk::Wait),
        "cancel" => cancel(ctx, a).await.map(SubagentsOk::Cancel),
        "steer" => steer(ctx, a).await.map(SubagentsOk::Steer),
        _ => respond(ctx, a).map(SubagentsOk::Respond),
    }
}

// ---- list ---------------------------------------------------------------------------------------

fn list(ctx: &Ctx, mut a: ArgReader) -> Result<ListOk, ToolError> {
    let limit = a.opt_number("limit", Bounds { min: 1, max: MAX_LIMIT })?.unwrap_or(DEFAULT_LIMIT) as usize;
    let before = a.opt_string("cursor", 256)?.map(|c| decode_cursor(&c)).transpose()?;
    let clamped = a.finish()?;
    let access = ctx.access;
    let page = access.subagent_page(ctx.caller, before, limit + 1)?;
    let has_more = page.len() > limit;
    let shown: Vec<&Child> = page.iter().take(limit).collect();
    let activity = access.last_messages(&shown.iter().map(|c| c.row.clone()).collect::<Vec<_>>(), 1)?;
    let children: Vec<ChildRow> =
        shown.iter().zip(activity).map(|(c, last)| child_row(ctx, c, last.first().map(|m| &m.content))).collect();
    let t = access.subagent_totals(ctx.caller)?;
    let mut ok = ListOk {
        status: ListStatus::Ok,
        action: ListAction::List,
        count: children.len(),
        next_cursor: (has_more && !children.is_empty()).then(|| encode_cursor(shown[children.len() - 1].row.id)),
        children,
        totals: Totals {
            children: t.sessions,
            unfinished: t.unfinished,
            tokens: Tokens {
                input: t.tokens_in,
                output: t.tokens_out,
                total: t.tokens_in.saturating_add(t.tokens_out),
            },
            cost: t.cost,
        },
        budget: access.own_budget(ctx.caller)?.map(|a| a.to_json()),
        has_more,
        limit_applied: super::limit_applied(clamped),
    };
    // Rows that do not fit the budget are on the next page (one row always stays).
    let budget = access.config().tools.sessions.max_result_bytes;
    while json_len(&ok) > budget && ok.children.len() > 1 {
        ok.children.pop();
        ok.count = ok.children.len();
        ok.has_more = true;
        ok.next_cursor = Some(encode_cursor(shown[ok.count - 1].row.id));
    }
    Ok(ok)
}

fn child_row(ctx: &Ctx, c: &Child, last: Option<&Value>) -> ChildRow {
    let scope = ctx.access.scope(ctx.caller);
    let row = &c.row;
    ChildRow {
        session_key: scope.display(&row.key),
        label: row.label.clone(),
        parent: row.spawned_by.as_ref().map(|p| scope.display(p)).unwrap_or_default(),
        depth: row.spawn_depth,
        agent_id: row.agent_id.to_string(),
        model: row.model.clone(),
        run_state: c.state,
        announce: c.announce,
        run_id: row.spawn_run.clone(),
        started_at: c.started_at(),
        ended_at: c.ended_at(),
        runtime_ms: c.runtime_ms(),
        tokens: Tokens {
            input: row.tokens_in,
            output: row.tokens_out,
            total: row.tokens_in.saturating_add(row.tokens_out),
        },
        cost: row.cost,
        last_activity: last.map(|m| crate::sanitize::redact(&crate::sanitize::preview(m, ACTIVITY_CHARS)).0),
        pending_requests: c.open_asks.iter().map(|a| request(ctx, &pending(ctx, a))).collect(),
        budget: c.budget.as_ref().map(Account::to_json),
    }
}

/// The ask with who may answer it, as the caller at its host sees it.
fn pending(ctx: &Ctx, ask: &AskRow) -> Pending {
    crate::engine::ask::pending(ctx.access.config(), &ctx.caller.key, ctx.host(), ask.clone())
}

fn request(ctx: &Ctx, p: &Pending) -> Request {
    let a = &p.ask;
    let words = crate::sanitize::ask_words(&a.text, a.options.as_ref(), a.details.as_ref());
    Request {
        request_id: a.id.clone(),
        child_session_key: ctx.access.scope(ctx.caller).display(&a.child),
        kind: a.kind.as_str().into(),
        text: words.text,
        options: words
            .options
            .as_ref()
            .and_then(Value::as_array)
            .map(|o| o.iter().map(|v| v.as_str().map_or_else(|| v.to_string(), String::from)).collect()),
        details: words.details.filter(Value::is_object),
        expires_at: a.deadline_at,
        waits_for: match p.who {
            Answerer::Model => WaitsFor::You,
            Answerer::Person => WaitsFor::Person,
        },
        why: p.why.clone(),
    }
}

/// A list cursor: the row id to continue below.
fn encode_cursor(id: i64) -> String {
    URL_SAFE_NO_PAD.encode(format!("below:{id}"))
}

fn decode_cursor(raw: &str) -> Result<i64, ToolError> {
    let bad = || ToolError::invalid("cursor is not a cursor of subagents list; pass nextCursor as it was given");
    let bytes = URL_SAFE_NO_PAD.decode(raw).map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    text.strip_prefix("below:").and_then(|n| n.parse().ok()).ok_or_else(bad)
}

// ---- wait ---------------------------------------------------------------------------------------

async fn wait(ctx: &Ctx<'_>, mut a: ArgReader) -> Result<WaitOk, ToolError> {
    let keys = a.opt_string_list("childSessionKeys", MAX_WAIT_CHILDREN)?;
    let until = match a.opt_choice("until", &["any", "all"])? {
        Some("all") => WaitUntil::All,
        _ => WaitUntil::Any,
    };
    let timeout = a.opt_number("timeoutSeconds", Bounds { min: 0, max: MAX_WAIT_SECONDS })?;
    a.finish()?;
    let access = ctx.access;
    let rows: Vec<SessionRow> = match keys {
        Some(keys) if keys.is_empty() => {
            return Err(ToolError::invalid("childSessionKeys is empty; name at least one child, or leave it out"));
        }
        Some(keys) => dedup_rows(keys.iter().map(|k| access.subagent(ctx.caller, "childSessionKeys", k)))?,
        None => access.unconsumed_children(ctx.caller)?.into_iter().map(|c| c.row).collect(),
    };
    if rows.is_empty() && access.asks_for(ctx.caller)?.is_empty() {
        return Ok(WaitOk {
            status: WaitStatus::Ok,
            action: WaitAction::Wait,
            until,
            finished: Vec::new(),
            unfinished: Vec::new(),
            requests: Vec::new(),
            waited_ms: 0,
            note:
                "You have no children whose outcome you have not read; subagents {\"action\": \"list\"} shows them all."
                    .into(),
        });
    }
    let started = std::time::Instant::now();
    let timeout = Duration::from_secs(timeout.unwrap_or(DEFAULT_WAIT_SECONDS));
    let engine_until = match until {
        WaitUntil::Any => Until::Any,
        WaitUntil::All => Until::All,
    };
    let Some(outcome) =
        ctx.engine().wait_subagents(ctx.caller, ctx.host(), &rows, engine_until, timeout, &ctx.cancel).await?
    else {
        return Err(ToolError::error("the wait was cancelled before it returned; no outcome was consumed"));
    };
    Ok(wait_answer(ctx, until, outcome, started.elapsed()))
}

/// The rows of the named children, each once, in the order named.
fn dedup_rows(rows: impl Iterator<Item = Result<SessionRow, ToolError>>) -> Result<Vec<SessionRow>, ToolError> {
    let mut out: Vec<SessionRow> = Vec::new();
    for row in rows {
        let row = row?;
        if !out.iter().any(|r| r.id == row.id) {
            out.push(row);
        }
    }
    Ok(out)
}

fn wait_answer(ctx: &Ctx, until: WaitUntil, outcome: WaitOutcome, waited: Duration) -> WaitOk {
    let scope = ctx.access.scope(ctx.caller);
    let finished = outcome
        .finished
        .iter()
        .map(|c| Finished {
            child_session_key: scope.display(&c.row.key),
            label: c.row.label.clone(),
            run_state: c.state,
            // Returning it is what consumed it.
            announce: if c.announce == AnnounceState::Delivered { AnnounceState::Read } else { c.announce },
            outcome: outcome_text(c),
            outcome_truncated: false,
        })
        .collect();
    let unfinished: Vec<Unfinished> = outcome
        .unfinished
        .iter()
        .map(|c| Unfinished {
            child_session_key: scope.display(&c.row.key),
            label: c.row.label.clone(),
            run_state: c.state,
            runtime_ms: c.runtime_ms(),
        })
        .collect();
    let requests: Vec<Request> = outcome.attention.iter().map(|p| request(ctx, p)).collect();
    let yours = requests.iter().any(|r| r.waits_for == WaitsFor::You);
    let note = match (outcome.timed_out, unfinished.is_empty()) {
        _ if yours => {
            "A sub-agent asks you something: answer each of `requests` whose waitsFor is \"you\" with subagents {\"action\": \"respond\", \"requestId\", \"decision\"}, then wait again."
        }
        _ if !requests.is_empty() => {
            "A sub-agent waits for a person's approval (see each request's why): tell the user it waits for them, and do not answer it yourself. Wait again: the wait returns when it is answered or something changes."
        }
        (true, _) => "Timed out with children still at work; wait again, or cancel the ones you no longer need.",
        (false, true) => "Every child you waited for has finished.",
        (false, false) => "Some children are still at work; wait again for the rest.",
    };
    let status = match (requests.is_empty(), outcome.timed_out) {
        (false, _) => WaitStatus::Attention,
        (true, true) => WaitStatus::Timeout,
        (true, false) => WaitStatus::Ok,
    };
    let mut ok = WaitOk {
        status,
        action: WaitAction::Wait,
        until,
        finished,
        unfinished,
        requests,
        waited_ms: waited.as_millis() as u64,
        note: note.into(),
    };
    fit_outcomes(&mut ok, ctx.access.config().tools.sessions.max_result_bytes);
    ok
}

/// A finished child's outcome: the text its announce carried (masked like its transcript, since
/// it is the child's reply), or — when it stayed silent, or the announce predates the stored
/// text — its run state.
fn outcome_text(c: &Child) -> String {
    if let Some(text) = c.announce_row.as_ref().and_then(|a| crate::sanitize::run_text(a.text.as_deref())) {
        return text;
    }
    let state = serde_json::to_value(c.state).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
    match c.announce {
        AnnounceState::Skipped => format!("Status: {state}\n(no announce: the child asked for silence)"),
        _ => format!("Status: {state}"),
    }
}

/// Cuts the longest outcomes until the answer fits the budget (an outcome too long for even a
/// cut goes whole; the child's transcript keeps it).
fn fit_outcomes(ok: &mut WaitOk, budget: usize) {
    loop {
        let size = json_len(ok);
        if size <= budget {
            return;
        }
        let candidates = ok.finished.iter_mut().filter(|f| !f.outcome.is_empty());
        let Some(longest) = candidates.max_by_key(|f| f.outcome.len()) else { return };
        let room = json_len(&longest.outcome).saturating_sub(size - budget + 64);
        longest.outcome =
            if room < 64 { String::new() } else { crate::sanitize::cut_to_json_len(&longest.outcome, room) };
        longest.outcome_truncated = true;
    }
}

// ---- cancel -------------------------------------------------------------------------------------

async fn cancel(ctx: &Ctx<'_>, mut a: ArgReader) -> Result<CancelOk, ToolError> {
    let raw = a.req_key("childSessionKey", 512)?;
    let cascade = a.opt_bool("cascade")?.unwrap_or(true);
    a.finish()?;
    let row = ctx.access.subagent(ctx.caller, "childSessionKey", &raw)?;
    let outcome = ctx.engine().cancel_subagent(ctx.caller, row, cascade, &ctx.cancel).await?;
    Ok(cancel_answer(ctx, outcome))
}

fn cancel_answer(ctx: &Ctx, outcome: CancelOutcome) -> CancelOk {
    let scope = ctx.access.scope(ctx.caller);
    let c = &outcome.child;
    let note = if outcome.already_ended {
        "It had already ended; nothing changed."
    } else if c.state == RunState::Cancelled {
        "Cancelled. Its announce (Status: cancelled) reaches you as usual."
    } else {
        "Cancel requested; it is still stopping. Its announce (Status: cancelled) reaches you when it has."
    };
    CancelOk {
        status: ListStatus::Ok,
        action: CancelAction::Cancel,
        child_session_key: scope.display(&c.row.key),
        run_state: c.state,
        announce: c.announce,
        cancelled: outcome.cancelled.iter().map(|k| scope.display(k)).collect(),
        already_ended: outcome.already_ended,
        note: note.into(),
    }
}

// ---- steer --------------------------------------------------------------------------------------

async fn steer(ctx: &Ctx<'_>, mut a: ArgReader) -> Result<SteerOk, ToolError> {
    let raw = a.raw();
    let key = a.req_key("childSessionKey", 512)?;
    let message = a.req_string("message", super::sessions_spawn::MAX_TASK_BYTES)?;
    let idempotency_key = a.opt_string("idempotencyKey", 256)?;
    a.finish()?;
    let row = ctx.access.subagent(ctx.caller, "childSessionKey", &key)?;
    let child = ctx.access.child(row)?;
    let display = ctx.access.scope(ctx.caller).display(&child.row.key);
    // A retry of a steer that was made re-attaches to it whatever the child did since.
    let retry = match &idempotency_key {
        Some(k) => ctx.access.idempotency(&ctx.caller.key, k)?.is_some(),
        None => false,
    };
    if child.state.is_finished() && !retry {
        let state = serde_json::to_value(child.state).unwrap_or_default();
        return Err(ToolError::invalid(format!(
            "childSessionKey {display} has ended ({}); steer reaches only unfinished sub-agents — send it a message with sessions_send, or spawn a new one",
            state.as_str().unwrap_or_default()
        )));
    }
    let request = SteerRequest { text: &message, idempotency_key: idempotency_key.as_deref(), raw: &raw };
    let steered = ctx.engine().steer_subagent(ctx.caller, &child, &request, &ctx.cancel).await?;
    let (target_disposition, note) = match steered.disposition {
        Disposition::Steered => (TargetDisposition::Steered, "Delivered into its running turn; it acts on it now."),
        Disposition::Queued if steered.joined => (
            TargetDisposition::Queued,
            "Its agent cannot take a message mid-turn: it joined the child's next turn, already queued with your earlier steer(s) and not started yet; the child gets them together, in order, and announces after it.",
        ),
        Disposition::Queued => (
            TargetDisposition::Queued,
            "Its agent cannot take a message mid-turn (or no turn runs): it is the child's next turn, and the child announces after it.",
        ),
    };
    Ok(SteerOk {
        status: ListStatus::Ok,
        action: SteerAction::Steer,
        child_session_key: display,
        target_disposition,
        run_id: steered.run_id,
        note: note.into(),
    })
}

// ---- respond ------------------------------------------------------------------------------------

fn respond(ctx: &Ctx, mut a: ArgReader) -> Result<RespondOk, ToolError> {
    let id = a.req_string("requestId", 64)?;
    let decision = match a.req_choice("decision", &["allow", "deny"])? {
        "allow" => AskDecision::Allow,
        _ => AskDecision::Deny,
    };
    let text = a.opt_string("text", super::sessions_spawn::MAX_TASK_BYTES)?;
    a.finish()?;
    let ask = ctx.access.ask_in_tree(ctx.caller, &id)?;
    let scope = ctx.access.scope(ctx.caller);
    match ctx.engine().respond(ctx.caller, &ask, decision, text.as_deref(), AnsweredVia::Subagents, ctx.host())? {
        Responded::Answered(ask) => Ok(RespondOk {
            status: ListStatus::Ok,
            action: RespondAction::Respond,
            request_id: ask.id.clone(),
            child_session_key: scope.display(&ask.child),
            decision: decision.as_str().into(),
            note: "Answered; the sub-agent continues with it.".into(),
        }),
        Responded::AlreadyAnswered(ask) => Err(ToolError::invalid(format!(
            "requestId {id} {}; your answer was not used",
            crate::engine::ask::closed_how(&ask)
        ))),
    }
}
