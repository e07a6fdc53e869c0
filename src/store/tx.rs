//! The unit of work the engine writes in: [`Store::write`] hands its closure a [`Tx`], one
//! transaction that commits when the closure returns `Ok` and rolls back otherwise. The engine
//! keeps its rules between the statements (a spawn's admission caps, an inbox append only when
//! the delivery moved); the statements themselves are these methods, in domain types, so no
//! SQL and no backend type leaves the store.

use super::sql::{Sql, args};
use serde_json::Value;

use super::{NewDelivery, NewMessage, NewRun, NewSession, Result, SpawnCounts, Store, StoreError};
use crate::keys::SessionKey;

/// One write transaction.
pub struct Tx<'a> {
    tx: &'a dyn Sql,
}

impl Store {
    /// Runs `f` in one write transaction; commits when `f` returns `Ok`.
    pub fn write<T, E>(&self, f: impl FnOnce(&Tx) -> std::result::Result<T, E>) -> std::result::Result<T, E>
    where
        E: From<StoreError>,
    {
        self.write_sql(|tx| f(&Tx { tx }))
    }

    /// As [`Store::write`], holding no global lock on a shared database (SQLite has one writer):
    /// for a transaction whose checks rest on the rows it touches, locked in the store's order
    /// (docs/ARCHITECTURE.md, PostgreSQL): inserts under unique keys, a key claimed by
    /// [`Tx::claim_key`], the rows `append_message` locks. `f` may run more than once (a
    /// transaction PostgreSQL ended for a deadlock is run again whole).
    pub fn write_row_locked<T, E>(&self, f: impl Fn(&Tx) -> std::result::Result<T, E>) -> std::result::Result<T, E>
    where
        E: From<StoreError>,
    {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| f(&Tx { tx }))
    }
}

