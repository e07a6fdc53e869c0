//! Steers: a message for a child's running turn (`subagents` steer). Any process records one
//! `pending` for the run it found running; the owner offers it to that run and settles it
//! `steered` or `queued`, once (a compare-and-set on `pending`, so the owner and a requester
//! that gave up waiting never both settle it). A steer that becomes a turn joins the child's
//! queued steer turn from the same requester when there is one, and never reaches a child whose
//! work was cancelled: both decided in the transaction that queues it.

use super::sql::{Optional, Row, Sql, args};
use serde_json::{Value, json};

use super::text_enum::text_enum;
use super::{NewRun, Result, RunMode, Store, now_ms};
use crate::keys::SessionKey;

/// Where a steer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SteerState {
    /// Offered to the running run; not settled yet.
    Pending,
    /// The running turn took it: the message is in the child's transcript.
    Steered,
    /// It became the child's next turn (the run in `queued_run`).
    Queued,
}

text_enum!(SteerState { Pending => "pending", Steered => "steered", Queued => "queued" });

/// A steer to record.
#[derive(Debug, Clone)]
pub struct NewSteer<'a> {
    pub session: i64,
    /// The child's running run it is offered to; None when none ran (it is queued at once).
    pub run_id: Option<&'a str>,
    pub requester: &'a SessionKey,
    pub text: &'a str,
    pub provenance: &'a Value,
    pub state: SteerState,
    pub queued_run: Option<&'a str>,
}

/// A stored steer.
#[derive(Debug, Clone)]
pub struct SteerRow {
    pub id: i64,
    pub session: i64,
    /// The child's key.
    pub child: SessionKey,
    pub run_id: Option<String>,
    pub requester: SessionKey,
    pub text: String,
    pub provenance: Option<Value>,
    pub state: SteerState,
    pub queued_run: Option<String>,
}

/// A steer with its child's key: `FROM steers s JOIN sessions c ON c.id = s.session`.
const SELECT: &str = "SELECT s.id, s.session, c.key, s.run_id, s.requester, s.text, s.provenance, s.state, s.queued_run
     FROM steers s JOIN sessions c ON c.id = s.session";

fn from_row(r: &Row) -> Result<SteerRow> {
    Ok(SteerRow {
        id: r.get(0)?,
        session: r.get(1)?,
        child: SessionKey::from_canonical(r.get::<String>(2)?),
        run_id: r.get(3)?,
        requester: SessionKey::from_canonical(r.get::<String>(4)?),
        text: r.get(5)?,
        provenance: r.get::<Option<String>>(6)?.and_then(|s| serde_json::from_str(&s).ok()),
        state: SteerState::parse(&r.get::<String>(7)?).unwrap_or(SteerState::Pending),
        queued_run: r.get(8)?,
    })
}

pub(super) fn add_steer(tx: &dyn Sql, s: &NewSteer) -> Result<i64> {
    let now = now_ms();
    let decided = (s.state != SteerState::Pending).then_some(now);
    tx.one(
        "INSERT INTO steers (session, run_id, requester, text, provenance, state, queued_run, created_at, decided_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) RETURNING id",
        args![
            s.session,
            s.run_id,
            s.requester.as_str(),
            s.text,
            s.provenance.to_string(),
            s.state.as_str(),
            s.queued_run,
            now,
            decided
        ],
    )
}

/// Settles a pending steer; false when it was settled already.
pub(super) fn settle_steer(tx: &dyn Sql, id: i64, state: SteerState, queued_run: Option<&str>) -> Result<bool> {
    let changed = tx.execute(
        "UPDATE steers SET state = ?2, queued_run = ?3, decided_at = ?4 WHERE id = ?1 AND state = 'pending'",
        args![id, state.as_str(), queued_run, now_ms()],
    )?;
    Ok(changed == 1)
}

