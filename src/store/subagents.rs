//! What the `subagents` tool reads and writes: a requester's spawned tree (a page of it and its
//! totals), each child's work and announce, the announce marked read, and a subtree cancelled in
//! one transaction.

use rusqlite::{OptionalExtension, params};

use super::ledger::{DeliveryKind, DeliveryStatus};
use super::run_queue::{RUN_COLUMNS, run_from_row};
use super::sessions::session_columns;
use super::{Result, RunRow, SessionRow, Store, now_ms};
use crate::keys::SessionKey;

/// The descendants a tree read shows: every state but deleted, and deleted ones removed after
/// `deleted_since` (the requester's grace to still read them).
const SHOWN: &str = "(s.state <> 2 OR s.deleted_at >= ?2)";

/// A child's announce as its requester got it.
#[derive(Debug, Clone)]
pub struct AnnounceRow {
    pub id: i64,
    pub kind: DeliveryKind,
    pub status: DeliveryStatus,
    /// When the requester consumed it (a `wait` returned it, history showed it, its completion
    /// run ended).
    pub read_at: Option<i64>,
    /// The Status / Result / Notes / Stats text (announces before schema version 4 lack it).
    pub text: Option<String>,
    /// When it was made, ms since the epoch.
    pub at: i64,
}

/// Sums over a whole tree.
#[derive(Debug, Clone, Copy, Default)]
pub struct TreeTotals {
    pub sessions: i64,
    /// Children whose work has not been announced yet.
    pub unfinished: i64,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub cost: Option<f64>,
}

/// What cancelling a subtree did, in one transaction.
#[derive(Debug, Default)]
pub struct SubtreeCancel {
    /// The sessions whose unfinished work is now cancelled (by this request or an earlier one).
    pub sessions: Vec<SessionRow>,
    /// Queued runs that now never start: `cancelled`, their steps still to take.
    pub dequeued: Vec<RunRow>,
    /// Running runs flagged for their owner to stop.
    pub flagged: Vec<String>,
}

impl Store {
    /// A page of `ancestor`'s descendants, newest first (by row id), below row id `before`.
    pub fn descendants(
        &self,
        ancestor: &SessionKey,
        before: Option<i64>,
        limit: usize,
        deleted_since: i64,
    ) -> Result<Vec<SessionRow>> {
        let sql = format!(
            "SELECT {} FROM session_tree t JOIN sessions s ON s.id = t.session
             WHERE t.ancestor = (SELECT id FROM sessions WHERE key = ?1) AND {SHOWN} AND t.session < ?3
             ORDER BY t.session DESC LIMIT ?4",
            prefixed_session_columns()
        );
        self.read(|c| {
            c.prepare_cached(&sql)?
                .query_map(
                    params![ancestor.as_str(), deleted_since, before.unwrap_or(i64::MAX), limit as i64],
                    SessionRow::from_row,
                )?
                .collect()
        })
    }

    /// The direct children of `parent`, oldest first.
    pub fn children(&self, parent: &SessionKey, deleted_since: i64) -> Result<Vec<SessionRow>> {
        let sql = format!(
            "SELECT {} FROM sessions s WHERE s.spawned_by = ?1 AND {SHOWN} ORDER BY s.id",
            prefixed_session_columns()
        );
        self.read(|c| {
            c.prepare_cached(&sql)?.query_map(params![parent.as_str(), deleted_since], SessionRow::from_row)?.collect()
        })
    }

    /// Counts and sums over all of `ancestor`'s shown descendants.
    pub fn tree_totals(&self, ancestor: &SessionKey, deleted_since: i64) -> Result<TreeTotals> {
        let sql = format!(
            "SELECT count(*), coalesce(sum(s.announced_at IS NULL AND s.spawn_run IS NOT NULL), 0),
                    coalesce(sum(s.tokens_in), 0), coalesce(sum(s.tokens_out), 0), sum(s.cost)
             FROM session_tree t JOIN sessions s ON s.id = t.session
             WHERE t.ancestor = (SELECT id FROM sessions WHERE key = ?1) AND {SHOWN}"
        );
        self.read(|c| {
            c.prepare_cached(&sql)?.query_row(params![ancestor.as_str(), deleted_since], |r| {
                Ok(TreeTotals {
                    sessions: r.get(0)?,
                    unfinished: r.get(1)?,
                    tokens_in: r.get(2)?,
                    tokens_out: r.get(3)?,
                    cost: r.get(4)?,
                })
            })
        })
    }

