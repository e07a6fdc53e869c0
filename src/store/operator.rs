//! Whole-store reads and maintenance for the operator CLI (ls, show, policy, export, prune).

use super::sql::args;

use super::messages::message_columns;
use super::sessions::session_columns;
use super::{MessageRow, Result, SessionRow, Store};

/// What `prune` removed.
#[derive(Debug, Default, serde::Serialize)]
pub struct Pruned {
    pub sessions: usize,
    pub messages: usize,
    pub runs: usize,
}

impl Store {
    /// Every session, deleted and archived ones included, in creation order.
    pub fn all_sessions(&self) -> Result<Vec<SessionRow>> {
        self.read(|c| {
            let sql = format!("SELECT {} FROM sessions ORDER BY id", session_columns());
            c.query_map(&sql, args![], SessionRow::from_row)
        })
    }

    /// Every message of a session, in seq order.
    pub fn all_messages(&self, session: i64) -> Result<Vec<MessageRow>> {
        self.read(|c| {
            let sql = format!("SELECT {} FROM messages WHERE session = ?1 ORDER BY seq", message_columns());
            c.query_map(&sql, args![session], MessageRow::from_row)
        })
    }

    /// Records where `export` wrote each session's transcript (keyed updates: no global lock).
    pub fn set_transcript_paths(&self, paths: &[(i64, String)]) -> Result<()> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<()> {
            for (id, path) in paths {
                tx.execute("UPDATE sessions SET transcript_path = ?2 WHERE id = ?1", args![id, path])?;
            }
            Ok(())
        })
    }

    /// Sets (allow/deny) or clears (None) a session's send-policy override. False if no such session.
    /// One keyed update: no global lock.
    pub fn set_send_policy(&self, key: &str, policy: Option<super::SendPolicyOverride>) -> Result<bool> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<bool> {
            Ok(tx.execute(
                "UPDATE sessions SET send_policy = ?2 WHERE key = ?1",
                args![key, policy.map(super::SendPolicyOverride::as_str)],
            )? > 0)
        })
    }

    /// Run counts per status.
    pub fn run_counts(&self) -> Result<Vec<(String, i64)>> {
        self.read(|c| {
            c.query_map("SELECT status, count(*) FROM runs GROUP BY status ORDER BY status", args![], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
        })
    }

    /// Permanently removes deleted and archived sessions whose deletedAt/archivedAt is before
    /// `before` (ms), with their messages, runs, deliveries and tree links.
    ///
    /// Holds no global lock on a shared database: one statement picks the sessions and locks
    /// their rows, root to leaf (`run_queue::lock_sessions`' order), before any of their rows
    /// elsewhere is touched (a claim holding one of them may still need its tree rows: no lock
    /// cycle with it); a session that another writer brought back meanwhile is re-read under
    /// its lock and left out.
    pub fn prune(&self, before: i64) -> Result<Pruned> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<Pruned> {
            let lock = if tx.dialect() == super::sql::Dialect::Postgres { " FOR UPDATE" } else { "" };
            let ids: Vec<i64> = tx.query_map(
                &format!(
                    "SELECT id FROM sessions WHERE (state = 2 AND deleted_at < ?1) OR (state = 1 AND archived_at < ?1)
                     ORDER BY spawn_depth, id{lock}"
                ),
                args![before],
                |r| r.get(0),
            )?;
            let mut out = Pruned::default();
            for id in ids {
                out.messages += tx.execute("DELETE FROM messages WHERE session = ?1", args![id])?;
                tx.execute(
                    "DELETE FROM deliveries WHERE run_id IN (SELECT run_id FROM runs WHERE session = ?1)",
                    args![id],
                )?;
                tx.execute(
                    "DELETE FROM attachments WHERE run_id IN (SELECT run_id FROM runs WHERE session = ?1)",
                    args![id],
                )?;
                out.runs += tx.execute("DELETE FROM runs WHERE session = ?1", args![id])?;
                tx.execute("DELETE FROM session_tree WHERE session = ?1 OR ancestor = ?1", args![id])?;
                out.sessions += tx.execute("DELETE FROM sessions WHERE id = ?1", args![id])?;
            }
            Ok(out)
        })
    }
}

impl Store {
    /// What `/metrics` reports of the store: runs by status and agent, deliveries by status and
    /// kind, usage and sessions by agent (deleted sessions left out of the last).
    pub fn metric_counts(&self) -> Result<crate::metrics::StoreCounts> {
        self.read(|c| {
            let rows3 = |sql: &str| -> Result<Vec<(String, String, i64)>> {
                c.query_map(sql, args![], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            };
            let runs = rows3(
                "SELECT r.status, s.agent_id, count(*) FROM runs r JOIN sessions s ON s.id = r.session
                 GROUP BY r.status, s.agent_id ORDER BY 1, 2",
            )?;
            let deliveries =
                rows3("SELECT status, kind, count(*) FROM deliveries GROUP BY status, kind ORDER BY 1, 2")?;
            let usage = c.query_map(
                &format!(
                    "SELECT agent_id, {}, {}, coalesce(sum(cost), 0) FROM sessions GROUP BY agent_id ORDER BY 1",
                    c.dialect().sum_int("tokens_in"),
                    c.dialect().sum_int("tokens_out")
                ),
                args![],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )?;
            let sessions = c.query_map(
                "SELECT agent_id, count(*) FROM sessions WHERE state <> 2 GROUP BY agent_id ORDER BY 1",
                args![],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            Ok(crate::metrics::StoreCounts { runs, deliveries, usage, sessions })
        })
    }
}