/// What queueing a steer as its child's next turn did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SteerQueued {
    /// It is a new turn of the child.
    NewTurn,
    /// It joined the child's queued, not yet started steer turn from the same requester: that
    /// turn's input now carries every steer queued into it, in the order they were made.
    Joined,
    /// The child's work was cancelled: the steer was dropped (its row deleted), nothing queued.
    ChildCancelled,
    /// It was settled before (by the owner, or by the requester that gave up waiting).
    AlreadySettled,
}

/// The input of a steer turn carrying `texts`: one text, or one text block per steer, in order.
pub fn steer_input(texts: &[String]) -> Value {
    let content = match texts {
        [one] => json!(one),
        many => Value::Array(many.iter().map(|t| json!({"type": "text", "text": t})).collect()),
    };
    json!({"role": "user", "content": content})
}

/// True when an ancestor cancelled `session`'s work (`cancel_subtree`): nothing of it may start.
pub(super) fn work_cancelled(tx: &dyn Sql, session: i64) -> Result<bool> {
    let at: Option<Option<i64>> =
        tx.query_row("SELECT cancelled_at FROM sessions WHERE id = ?1", args![session], |r| r.get(0)).optional()?;
    Ok(at.flatten().is_some())
}

/// The run of `session` that is running now, if any.
pub(super) fn running_run(tx: &dyn Sql, session: i64) -> Result<Option<String>> {
    tx.query_row("SELECT run_id FROM runs WHERE session = ?1 AND status = 'running' LIMIT 1", args![session], |r| {
        r.get(0)
    })
    .optional()
}

/// Queues pending steer `id` as its child's next turn: `turn` (carrying this steer alone), or,
/// when the child has a queued steer turn with the same provenance (the same requester), that
/// one, which then carries all its steers. Refuses a child whose work was cancelled: the check
/// and the enqueue are one transaction, so a cancel that committed first is always seen, and one
/// that comes after dequeues what this queued.
pub(super) fn queue_steer(tx: &dyn Sql, id: i64, turn: &NewRun) -> Result<SteerQueued> {
    // The queued steer turn found below is not claimed before its input is set.
    super::run_queue::lock_session(tx, turn.session)?;
    if work_cancelled(tx, turn.session)? {
        tx.execute("DELETE FROM steers WHERE id = ?1 AND state = 'pending'", args![id])?;
        return Ok(SteerQueued::ChildCancelled);
    }
    let queued = super::run_queue::queued_runs(tx, turn.session, RunMode::Steer)?
        .into_iter()
        .find(|r| r.provenance == turn.provenance)
        .map(|r| r.run_id);
    let run_id = queued.as_deref().unwrap_or(&turn.run_id);
    if !settle_steer(tx, id, SteerState::Queued, Some(run_id))? {
        return Ok(SteerQueued::AlreadySettled);
    }
    if queued.is_none() {
        super::run_queue::enqueue(tx, turn)?;
        return Ok(SteerQueued::NewTurn);
    }
    let texts: Vec<String> = tx.query_map(
        "SELECT text FROM steers WHERE queued_run = ?1 AND state = 'queued' ORDER BY id",
        args![run_id],
        |r| r.get(0),
    )?;
    super::run_queue::set_queued_input(tx, run_id, &steer_input(&texts))?;
    Ok(SteerQueued::Joined)
}

impl Store {
    pub fn steer(&self, id: i64) -> Result<Option<SteerRow>> {
        let sql = format!("{SELECT} WHERE s.id = ?1");
        self.read(|c| c.query_row(&sql, args![id], from_row).optional())
    }

    /// Pending steers for the running runs of `owner`, oldest first.
    pub fn pending_steers(&self, owner: &str) -> Result<Vec<SteerRow>> {
        self.steers_where("r.status = 'running' AND r.owner = ?1", owner)
    }

    /// Pending steers whose run is no longer running (it ended before its owner offered them).
    pub fn stranded_steers(&self) -> Result<Vec<SteerRow>> {
        self.steers_where("r.status <> 'running' AND ?1 = ?1", "")
    }

