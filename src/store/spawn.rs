//! Sub-agent bookkeeping: admission counts, the announce mark (which closes the child's budget),
//! and the archive sweep.

use super::sql::{Sql, args};

use super::{Result, Store, now_ms};

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

impl Store {
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
    pub fn mark_announced(&self, session: i64, delete: bool, archive_after_ms: Option<i64>) -> Result<()> {
        self.write_sql(|tx| -> Result<()> {
            let now = now_ms();
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

impl Store {
    /// Records that a run's attachment files were removed (their receipts stay).
    pub fn attachments_removed(&self, run_id: &str) -> Result<()> {
        self.write_sql(|tx| -> Result<()> {
            tx.execute("UPDATE attachments SET removed_at = ?2 WHERE run_id = ?1", args![run_id, now_ms()])?;
            Ok(())
        })
    }
}
