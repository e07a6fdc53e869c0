//! Thread bindings (schema v8): a sub-agent bound to a thread of its requester's channel, found
//! again by the channel, address and thread a bridge posts in, and kept available (mode
//! `session`) until its idle time or age runs out — the archive sweep ends it.

use super::sql::{Optional, Sql, args};

use super::text_enum::text_enum;
use super::{Result, Store, now_ms};
use crate::keys::SessionKey;

/// How long a thread-bound child lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindingMode {
    /// One task: it is archived after its announce as any child is.
    Run,
    /// Persistent: later messages in its thread are its next turns, until it is idle too long.
    Session,
}

text_enum!(BindingMode { Run => "run", Session => "session" });

/// A child's thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadBinding {
    pub channel: String,
    pub to: String,
    pub thread_id: String,
    pub mode: BindingMode,
    pub idle_ms: Option<i64>,
    pub max_age_ms: Option<i64>,
    pub created_at: i64,
}

impl ThreadBinding {
    /// When a session-mode child archives if nothing happens from `now`: its idle time from now,
    /// capped by its age.
    pub fn archive_due(&self, now: i64) -> Option<i64> {
        if self.mode != BindingMode::Session {
            return None;
        }
        let idle = self.idle_ms.map(|ms| now + ms);
        let aged = self.max_age_ms.map(|ms| self.created_at + ms);
        match (idle, aged) {
            (Some(i), Some(a)) => Some(i.min(a)),
            (i, a) => i.or(a),
        }
    }
}

pub(super) fn bind(c: &dyn Sql, session: i64, b: &ThreadBinding) -> Result<()> {
    c.execute(
        "INSERT INTO thread_bindings (session, channel, to_addr, thread_id, mode, idle_ms, max_age_ms, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        args![session, b.channel, b.to, b.thread_id, b.mode.as_str(), b.idle_ms, b.max_age_ms, b.created_at],
    )?;
    Ok(())
}

pub(super) fn binding_of(c: &dyn Sql, session: i64) -> Result<Option<ThreadBinding>> {
    c.query_row("SELECT channel, to_addr, thread_id, mode, idle_ms, max_age_ms, created_at FROM thread_bindings WHERE session = ?1", args![session], |r| {
        Ok(ThreadBinding {
            channel: r.get(0)?,
            to: r.get(1)?,
            thread_id: r.get(2)?,
            mode: BindingMode::parse(&r.get::<String>(3)?).unwrap_or(BindingMode::Run),
            idle_ms: r.get(4)?,
            max_age_ms: r.get(5)?,
            created_at: r.get(6)?,
        })
    })
    .optional()
}

impl Store {
    /// A session's thread, if it is bound to one.
    pub fn thread_binding(&self, session: i64) -> Result<Option<ThreadBinding>> {
        self.read(|c| binding_of(c, session))
    }

    /// The live (not archived, not deleted) session-mode child bound to this thread, if any.
    pub fn bound_session(&self, channel: &str, to: &str, thread_id: &str) -> Result<Option<SessionKey>> {
        self.read(|c| {
            c.query_row(
                "SELECT s.key FROM thread_bindings b JOIN sessions s ON s.id = b.session
                 WHERE b.channel = ?1 AND b.to_addr = ?2 AND b.thread_id = ?3 AND b.mode = 'session' AND s.state = 0
                 ORDER BY b.created_at DESC LIMIT 1",
                args![channel, to, thread_id],
                |r| Ok(SessionKey::from_canonical(r.get::<String>(0)?)),
            )
            .optional()
        })
    }

    /// A session-mode child was active: its archive moves to its idle time from now (capped by
    /// its age). Nothing for other sessions. No global lock on a shared database: the binding
    /// it reads is written once, at the spawn, and the update re-checks the session's state.
    pub fn touch_binding(&self, session: i64) -> Result<()> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<()> {
            let now = now_ms();
            let Some(due) = binding_of(tx, session)?.and_then(|b| b.archive_due(now)) else { return Ok(()) };
            tx.execute(
                "UPDATE sessions SET archive_due_at = ?2 WHERE id = ?1 AND state = 0 AND announced_at IS NOT NULL",
                args![session, due],
            )?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_child_archives_after_its_idle_time_capped_by_its_age() {
        let b = ThreadBinding {
            channel: "discord".into(),
            to: "channel:1".into(),
            thread_id: "t".into(),
            mode: BindingMode::Session,
            idle_ms: Some(1000),
            max_age_ms: Some(5000),
            created_at: 0,
        };
        assert_eq!(b.archive_due(100), Some(1100));
        assert_eq!(b.archive_due(4500), Some(5000), "never past its age");
        assert_eq!(ThreadBinding { idle_ms: None, ..b.clone() }.archive_due(100), Some(5000));
        assert_eq!(ThreadBinding { mode: BindingMode::Run, ..b }.archive_due(100), None, "a run child archives as any");
    }
}
