//! The caller's spawned tree, as the `subagents` tool sees it: which descendants it has, what
//! each one's work is doing, and where its announce is. Lineage decides: a caller manages exactly
//! the sessions it or its descendants spawned (the spawn tree, `session_tree`), whatever
//! `tools.sessions.visibility` says of listing; any other key gets the answer a key that does
//! not exist gets, byte for byte.

use schemars::JsonSchema;
use serde::Serialize;

use super::{Access, ToolError};
use crate::access::caller::Caller;
use crate::keys::SessionRef;
use crate::policy::budget::{Account, Limits};
use crate::store::{
    AnnounceRow, AskRow, AskState, ChildRows, DeliveryStatus, RunRow, RunStatus, SessionRow, TreeTotals, now_ms,
};

/// Where a child's work is. Kept apart from where its announce is ([`AnnounceState`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Admitted, waiting for a slot (agents.defaults.subagents.maxConcurrent).
    Queued,
    /// A run of the child is running (its task, a completion of its own child, its Notes step).
    Running,
    /// It waits: for its children before it announces, or for the answer to a question it asked.
    Waiting,
    Completed,
    Failed,
    TimedOut,
    Cancelled,
    /// Its run's owner died; it was never re-run.
    Interrupted,
    /// Stopped because its budget (or the one it shares) was spent.
    BudgetExceeded,
    /// A thread-bound session child between turns: its task announced, it waits for its thread's
    /// follow-ups until idle too long.
    Idle,
}

impl RunState {
    pub fn is_finished(self) -> bool {
        !matches!(self, RunState::Queued | RunState::Running | RunState::Waiting)
    }

    fn ended(status: RunStatus) -> RunState {
        match status {
            RunStatus::Queued => RunState::Queued,
            RunStatus::Running => RunState::Running,
            RunStatus::Ok => RunState::Completed,
            RunStatus::Error => RunState::Failed,
            RunStatus::Timeout => RunState::TimedOut,
            RunStatus::Cancelled => RunState::Cancelled,
            RunStatus::Interrupted => RunState::Interrupted,
            RunStatus::BudgetExceeded => RunState::BudgetExceeded,
        }
    }
}

/// Where a child's announce is: not made yet, on its way, delivered, consumed by its requester.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AnnounceState {
    /// The child has not finished.
    Pending,
    Queued,
    /// In the requester's session (its inbox, or a completion run there).
    Delivered,
    /// The requester consumed it: a `wait` returned it, its history showed it, or its completion
    /// run ended.
    Read,
    /// Not delivered on purpose: the child asked for silence (ANNOUNCE_SKIP), or its requester
    /// was cancelled.
    Skipped,
    Failed,
}

/// One descendant with what its work and announce are.
#[derive(Debug, Clone)]
pub struct Child {
    pub row: SessionRow,
    pub spawn_run: Option<RunRow>,
    /// The run that decided its outcome (its spawn run, or the last completion run it took).
    pub last_work: Option<RunRow>,
    pub state: RunState,
    pub announce: AnnounceState,
    pub announce_row: Option<AnnounceRow>,
    /// Its questions and approvals no one has answered yet.
    pub open_asks: Vec<AskRow>,
    /// Its own budget account, when it was spawned with one.
    pub budget: Option<Account>,
}

impl Child {
    pub fn started_at(&self) -> Option<i64> {
        self.spawn_run.as_ref().and_then(|r| r.started_at)
    }

    /// From its start to its end, or to now while it is unfinished (None before it started).
    pub fn runtime_ms(&self) -> Option<i64> {
        let started = self.started_at()?;
        Some((self.ended_at().unwrap_or_else(now_ms) - started).max(0))
    }

    /// When its work ended (None while it is unfinished).
    pub fn ended_at(&self) -> Option<i64> {
        if !self.state.is_finished() {
            return None;
        }
        self.last_work.as_ref().and_then(|r| r.ended_at).or(self.row.announced_at)
    }
}

impl Access {
    /// Deleted children stay in their requester's tree until `archiveAfterMinutes` after their
    /// deletion (≤ 0: always), as they stay readable.
    fn deleted_since(&self) -> i64 {
        let minutes = self.config.agents.defaults.subagents.archive_after_minutes;
        if minutes <= 0.0 { i64::MIN } else { now_ms() - (minutes * 60_000.0) as i64 }
    }

