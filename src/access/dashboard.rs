//! What the dashboard (`/ui`) may show a viewer, shaped as the page reads it. The operator sees
//! every session; a client or run token sees its own session's tree and reads transcripts by the
//! same rule as `sessions_history` — so a session outside that gets the answer a missing one gets.

use serde_json::{Value, json};

use super::caller::Caller;
use super::{Access, HistoryFrom, ToolError};
use crate::keys::{self, SessionKey, SessionRef};
use crate::policy::Action;
use crate::store::{LatestRun, RunStatus, Scope, TreeNode, UsageBucket, now_ms};

/// Who looks at the dashboard.
#[derive(Debug, Clone)]
pub enum Viewer {
    /// A `server.operatorTokens` bearer: everything, and every act.
    Operator,
    /// A client or run token (or the loopback `--as` session): what that session may see.
    Session(Box<Caller>),
}

/// How much one view holds (bounded whatever the store's size).
#[derive(Debug, Clone)]
pub struct ViewRequest {
    /// Matches a root's key, label or agent (operator).
    pub filter: Option<String>,
    pub roots: usize,
}

/// Descendants shown under one root; the rest are counted.
const PER_ROOT: usize = 50;
/// Runs shown of each kind (active, ended); deliveries and asks shown.
const RUNS: usize = 100;
const DELIVERIES: usize = 100;
const ASKS: usize = 100;
/// Messages in one transcript page.
const TRANSCRIPT_PAGE: usize = 200;
/// Characters of one message's text shown (the rest is said to be cut).
const MESSAGE_CHARS: usize = 20_000;
const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

impl Viewer {
    pub fn is_operator(&self) -> bool {
        matches!(self, Viewer::Operator)
    }

    /// The viewer as the dashboard names it (the session key, or "operator").
    pub fn name(&self) -> String {
        match self {
            Viewer::Operator => "operator".into(),
            Viewer::Session(c) => c.key.to_string(),
        }
    }
}

impl Access {
    /// The viewer's scope: None when its session has no row yet (nothing to show).
    fn scope_of(&self, viewer: &Viewer) -> Result<Option<Scope>, ToolError> {
        Ok(match viewer {
            Viewer::Operator => Some(Scope::All),
            Viewer::Session(caller) => self.own_row(caller)?.map(|row| Scope::Tree(row.id)),
        })
    }

    /// The whole view: trees, runs, the ledger, open asks, usage over the last two days (hourly)
    /// and month (daily).
    pub fn dashboard(&self, viewer: &Viewer, req: &ViewRequest) -> Result<Value, ToolError> {
        let mut view = json!({
            "viewer": {"name": viewer.name(), "operator": viewer.is_operator()},
            "generatedAt": now_ms(),
            "trees": {"rootsTotal": 0, "roots": []},
            "runs": [], "deliveries": [], "asks": [],
            "usage": {"hourly": [], "daily": []},
        });
        let Some(scope) = self.scope_of(viewer)? else { return Ok(view) };
        let store = &self.store;
        let filter = req.filter.as_deref().filter(|_| viewer.is_operator());
        let page = store.dashboard_trees(scope, filter, req.roots, PER_ROOT)?;
        let roots: Vec<Value> = page
            .roots
            .iter()
            .zip(&page.descendants)
            .map(|(root, (below, total))| tree_json(root, below, *total))
            .collect();
        view["trees"] = json!({"rootsTotal": page.roots_total, "roots": roots});
        view["runs"] = store.dashboard_runs(scope, RUNS)?.iter().map(run_json).collect();
        view["deliveries"] = deliveries_json(store.dashboard_deliveries(scope, DELIVERIES)?);
        view["asks"] = store.open_asks_in(scope, ASKS)?.iter().map(ask_json).collect();
        let now = now_ms();
        let usage =
            |since, bucket| -> Result<Vec<UsageBucket>, ToolError> { Ok(store.usage_over_time(scope, since, bucket)?) };
        view["usage"] = json!({
            "hourly": usage(now - 48 * HOUR, HOUR)?,
            "daily": usage(now - 30 * DAY, DAY)?,
        });
        Ok(view)
    }

    /// A mark that changes when anything a view shows may have (the live view's cheap check).
    pub fn dashboard_mark(&self) -> Result<String, ToolError> {
        Ok(self.store.dashboard_mark()?)
    }

    /// The session an operator names (any key form, or a sessionId).
    pub fn operator_row(&self, raw: &str) -> Result<crate::store::SessionRow, ToolError> {
        self.operator_lookup(raw)?.ok_or_else(|| ToolError::not_found(format!("Session not found: {raw}")))
    }

