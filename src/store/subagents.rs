//! What the `subagents` tool reads and writes: a requester's spawned tree (a page of it and its
//! totals), each child's work and announce, the announce marked read, and a subtree cancelled in
//! one transaction.

use super::sql::{Dialect, Optional, Row, args};

use super::asks::open_asks_of;
use super::ledger::{DeliveryKind, DeliveryStatus};
use super::run_queue::{RUN_COLUMNS, RUN_WIDTH, run_at, run_columns, run_from_row};
use super::sessions::session_columns;
use super::{AskRow, Result, RunRow, SessionRow, Store, now_ms};
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

/// The columns of an [`AnnounceRow`], from `deliveries d`.
const ANNOUNCE_COLUMNS: &str = "d.id, d.kind, d.status, d.read_at, d.payload, d.created_at";

/// The id of the announce of spawn run `run` (an SQL expression): its first announce or
/// completion delivery.
fn announce_id(run: &str) -> String {
    format!(
        "(SELECT x.id FROM deliveries x WHERE x.run_id = {run} AND x.kind IN ('announce', 'completion')
          ORDER BY x.id LIMIT 1)"
    )
}

/// The announce whose [`ANNOUNCE_COLUMNS`] start at column `at`; None where they are NULL (a
/// LEFT JOIN found none).
fn announce_at(r: &Row, at: usize) -> Result<Option<AnnounceRow>> {
    let Some(id) = r.get(at)? else { return Ok(None) };
    let kind: String = r.get(at + 1)?;
    let status: String = r.get(at + 2)?;
    Ok(Some(AnnounceRow {
        id,
        kind: DeliveryKind::parse(&kind).unwrap_or(DeliveryKind::Completion),
        status: DeliveryStatus::parse(&status).unwrap_or(DeliveryStatus::Failed),
        read_at: r.get(at + 3)?,
        text: r.get(at + 4)?,
        at: r.get(at + 5)?,
    }))
}

/// Which of a session's runs a read picks: the first of those that pass `filter` in `order`.
struct RunPick {
    filter: &'static str,
    order: &'static str,
}

/// What [`Store::active_run_of`] picks.
const ACTIVE_RUN: RunPick =
    RunPick { filter: "r.status IN ('queued', 'running')", order: "r.status = 'running' DESC, r.created_at, r.{seq}" };

/// What [`Store::last_work_run`] picks.
const LAST_WORK_RUN: RunPick =
    RunPick { filter: "r.mode IN ('spawn', 'completion', 'steer')", order: "r.created_at DESC, r.{seq} DESC" };

impl RunPick {
    /// Its order, `{seq}` being the column that orders runs by when they were queued.
    fn order(&self, dialect: Dialect) -> String {
        self.order.replace("{seq}", dialect.runs_order())
    }

    /// The id of the run it picks of session `session` (an SQL expression).
    fn run_id(&self, session: &str, dialect: Dialect) -> String {
        format!(
            "(SELECT r.run_id FROM runs r WHERE r.session = {session} AND {} ORDER BY {} LIMIT 1)",
            self.filter,
            self.order(dialect)
        )
    }
}