    /// Resolves `raw` (a key or sessionId) to one of the caller's descendants. A key outside the
    /// caller's tree is answered as if it did not exist.
    pub fn subagent(&self, caller: &Caller, field: &str, raw: &str) -> Result<SessionRow, ToolError> {
        let since = self.deleted_since();
        let shown = |row: &SessionRow| row.deleted_at.is_none_or(|d| d >= since);
        match self.parse_ref(caller, field, raw)? {
            SessionRef::Key(key) => {
                let display = self.scope(caller).display(&key);
                let row = if key != caller.key && self.store.is_ancestor(&caller.key, &key)? {
                    self.store.session_by_key(&key)?.filter(shown)
                } else {
                    None
                };
                row.ok_or_else(|| not_a_subagent(&display))
            }
            SessionRef::SessionId(id) => {
                let mut found = Vec::new();
                for row in self.store.sessions_by_session_id(&id)? {
                    if shown(&row) && self.store.is_ancestor(&caller.key, &row.key)? {
                        found.push(row);
                    }
                }
                match found.len() {
                    0 => Err(not_a_subagent(&id)),
                    1 => Ok(found.remove(0)),
                    _ => Err(ToolError::invalid(format!(
                        "{field} {id:?} names several of your sub-agents; pass the session key instead"
                    ))),
                }
            }
        }
    }

    /// A page of the caller's descendants, newest first, below row id `before`.
    pub fn subagent_page(&self, caller: &Caller, before: Option<i64>, limit: usize) -> Result<Vec<Child>, ToolError> {
        let rows = self.store.descendants(&caller.key, before, limit, self.deleted_since())?;
        rows.into_iter().map(|r| self.child(r)).collect()
    }

    /// Counts and sums over the caller's whole tree.
    pub fn subagent_totals(&self, caller: &Caller) -> Result<TreeTotals, ToolError> {
        Ok(self.store.tree_totals(&caller.key, self.deleted_since())?)
    }

    /// The caller's direct children whose outcome it has not consumed: unfinished, or finished
    /// with an announce it has not read (what `wait` waits for by default).
    pub fn unconsumed_children(&self, caller: &Caller) -> Result<Vec<Child>, ToolError> {
        let mut open = Vec::new();
        for row in self.store.children(&caller.key, self.deleted_since())? {
            let child = self.child(row)?;
            if matches!(child.announce, AnnounceState::Pending | AnnounceState::Queued | AnnounceState::Delivered) {
                open.push(child);
            }
        }
        Ok(open)
    }

    /// Reads a descendant's work and announce.
    pub fn child(&self, row: SessionRow) -> Result<Child, ToolError> {
        let ChildRows { spawn_run, active, last_work, announce: announce_row, open_asks, budget, thread } =
            self.store.child_rows(row.id, row.spawn_run.as_deref())?;
        let mut state = run_state(&row, spawn_run.as_ref(), active.as_ref(), last_work.as_ref());
        if state == RunState::Running && !open_asks.is_empty() {
            state = RunState::Waiting; // on an answer
        }
        let announce = announce_state(&row, announce_row.as_ref());
        let bound = thread.is_some_and(|b| b.mode == crate::store::BindingMode::Session);
        if bound && state.is_finished() && row.announced_at.is_some() && row.archived_at.is_none() && active.is_none() {
            state = RunState::Idle;
        }
        Ok(Child { row, spawn_run, last_work, state, announce, announce_row, open_asks, budget })
    }

    /// The caller's own budget account: the one it was spawned with, or for a root the configured
    /// `session.budget` (whose account opens at its first spawn).
    pub fn own_budget(&self, caller: &Caller) -> Result<Option<Account>, ToolError> {
        let Some(row) = self.store.session_by_key(&caller.key)? else { return Ok(None) };
        if let Some(account) = self.store.budget_of(row.id)? {
            return Ok(Some(account));
        }
        let root = self.config.session.budget.as_ref().filter(|_| row.spawned_by.is_none());
        Ok(root.map(|b| Account { session: row.id, limits: Limits::of(b), ..Account::default() }))
    }

    /// Resolves a request id to an ask of one of the caller's descendants; any other id — another
    /// tree's, or none at all — gets the same `not_found`.
    pub fn ask_in_tree(&self, caller: &Caller, id: &str) -> Result<AskRow, ToolError> {
        let ask = self.store.ask(id)?;
        match ask {
            Some(a) if a.child != caller.key && self.store.is_ancestor(&caller.key, &a.child)? => Ok(a),
            _ => Err(ToolError::not_found(format!(
                "Input request not found: {id} (subagents {{\"action\": \"list\"}} shows your sub-agents' open requests)"
            ))),
        }
    }

    /// Open asks in the caller's tree put to the caller (what makes a `wait` return early).
    pub fn asks_for(&self, caller: &Caller) -> Result<Vec<AskRow>, ToolError> {
        let mut open = self.store.open_asks_below(&caller.key)?;
        open.retain(|a| a.target == caller.key);
        Ok(open)
    }

    /// Open asks of one run that the caller may answer (a task's input requests).
    pub fn open_asks_of_run(&self, caller: &Caller, run_id: &str) -> Result<Vec<AskRow>, ToolError> {
        let mut asks = self.store.asks_of_runs(&[run_id.to_string()])?;
        asks.retain(|a| a.state == AskState::Open && a.child != caller.key);
        let mut mine = Vec::with_capacity(asks.len());
        for ask in asks {
            if self.store.is_ancestor(&caller.key, &ask.child)? {
                mine.push(ask);
            }
        }
        Ok(mine)
    }