    /// The announce of a child's spawn run, if it was made.
    pub fn announce_of(&self, spawn_run: &str) -> Result<Option<AnnounceRow>> {
        self.read(|c| {
            c.prepare_cached(
                "SELECT id, kind, status, read_at, payload, created_at FROM deliveries
                 WHERE run_id = ?1 AND kind IN ('announce', 'completion') ORDER BY id LIMIT 1",
            )?
            .query_row([spawn_run], |r| {
                let kind: String = r.get(1)?;
                let status: String = r.get(2)?;
                Ok(AnnounceRow {
                    id: r.get(0)?,
                    kind: if kind == "announce" { DeliveryKind::Announce } else { DeliveryKind::Completion },
                    status: DeliveryStatus::parse(&status).unwrap_or(DeliveryStatus::Failed),
                    read_at: r.get(3)?,
                    text: r.get(4)?,
                    at: r.get(5)?,
                })
            })
            .optional()
        })
    }

    /// The run a session works on now: its running run, else its oldest queued one.
    pub fn active_run_of(&self, session: i64) -> Result<Option<RunRow>> {
        self.newest_run_where(session, "r.status IN ('queued', 'running')", "r.status = 'running' DESC, r.created_at")
    }

    /// A child's last run of its own work (its spawn run, a completion run that read its
    /// children's results, a steer turn): its status is the one the announce carries.
    pub fn last_work_run(&self, session: i64) -> Result<Option<RunRow>> {
        self.newest_run_where(session, "r.mode IN ('spawn', 'completion', 'steer')", "r.created_at DESC, r.rowid DESC")
    }

    fn newest_run_where(&self, session: i64, filter: &str, order: &str) -> Result<Option<RunRow>> {
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session
             WHERE r.session = ?1 AND {filter} ORDER BY {order} LIMIT 1"
        );
        self.read(|c| c.prepare_cached(&sql)?.query_row([session], run_from_row).optional())
    }

    /// Marks the delivered announces of these spawn runs read (the first read counts).
    pub fn mark_announces_read(&self, spawn_runs: &[&str]) -> Result<()> {
        if spawn_runs.is_empty() {
            return Ok(());
        }
        self.write_sql(|tx| -> Result<()> {
            let mut stmt = tx.prepare_cached(
                "UPDATE deliveries SET read_at = ?2
                 WHERE run_id = ?1 AND kind IN ('announce', 'completion') AND status = 'delivered' AND read_at IS NULL",
            )?;
            let now = now_ms();
            for run in spawn_runs {
                stmt.execute(params![run, now])?;
            }
            Ok(())
        })
    }

    /// Cancels the unfinished work of `root` (and with `cascade` of its descendants): marks the
    /// sessions cancelled, dequeues their queued runs and flags their running ones, in one
    /// transaction. Sessions whose work already ended are left as they are.
    pub fn cancel_subtree(&self, root: &SessionKey, cascade: bool) -> Result<SubtreeCancel> {
        let select = format!(
            "SELECT {} FROM sessions s
             WHERE s.spawn_run IS NOT NULL AND s.announced_at IS NULL
               AND (s.key = ?1 OR (?2 AND s.id IN (SELECT t.session FROM session_tree t
                                                   WHERE t.ancestor = (SELECT id FROM sessions WHERE key = ?1))))
             ORDER BY s.spawn_depth, s.id",
            prefixed_session_columns()
        );
        self.write_sql(|tx| -> Result<SubtreeCancel> {
            let now = now_ms();
            let mut out = SubtreeCancel::default();
            let sessions: Vec<SessionRow> = tx
                .prepare(&select)?
                .query_map(params![root.as_str(), cascade], SessionRow::from_row)?
                .collect::<rusqlite::Result<_>>()?;
            let runs_sql = format!(
                "SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session
                 WHERE r.session = ?1 AND r.status IN ('queued', 'running')"
            );
            for session in sessions {
                tx.execute(
                    "UPDATE sessions SET cancelled_at = coalesce(cancelled_at, ?2) WHERE id = ?1",
                    params![session.id, now],
                )?;
                let runs: Vec<RunRow> = tx
                    .prepare_cached(&runs_sql)?
                    .query_map([session.id], run_from_row)?
                    .collect::<rusqlite::Result<_>>()?;
                for run in runs {
                    if run.status == super::RunStatus::Running {
                        tx.execute(
                            "UPDATE runs SET cancel_requested_at = coalesce(cancel_requested_at, ?2) WHERE run_id = ?1",
                            params![run.run_id, now],
                        )?;
                        out.flagged.push(run.run_id);
                    } else {
                        super::cancel::dequeue(tx, &run.run_id, now, "cancelled by an ancestor before it started")?;
                        out.dequeued
                            .push(super::run_queue::run_by_id(tx, &run.run_id)?.expect("the run was just read"));
                    }
                }
                out.sessions.push(SessionRow { cancelled_at: session.cancelled_at.or(Some(now)), ..session });
            }
            Ok(out)
        })
    }
}

