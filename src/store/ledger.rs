//! The delivery ledger and idempotency keys.

use super::sql::{Optional, Sql, args};
use serde_json::{Value, json};

use super::text_enum::text_enum;
use super::{NewMessage, Result, Store, now_ms};
use crate::keys::SessionKey;

/// What a delivery carries out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryKind {
    Inbox,
    Reply,
    Announce,
    Completion,
    /// A sub-agent's approval, posted to the chat its tree is bound to for a person to answer
    /// (one per ask; a run may post several).
    Ask,
}

text_enum!(DeliveryKind { Inbox => "inbox", Reply => "reply", Announce => "announce", Completion => "completion", Ask => "ask" });

/// How a delivery reaches its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryMode {
    Announce,
    Inbox,
    Channel,
}

text_enum!(DeliveryMode { Announce => "announce", Inbox => "inbox", Channel => "channel" });

/// Where a delivery is. `queued` and `running` may still change; the rest are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryStatus {
    Queued,
    Running,
    Delivered,
    Failed,
    Skipped,
    /// A channel delivery that kept failing until its deadline.
    Expired,
    /// No channel can carry it (no deliverer configured, no address).
    Undeliverable,
    /// An operator closed a failed, expired or undeliverable one: nobody tries it again.
    Dismissed,
}

text_enum!(DeliveryStatus {
    Queued => "queued", Running => "running", Delivered => "delivered", Failed => "failed", Skipped => "skipped",
    Expired => "expired", Undeliverable => "undeliverable", Dismissed => "dismissed",
});

/// A ledger row to create.
#[derive(Debug, Clone)]
pub struct NewDelivery<'a> {
    pub run_id: &'a str,
    pub kind: DeliveryKind,
    pub mode: DeliveryMode,
    pub status: DeliveryStatus,
    pub target_key: &'a str,
    pub channel: Option<&'a str>,
    pub last_error: Option<&'a str>,
}

/// Records a delivery, once: a run has at most one delivery of each kind, so a flow step that is
/// taken again after a crash adds nothing. Returns false when the delivery was already there.
pub(super) fn add_delivery(tx: &dyn Sql, d: &NewDelivery, payload: Option<&str>) -> Result<bool> {
    lock_deliveries_of(tx, d.run_id)?;
    let now = now_ms();
    let added = tx
        .execute("INSERT INTO deliveries (run_id, kind, mode, status, target_key, channel, last_error, attempts, created_at, updated_at, payload)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10
             WHERE NOT EXISTS (SELECT 1 FROM deliveries WHERE run_id = ?1 AND kind = ?2)", args![
            d.run_id,
            d.kind.as_str(),
            d.mode.as_str(),
            d.status.as_str(),
            d.target_key,
            d.channel,
            d.last_error,
            i64::from(d.status != DeliveryStatus::Queued),
            now,
            payload
        ])?;
    Ok(added == 1)
}

/// Locks the row of the run whose deliveries a writer is about to add, so that its "none of this
/// kind yet" check holds until its commit: on PostgreSQL two writers (the run's owner taking its
/// steps and another node catching them up) would otherwise both find none and both insert. The
/// check runs in a statement of its own after the lock, whose snapshot sees the other's commit
/// (a subquery of the locking statement would still read the snapshot taken before the wait).
/// A run row in the store's lock order: after the session row, before rows keyed to the run.
fn lock_deliveries_of(tx: &dyn Sql, run_id: &str) -> Result<()> {
    if tx.dialect() == super::sql::Dialect::Postgres {
        tx.query_map("SELECT 1 FROM runs WHERE run_id = ?1 FOR UPDATE", args![run_id], |_| Ok(()))?;
    }
    Ok(())
}

/// Moves a pending delivery to `status`. Returns false when it had already reached a final
/// status (a step taken again after a crash): final is final.
pub(super) fn set_delivery_status(tx: &dyn Sql, id: i64, status: DeliveryStatus, error: Option<&str>) -> Result<bool> {
    let changed = tx.execute(
        "UPDATE deliveries SET status = ?2, last_error = coalesce(?3, last_error), attempts = attempts + 1,
                 updated_at = ?4
             WHERE id = ?1 AND status IN ('queued', 'running')",
        args![id, status.as_str(), error, now_ms()],
    )?;
    Ok(changed == 1)
}

