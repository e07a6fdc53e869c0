//! What the layers above read once access has said yes: a visible session's transcript, runs and
//! deliveries, and the change feed of the server's subscriptions. Everything above the engine
//! reads the store through these (the tools never hold it), with the row `resolve` gave them, so
//! no read can skip the visibility decision that produced the row.

use std::path::PathBuf;

use serde_json::Value;

use super::{Access, ToolError};
use crate::config::Config;
use crate::keys::SessionKey;
use crate::store::{HistoryPage, IdempotencyHit, MessageRow, PendingInput, RunRow, SessionRow, StoreError};

/// Where a history page starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryFrom {
    /// The newest messages.
    Newest,
    /// The oldest messages after this seq.
    After(i64),
    /// The newest messages before this seq.
    Before(i64),
}

impl Access {
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// `<stateDir>/export`, where exported transcripts lie.
    pub fn export_dir(&self) -> Option<PathBuf> {
        self.store.path().parent().map(crate::config::export_dir)
    }

    pub fn history(
        &self,
        row: &SessionRow,
        from: HistoryFrom,
        limit: usize,
        tools: bool,
    ) -> Result<HistoryPage, ToolError> {
        Ok(match from {
            HistoryFrom::Newest => self.store.history_tail(row.id, limit, tools)?,
            HistoryFrom::After(after) => self.store.history_after(row.id, after, limit, tools)?,
            HistoryFrom::Before(before) => self.store.history_before(row.id, before, limit, tools)?,
        })
    }

    /// Whether the session has messages before `first` and after `last` (the page pointers).
    pub fn history_around(
        &self,
        row: &SessionRow,
        first: i64,
        last: i64,
        tools: bool,
    ) -> Result<(bool, bool), ToolError> {
        Ok(self.store.history_around(row.id, first, last, tools)?)
    }

    pub fn message_at(&self, row: &SessionRow, seq: i64) -> Result<Option<MessageRow>, ToolError> {
        Ok(self.store.message_at(row.id, seq)?)
    }

    /// Inputs queued for the session that no run has taken yet.
    pub fn pending_inputs(&self, row: &SessionRow) -> Result<Vec<PendingInput>, ToolError> {
        Ok(self.store.pending_inputs(row.id)?)
    }

    pub fn recent_runs(&self, row: &SessionRow, limit: usize) -> Result<Vec<Value>, ToolError> {
        Ok(self.store.recent_runs(row.id, limit)?)
    }

    /// The last `limit` messages of each row, in the rows' order.
    pub fn last_messages(&self, rows: &[SessionRow], limit: usize) -> Result<Vec<Vec<MessageRow>>, ToolError> {
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        Ok(self.store.last_messages(&ids, limit)?)
    }

    /// The newest seq of a session (0 when it has none).
    pub fn last_seq_of(&self, key: &SessionKey) -> Result<i64, StoreError> {
        self.store.last_seq_of(key)
    }

    pub fn last_seqs_of(&self, keys: &[SessionKey]) -> Result<Vec<i64>, StoreError> {
        self.store.last_seqs_of(keys)
    }

    /// The newest message id of the store: where the change feed starts.
    pub fn newest_message_id(&self) -> Result<i64, StoreError> {
        self.store.newest_message_id()
    }

    /// Watches the store's changes (every commit, and what other processes report).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.store.changes()
    }

    /// The sessions that gained messages after message id `after`, and the new newest id.
    pub fn grown_since(&self, after: i64) -> Result<(i64, Vec<(String, i64)>), StoreError> {
        self.store.grown_since(after)
    }

    /// A run by id: the engine's tasks and answers name runs the caller started.
    pub fn run(&self, run_id: &str) -> Result<Option<RunRow>, StoreError> {
        self.store.run(run_id)
    }

    /// A run's reply delivery as the ledger records it ({status, mode}).
    pub fn delivery_of(&self, run_id: &str) -> Option<Value> {
        self.store.delivery_of(run_id).ok().flatten()
    }

    /// The seq of a run's reply in its session (where a cut reply is whole).
    pub fn reply_seq(&self, session: &SessionKey, run_id: &str) -> Option<i64> {
        self.store.reply_seq(session, run_id).ok().flatten()
    }
}

/// The facts the engine's admission reads before it needs the runtime: the same refusals with or
/// without one.
impl Access {
    /// The caller's own row (None for a main session that exists only virtually).
    /// The store's counts for `/metrics` (operators only: the endpoint checks the token).
    pub fn metric_counts(&self) -> Result<crate::metrics::StoreCounts, StoreError> {
        self.store.metric_counts()
    }

    pub fn own_row(&self, caller: &super::caller::Caller) -> Result<Option<SessionRow>, StoreError> {
        self.store.session_by_key(&caller.key)
    }

    /// A caller's idempotency key, if it was used within its lifetime.
    pub fn idempotency(&self, caller: &SessionKey, key: &str) -> Result<Option<IdempotencyHit>, StoreError> {
        self.store.idempotency(caller.as_str(), key)
    }

    /// How many inter-session messages a chain has carried.
    pub fn chain_messages(&self, chain: &str) -> Result<i64, StoreError> {
        self.store.chain_messages(chain)
    }

    /// Whether waiting on `target` from `caller` would close a wait cycle.
    pub fn wait_would_deadlock(&self, caller: &SessionRow, target: &SessionRow) -> Result<bool, StoreError> {
        self.store.wait_would_deadlock(caller.id, target.id)
    }
}
