//! The bearer tokens `sessions-mcp token create` mints (docs/TOKENS.md): an operator's (the
//! dashboard, `/metrics`) or a client's (`/mcp` as one session). Only each token's sha256 is
//! kept; the HTTP server looks a presented token up here on every request, beside the config's
//! hashes, so a token minted or revoked takes effect without a restart.

use super::sql::{Optional, Row, args};
use super::text_enum::text_enum;
use super::{Result, Store, now_ms};

/// Who a minted token signs in as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessKind {
    /// The operator: every tree on the dashboard, its acts, `/metrics`.
    Operator,
    /// An external client acting as one session (as a `server.tokens` entry does).
    Client,
}

text_enum!(AccessKind { Operator => "operator", Client => "client" });

/// A minted token as `token list` shows it: never the token, only its hash's last 4 characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessToken {
    pub id: String,
    pub kind: AccessKind,
    /// The session a client token acts as.
    pub session_key: Option<String>,
    pub label: Option<String>,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
    pub hash_tail: String,
}

/// Why a token could not be minted.
#[derive(Debug, PartialEq, Eq)]
pub enum MintRefused {
    /// Another live token has this label (labels name one token, for `token revoke LABEL`).
    LabelTaken(String),
}

const COLUMNS: &str = "id, kind, session_key, label, created_at, revoked_at, hash";

fn from_row(r: &Row) -> Result<AccessToken> {
    let kind: String = r.get(1)?;
    let hash: String = r.get(6)?;
    Ok(AccessToken {
        id: r.get(0)?,
        // The column's CHECK allows only these two.
        kind: AccessKind::parse(&kind).unwrap_or(AccessKind::Client),
        session_key: r.get(2)?,
        label: r.get(3)?,
        created_at: r.get(4)?,
        revoked_at: r.get(5)?,
        hash_tail: hash[hash.len().saturating_sub(4)..].to_string(),
    })
}

impl Store {
    /// Keeps a minted token's hash under a new id.
    pub fn insert_access_token(
        &self,
        hash: &str,
        kind: AccessKind,
        session_key: Option<&str>,
        label: Option<&str>,
    ) -> Result<std::result::Result<AccessToken, MintRefused>> {
        // No global lock on a shared database: the insert decides by itself, the live label's
        // uniqueness resting on the partial unique index `access_tokens_label` (a concurrent mint
        // of the label waits for the other's commit, then inserts nothing).
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| {
            let id = format!("tok_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
            let inserted = tx.execute(
                "INSERT INTO access_tokens (id, hash, kind, session_key, label, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (label) WHERE label IS NOT NULL AND revoked_at IS NULL DO NOTHING",
                args![id, hash, kind.as_str(), session_key, label, now_ms()],
            )?;
            if let Some(label) = label.filter(|_| inserted == 0) {
                return Ok(Err(MintRefused::LabelTaken(label.to_string())));
            }
            let row = tx.query_row(&format!("SELECT {COLUMNS} FROM access_tokens WHERE id = ?1"), args![id], from_row)?;
            Ok(Ok(row))
        })
    }

    /// Every minted token, revoked ones too, oldest first.
    pub fn access_tokens(&self) -> Result<Vec<AccessToken>> {
        self.read(|c| {
            c.query_map(&format!("SELECT {COLUMNS} FROM access_tokens ORDER BY created_at, id"), args![], from_row)
        })
    }

    /// The live (not revoked) minted token with this hash.
    pub fn live_access_token(&self, hash: &str) -> Result<Option<AccessToken>> {
        self.read(|c| {
            c.query_row(
                &format!("SELECT {COLUMNS} FROM access_tokens WHERE hash = ?1 AND revoked_at IS NULL"),
                args![hash],
                from_row,
            )
            .optional()
        })
    }

    /// Revokes the live token with this id or label; `None` when there is none.
    ///
    /// No global lock on a shared database: the update revokes only a live token (a revoke at
    /// the same time on another node waits for this one's commit, then finds nothing live).
    pub fn revoke_access_token(&self, id_or_label: &str) -> Result<Option<AccessToken>> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| {
            let found = tx
                .query_row(
                    &format!(
                        "SELECT {COLUMNS} FROM access_tokens WHERE (id = ?1 OR label = ?1) AND revoked_at IS NULL
                         ORDER BY id = ?1 DESC LIMIT 1"
                    ),
                    args![id_or_label],
                    from_row,
                )
                .optional()?;
            let Some(mut token) = found else { return Ok(None) };
            let now = now_ms();
            let revoked = tx.execute(
                "UPDATE access_tokens SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
                args![token.id, now],
            )?;
            if revoked == 0 {
                return Ok(None);
            }
            token.revoked_at = Some(now);
            Ok(Some(token))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_token_is_found_by_its_hash_until_revoked_by_id_or_label_and_a_live_label_names_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let op = store.insert_access_token("aa11", AccessKind::Operator, None, Some("laptop")).unwrap().unwrap();
        assert_eq!((op.kind, op.hash_tail.as_str(), op.revoked_at), (AccessKind::Operator, "aa11", None));
        let again = store.insert_access_token("bb22", AccessKind::Operator, None, Some("laptop")).unwrap();
        assert_eq!(again, Err(MintRefused::LabelTaken("laptop".into())));
        let client = store.insert_access_token("cc33", AccessKind::Client, Some("agent:main:desk"), None).unwrap();
        let client = client.unwrap();
        assert_eq!(store.live_access_token("aa11").unwrap().map(|t| t.id), Some(op.id.clone()));
        assert_eq!(store.revoke_access_token("laptop").unwrap().map(|t| t.id), Some(op.id.clone()));
        assert_eq!(store.live_access_token("aa11").unwrap(), None, "revoked");
        assert_eq!(store.revoke_access_token("laptop").unwrap(), None, "nothing live by that label");
        assert!(store.insert_access_token("dd44", AccessKind::Operator, None, Some("laptop")).unwrap().is_ok());
        assert_eq!(store.revoke_access_token(&client.id).unwrap().map(|t| t.kind), Some(AccessKind::Client));
        let listed = store.access_tokens().unwrap();
        assert_eq!(listed.len(), 3, "revoked ones stay listed: {listed:?}");
        assert!(listed[0].revoked_at.is_some() && listed[2].revoked_at.is_none(), "{listed:?}");
    }
}