    fn steers_where(&self, filter: &str, param: &str) -> Result<Vec<SteerRow>> {
        let sql =
            format!("{SELECT} JOIN runs r ON r.run_id = s.run_id WHERE s.state = 'pending' AND {filter} ORDER BY s.id");
        self.read(|c| c.query_map(&sql, args![param], from_row))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{AgentId, SessionKind};
    use crate::store::NewSession;

    #[test]
    fn a_steer_is_settled_once_whoever_comes_second() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let key = SessionKey::from_canonical("agent:main:subagent:x");
        let requester = SessionKey::from_canonical("agent:main:main");
        let provenance = serde_json::json!({"kind": "inter_session"});
        let id = store
            .write(|tx| -> Result<i64> {
                tx.insert_session(&NewSession::new(key.clone(), AgentId::main(), SessionKind::Other, false))?;
                let session = tx.session_id(&key)?;
                let steer = NewSteer {
                    session,
                    run_id: Some("run-1"),
                    requester: &requester,
                    text: "plan B",
                    provenance: &provenance,
                    state: SteerState::Pending,
                    queued_run: None,
                };
                tx.add_steer(&steer)
            })
            .unwrap();
        let pending = store.steer(id).unwrap().unwrap();
        assert_eq!((pending.state, pending.child.clone()), (SteerState::Pending, key));
        assert!(store.write(|tx| tx.settle_steer(id, SteerState::Steered, None)).unwrap());
        assert!(!store.write(|tx| tx.settle_steer(id, SteerState::Queued, Some("turn"))).unwrap(), "settled already");
        let settled = store.steer(id).unwrap().unwrap();
        assert_eq!((settled.state, settled.queued_run), (SteerState::Steered, None));
        assert!(store.stranded_steers().unwrap().is_empty(), "a settled steer is never stranded");
    }

