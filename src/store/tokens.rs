//! Bearer tokens, stored only as sha256 hashes.

use super::sql::{Optional, args};
use sha2::{Digest, Sha256};

use super::{Result, Store};

/// A stored token row.
#[derive(Debug, Clone)]
pub struct TokenRow {
    pub session_key: String,
    pub run_id: Option<String>,
    pub chain_id: Option<String>,
    pub hop: i64,
    pub sandboxed: bool,
}

impl Store {
    /// The run token with this hash, if it is valid at `now` (from run start until its expiry).
    pub fn run_token(&self, hash: &str, now: i64) -> Result<Option<TokenRow>> {
        self.read(|c| {
            c.query_row(
                "SELECT session_key, run_id, chain_id, hop, sandboxed FROM tokens
                 WHERE hash = ?1 AND kind = 'run' AND (valid_from IS NULL OR valid_from <= ?2)
                   AND (expires_at IS NULL OR expires_at > ?2)",
                args![hash, now],
                |r| {
                    Ok(TokenRow {
                        session_key: r.get(0)?,
                        run_id: r.get(1)?,
                        chain_id: r.get(2)?,
                        hop: r.get(3)?,
                        sandboxed: r.get(4)?,
                    })
                },
            )
            .optional()
        })
    }
}

impl Store {
    /// Stores a run token (its sha256 only), valid from now until its run ends.
    pub fn insert_run_token(&self, hash: &str, row: &TokenRow) -> Result<()> {
        self.write_sql_for_this_boot(|tx| -> Result<()> {
            tx.execute(
                "INSERT INTO tokens (hash, kind, session_key, run_id, chain_id, hop, sandboxed, valid_from, created_at)
                 VALUES (?1, 'run', ?2, ?3, ?4, ?5, ?6, ?7, ?7)",
                args![hash, row.session_key, row.run_id, row.chain_id, row.hop, row.sandboxed, super::now_ms()],
            )?;
            Ok(())
        })
    }
}

/// How a token is kept: its SHA-256, hex (the token itself is never stored).
pub fn sha256_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}
