//! Bulk seeding: a whole world written in one transaction — sessions with their transcripts, then
//! run tokens, runs and idempotency keys — for `dev seed` (the tests build their worlds with it) and the stores the
//! benchmarks generate. Rows are written as given: nothing here decides visibility or policy.

use super::sql::{Sql, args};
use serde_json::Value;

use super::messages::append_message;
use super::sessions::{insert_session, session_id, set_updated_at};
use super::{NewMessage, NewSession, Result, RunStatus, SendPolicyOverride, Store, TokenRow, now_ms};
use crate::keys::SessionKey;

/// One session to seed and its transcript, appended in order (any iterator of messages, so that a
/// generated transcript of 100,000 messages is never held in memory at once).
pub struct SeedSession<M> {
    pub session: NewSession,
    pub messages: M,
    /// What a world spec states about the row beyond [`NewSession`]; None for generated sessions.
    pub stated: Option<Stated>,
}

impl<M: IntoIterator<Item = NewMessage>> SeedSession<M> {
    /// A generated session: its messages move its `updated_at` as appends do.
    pub fn new(session: NewSession, messages: M) -> Self {
        SeedSession { session, messages, stated: None }
    }
}

/// What a world spec states about a session row. It is applied whether the row was just created
/// or was already there, and after the messages `updated_at` is set back to the session's own:
/// the spec, not the appends, says when the session was last active.
#[derive(Debug, Clone, Default)]
pub struct Stated {
    pub send_policy: Option<SendPolicyOverride>,
    /// When the session was soft-deleted (it is then `Deleted`).
    pub deleted_at: Option<i64>,
}

/// A run token to store: its hash, what it is bound to, and its expiry (None = valid while its
/// run lasts).
#[derive(Debug, Clone)]
pub struct SeedToken {
    pub hash: String,
    pub row: TokenRow,
    pub expires_at: Option<i64>,
}

/// A run stored as it is (mode `send`, created and started at `created_at` or now), e.g. the
/// `running` run a token is bound to.
#[derive(Debug, Clone)]
pub struct SeedRun {
    pub run_id: String,
    pub session: SessionKey,
    pub status: RunStatus,
    /// The input message (`{role, content}`).
    pub input: Value,
    pub waiting_on: Option<String>,
    pub owner: Option<String>,
    /// The session that asked for the run.
    pub requester: Option<SessionKey>,
    pub created_at: Option<i64>,
}

/// A remembered idempotency key (created now), as a call would have left it.
#[derive(Debug, Clone)]
pub struct SeedKey {
    pub caller: SessionKey,
    pub key: String,
    pub tool: String,
    pub args_hash: String,
    pub run_id: Option<String>,
}

/// The rows a world has beside its sessions; their sessions must be seeded with them.
#[derive(Debug, Clone, Default)]
pub struct SeedRows {
    pub tokens: Vec<SeedToken>,
    pub runs: Vec<SeedRun>,
    pub keys: Vec<SeedKey>,
}

impl Store {
    /// Writes `sessions`, then the `rows` (whose sessions must exist by then) in one
    /// transaction: a world is seeded whole or not at all. A session whose key exists keeps its
    /// row and gets the messages appended.
    pub fn seed<M: IntoIterator<Item = NewMessage>>(
        &self,
        sessions: impl IntoIterator<Item = SeedSession<M>>,
        rows: &SeedRows,
    ) -> Result<()> {
        self.write_sql(|tx| -> Result<()> {
            for s in sessions {
                seed_session(tx, s)?;
            }
            for t in &rows.tokens {
                insert_token(tx, t)?;
            }
            for r in &rows.runs {
                insert_run(tx, r)?;
            }
            for k in &rows.keys {
                insert_key(tx, k)?;
            }
            Ok(())
        })
    }
}

fn seed_session<M: IntoIterator<Item = NewMessage>>(tx: &dyn Sql, s: SeedSession<M>) -> Result<()> {
    insert_session(tx, &s.session)?;
    let id = session_id(tx, &s.session.key)?;
    if let Some(stated) = &s.stated {
        tx.execute(
            "UPDATE sessions SET send_policy = ?2, deleted_at = ?3,
                 state = CASE WHEN CAST(?3 AS BIGINT) IS NOT NULL THEN 2 ELSE state END
             WHERE id = ?1",
            args![id, stated.send_policy.map(SendPolicyOverride::as_str), stated.deleted_at],
        )?;
    }
    for m in s.messages {
        append_message(tx, id, &m)?;
    }
    if s.stated.is_some() {
        set_updated_at(tx, id, s.session.updated_at)?;
    }
    Ok(())
}

fn insert_token(tx: &dyn Sql, t: &SeedToken) -> Result<()> {
    let r = &t.row;
    tx.execute(
        "INSERT INTO tokens (hash, kind, session_key, run_id, chain_id, hop, sandboxed, expires_at, created_at)
         VALUES (?1, 'run', ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        args![t.hash, r.session_key, r.run_id, r.chain_id, r.hop, r.sandboxed, t.expires_at, now_ms()],
    )?;
    Ok(())
}

fn insert_run(tx: &dyn Sql, r: &SeedRun) -> Result<()> {
    let session = session_id(tx, &r.session)?;
    tx.execute("INSERT INTO runs (run_id, session, mode, status, input, waiting_on, owner, requester_key, created_at, started_at)
         VALUES (?1, ?2, 'send', ?3, ?4, ?5, ?6, ?7, ?8, ?8)", args![
        r.run_id,
        session,
        r.status.as_str(),
        r.input.to_string(),
        r.waiting_on,
        r.owner,
        r.requester.as_ref().map(SessionKey::as_str),
        r.created_at.unwrap_or_else(now_ms)
    ])?;
    Ok(())
}