/// What a child's work and announce are read from, in one read transaction.
#[derive(Debug, Clone)]
pub struct ChildRows {
    pub spawn_run: Option<RunRow>,
    /// The run it works on now ([`Store::active_run_of`]).
    pub active: Option<RunRow>,
    /// Its last run of its own work ([`Store::last_work_run`]).
    pub last_work: Option<RunRow>,
    /// The announce of its spawn run ([`Store::announce_of`]).
    pub announce: Option<AnnounceRow>,
    /// Its open asks, oldest first.
    pub open_asks: Vec<AskRow>,
    /// Its own budget account ([`Store::budget_of`]).
    pub budget: Option<crate::policy::budget::Account>,
    /// Its thread ([`Store::thread_binding`]).
    pub thread: Option<super::ThreadBinding>,
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
            c.query_map(
                &sql,
                args![ancestor.as_str(), deleted_since, before.unwrap_or(i64::MAX), limit as i64],
                SessionRow::from_row,
            )
        })
    }

    /// The direct children of `parent`, oldest first.
    pub fn children(&self, parent: &SessionKey, deleted_since: i64) -> Result<Vec<SessionRow>> {
        let sql = format!(
            "SELECT {} FROM sessions s WHERE s.spawned_by = ?1 AND {SHOWN} ORDER BY s.id",
            prefixed_session_columns()
        );
        self.read(|c| c.query_map(&sql, args![parent.as_str(), deleted_since], SessionRow::from_row))
    }

    /// Counts and sums over all of `ancestor`'s shown descendants.
    pub fn tree_totals(&self, ancestor: &SessionKey, deleted_since: i64) -> Result<TreeTotals> {
        self.read(|c| {
            let sql = format!(
                "SELECT count(*),
                    CAST(coalesce(sum(CASE WHEN s.announced_at IS NULL AND s.spawn_run IS NOT NULL THEN 1 ELSE 0 END), 0) AS BIGINT),
                    {}, {}, sum(s.cost)
             FROM session_tree t JOIN sessions s ON s.id = t.session
             WHERE t.ancestor = (SELECT id FROM sessions WHERE key = ?1) AND {SHOWN}",
                c.dialect().sum_int("s.tokens_in"),
                c.dialect().sum_int("s.tokens_out")
            );
            c.query_row(&sql, args![ancestor.as_str(), deleted_since], |r| {
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
        let sql = format!("SELECT {ANNOUNCE_COLUMNS} FROM deliveries d WHERE d.id = {}", announce_id("?1"));
        self.read(|c| Ok(c.query_row(&sql, args![spawn_run], |r| announce_at(r, 0)).optional()?.flatten()))
    }

    /// The run a session works on now: its running run, else its oldest queued one.
    pub fn active_run_of(&self, session: i64) -> Result<Option<RunRow>> {
        self.picked_run(session, &ACTIVE_RUN)
    }

    /// A child's last run of its own work (its spawn run, a completion run that read its
    /// children's results, a steer turn): its status is the one the announce carries.
    pub fn last_work_run(&self, session: i64) -> Result<Option<RunRow>> {
        self.picked_run(session, &LAST_WORK_RUN)
    }

    fn picked_run(&self, session: i64, pick: &RunPick) -> Result<Option<RunRow>> {
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session
             WHERE r.session = ?1 AND {} ORDER BY {} LIMIT 1",
            pick.filter,
            pick.order(self.dialect())
        );
        self.read(|c| c.query_row(&sql, args![session], run_from_row).optional())
    }

    /// A child's spawn run (`spawn_run`), active run, last work run and announce in one
    /// statement, its open asks, budget and thread after it, all in one read transaction: what a `subagents`
    /// read of it needs, picked as [`Store::run`], [`Store::active_run_of`],
    /// [`Store::last_work_run`] and [`Store::announce_of`] pick them.
    pub fn child_rows(&self, session: i64, spawn_run: Option<&str>) -> Result<ChildRows> {
        let sql = format!(
            "SELECT {}, {}, {}, {ANNOUNCE_COLUMNS}
             FROM (SELECT CAST(?1 AS BIGINT) AS id, CAST(?2 AS TEXT) AS spawn_run) child
             LEFT JOIN runs sp ON sp.run_id = child.spawn_run
             LEFT JOIN sessions sps ON sps.id = sp.session
             LEFT JOIN runs ac ON ac.run_id = {}
             LEFT JOIN sessions acs ON acs.id = ac.session
             LEFT JOIN runs lw ON lw.run_id = {}
             LEFT JOIN sessions lws ON lws.id = lw.session
             LEFT JOIN deliveries d ON d.id = {}",
            run_columns("sp", "sps"),
            run_columns("ac", "acs"),
            run_columns("lw", "lws"),
            ACTIVE_RUN.run_id("child.id", self.dialect()),
            LAST_WORK_RUN.run_id("child.id", self.dialect()),
            announce_id("child.spawn_run"),
        );
        let run = |r: &Row, i: usize| -> Result<Option<RunRow>> {
            let at = i * RUN_WIDTH;
            match r.get::<Option<String>>(at)? {
                Some(_) => run_at(r, at).map(Some),
                None => Ok(None),
            }
        };
        self.read(|c| {
            let (spawn_run, active, last_work, announce) = c.query_row(&sql, args![session, spawn_run], |r| {
                Ok((run(r, 0)?, run(r, 1)?, run(r, 2)?, announce_at(r, 3 * RUN_WIDTH)?))
            })?;
            Ok(ChildRows {
                spawn_run,
                active,
                last_work,
                announce,
                open_asks: open_asks_of(c, session)?,
                budget: super::budgets::account(c, session, super::now_ms())?,
                thread: super::threads::binding_of(c, session)?,
            })
        })
    }

    /// Marks the delivered announces of these spawn runs read (the first read counts). Holds no
    /// global lock on a shared database: each statement decides on the rows it names by itself.
    pub fn mark_announces_read(&self, spawn_runs: &[&str]) -> Result<()> {
        if spawn_runs.is_empty() {
            return Ok(());
        }
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<()> {
            let now = now_ms();
            for run in spawn_runs {
                tx.execute(
                    "UPDATE deliveries SET read_at = ?2
                     WHERE run_id = ?1 AND kind IN ('announce', 'completion') AND status = 'delivered' AND read_at IS NULL",
                    args![run, now],
                )?;
            }
            Ok(())
        })
    }

    /// Cancels the unfinished work of `root` (and with `cascade` of its descendants): marks the
    /// sessions cancelled, dequeues their queued runs and flags their running ones, in one
    /// transaction. Sessions whose work already ended are left as they are.
    ///
    /// Holds no global lock on a shared database: it locks the rows of the subtree's sessions
    /// first, root to leaf (`run_queue::lock_sessions`, the order of every writer of several
    /// sessions, so two cancels of overlapping trees never deadlock), and reads their runs only
    /// then. A child spawned while the locks were taken (its admission holds its requester's row,
    /// one of these) is seen by reading the subtree again once they are held: until a read finds
    /// no session it has not locked.
    pub fn cancel_subtree(&self, root: &SessionKey, cascade: bool) -> Result<SubtreeCancel> {
        let select = format!(
            "SELECT {} FROM sessions s
             WHERE s.spawn_run IS NOT NULL AND s.announced_at IS NULL
               AND (s.key = ?1 OR (?2 AND s.id IN (SELECT t.session FROM session_tree t
                                                   WHERE t.ancestor = (SELECT id FROM sessions WHERE key = ?1))))
             ORDER BY s.spawn_depth, s.id",
            prefixed_session_columns()
        );
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<SubtreeCancel> {
            let now = now_ms();
            let mut out = SubtreeCancel::default();
            let mut locked: Vec<i64> = Vec::new();
            let sessions = loop {
                let sessions: Vec<SessionRow> =
                    tx.query_map(&select, args![root.as_str(), cascade], SessionRow::from_row)?;
                let new: Vec<i64> = sessions.iter().map(|s| s.id).filter(|id| !locked.contains(id)).collect();
                if new.is_empty() {
                    break sessions;
                }
                super::run_queue::lock_sessions(tx, &new)?;
                locked.extend(new);
            };
            let runs_sql = format!(
                "SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session
                 WHERE r.session = ?1 AND r.status IN ('queued', 'running')"
            );
            for session in sessions {
                tx.execute(
                    "UPDATE sessions SET cancelled_at = coalesce(cancelled_at, ?2) WHERE id = ?1",
                    args![session.id, now],
                )?;
                let runs: Vec<RunRow> = tx.query_map(&runs_sql, args![session.id], run_from_row)?;
                for run in runs {
                    if run.status == super::RunStatus::Running {
                        tx.execute(
                            "UPDATE runs SET cancel_requested_at = coalesce(cancel_requested_at, ?2) WHERE run_id = ?1",
                            args![run.run_id, now],
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
pub(super) fn prefixed_session_columns() -> String {
    session_columns().split(", ").map(|c| format!("s.{}", c.trim())).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{AgentId, SessionKind};
    use crate::store::{Caps, DeliveryMode, NewDelivery, NewRun, NewSession, RunMode, RunStatus};

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
        let (claimed, _) = store.claim_ready("owner", &caps).unwrap().into_iter().next().expect("one run claimable");
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
    fn a_childs_rows_in_one_read_are_what_the_single_reads_pick() {
        let (_dir, store, keys, runs) = tree();
        let child = store.session_by_key(&keys[1]).unwrap().unwrap();
        store
            .write(|tx| -> Result<()> {
                tx.enqueue(&NewRun::new("turn".into(), child.id, RunMode::Steer, serde_json::json!({})))?;
                let announce = NewDelivery {
                    run_id: &runs[0],
                    kind: DeliveryKind::Completion,
                    mode: DeliveryMode::Inbox,
                    status: DeliveryStatus::Delivered,
                    target_key: keys[0].as_str(),
                    channel: None,
                    last_error: None,
                };
                tx.add_announce(&announce, "Status: done")?;
                Ok(())
            })
            .unwrap();
        let id = |r: Option<RunRow>| r.map(|r| r.run_id);
        let rows = store.child_rows(child.id, Some(&runs[0])).unwrap();
        assert_eq!(id(rows.spawn_run), Some(runs[0].clone()));
        assert_eq!(id(rows.active), id(store.active_run_of(child.id).unwrap()));
        assert_eq!(id(rows.last_work), id(store.last_work_run(child.id).unwrap()));
        let announce = rows.announce.expect("the announce");
        assert_eq!((announce.kind, announce.text.as_deref()), (DeliveryKind::Completion, Some("Status: done")));
        assert_eq!(announce.id, store.announce_of(&runs[0]).unwrap().unwrap().id);
        assert!(rows.open_asks.is_empty());
        let top = store.session_by_key(&keys[0]).unwrap().unwrap();
        let none = store.child_rows(top.id, None).unwrap();
        assert!(
            none.spawn_run.is_none() && none.active.is_none() && none.last_work.is_none() && none.announce.is_none()
        );
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

    /// Cascading cancels of overlapping trees on two nodes, each child's own cancel on a third
    /// and a fourth node claiming the tree's runs, all at once, without the global write lock:
    /// every cancel answers, every session below the top is cancelled, each queued run is
    /// dequeued by one cancel at most and never also claimed, and every claimed run that still
    /// runs is flagged for its owner.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_overlapping_subtree_cancels_and_claims_on_four_nodes_end_every_run_once() {
        use std::collections::HashSet;
        crate::store::postgres::with_test_database(async |target| {
            let dirs = [(); 4].map(|_| tempfile::tempdir().unwrap());
            let nodes: Vec<Store> =
                dirs.iter().map(|d| Store::open_postgres(target.clone(), d.path()).unwrap()).collect();
            let caps = Caps { global: 64, per_agent: Default::default(), default_agent: 64, spawns: 64 };
            for round in 0..4 {
                let top = SessionKey::from_canonical(format!("agent:main:subagent:t{round}"));
                let mut tree = vec![(top.clone(), None, 1)];
                for b in 0..4 {
                    let child = SessionKey::from_canonical(format!("agent:main:subagent:t{round}-{b}"));
                    tree.push((SessionKey::from_canonical(format!("{child}-x")), Some(child.clone()), 3));
                    tree.insert(1, (child, Some(top.clone()), 2));
                }
                let children: Vec<SessionKey> = tree.iter().filter(|t| t.2 == 2).map(|t| t.0.clone()).collect();
                nodes[0]
                    .write(|tx| -> Result<()> {
                        for (key, parent, depth) in &tree {
                            let mut s = NewSession::new(key.clone(), AgentId::main(), SessionKind::Other, false);
                            let parent =
                                parent.clone().unwrap_or_else(|| SessionKey::from_canonical("agent:main:main"));
                            (s.spawned_by, s.spawn_depth) = (Some(parent), *depth);
                            tx.insert_session(&s)?;
                            let id = tx.session_id(key)?;
                            let run = format!("run-{key}");
                            tx.set_spawn_run(id, &run)?;
                            tx.enqueue(&NewRun::new(
                                run,
                                id,
                                RunMode::Spawn,
                                serde_json::json!({"role": "user", "content": "t"}),
                            ))?;
                        }
                        Ok(())
                    })
                    .unwrap();
                let start = std::sync::Arc::new(std::sync::Barrier::new(4));
                let cancels: Vec<_> = [vec![top.clone()], children[..2].to_vec(), children[2..].to_vec()]
                    .into_iter()
                    .zip(nodes.iter().cloned())
                    .map(|(roots, store)| {
                        let start = start.clone();
                        std::thread::spawn(move || {
                            start.wait();
                            roots.iter().map(|root| store.cancel_subtree(root, true).unwrap()).collect::<Vec<_>>()
                        })
                    })
                    .collect();
                let (claimer, claim_caps) = (nodes[3].clone(), caps.clone());
                let owner = crate::store::RunOwner::new(&format!("node{round}"));
                let owner_id = owner.as_str().to_string();
                let claims = std::thread::spawn(move || {
                    start.wait();
                    (0..20)
                        .flat_map(|_| claimer.claim_ready(owner.as_str(), &claim_caps).unwrap())
                        .map(|(r, _)| r.run_id)
                        .collect::<Vec<_>>()
                });
                let done: Vec<SubtreeCancel> = cancels.into_iter().flat_map(|c| c.join().unwrap()).collect();
                let claimed: HashSet<String> = claims.join().unwrap().into_iter().collect();
                let dequeued: Vec<&str> =
                    done.iter().flat_map(|d| d.dequeued.iter().map(|r| r.run_id.as_str())).collect();
                let once: HashSet<&str> = dequeued.iter().copied().collect();
                assert_eq!(once.len(), dequeued.len(), "round {round}: a run dequeued twice: {dequeued:?}");
                assert!(once.iter().all(|r| !claimed.contains(*r)), "round {round}: a run both claimed and dequeued");
                let flagged: HashSet<String> = nodes[0].cancel_requests(&owner_id).unwrap().into_iter().collect();
                for (key, _, _) in &tree {
                    let session = nodes[1].session_by_key(key).unwrap().unwrap();
                    assert!(session.cancelled_at.is_some(), "round {round}: {key} was not cancelled");
                    let run = nodes[1].run(&format!("run-{key}")).unwrap().unwrap();
                    match run.status {
                        RunStatus::Cancelled => assert!(once.contains(run.run_id.as_str())),
                        RunStatus::Running => {
                            assert!(flagged.contains(&run.run_id), "round {round}: {key} runs unflagged")
                        }
                        other => panic!("round {round}: {key}'s run is {other:?}"),
                    }
                }
            }
        })
        .await;
    }
}