impl Tx<'_> {
    /// Creates the session unless its key exists. True when it was created.
    pub fn insert_session(&self, s: &NewSession) -> Result<bool> {
        super::sessions::insert_session(self.tx, s)
    }

    /// The row id of a session written in this transaction or before.
    pub fn session_id(&self, key: &SessionKey) -> Result<i64> {
        super::sessions::session_id(self.tx, key)
    }

    /// The row id of a session, if it exists.
    pub fn find_session_id(&self, key: &SessionKey) -> Result<Option<i64>> {
        use super::sql::Optional;
        super::sessions::session_id(self.tx, key).optional()
    }

    /// Appends a message to a session; returns its seq.
    pub fn append_message(&self, session: i64, m: &NewMessage) -> Result<i64> {
        super::messages::append_message(self.tx, session, m)
    }

    /// Queues a run, once: false when a run with its id exists (a step taken again).
    pub fn enqueue(&self, run: &NewRun) -> Result<bool> {
        super::run_queue::enqueue(self.tx, run)
    }

    /// Records a delivery, once per run and kind: false when it was already there.
    pub fn add_delivery(&self, d: &NewDelivery) -> Result<bool> {
        super::ledger::add_delivery(self.tx, d, None)
    }

    /// Ends a queued run `cancelled` with its steps taken (there are none to take): a step that
    /// became moot before it started. Nothing when it started already.
    pub fn withdraw_queued_run(&self, run_id: &str, why: &str) -> Result<()> {
        let now = super::now_ms();
        super::cancel::dequeue(self.tx, run_id, now, why)?;
        self.tx.execute(
            "UPDATE runs SET steps_done_at = ?2 WHERE run_id = ?1 AND status = 'cancelled' AND steps_done_at IS NULL",
            args![run_id, now],
        )?;
        Ok(())
    }

    /// The budget accounts `session` draws on: its own, then its ancestors', nearest first;
    /// locked for the rest of the transaction, root to leaf, as every writer that reserves or
    /// settles from them locks them (`budgets::lock_chains`).
    pub fn budget_chain(&self, session: i64) -> Result<Vec<crate::policy::budget::Account>> {
        super::budgets::lock_accounts(self.tx, session)?;
        super::budgets::chain(self.tx, session, super::now_ms())
    }

    /// Opens a child's budget account.
    pub fn open_budget(
        &self,
        session: i64,
        limits: &crate::policy::budget::Limits,
        clamped: &[crate::policy::budget::Dim],
    ) -> Result<()> {
        super::budgets::open_account(self.tx, session, limits, clamped)
    }

    /// Opens a root's account with the configured limits, or brings its open one to them.
    pub fn set_root_budget(&self, session: i64, limits: &crate::policy::budget::Limits) -> Result<()> {
        super::budgets::set_root_account(self.tx, session, limits)
    }

    /// The nearest account of `chain` marked exceeded, as a crossing.
    pub fn exceeded_in(&self, chain: &[crate::policy::budget::Account]) -> Result<Option<super::Crossing>> {
        super::budgets::exceeded_in(self.tx, chain)
    }

    /// Reserves `amount` of `dim` in `account` for a child.
    pub fn reserve_budget(&self, account: i64, dim: crate::policy::budget::Dim, amount: i64) -> Result<()> {
        super::budgets::reserve(self.tx, account, dim, amount)
    }

    /// Records an open ask.
    pub fn add_ask(&self, a: &super::NewAsk) -> Result<()> {
        super::asks::add_ask(self.tx, a)
    }

    /// Queues a channel delivery to attempt now (see [`super::Store::queue_channel_delivery`]).
    pub fn queue_channel_delivery(
        &self,
        run_id: &str,
        kind: super::DeliveryKind,
        target: &str,
        channel: &str,
        payload: &Value,
    ) -> Result<()> {
        super::ledger::queue_channel(self.tx, run_id, kind, target, channel, payload)
    }

    /// Adds how one way to a person went to open ask `id`; false when it is closed.
    pub fn add_ask_route(&self, id: &str, event: &Value) -> Result<bool> {
        super::asks::add_ask_route(self.tx, id, event)
    }

    /// How many asks of `run_id` are open.
    pub fn open_asks_of_run(&self, run_id: &str) -> Result<i64> {
        super::asks::open_asks_of_run(self.tx, run_id)
    }

    /// The queued (not started) runs of `session` in `mode`, oldest first.
    /// The session's row stays locked to the end of the transaction (`run_queue::lock_session`):
    /// what is read here is not claimed meanwhile.
    pub fn queued_runs(&self, session: i64, mode: super::RunMode) -> Result<Vec<super::RunRow>> {
        super::run_queue::lock_session(self.tx, session)?;
        super::run_queue::queued_runs(self.tx, session, mode)
    }

    /// Replaces the input of a run that has not started; false when it has.
    pub fn set_queued_input(&self, run_id: &str, input: &Value) -> Result<bool> {
        super::run_queue::set_queued_input(self.tx, run_id, input)
    }

    /// Closes an open ask as `state` with `answer`: false when it was closed already.
    pub fn close_ask(&self, id: &str, state: super::AskState, answer: &super::Answer) -> Result<bool> {
        super::asks::close_ask(self.tx, id, state, answer)
    }

    /// Records a steer; returns its id.
    pub fn add_steer(&self, s: &super::NewSteer) -> Result<i64> {
        super::steer::add_steer(self.tx, s)
    }

    /// Settles a pending steer (`steered`, or `queued` as `queued_run`): false when it was already.
    pub fn settle_steer(&self, id: i64, state: super::SteerState, queued_run: Option<&str>) -> Result<bool> {
        super::steer::settle_steer(self.tx, id, state, queued_run)
    }

    /// True when an ancestor cancelled the work of `session`: nothing of it may start. The
    /// session's row stays locked to the end of the transaction (`run_queue::lock_session`): a
    /// cancel (`cancel_subtree` locks it too) cannot commit between this read and what follows.
    pub fn work_cancelled(&self, session: i64) -> Result<bool> {
        super::run_queue::lock_session(self.tx, session)?;
        super::steer::work_cancelled(self.tx, session)
    }

    /// Locks the rows of `sessions` for the rest of the transaction, root to leaf
    /// (`run_queue::lock_sessions`): a writer that decides on several sessions' runs or
    /// transcripts takes them all first, in the order every such writer takes them.
    pub fn lock_sessions(&self, sessions: &[i64]) -> Result<()> {
        super::run_queue::lock_sessions(self.tx, sessions)
    }

    /// The run of `session` running now, if any; the session's row stays locked to the end of
    /// the transaction (`run_queue::lock_session`): no run of it starts meanwhile.
    pub fn running_run(&self, session: i64) -> Result<Option<String>> {
        super::run_queue::lock_session(self.tx, session)?;
        super::steer::running_run(self.tx, session)
    }

    /// Queues pending steer `id` as its child's next turn (`turn`, or the child's queued steer
    /// turn from the same requester), unless the child's work was cancelled.
    pub fn queue_steer(&self, id: i64, turn: &NewRun) -> Result<super::SteerQueued> {
        super::steer::queue_steer(self.tx, id, turn)
    }

    /// Records a child's announce with the text it carried (`subagents` wait returns it), once.
    pub fn add_announce(&self, d: &NewDelivery, text: &str) -> Result<bool> {
        super::ledger::add_delivery(self.tx, d, Some(text))
    }

    /// Moves a pending delivery to `status`: false when it had already reached a final one.
    pub fn set_delivery_status(&self, id: i64, status: super::DeliveryStatus, error: Option<&str>) -> Result<bool> {
        super::ledger::set_delivery_status(self.tx, id, status, error)
    }

    /// Takes the caller's idempotency key for the run it starts, or answers the use that holds
    /// it (then nothing was written; `ledger::claim_key`).
    pub fn claim_key(&self, key: &super::RememberedKey) -> Result<Option<super::IdempotencyHit>> {
        super::ledger::claim_key(self.tx, key)
    }

    /// Remembers the caller's idempotency key for the run it started.
    pub fn remember_key(
        &self,
        caller: &SessionKey,
        key: &str,
        tool: &str,
        args_hash: &str,
        run_id: &str,
        result: &Value,
    ) -> Result<()> {
        super::ledger::remember_key(self.tx, caller.as_str(), key, tool, args_hash, run_id, result)
    }

    /// Binds a child to its thread.
    pub fn bind_thread(&self, session: i64, binding: &super::ThreadBinding) -> Result<()> {
        super::threads::bind(self.tx, session, binding)
    }

    /// A session's `channel` column: where its replies go when its key names no channel.
    pub fn set_channel(&self, session: i64, channel: &str) -> Result<()> {
        self.tx.execute("UPDATE sessions SET channel = ?2 WHERE id = ?1", args![session, channel])?;
        Ok(())
    }

    /// Takes a message id a channel's bridge posts into `session` for the run it starts, or
    /// answers the post of the last 24 h that holds it (then nothing was written). Remembered
    /// apart from the tools' idempotency keys, so that neither answers for the other; one
    /// statement on the id's row (`ledger::claim_key`), so two posts of one message on two nodes
    /// start one run between them.
    pub fn claim_bridge_message(
        &self,
        session: &SessionKey,
        message_id: &str,
        run_id: &str,
    ) -> Result<Option<super::IdempotencyHit>> {
        let (caller, key) = super::ledger::bridge_message_key(session, message_id);
        let result = serde_json::json!({});
        let use_of_key = super::RememberedKey {
            caller: &caller,
            key: &key,
            tool: "channel_bridge",
            args_hash: "",
            run_id,
            result: &result,
        };
        super::ledger::claim_key(self.tx, &use_of_key)
    }

    /// Runs of a channel's users' messages (posted by its bridge) that wait to start; the
    /// count holds to the commit (the channel's queue-bound key, `run_queue::lock_queue_bound`).
    pub fn queued_channel_runs(&self, channel: &str) -> Result<i64> {
        super::run_queue::queued_channel_runs(self.tx, channel)
    }

    /// Runs of an A2A peer's messages that wait to start, held to the commit as
    /// [`Tx::queued_channel_runs`] is.
    pub fn queued_peer_runs(&self, peer: &str) -> Result<i64> {
        super::run_queue::queued_peer_runs(self.tx, peer)
    }

    /// A caller's idempotency key, if used in the last 24 h: read in the transaction that would
    /// use it, so that two posts of one message cannot both pass.
    pub fn idempotency(&self, caller: &SessionKey, key: &str) -> Result<Option<super::IdempotencyHit>> {
        super::ledger::idempotency_hit(self.tx, caller.as_str(), key)
    }

    /// Where a session's channel replies go: the channel, the address on it, the thread and the
    /// account its last inbound message came from.
    pub fn set_route(&self, session: i64, route: &super::Route) -> Result<()> {
        self.tx.execute(
            "UPDATE sessions SET last_channel = ?2, last_to = coalesce(?3, last_to), last_thread_id = ?4,
                 last_account_id = coalesce(?5, last_account_id) WHERE id = ?1",
            args![session, route.channel, route.to, route.thread_id, route.account_id],
        )?;
        Ok(())
    }

    /// A requester's children by state (the spawn caps count them), with what they count
    /// locked for the rest of the transaction (`run_queue::lock_spawn_admission`).
    pub fn spawn_counts(&self, requester: &SessionKey) -> Result<SpawnCounts> {
        super::run_queue::lock_spawn_admission(self.tx, requester.as_str())?;
        super::spawn::spawn_counts(self.tx, requester.as_str())
    }

    /// Links a child session to the run that spawned it.
    pub fn set_spawn_run(&self, child: i64, run_id: &str) -> Result<()> {
        self.tx.execute("UPDATE sessions SET spawn_run = ?2 WHERE id = ?1", args![child, run_id])?;
        Ok(())
    }

    /// The receipt of one file placed for a child's run.
    pub fn add_attachment_receipt(&self, run_id: &str, r: &AttachmentReceipt) -> Result<()> {
        self.tx.execute(
            "INSERT INTO attachments (run_id, name, bytes, sha256, rel_dir, content, mime_type) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            args![run_id, r.name, r.bytes as i64, r.sha256, r.rel_dir, r.content, r.mime_type],
        )?;
        Ok(())
    }
}

/// One attachment as recorded with its run.
pub struct AttachmentReceipt<'a> {
    pub name: &'a str,
    pub bytes: u64,
    pub sha256: &'a str,
    pub rel_dir: &'a str,
    /// The file itself, kept only on a store other nodes share (schema version 10).
    pub content: Option<&'a [u8]>,
    pub mime_type: Option<&'a str>,
}