/// A remembered idempotency key.
#[derive(Debug, Clone)]
pub struct IdempotencyHit {
    pub args_hash: String,
    pub run_id: Option<String>,
    pub result: Option<Value>,
}

/// Idempotency keys are kept 24 h.
pub const IDEMPOTENCY_TTL_MS: i64 = 24 * 3600 * 1000;

/// Where a bridge's message id posted into `session` is remembered, as (caller, key): under a
/// caller that is no session key (those are `agent:…` or `global`), so that the tools' keys,
/// remembered under their caller's session key, are another namespace whatever their text.
/// Schema 11 moved the rows written before into it.
pub(super) fn bridge_message_key(session: &crate::keys::SessionKey, message_id: &str) -> (String, String) {
    (format!("channel_bridge:{session}"), format!("message:{message_id}"))
}

pub(super) fn remember_key(
    tx: &dyn Sql,
    caller: &str,
    key: &str,
    tool: &str,
    args_hash: &str,
    run_id: &str,
    result: &Value,
) -> Result<()> {
    tx.execute(
        "INSERT INTO idempotency (caller, key, tool, args_hash, run_id, result, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (caller, key) DO UPDATE SET tool = excluded.tool, args_hash = excluded.args_hash,
             run_id = excluded.run_id, result = excluded.result, created_at = excluded.created_at",
        args![caller, key, tool, args_hash, run_id, result.to_string(), now_ms()],
    )?;
    Ok(())
}

/// Takes the caller's idempotency key for the run it starts, unless a use of it within
/// [`IDEMPOTENCY_TTL_MS`] holds it: then that use, and nothing is written. One statement that
/// decides on the key's row itself (a concurrent use waits for the other's commit, then finds it),
/// so two uses of one key on two nodes start one run between them, with no global lock.
pub(super) fn claim_key(tx: &dyn Sql, key: &RememberedKey) -> Result<Option<IdempotencyHit>> {
    let now = now_ms();
    let taken = tx.execute(
        "INSERT INTO idempotency (caller, key, tool, args_hash, run_id, result, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (caller, key) DO UPDATE SET tool = excluded.tool, args_hash = excluded.args_hash,
             run_id = excluded.run_id, result = excluded.result, created_at = excluded.created_at
         WHERE idempotency.created_at <= ?8",
        args![
            key.caller,
            key.key,
            key.tool,
            key.args_hash,
            key.run_id,
            key.result.to_string(),
            now,
            now - IDEMPOTENCY_TTL_MS
        ],
    )?;
    if taken == 1 {
        return Ok(None);
    }
    idempotency_hit(tx, key.caller, key.key)
}

/// A use of an idempotency key, as [`claim_key`] records it.
pub struct RememberedKey<'a> {
    pub caller: &'a str,
    pub key: &'a str,
    pub tool: &'a str,
    pub args_hash: &'a str,
    pub run_id: &'a str,
    pub result: &'a Value,
}

impl Store {
    /// The first delivery of a run: `{status, mode}` (what sessions_send reports).
    pub fn delivery_of(&self, run_id: &str) -> Result<Option<Value>> {
        self.read(|c| {
            c.query_row(
                "SELECT status, mode FROM deliveries WHERE run_id = ?1 AND kind <> 'ask' ORDER BY id LIMIT 1",
                args![run_id],
                |r| Ok(json!({"status": r.get::<String>(0)?, "mode": r.get::<String>(1)?})),
            )
            .optional()
        })
    }

    /// A caller's idempotency key, if used in the last 24 h.
    pub fn idempotency(&self, caller: &str, key: &str) -> Result<Option<IdempotencyHit>> {
        self.read(|c| idempotency_hit(c, caller, key))
    }
}

impl Store {
    /// Whether the steps after a run were taken and none of its deliveries is still on its way.
    pub fn run_settled(&self, run_id: &str) -> Result<bool> {
        self.read(|c| {
            c.query_row(
                "SELECT (SELECT steps_done_at IS NOT NULL FROM runs WHERE run_id = ?1)
                    AND NOT EXISTS (SELECT 1 FROM deliveries WHERE run_id = ?1 AND status IN ('queued', 'running'))",
                args![run_id],
                |r| Ok(r.get::<Option<bool>>(0)?.unwrap_or(true)),
            )
        })
    }

