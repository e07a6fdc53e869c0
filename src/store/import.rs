//! The writes of an OpenClaw import (`openclaw::import` reads the reference store): each session
//! entry is merged into the store — created with the reference's row fields when its key is new,
//! and only the messages whose reference id is not stored yet appended — so that importing the same
//! store twice changes nothing.

use std::collections::HashSet;

use super::sql::{Sql, args};

use super::messages::append_message;
use super::sessions::{insert_session, set_updated_at};
use super::{NewMessage, NewSession, Result, SendPolicyOverride, Store};

/// One session entry of a reference store, ready to merge.
#[derive(Debug, Clone)]
pub struct ImportedSession {
    pub session: NewSession,
    pub extras: SessionExtras,
    /// The transcript in file order, each message with its reference id.
    pub messages: Vec<(String, NewMessage)>,
}

/// Row fields of a reference entry that [`NewSession`] does not carry; written only when the
/// import creates the session.
#[derive(Debug, Clone, Default)]
pub struct SessionExtras {
    pub last_account_id: Option<String>,
    pub send_policy: Option<SendPolicyOverride>,
    pub model_provider: Option<String>,
    pub thinking_level: Option<String>,
    pub verbose_level: Option<String>,
    pub context_tokens: Option<i64>,
    pub system_sent: Option<bool>,
    pub aborted_last_run: Option<bool>,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub tokens_total: i64,
    pub cost: Option<f64>,
}

/// What merging one session did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    /// False when the key was already stored (its row was kept as it was).
    pub created: bool,
    /// The sessionId of the stored row: the imported one unless the key was already there.
    pub stored_session_id: String,
    pub messages_imported: usize,
    /// Messages skipped because one with the same reference id is stored (or came earlier).
    pub messages_already_present: usize,
}

impl Store {
    /// Merges `sessions` in order, in one transaction; one [`Merged`] per session. Give parents
    /// before their children, so that the spawn tree links as the rows arrive.
    pub fn import_sessions(&self, sessions: &[ImportedSession]) -> Result<Vec<Merged>> {
        self.write_sql(|tx| -> Result<Vec<Merged>> { sessions.iter().map(|s| merge_session(tx, s)).collect() })
    }
}

fn merge_session(tx: &dyn Sql, s: &ImportedSession) -> Result<Merged> {
    let created = insert_session(tx, &s.session)?;
    let (id, stored_session_id, updated_before): (i64, String, i64) = tx.query_row(
        "SELECT id, session_id, updated_at FROM sessions WHERE key = ?1",
        args![s.session.key.as_str()],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    if created {
        write_extras(tx, id, &s.extras)?;
    }
    let mut present = imported_ids(tx, id)?;
    let mut merged = Merged { created, stored_session_id, messages_imported: 0, messages_already_present: 0 };
    for (ref_id, m) in &s.messages {
        if !present.insert(ref_id.clone()) {
            merged.messages_already_present += 1;
            continue;
        }
        append_message(tx, id, m)?;
        merged.messages_imported += 1;
    }
    // The reference's updatedAt is the session's; appending old messages must not move it.
    if created && merged.messages_imported > 0 {
        set_updated_at(tx, id, updated_before)?;
    }
    Ok(merged)
}

fn write_extras(tx: &dyn Sql, id: i64, x: &SessionExtras) -> Result<()> {
    tx.execute(
        "UPDATE sessions SET last_account_id = ?2, send_policy = ?3, model_provider = ?4, thinking_level = ?5,
             verbose_level = ?6, context_tokens = ?7, system_sent = ?8, aborted_last_run = ?9, tokens_in = ?10,
             tokens_out = ?11, tokens_total = ?12, cost = ?13
         WHERE id = ?1",
        args![
            id,
            x.last_account_id,
            x.send_policy.map(SendPolicyOverride::as_str),
            x.model_provider,
            x.thinking_level,
            x.verbose_level,
            x.context_tokens,
            x.system_sent,
            x.aborted_last_run,
            x.tokens_in,
            x.tokens_out,
            x.tokens_total,
            x.cost
        ],
    )?;
    Ok(())
}

/// The reference ids of the session's messages that an import wrote.
fn imported_ids(tx: &dyn Sql, session: i64) -> Result<HashSet<String>> {
    let sql = format!(
        "SELECT {} FROM messages WHERE session = ?1 AND extra IS NOT NULL",
        tx.dialect().json_text("extra", "imported.id")
    );
    let ids = tx.query_map(&sql, args![session], |r| r.get::<Option<String>>(0))?;
    Ok(ids.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, json};

    use super::*;
    use crate::keys::{AgentId, SessionKey, SessionKind};

    fn entry(session_id: &str, updated_at: i64, refs: &[&str]) -> ImportedSession {
        let key = SessionKey::from_canonical("agent:main:imported");
        let mut session = NewSession::new(key, AgentId::main(), SessionKind::Other, false);
        session.session_id = session_id.into();
        (session.created_at, session.updated_at) = (updated_at, updated_at);
        let message = |r: &&str| {
            let imported = Map::from_iter([("imported".to_string(), json!({"id": r}))]);
            let m = NewMessage {
                role: "user".into(),
                content: json!(r),
                timestamp: Some(updated_at + 10_000),
                extra: Some(imported),
                ..Default::default()
            };
            (r.to_string(), m)
        };
        let extras = SessionExtras { thinking_level: Some("high".into()), tokens_total: 3, ..Default::default() };
        ImportedSession { session, extras, messages: refs.iter().map(message).collect() }
    }

    #[test]
    fn a_new_session_is_created_with_its_extras_and_keeps_the_reference_updated_at() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let merged = store.import_sessions(&[entry("sid", 1_000, &["a", "b", "a"])]).unwrap();
        let expected = Merged {
            created: true,
            stored_session_id: "sid".into(),
            messages_imported: 2,
            messages_already_present: 1,
        };
        assert_eq!(merged, [expected], "a reference id repeated in one transcript is imported once");
        let row = store.session_by_key(&SessionKey::from_canonical("agent:main:imported")).unwrap().unwrap();
        assert_eq!((row.updated_at, row.tokens_total, row.thinking_level.as_deref()), (1_000, 3, Some("high")));
    }

    #[test]
    fn a_second_import_appends_only_new_messages_and_keeps_the_stored_row() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        store.import_sessions(&[entry("sid", 1_000, &["a"])]).unwrap();
        let mut again = entry("other-sid", 2_000, &["a", "b"]);
        again.extras.tokens_total = 99;
        let merged = store.import_sessions(&[again]).unwrap();
        let expected = Merged {
            created: false,
            stored_session_id: "sid".into(),
            messages_imported: 1,
            messages_already_present: 1,
        };
        assert_eq!(merged, [expected]);
        let row = store.session_by_key(&SessionKey::from_canonical("agent:main:imported")).unwrap().unwrap();
        assert_eq!(row.tokens_total, 3, "extras are written only on creation");
        assert_eq!(row.updated_at, 12_000, "appending to a kept session moves it, as any append does");
    }
}
