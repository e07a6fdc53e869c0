//! Sub-agent bookkeeping: admission counts, the announce mark (which closes the child's budget),
//! and the archive sweep.

use super::sql::{Sql, args};

use super::{Result, SessionRow, Store, now_ms};
use crate::keys::SessionKey;

/// What admission looks at, read inside the transaction that creates the child.
#[derive(Debug, Clone, Copy)]
pub struct SpawnCounts {
    /// The requester's children whose spawn run is queued or running.
    pub unfinished: i64,
    /// Spawn runs queued server-wide.
    pub queued: i64,
    /// Spawn runs running server-wide.
    pub running: i64,
}

pub(super) fn spawn_counts(tx: &dyn Sql, requester: &str) -> Result<SpawnCounts> {
    let count = |sql: &str, p: &[&dyn super::sql::Arg]| tx.one::<i64>(sql, p);
    Ok(SpawnCounts {
        unfinished: count(
            "SELECT count(*) FROM runs WHERE requester_key = ?1 AND mode = 'spawn' AND status IN ('queued', 'running')",
            &[&requester],
        )?,
        queued: count("SELECT count(*) FROM runs WHERE mode = 'spawn' AND status = 'queued'", &[])?,
        running: count("SELECT count(*) FROM runs WHERE mode = 'spawn' AND status = 'running'", &[])?,
    })
}

/// A child that holds an admission slot: its session and its spawn run's status (`queued` or
/// `running`).
#[derive(Debug, Clone)]
pub struct SlotHolder {
    pub session: SessionRow,
    pub status: String,
}

impl Store {
    /// The children that hold admission slots, oldest spawn first, at most `limit`: with a
    /// requester its unfinished children (what `maxChildrenPerAgent` counts), without one every
    /// child waiting to start (what `maxQueued` counts).
    pub fn slot_holders(&self, requester: Option<&SessionKey>, limit: usize) -> Result<Vec<SlotHolder>> {
        let filter = match requester {
            Some(_) => "r.requester_key = ?2 AND r.status IN ('queued', 'running')",
            None => "r.status = 'queued'",
        };
        let sql = format!(
            "SELECT {}, r.status FROM runs r JOIN sessions s ON s.id = r.session
             WHERE r.mode = 'spawn' AND {filter} ORDER BY r.created_at, r.run_id LIMIT ?1",
            super::subagents::prefixed_session_columns()
        );
        let status_at = super::sessions::session_columns().split(", ").count();
        let holder =
            |r: &super::sql::Row| Ok(SlotHolder { session: SessionRow::from_row(r)?, status: r.get(status_at)? });
        self.read(|c| match requester {
            Some(key) => c.query_map(&sql, args![limit as i64, key.as_str()], holder),
            None => c.query_map(&sql, args![limit as i64], holder),
        })
    }

    /// Children of `key` whose completion has not been announced yet.
    pub fn unannounced_children(&self, key: &str) -> Result<i64> {
        self.read(|c| {
            c.query_row(
                "SELECT count(*) FROM sessions WHERE spawned_by = ?1 AND spawn_run IS NOT NULL AND announced_at IS NULL", args![key],
                |r| r.get(0))
        })
    }

    /// Marks a child announced; `delete` soft-deletes it now, else it is archived
    /// `archive_after_ms` from now (None = never).
    ///
    /// Holds no global lock on a shared database: the child's session row first, then its
    /// budget chain root to leaf (`close_account`, which closes the account once: a
    /// compare-and-set on `closed_at`), the store's lock order.
    pub fn mark_announced(&self, session: i64, delete: bool, archive_after_ms: Option<i64>) -> Result<()> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<()> {
            let now = now_ms();
            super::run_queue::lock_session(tx, session)?;
            super::budgets::close_account(tx, session)?;
            if delete {
                tx.execute(
                    "UPDATE sessions SET announced_at = ?2, state = 2, deleted_at = ?2 WHERE id = ?1",
                    args![session, now],
                )?;
            } else {
                tx.execute(
                    "UPDATE sessions SET announced_at = ?2, archive_due_at = ?3 WHERE id = ?1",
                    args![session, now, archive_after_ms.map(|ms| now + ms)],
                )?;
            }
            Ok(())
        })
    }

    /// Archives kept children whose archive time has come. Returns their keys.
    pub fn archive_due(&self) -> Result<Vec<String>> {
        self.write_sql(|tx| -> Result<Vec<String>> {
            let now = now_ms();
            let keys: Vec<String> = tx
                .query_map("SELECT key FROM sessions WHERE archive_due_at IS NOT NULL AND archive_due_at <= ?1 AND state = 0", args![now], |r| r.get(0))?;
            tx.execute(
                "UPDATE sessions SET state = 1, archived_at = ?1 WHERE archive_due_at IS NOT NULL AND archive_due_at <= ?1 AND state = 0", args![now])?;
            Ok(keys)
        })
    }
}

/// One attachment of a child session as kept in a shared store, to be written into the workdir
/// of a node that runs the child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAttachment {
    /// `.openclaw/attachments/<id>`, relative to the child's run workdir.
    pub rel_dir: String,
    pub name: String,
    pub content: Vec<u8>,
    pub mime_type: Option<String>,
}

impl Store {
    /// The attachments of the spawn that made `session`, with their bytes, unless removed: empty
    /// on a store nobody shares (the bytes are kept only where another node may run the child).
    pub fn stored_attachments(&self, session: i64) -> Result<Vec<StoredAttachment>> {
        self.read(|c| {
            c.query_map(
                "SELECT a.rel_dir, a.name, a.content, a.mime_type FROM attachments a
                 JOIN sessions s ON s.spawn_run = a.run_id
                 WHERE s.id = ?1 AND a.removed_at IS NULL AND a.content IS NOT NULL ORDER BY a.id",
                args![session],
                |r| {
                    Ok(StoredAttachment {
                        rel_dir: r.get(0)?,
                        name: r.get(1)?,
                        content: r.get(2)?,
                        mime_type: r.get(3)?,
                    })
                },
            )
        })
    }

    /// Records that a run's attachment files were removed (their receipts stay). One keyed
    /// statement: no global lock on a shared database.
    pub fn attachments_removed(&self, run_id: &str) -> Result<()> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<()> {
            tx.execute("UPDATE attachments SET removed_at = ?2 WHERE run_id = ?1", args![run_id, now_ms()])?;
            Ok(())
        })
    }
}