    /// The run's reply delivery that is still queued, if any.
    pub fn pending_delivery(&self, run_id: &str) -> Result<Option<i64>> {
        self.read(|c| {
            c.query_row(
                "SELECT id FROM deliveries WHERE run_id = ?1 AND status = 'queued' AND kind <> 'ask' ORDER BY id LIMIT 1",
                args![run_id],
                |r| r.get(0),
            )
            .optional()
        })
    }

    /// Messages appended on a chain so far (the loop guard's count).
    pub fn chain_messages(&self, chain: &str) -> Result<i64> {
        self.read(|c| c.query_row("SELECT count(*) FROM messages WHERE chain_id = ?1", args![chain], |r| r.get(0)))
    }
}

/// Queues a channel delivery to attempt now: once per run and kind, except asks (one per ask).
pub(super) fn queue_channel(
    tx: &dyn Sql,
    run_id: &str,
    kind: DeliveryKind,
    target: &str,
    channel: &str,
    payload: &Value,
) -> Result<()> {
    if kind != DeliveryKind::Ask {
        lock_deliveries_of(tx, run_id)?;
    }
    let now = now_ms();
    tx.execute(
        "INSERT INTO deliveries (run_id, kind, mode, status, target_key, channel, payload, attempts,
             next_attempt_at, deadline_at, created_at, updated_at)
         SELECT ?1, ?7, 'channel', 'queued', ?2, ?3, ?4, 0, ?5, ?6, ?5, ?5
         WHERE ?7 = 'ask' OR NOT EXISTS (SELECT 1 FROM deliveries WHERE run_id = ?1 AND kind = ?7)",
        args![run_id, target, channel, payload.to_string(), now, now + 30 * 60 * 1000, kind.as_str()],
    )?;
    Ok(())
}

/// A channel delivery waiting for its deliverer.
#[derive(Debug, Clone)]
pub struct DueDelivery {
    pub id: i64,
    pub channel: String,
    pub payload: Value,
    pub attempts: i64,
    pub deadline_at: i64,
}