    fn operator_lookup(&self, raw: &str) -> Result<Option<crate::store::SessionRow>, ToolError> {
        let scope = crate::config::key_scope(&self.config, &self.config.default_agent());
        Ok(match keys::parse_ref(raw, &scope) {
            Ok(SessionRef::Key(key)) => self.store.session_by_key(&key)?,
            Ok(SessionRef::SessionId(id)) => self.store.sessions_by_session_id(&id)?.into_iter().next(),
            Err(e) => return Err(ToolError::invalid(format!("sessionKey {raw:?}: {e}"))),
        })
    }

    /// An ask by id, whoever's (the operator's answer).
    pub fn ask(&self, id: &str) -> Result<Option<crate::store::AskRow>, ToolError> {
        Ok(self.store.ask(id)?)
    }

    /// A page of one session's transcript (tool calls included), newest last, each message with
    /// who said it; `before` pages back. A session the viewer may not read is `not_found`, worded
    /// as for one that does not exist.
    pub fn dashboard_transcript(&self, viewer: &Viewer, raw: &str, before: Option<i64>) -> Result<Value, ToolError> {
        let row = match viewer {
            Viewer::Session(caller) => self.resolve(caller, Action::History, "sessionKey", raw)?.row,
            Viewer::Operator => self.operator_lookup(raw)?,
        };
        let Some(row) = row else {
            return Err(ToolError::not_found(format!("Session not found: {raw}")));
        };
        let from = before.map_or(HistoryFrom::Newest, HistoryFrom::Before);
        let page = self.history(&row, from, TRANSCRIPT_PAGE, true)?;
        let first = page.messages.first().map(|m| m.seq);
        let more_before = match first {
            Some(first) => self.history_around(&row, first, first, true)?.0,
            None => false,
        };
        let messages: Vec<Value> = page.messages.iter().map(message_json).collect();
        Ok(json!({
            "sessionKey": row.key.as_str(), "agent": row.agent_id.as_str(), "label": row.label,
            "messages": messages, "moreBefore": more_before, "firstSeq": first,
        }))
    }
}

/// A node's state in a word: its newest run's, `waiting` while that run has an open ask, `idle`
/// before any run.
fn node_state(run: Option<&LatestRun>, open_asks: i64) -> &'static str {
    let Some(run) = run else { return "idle" };
    match run.status {
        RunStatus::Running if open_asks > 0 => "waiting",
        RunStatus::Ok => "completed",
        RunStatus::Error => "failed",
        other => other.as_str(),
    }
}

/// The most of a task a row shows.
const TASK_CHARS: usize = 200;

/// A task as a row shows it: masked like every transcript text, its first [`TASK_CHARS`].
fn task_excerpt(task: Option<&str>) -> Option<String> {
    let task = crate::sanitize::run_text(task.map(str::trim).filter(|t| !t.is_empty()))?;
    let mut cut: String = task.chars().take(TASK_CHARS).collect();
    if cut.len() < task.len() {
        cut.push('…');
    }
    Some(cut)
}

fn run_fields(run: &LatestRun) -> Value {
    // Only for ended runs: a running one's ticks on the page, so the view does not change by itself.
    let runtime = run.started_at.zip(run.ended_at).map(|(s, e)| e - s);
    let error = crate::sanitize::run_text(run.error.as_deref());
    // Why a run that did not succeed ended, in one line: what a row shows without the transcript.
    let reason = error.as_deref().filter(|_| run.status.is_finished() && run.status != RunStatus::Ok).map(|e| {
        let first = e.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or(run.status.as_str());
        first.to_string()
    });
    json!({
        "runId": run.run_id, "mode": run.mode.as_str(), "status": run.status.as_str(),
        "createdAt": run.created_at, "startedAt": run.started_at, "endedAt": run.ended_at,
        "runtimeMs": runtime, "error": error, "reason": reason,
    })
}

fn node_json(n: &TreeNode) -> Value {
    let r = &n.row;
    json!({
        "key": r.key.as_str(), "label": r.label, "task": task_excerpt(n.task.as_deref()),
        "agent": r.agent_id.as_str(), "depth": r.spawn_depth,
        "parent": r.spawned_by.as_ref().map(SessionKey::as_str), "role": r.subagent_role,
        "state": node_state(n.run.as_ref(), n.open_asks), "run": n.run.as_ref().map(run_fields),
        "startedAt": n.first_started_at,
        "endedAt": n.run.as_ref().filter(|r| r.status.is_finished()).and_then(|r| r.ended_at),
        "tokens": {"in": r.tokens_in, "out": r.tokens_out}, "costUsd": r.cost,
        "budget": n.budget.as_ref().map(|b| b.to_json()), "openAsks": n.open_asks,
        "updatedAt": r.updated_at, "createdAt": r.created_at, "children": [],
    })
}

