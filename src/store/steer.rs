//! Steers: a message for a child's running turn (`subagents` steer). Any process records one
//! `pending` for the run it found running; the owner offers it to that run and settles it
//! `steered` or `queued`, once (a compare-and-set on `pending`, so the owner and a requester
//! that gave up waiting never both settle it).

use super::sql::{Optional, Row, Sql, args};
use serde_json::Value;

use super::text_enum::text_enum;
use super::{Result, Store, now_ms};
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
}