    /// A descendant read again (after a wait's wake, or a cancel).
    pub fn subagent_again(&self, row: &SessionRow) -> Result<Child, ToolError> {
        let fresh = self.store.session_by_key(&row.key)?.unwrap_or_else(|| row.clone());
        self.child(fresh)
    }

    /// The caller consumed these children's announces.
    pub fn mark_read(&self, children: &[&Child]) -> Result<(), ToolError> {
        let runs: Vec<&str> = children.iter().filter_map(|c| c.row.spawn_run.as_deref()).collect();
        self.mark_announces_read(&runs)
    }

    /// The caller read the announces of these spawn runs in its own session.
    pub fn mark_announces_read(&self, spawn_runs: &[&str]) -> Result<(), ToolError> {
        Ok(self.store.mark_announces_read(spawn_runs)?)
    }
}

fn not_a_subagent(display: &str) -> ToolError {
    ToolError::not_found(format!(
        "Sub-agent not found: {display} (subagents {{\"action\": \"list\"}} shows the sub-agents you started)"
    ))
}

/// A child's run state from its rows: what runs now, else whether it still waits for its
/// children, else how its work ended (a cancel by an ancestor wins over the run's own end).
fn run_state(row: &SessionRow, spawn: Option<&RunRow>, active: Option<&RunRow>, last: Option<&RunRow>) -> RunState {
    if let Some(run) = active {
        let started = run.status == RunStatus::Running || spawn.is_none_or(|s| s.run_id != run.run_id);
        return if started { RunState::Running } else { RunState::Queued };
    }
    if row.cancelled_at.is_some() {
        return RunState::Cancelled;
    }
    if row.announced_at.is_none() {
        return RunState::Waiting;
    }
    last.or(spawn).map_or(RunState::Completed, |r| RunState::ended(r.status))
}

fn announce_state(row: &SessionRow, announce: Option<&AnnounceRow>) -> AnnounceState {
    let Some(a) = announce else {
        // Announced without a delivery: it asked for silence.
        return if row.announced_at.is_some() { AnnounceState::Skipped } else { AnnounceState::Pending };
    };
    match a.status {
        _ if a.read_at.is_some() => AnnounceState::Read,
        DeliveryStatus::Queued | DeliveryStatus::Running => AnnounceState::Queued,
        DeliveryStatus::Delivered => AnnounceState::Delivered,
        DeliveryStatus::Skipped => AnnounceState::Skipped,
        DeliveryStatus::Failed
        | DeliveryStatus::Expired
        | DeliveryStatus::Undeliverable
        | DeliveryStatus::Dismissed => AnnounceState::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{AgentId, SessionKey};
    use crate::store::{RunMode, RunRow};

    fn row(announced: bool, cancelled: bool) -> SessionRow {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("s.db")).unwrap();
        let key = SessionKey::from_canonical("agent:main:subagent:x");
        let new = crate::store::NewSession::new(key.clone(), AgentId::main(), crate::keys::SessionKind::Other, false);
        store.write(|tx| tx.insert_session(&new)).unwrap();
        let mut r = store.session_by_key(&key).unwrap().unwrap();
        r.announced_at = announced.then_some(1);
        r.cancelled_at = cancelled.then_some(1);
        r
    }

    #[test]
    fn the_run_state_says_what_runs_then_what_it_waits_for_then_how_it_ended() {
        let spawn_queued = RunRow::for_test("s", RunMode::Spawn, RunStatus::Queued);
        let spawn_ok = RunRow::for_test("s", RunMode::Spawn, RunStatus::Ok);
        let completion = RunRow::for_test("c", RunMode::Completion, RunStatus::Queued);
        let open = row(false, false);
        assert_eq!(run_state(&open, Some(&spawn_queued), Some(&spawn_queued), None), RunState::Queued);
        let running = RunRow::for_test("s", RunMode::Spawn, RunStatus::Running);
        assert_eq!(run_state(&open, Some(&running), Some(&running), None), RunState::Running);
        assert_eq!(
            run_state(&open, Some(&spawn_ok), Some(&completion), None),
            RunState::Running,
            "a completion to take"
        );
        assert_eq!(run_state(&open, Some(&spawn_ok), None, Some(&spawn_ok)), RunState::Waiting);
        assert_eq!(run_state(&row(false, true), Some(&spawn_ok), None, None), RunState::Cancelled);
        let done = row(true, false);
        let timed_out = RunRow::for_test("c", RunMode::Completion, RunStatus::Timeout);
        assert_eq!(run_state(&done, Some(&spawn_ok), None, Some(&timed_out)), RunState::TimedOut, "the last own run");
        assert_eq!(run_state(&row(true, true), Some(&spawn_ok), None, Some(&spawn_ok)), RunState::Cancelled);
    }
}