    #[test]
    fn queued_steers_join_one_turn_in_order_and_none_is_queued_after_a_cancel() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let key = SessionKey::from_canonical("agent:main:subagent:x");
        let requester = SessionKey::from_canonical("agent:main:main");
        let provenance = serde_json::json!({"kind": "inter_session", "sourceSessionKey": "agent:main:main"});
        let steer = |text: &str| {
            store
                .write(|tx| -> Result<(i64, SteerQueued)> {
                    tx.insert_session(&NewSession::new(key.clone(), AgentId::main(), SessionKind::Other, false))?;
                    let session = tx.session_id(&key)?;
                    tx.set_spawn_run(session, "spawn")?;
                    let new = NewSteer {
                        session,
                        run_id: None,
                        requester: &requester,
                        text,
                        provenance: &provenance,
                        state: SteerState::Pending,
                        queued_run: None,
                    };
                    let id = tx.add_steer(&new)?;
                    let turn = NewRun {
                        provenance: Some(provenance.clone()),
                        ..NewRun::new(
                            format!("turn-{id}"),
                            session,
                            crate::store::RunMode::Steer,
                            steer_input(&[text.into()]),
                        )
                    };
                    Ok((id, tx.queue_steer(id, &turn)?))
                })
                .unwrap()
        };
        let (first, queued) = steer("one");
        assert_eq!(queued, SteerQueued::NewTurn);
        assert_eq!(steer("two").1, SteerQueued::Joined);
        let turn = store.run(&format!("turn-{first}")).unwrap().unwrap();
        assert_eq!(
            turn.input["content"],
            serde_json::json!([{"type": "text", "text": "one"}, {"type": "text", "text": "two"}])
        );
        store.cancel_subtree(&key, true).unwrap();
        let (late, dropped) = steer("three");
        assert_eq!(dropped, SteerQueued::ChildCancelled);
        assert!(store.steer(late).unwrap().is_none(), "the dropped steer left no row");
        assert!(store.active_run_of(turn.session).unwrap().is_none(), "nothing of the cancelled child is queued");
    }

    /// A steer recorded as `subagents` steer records it (`engine::steer::record`): the child's
    /// session row, then what runs, then pending for that run or queued as its next turn.
    fn record_steer(store: &Store, session: i64, requester: &SessionKey, provenance: &Value, text: &str) -> i64 {
        store
            .write_row_locked(|tx| -> Result<i64> {
                assert!(!tx.work_cancelled(session)?);
                let running = tx.running_run(session)?;
                let new = NewSteer {
                    session,
                    run_id: running.as_deref(),
                    requester,
                    text,
                    provenance,
                    state: SteerState::Pending,
                    queued_run: None,
                };
                let id = tx.add_steer(&new)?;
                if running.is_none() {
                    let turn = NewRun {
                        provenance: Some(provenance.clone()),
                        ..NewRun::new(format!("turn-{id}"), session, RunMode::Steer, steer_input(&[text.into()]))
                    };
                    tx.queue_steer(id, &turn)?;
                }
                Ok(id)
            })
            .unwrap()
    }

    /// A steer racing another node's claim of the steer turn it would join, without the global
    /// write lock: it reaches the child exactly once, in the input the turn was claimed with, or
    /// pending for that turn now running, or as a turn of its own that is still queued.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_a_steer_racing_a_claim_of_its_turn_on_another_node_reaches_the_child_once() {
        use crate::store::{Caps, RunOwner, RunStatus};
        crate::store::postgres::with_test_database(async |target| {
            let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
            let nodes: Vec<Store> =
                dirs.iter().map(|d| Store::open_postgres(target.clone(), d.path()).unwrap()).collect();
            let requester = SessionKey::from_canonical("agent:main:main");
            let provenance = serde_json::json!({"kind": "inter_session", "sourceSessionKey": "agent:main:main"});
            let caps = Caps { global: 64, per_agent: Default::default(), default_agent: 64, spawns: 64 };
            for round in 0..12 {
                let key = SessionKey::from_canonical(format!("agent:main:subagent:r{round}"));
                let session = nodes[0]
                    .write(|tx| -> Result<i64> {
                        tx.insert_session(&NewSession::new(key.clone(), AgentId::main(), SessionKind::Other, false))?;
                        tx.session_id(&key)
                    })
                    .unwrap();
                let first = record_steer(&nodes[0], session, &requester, &provenance, "one");
                let turn = format!("turn-{first}");
                let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
                let claimer = (nodes[1].clone(), barrier.clone(), turn.clone(), caps.clone());
                let claim = std::thread::spawn(move || {
                    let (store, barrier, turn, caps) = claimer;
                    let owner = RunOwner::new("node1");
                    barrier.wait();
                    // A claim skips a session another writer holds: it looks again, as a node does.
                    loop {
                        let claimed = store.claim_ready(owner.as_str(), &caps).unwrap();
                        if let Some((run, _)) = claimed.into_iter().find(|(r, _)| r.run_id == turn) {
                            return run;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                });
                barrier.wait();
                let second = record_steer(&nodes[0], session, &requester, &provenance, "two");
                let claimed = claim.join().unwrap();
                let steer = nodes[0].steer(second).unwrap().unwrap();
                let carried = |input: &Value| input.to_string().contains("\"two\"");
                match (steer.state, steer.queued_run.as_deref(), steer.run_id.as_deref()) {
                    (SteerState::Queued, Some(run), _) if run == turn => {
                        assert!(carried(&claimed.input), "round {round}: joined, so claimed with it: {}", claimed.input)
                    }
                    (SteerState::Pending, None, Some(run)) if run == turn => {
                        assert!(
                            !carried(&claimed.input),
                            "round {round}: pending for the running turn, not in its input"
                        )
                    }
                    (SteerState::Queued, Some(own), None) => {
                        assert!(!carried(&claimed.input), "round {round}: a turn of its own, not in the claimed one");
                        let own = nodes[0].run(own).unwrap().unwrap();
                        assert_eq!(own.status, RunStatus::Queued);
                        assert!(carried(&own.input));
                    }
                    other => panic!("round {round}: the steer reached the child as {other:?}"),
                }
            }
        })
        .await;
    }
}