/// A root with its descendants nested under their parents; one whose parent fell outside the
/// page hangs under the root.
fn tree_json(root: &TreeNode, below: &[TreeNode], total: i64) -> Value {
    let mut nodes: Vec<Value> = below.iter().map(node_json).collect();
    // Deepest first, so a node is complete before it moves under its parent.
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(below[i].row.spawn_depth));
    let index: std::collections::HashMap<&str, usize> =
        below.iter().enumerate().map(|(i, n)| (n.row.key.as_str(), i)).collect();
    let mut top = Vec::new();
    for i in order {
        let node = std::mem::take(&mut nodes[i]);
        match below[i].row.spawned_by.as_ref().and_then(|p| index.get(p.as_str())) {
            Some(&parent) => nodes[parent]["children"].as_array_mut().expect("children").push(node),
            None => top.push((i, node)),
        }
    }
    // Siblings newest first, as the store gave them (within a parent they already are: the
    // depth sort is stable).
    top.sort_by_key(|(i, _)| *i);
    let mut root_json = node_json(root);
    root_json["children"] = Value::Array(top.into_iter().map(|(_, n)| n).collect());
    root_json["descendantsTotal"] = total.into();
    root_json["descendantsShown"] = below.len().into();
    root_json
}

fn run_json(line: &crate::store::RunLine) -> Value {
    let mut run = run_fields(&line.run);
    let state = node_state(Some(&line.run), line.open_asks);
    run["state"] = state.into();
    run["sessionKey"] = line.session_key.clone().into();
    run["label"] = json!(line.label);
    run["task"] = json!(task_excerpt(line.task.as_deref()));
    run["agent"] = line.agent_id.clone().into();
    run["requester"] = json!(line.requester);
    run["tokens"] = json!({"in": line.tokens_in, "out": line.tokens_out});
    run["costUsd"] = json!(line.cost);
    run["deliveries"] = deliveries_json(line.deliveries.clone());
    run
}

/// Ledger rows with their session's task as a row shows it.
fn deliveries_json(mut lines: Vec<crate::store::DeliveryLine>) -> Value {
    for d in &mut lines {
        d.task = task_excerpt(d.task.as_deref());
    }
    serde_json::to_value(lines).unwrap_or_default()
}

fn ask_json(a: &crate::store::AskRow) -> Value {
    let words = crate::sanitize::ask_words(&a.text, a.options.as_ref(), a.details.as_ref());
    json!({
        "requestId": a.id, "sessionKey": a.child.as_str(), "runId": a.run_id, "kind": a.kind.as_str(),
        "text": words.text, "options": words.options, "details": words.details, "askedOf": a.target.as_str(),
        "createdAt": a.created_at, "deadlineAt": a.deadline_at, "routes": a.routes,
    })
}

/// Who said a message: the session's own agent, a person (the operator, a channel user), another
/// session, or the system.
fn speaker(m: &crate::store::MessageRow) -> Value {
    let p = m.provenance.as_ref();
    let field = |k: &str| p.and_then(|p| p.get(k)).cloned().unwrap_or(Value::Null);
    match (m.role.as_str(), p.and_then(|p| p["kind"].as_str())) {
        ("assistant", _) => json!({"kind": "agent"}),
        ("toolResult", _) => json!({"kind": "tool"}),
        (_, Some("inter_session")) => {
            json!({"kind": "session", "session": field("sourceSessionKey"), "via": field("sourceTool")})
        }
        (_, Some("internal_system")) => json!({"kind": "system", "via": field("sourceTool")}),
        (_, Some("external_user")) => json!({
            "kind": "user", "via": field("sourceTool"), "channel": field("sourceChannel"),
            "name": field("senderName"), "sender": field("senderId"),
        }),
        ("system", _) => json!({"kind": "system"}),
        _ => json!({"kind": "user"}),
    }
}

fn message_json(m: &crate::store::MessageRow) -> Value {
    let mut flags = crate::sanitize::Flags::default();
    let text = crate::sanitize::whole_text(&m.content, &mut flags);
    let total = text.chars().count();
    let shown: String = text.chars().take(MESSAGE_CHARS).collect();
    json!({
        "seq": m.seq, "role": m.role, "timestamp": m.timestamp, "runId": m.run_id, "text": shown,
        "cut": (total > MESSAGE_CHARS).then_some(total), "redacted": flags.content_redacted,
        "from": speaker(m), "silent": m.silent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_run_with_an_open_ask_is_waiting_and_words_follow_the_status() {
        let run = |status| LatestRun {
            run_id: "r".into(),
            mode: crate::store::RunMode::Spawn,
            status,
            created_at: 0,
            started_at: Some(1),
            ended_at: None,
            error: None,
        };
        assert_eq!(node_state(None, 0), "idle");
        assert_eq!(node_state(Some(&run(RunStatus::Running)), 1), "waiting");
        assert_eq!(node_state(Some(&run(RunStatus::Running)), 0), "running");
        assert_eq!(node_state(Some(&run(RunStatus::Ok)), 0), "completed");
        assert_eq!(node_state(Some(&run(RunStatus::Error)), 0), "failed");
        assert_eq!(node_state(Some(&run(RunStatus::BudgetExceeded)), 0), "budget_exceeded");
    }
}