impl Store {
    /// Adds a channel delivery to attempt now (payload is what the deliverer gets on stdin), once
    /// per run and kind. No global lock on a shared database: the run's row is locked for the
    /// check (`lock_deliveries_of`).
    pub fn queue_channel_delivery(
        &self,
        run_id: &str,
        kind: DeliveryKind,
        target: &str,
        channel: &str,
        payload: &Value,
    ) -> Result<()> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| {
            queue_channel(tx, run_id, kind, target, channel, payload)
        })
    }

    /// Hands a pending delivery over into the transcript of session `to` (an external requester's
    /// inbox): `message` is appended in the transaction that moves the delivery to `delivered`,
    /// so it is appended once however many takers of the step try. False when the delivery had
    /// already reached a final status. No global lock on a shared database: the conditional
    /// update decides (a second taker waits for the first's commit, then finds it final), the
    /// session's row locked before it, in the store's lock order.
    pub fn hand_over_to_inbox(&self, delivery: i64, to: &SessionKey, message: &NewMessage) -> Result<bool> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<bool> {
            let session = super::sessions::session_id(tx, to)?;
            super::run_queue::lock_session(tx, session)?;
            if !set_delivery_status(tx, delivery, DeliveryStatus::Delivered, None)? {
                return Ok(false);
            }
            super::messages::append_message(tx, session, message)?;
            Ok(true)
        })
    }

    /// Queues a reply step (`step`, whose run id is derived from the run it answers) with its own
    /// pending reply delivery to `reply_to`, and moves the answered run's pending delivery
    /// (`answered`) to `delivered`: all once, however many takers of the step try (false for a
    /// taker that found the step queued). No global lock on a shared database: the step's
    /// insert under its run id decides (a second taker waits for the first's commit, then finds
    /// it and stops).
    pub fn queue_reply_step(&self, step: &super::NewRun, answered: Option<i64>, reply_to: &str) -> Result<bool> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<bool> {
            if !super::run_queue::enqueue(tx, step)? {
                return Ok(false);
            }
            if let Some(id) = answered {
                set_delivery_status(tx, id, DeliveryStatus::Delivered, None)?;
            }
            let reply = NewDelivery {
                run_id: &step.run_id,
                kind: DeliveryKind::Reply,
                mode: DeliveryMode::Inbox,
                status: DeliveryStatus::Queued,
                target_key: reply_to,
                channel: None,
                last_error: None,
            };
            add_delivery(tx, &reply, None)?;
            Ok(true)
        })
    }

    /// Claims channel deliveries that are due (marks them running).
    ///
    /// On a shared database the sweeping node asks at every tick: a read says whether any is due
    /// (most ticks none is, and then nothing is written), and the claim holds no global lock,
    /// only the rows it claims (`FOR UPDATE SKIP LOCKED`: a row another claim holds is left to it).
    pub fn claim_due_deliveries(&self, limit: usize) -> Result<Vec<DueDelivery>> {
        const DUE: &str = "FROM deliveries WHERE status = 'queued' AND mode = 'channel' AND next_attempt_at <= ?1";
        if self.is_shared() {
            let any = self.read(|c| c.one::<bool>(&format!("SELECT EXISTS (SELECT 1 {DUE})"), args![now_ms()]))?;
            if !any {
                return Ok(Vec::new());
            }
        }
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<Vec<DueDelivery>> {
            let now = now_ms();
            let skip_locked = match tx.dialect() {
                super::sql::Dialect::Postgres => " FOR UPDATE SKIP LOCKED",
                super::sql::Dialect::Sqlite => "",
            };
            let sql = format!(
                "SELECT id, channel, payload, attempts, deadline_at {DUE} ORDER BY next_attempt_at LIMIT ?2{skip_locked}"
            );
            let due: Vec<DueDelivery> = tx.query_map(&sql, args![now, limit as i64], |r| {
                Ok(DueDelivery {
                    id: r.get(0)?,
                    channel: r.get::<Option<String>>(1)?.unwrap_or_default(),
                    payload: r.get::<Option<String>>(2)?.and_then(|s| serde_json::from_str(&s).ok()).unwrap_or(Value::Null),
                    attempts: r.get(3)?,
                    deadline_at: r.get::<Option<i64>>(4)?.unwrap_or(now),
                })
            })?;
            for d in &due {
                tx.execute("UPDATE deliveries SET status = 'running', updated_at = ?2 WHERE id = ?1", args![d.id, now])?;
            }
            Ok(due)
        })
    }

    /// Records one attempt: a final status, or `queued` again with the next attempt time.
    pub fn delivery_attempted(
        &self,
        id: i64,
        status: DeliveryStatus,
        error: Option<&str>,
        next_attempt_at: Option<i64>,
    ) -> Result<()> {
        // One statement on the row its claim holds: no global lock on a shared database.
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<()> {
            tx.execute(
                "UPDATE deliveries SET status = ?2, last_error = coalesce(?3, last_error), attempts = attempts + 1,
                     next_attempt_at = coalesce(?4, next_attempt_at), updated_at = ?5 WHERE id = ?1",
                args![id, status.as_str(), error, next_attempt_at, now_ms()],
            )?;
            Ok(())
        })
    }

    /// Channel deliveries left `running` by a dead owner are attempted again. One statement that
    /// decides by itself: no global lock on a shared database.
    pub fn requeue_running_deliveries(&self) -> Result<usize> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<usize> {
            tx.execute("UPDATE deliveries SET status = 'queued' WHERE status = 'running' AND mode = 'channel'", args![])
        })
    }
}