/// The session columns qualified with `s.` (the tree reads join `session_tree`).
fn prefixed_session_columns() -> String {
    session_columns().split(", ").map(|c| format!("s.{}", c.trim())).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{AgentId, SessionKind};
    use crate::store::{Caps, NewRun, NewSession, RunMode, RunStatus};

    /// A store with main and a chain main → a → b, each child with a queued spawn run.
    fn tree() -> (tempfile::TempDir, Store, [SessionKey; 3], [String; 2]) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let keys =
            ["agent:main:main", "agent:main:subagent:a", "agent:main:subagent:b"].map(SessionKey::from_canonical);
        let runs = ["run-a", "run-b"].map(String::from);
        store
            .write(|tx| -> Result<()> {
                for (i, key) in keys.iter().enumerate() {
                    let mut s = NewSession::new(key.clone(), AgentId::main(), SessionKind::Other, i == 0);
                    s.spawned_by = i.checked_sub(1).map(|p| keys[p].clone());
                    tx.insert_session(&s)?;
                    if i > 0 {
                        let id = tx.session_id(key)?;
                        tx.set_spawn_run(id, &runs[i - 1])?;
                        let input = serde_json::json!({"role": "user", "content": "t"});
                        tx.enqueue(&NewRun::new(runs[i - 1].clone(), id, RunMode::Spawn, input))?;
                    }
                }
                Ok(())
            })
            .unwrap();
        (dir, store, keys, runs)
    }

    #[test]
    fn a_cascading_cancel_flags_running_runs_dequeues_queued_ones_and_marks_every_session() {
        let (_dir, store, keys, runs) = tree();
        let caps = Caps { global: 1, per_agent: Default::default(), default_agent: 1, spawns: 1 };
        let (claimed, _) = store.claim_next("owner", &caps).unwrap().expect("one run claimable");
        assert_eq!(claimed.run_id, runs[0]);
        let done = store.cancel_subtree(&keys[1], true).unwrap();
        assert_eq!(done.flagged, [runs[0].clone()]);
        assert_eq!(done.dequeued.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(), [runs[1].as_str()]);
        assert_eq!(done.dequeued[0].status, RunStatus::Cancelled);
        assert_eq!(done.sessions.iter().map(|s| s.key.clone()).collect::<Vec<_>>(), [keys[1].clone(), keys[2].clone()]);
        assert!(store.session_by_key(&keys[2]).unwrap().unwrap().cancelled_at.is_some());
        assert!(store.session_by_key(&keys[0]).unwrap().unwrap().cancelled_at.is_none(), "the caller is never touched");
        assert_eq!(store.cancel_requests("owner").unwrap(), [runs[0].clone()]);
    }

    #[test]
    fn without_cascade_only_the_child_is_cancelled() {
        let (_dir, store, keys, runs) = tree();
        let done = store.cancel_subtree(&keys[1], false).unwrap();
        assert_eq!(done.sessions.len(), 1);
        assert_eq!(store.run(&runs[1]).unwrap().unwrap().status, RunStatus::Queued, "the grandchild still runs");
        assert!(store.session_by_key(&keys[2]).unwrap().unwrap().cancelled_at.is_none());
    }

    #[test]
    fn the_tree_reads_page_newest_first_and_sum_over_every_descendant() {
        let (_dir, store, keys, _) = tree();
        let page = store.descendants(&keys[0], None, 1, i64::MIN).unwrap();
        assert_eq!(page.iter().map(|r| r.key.clone()).collect::<Vec<_>>(), [keys[2].clone()]);
        let rest = store.descendants(&keys[0], Some(page[0].id), 10, i64::MIN).unwrap();
        assert_eq!(rest.iter().map(|r| r.key.clone()).collect::<Vec<_>>(), [keys[1].clone()]);
        let totals = store.tree_totals(&keys[0], i64::MIN).unwrap();
        assert_eq!((totals.sessions, totals.unfinished), (2, 2));
        assert_eq!(store.children(&keys[0], i64::MIN).unwrap().len(), 1, "only direct children");
    }
}