fn insert_key(tx: &dyn Sql, k: &SeedKey) -> Result<()> {
    tx.execute(
        "INSERT INTO idempotency (caller, key, tool, args_hash, run_id, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        args![k.caller.as_str(), k.key, k.tool, k.args_hash, k.run_id, now_ms()],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::keys::{AgentId, SessionKind};
    use crate::store::SessionState;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        (dir, store)
    }

    fn session(key: &str, updated_at: i64) -> NewSession {
        let mut s = NewSession::new(SessionKey::from_canonical(key), AgentId::main(), SessionKind::Other, false);
        (s.created_at, s.updated_at) = (updated_at, updated_at);
        s
    }

    fn text(ts: i64) -> NewMessage {
        NewMessage { role: "user".into(), content: json!("hi"), timestamp: Some(ts), ..Default::default() }
    }

    fn row(store: &Store, key: &str) -> crate::store::SessionRow {
        store.session_by_key(&SessionKey::from_canonical(key)).unwrap().expect("seeded")
    }

    #[test]
    fn a_stated_row_keeps_its_updated_at_and_a_generated_one_moves_with_its_messages() {
        let (_dir, store) = store();
        let stated = SeedSession {
            stated: Some(Stated { send_policy: Some(SendPolicyOverride::Deny), deleted_at: Some(7) }),
            ..SeedSession::new(session("agent:main:stated", 1_000), vec![text(5_000)])
        };
        let generated = SeedSession::new(session("agent:main:generated", 1_000), vec![text(5_000)]);
        store.seed([stated, generated], &SeedRows::default()).unwrap();
        let s = row(&store, "agent:main:stated");
        assert_eq!((s.updated_at, s.state, s.deleted_at), (1_000, SessionState::Deleted, Some(7)));
        assert_eq!(s.send_policy, Some(SendPolicyOverride::Deny));
        let g = row(&store, "agent:main:generated");
        assert_eq!((g.updated_at, g.state, g.send_policy), (5_000, SessionState::Active, None));
        assert_eq!(store.last_seq_of(&g.key).unwrap(), 1);
    }

    #[test]
    fn a_stated_row_that_exists_takes_the_spec_and_gets_the_messages_appended() {
        let (_dir, store) = store();
        let policed = Stated { send_policy: Some(SendPolicyOverride::Allow), deleted_at: None };
        let first = SeedSession { stated: Some(policed), ..SeedSession::new(session("agent:main:a", 1_000), vec![]) };
        store.seed([first], &SeedRows::default()).unwrap();
        let again = SeedSession {
            stated: Some(Stated::default()),
            ..SeedSession::new(session("agent:main:a", 2_000), vec![text(9)])
        };
        store.seed([again], &SeedRows::default()).unwrap();
        let a = row(&store, "agent:main:a");
        assert_eq!((a.send_policy, a.updated_at, a.created_at), (None, 2_000, 1_000), "the spec states the row");
        assert_eq!(store.last_seq_of(&a.key).unwrap(), 1);
    }

    #[test]
    fn tokens_and_runs_are_stored_and_a_run_of_an_unknown_session_seeds_nothing() {
        let (_dir, store) = store();
        let key = SessionKey::from_canonical("agent:main:w");
        let token = SeedToken {
            hash: "h".into(),
            row: TokenRow {
                session_key: key.as_str().into(),
                run_id: Some("r1".into()),
                chain_id: None,
                hop: 2,
                sandboxed: true,
            },
            expires_at: None,
        };
        let run = |session: &SessionKey| SeedRun {
            run_id: format!("run-{session}"),
            session: session.clone(),
            status: RunStatus::Running,
            input: json!({"role": "user", "content": "go"}),
            waiting_on: None,
            owner: Some("elsewhere".into()),
            requester: None,
            created_at: None,
        };
        let w = || SeedSession::new(session(key.as_str(), 1), Vec::new());
        store.seed([w()], &SeedRows { tokens: vec![token], runs: vec![run(&key)], keys: Vec::new() }).unwrap();
        let bound = store.run_token("h", now_ms()).unwrap().expect("token stored");
        assert_eq!((bound.session_key.as_str(), bound.hop, bound.sandboxed), (key.as_str(), 2, true));
        let stored = store.run(&format!("run-{key}")).unwrap().expect("run stored");
        assert_eq!((stored.status, stored.input["content"].as_str()), (RunStatus::Running, Some("go")));

        let stranger = SessionKey::from_canonical("agent:main:nobody");
        let lone = SeedSession::new(session("agent:main:lone", 1), Vec::new());
        assert!(store.seed([lone], &SeedRows { runs: vec![run(&stranger)], ..SeedRows::default() }).is_err());
        assert!(store.session_by_key(&SessionKey::from_canonical("agent:main:lone")).unwrap().is_none(), "rolled back");
    }
}