/// A caller's idempotency key, if used in the last 24 h (inside a transaction too).
pub(super) fn idempotency_hit(c: &dyn Sql, caller: &str, key: &str) -> Result<Option<IdempotencyHit>> {
    c.query_row(
        "SELECT args_hash, run_id, result FROM idempotency WHERE caller = ?1 AND key = ?2 AND created_at > ?3",
        args![caller, key, now_ms() - IDEMPOTENCY_TTL_MS],
        |r| {
            Ok(IdempotencyHit {
                args_hash: r.get(0)?,
                run_id: r.get(1)?,
                result: r.get::<Option<String>>(2)?.and_then(|s| serde_json::from_str(&s).ok()),
            })
        },
    )
    .optional()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{AgentId, SessionKind};
    use crate::store::postgres::with_test_database;
    use crate::store::{NewRun, NewSession, RunMode};

    /// Issue 37: the writes of a run's steps hold no global lock, so the run's owner taking them
    /// and another node catching them up (`runs_with_steps_pending`) may write at once. Eight
    /// takers on two nodes take each step of one run at the same moment, round after round: the
    /// reply lands in the external inbox once, the reply step is queued once with one delivery,
    /// the recorded delivery and the channel delivery are each there once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_eight_takers_on_two_nodes_take_each_step_once() {
        with_test_database(async |target| {
            let dirs = [(); 2].map(|_| tempfile::tempdir().unwrap());
            let nodes: Vec<Store> =
                dirs.iter().map(|d| Store::open_postgres(target.clone(), d.path()).unwrap()).collect();
            let (inbox, worker) =
                (SessionKey::from_canonical("agent:main:inbox"), SessionKey::from_canonical("agent:main:b"));
            for key in [&inbox, &worker] {
                let new = NewSession::new(key.clone(), AgentId::main(), SessionKind::Other, false);
                nodes[0].write(|tx| tx.insert_session(&new)).unwrap();
            }
            let worker_id = nodes[0].session_by_key(&worker).unwrap().unwrap().id;
            for round in 0..12 {
                let run_id = format!("run-{round}");
                let input = json!({"role": "user", "content": "hi"});
                nodes[0]
                    .write(|tx| -> Result<bool> {
                        tx.enqueue(&NewRun::new(run_id.clone(), worker_id, RunMode::Send, input))?;
                        tx.add_delivery(&reply_delivery(&run_id, DeliveryKind::Reply, DeliveryStatus::Queued))
                    })
                    .unwrap();
                let delivery = nodes[0].pending_delivery(&run_id).unwrap().expect("the queued reply delivery");
                take_at_once(&nodes, &run_id, delivery, &inbox, worker_id);
                let count = |sql: &str| -> i64 { nodes[1].read(|c| c.one(sql, args![run_id])).unwrap() };
                let step = format!("{run_id}/reply");
                assert_eq!(
                    count("SELECT count(*) FROM messages WHERE run_id = ?1"),
                    1,
                    "round {round}: one inbox append"
                );
                assert_eq!(count("SELECT count(*) FROM deliveries WHERE run_id = ?1 AND kind = 'announce'"), 1);
                assert_eq!(count("SELECT count(*) FROM deliveries WHERE run_id = ?1 AND kind = 'completion'"), 1);
                assert_eq!(count("SELECT count(*) FROM deliveries WHERE run_id = ?1 AND status = 'delivered'"), 2);
                let steps: i64 = nodes[1]
                    .read(|c| {
                        c.one("SELECT count(*) FROM deliveries WHERE run_id = ?1 AND kind = 'reply'", args![step])
                    })
                    .unwrap();
                assert_eq!(steps, 1, "round {round}: the reply step's delivery once");
            }
        })
        .await;
    }

    fn reply_delivery(run_id: &str, kind: DeliveryKind, status: DeliveryStatus) -> NewDelivery<'_> {
        NewDelivery {
            run_id,
            kind,
            mode: DeliveryMode::Inbox,
            status,
            target_key: "agent:main:inbox",
            channel: None,
            last_error: None,
        }
    }

    /// Eight threads, four per node, each taking every step of `run_id` as the engine does
    /// (steps.rs, deliver.rs), started together.
    fn take_at_once(nodes: &[Store], run_id: &str, delivery: i64, inbox: &SessionKey, worker: i64) {
        let start = std::sync::Arc::new(std::sync::Barrier::new(8));
        std::thread::scope(|s| {
            for i in 0..8 {
                let (store, start) = (nodes[i % 2].clone(), start.clone());
                s.spawn(move || {
                    start.wait();
                    let message = NewMessage::user_text("the reply", Some(run_id.to_string()), json!({}), None);
                    store.hand_over_to_inbox(delivery, inbox, &message).unwrap();
                    let payload = json!({"text": "the announce"});
                    store
                        .queue_channel_delivery(run_id, DeliveryKind::Announce, "agent:main:b", "slack", &payload)
                        .unwrap();
                    let recorded = reply_delivery(run_id, DeliveryKind::Completion, DeliveryStatus::Delivered);
                    store.write_row_locked(|tx| tx.add_delivery(&recorded)).unwrap();
                    let input = json!({"role": "user", "content": "the reply"});
                    let step = NewRun::new(format!("{run_id}/reply"), worker, RunMode::Reply, input);
                    store.queue_reply_step(&step, Some(delivery), "agent:main:b").unwrap();
                });
            }
        });
    }
}
