//! Stopping a run on request (MCP `tasks/cancel`). Any process may ask: a queued run is cancelled
//! at once; a running one is flagged, and its owner — the one process that runs runs — cancels the
//! agent when it sees the flag (the agent gets the protocol's `cancel` line and its grace period).

use super::sql::{Sql, args};

use super::run_queue::run_by_id;
use super::{Result, RunRow, RunStatus, Store, now_ms};

/// What a cancel request did.
#[derive(Debug)]
pub enum CancelRequest {
    /// The run was still queued: it is now `cancelled` and never runs.
    Dequeued(Box<RunRow>),
    /// The run is running: its owner will stop it.
    Flagged,
    /// The run had already ended (or does not exist): nothing changed.
    AlreadyEnded,
}

/// Ends a queued run `cancelled` before it started; `why` is its error.
pub(super) fn dequeue(tx: &dyn Sql, run_id: &str, now: i64, why: &str) -> Result<()> {
    tx.execute(
        "UPDATE runs SET status = 'cancelled', ended_at = ?2, cancel_requested_at = ?2, error = ?3
         WHERE run_id = ?1 AND status = 'queued'",
        args![run_id, now, why],
    )?;
    Ok(())
}

impl Store {
    /// Asks `run_id` to stop. Holds no global lock on a shared database: it locks the run's
    /// session row (a run's session never changes, so reading it first decides nothing), which
    /// the claim takes (with `SKIP LOCKED`) and a run's end takes, and then reads the run's
    /// status, so a claim of the queued run on another node either committed before (the run
    /// is flagged) or finds the run cancelled.
    pub fn request_cancel(&self, run_id: &str) -> Result<CancelRequest> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<CancelRequest> {
            // A queued run read here is not claimed before it is dequeued.
            let session = tx.query_opt("SELECT session FROM runs WHERE run_id = ?1", args![run_id], |r| r.get(0))?;
            let Some(session) = session else { return Ok(CancelRequest::AlreadyEnded) };
            super::run_queue::lock_session(tx, session)?;
            let Some(run) = run_by_id(tx, run_id)? else { return Ok(CancelRequest::AlreadyEnded) };
            let now = now_ms();
            match run.status {
                RunStatus::Queued => {
                    dequeue(tx, run_id, now, "cancelled by its requester before it started")?;
                    let dequeued = run_by_id(tx, run_id)?.expect("the run was just read");
                    Ok(CancelRequest::Dequeued(Box::new(dequeued)))
                }
                RunStatus::Running => {
                    tx.execute(
                        "UPDATE runs SET cancel_requested_at = coalesce(cancel_requested_at, ?2) WHERE run_id = ?1",
                        args![run_id, now],
                    )?;
                    Ok(CancelRequest::Flagged)
                }
                _ => Ok(CancelRequest::AlreadyEnded),
            }
        })
    }

    /// Runs of `owner` that were asked to stop and still run.
    pub fn cancel_requests(&self, owner: &str) -> Result<Vec<String>> {
        self.read(|c| {
            c.query_map(
                "SELECT run_id FROM runs WHERE owner = ?1 AND cancel_requested_at IS NOT NULL AND status = 'running'",
                args![owner],
                |r| r.get(0),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{AgentId, SessionKey, SessionKind};
    use crate::store::{NewRun, NewSession, RunMode};

    fn store_with_session() -> (tempfile::TempDir, Store, i64) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let key = SessionKey::from_canonical("agent:main:main");
        let new = NewSession::new(key.clone(), AgentId::parse("main").unwrap(), SessionKind::Main, false);
        let id = store
            .write(|tx| -> Result<i64> {
                tx.insert_session(&new)?;
                tx.session_id(&key)
            })
            .unwrap();
        (dir, store, id)
    }

    fn queued_run(store: &Store, session: i64) -> String {
        let run_id = uuid::Uuid::new_v4().to_string();
        let run =
            NewRun::new(run_id.clone(), session, RunMode::Send, serde_json::json!({"role": "user", "content": "hi"}));
        store.write(|tx| tx.enqueue(&run)).unwrap();
        run_id
    }

    #[test]
    fn a_queued_run_is_dequeued_and_a_second_request_changes_nothing() {
        let (_dir, store, session) = store_with_session();
        let run_id = queued_run(&store, session);
        match store.request_cancel(&run_id).unwrap() {
            CancelRequest::Dequeued(run) => assert_eq!(run.status, RunStatus::Cancelled),
            other => panic!("expected Dequeued, got {other:?}"),
        }
        assert!(matches!(store.request_cancel(&run_id).unwrap(), CancelRequest::AlreadyEnded));
        assert!(matches!(store.request_cancel("no-such-run").unwrap(), CancelRequest::AlreadyEnded));
    }

    #[test]
    fn a_running_run_is_flagged_for_its_owner_only() {
        let (_dir, store, session) = store_with_session();
        let run_id = queued_run(&store, session);
        let caps = crate::store::Caps { global: 4, per_agent: Default::default(), default_agent: 4, spawns: 4 };
        let (claimed, _) = store.claim_ready("owner-a", &caps).unwrap().into_iter().next().expect("claimable");
        assert_eq!(claimed.run_id, run_id);
        assert!(store.cancel_requests("owner-a").unwrap().is_empty());
        assert!(matches!(store.request_cancel(&run_id).unwrap(), CancelRequest::Flagged));
        assert_eq!(store.cancel_requests("owner-a").unwrap(), vec![run_id.clone()]);
        assert!(store.cancel_requests("owner-b").unwrap().is_empty());
        assert_eq!(store.run(&run_id).unwrap().unwrap().status, RunStatus::Running, "only the owner ends it");
    }
}
