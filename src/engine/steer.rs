//! Steering a child (`subagents` steer): a message from an ancestor for the child's work now.
//!
//! Any process records the steer. When the child has a running run, the steer is `pending` for
//! that run, and the owner — the one process that runs it — offers it to the turn
//! ([`crate::runner::Steer`]): an agent that declared it can take steers gets it on stdin and the
//! message joins the transcript (`steered`); otherwise it becomes the child's next turn
//! (`queued`, a run of mode `steer`). Without a running run it is queued at once. Settling is a
//! compare-and-set on `pending`, so a requester that waited in vain for the owner and queues it
//! itself can never race the owner into both.
//!
//! Queued steers coalesce: while a steer turn of the child from the same requester is queued and
//! not started, a further steer joins it instead of queueing another run, so the child gets them
//! all, in order, in one turn. A child whose work was cancelled takes no steer: the check is in
//! the transaction that would queue its turn, so after a cancel answers nothing of it starts.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::chain::{Provenance, SourceTool};
use super::scheduler::Scheduler;
use super::{Engine, step_id};
use crate::access::caller::Caller;
use crate::access::{Child, ToolError};
use crate::runner::Steer;
use crate::store::{
    IdempotencyHit, NewMessage, NewRun, NewSteer, RememberedKey, RunMode, RunRow, SteerQueued, SteerRow, SteerState,
    StoreError, steer_input,
};

/// How long a steer call waits for the owner to say whether the running turn took it.
const DECISION_WAIT: Duration = Duration::from_secs(5);

/// What became of a steer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Written into the running turn; the message is in the child's transcript.
    Steered,
    /// The child's next turn.
    Queued,
}

/// A steer the engine recorded, or the earlier one its idempotency key names.
#[derive(Debug)]
pub struct Steered {
    pub disposition: Disposition,
    /// The child's run that took it, or the run it became.
    pub run_id: Option<String>,
    /// Queued into a steer turn that an earlier steer had queued (it was not started yet).
    pub joined: bool,
}

/// What a caller asks to steer (validated by the tool).
pub struct SteerRequest<'a> {
    pub text: &'a str,
    pub idempotency_key: Option<&'a str>,
    /// The arguments as given: a key re-attaches only to the same ones.
    pub raw: &'a Value,
}

impl Engine<'_> {
    /// Steers `child` (an unfinished descendant the façade resolved): offered to its running
    /// turn, else queued as its next turn. Waits a bounded time for the owner's decision.
    pub async fn steer_subagent(
        &self,
        caller: &Caller,
        child: &Child,
        req: &SteerRequest<'_>,
        cancel: &CancellationToken,
    ) -> Result<Steered, ToolError> {
        let access = self.access;
        access.check_can_act(caller)?;
        let rt = self.runtime("subagents")?;
        let args_hash = crate::store::sha256_hex(&req.raw.to_string());
        let id = match super::chain::replay(access, caller, req.idempotency_key, &args_hash, "steer")? {
            Some(hit) => steer_of(hit)?,
            None => record(rt, caller, child, req, &args_hash)?,
        };
        rt.wake();
        let decided = rt
            .wait_for(DECISION_WAIT, cancel, || -> Result<Option<Option<SteerRow>>, StoreError> {
                // A steer that vanished was dropped: its child was cancelled first.
                Ok(match rt.store.steer(id)? {
                    Some(s) if s.state == SteerState::Pending => None,
                    decided => Some(decided),
                })
            })
            .await?;
        let steer = match decided {
            super::scheduler::Waited::Finished(steer) => steer,
            // No owner decided in time (none runs, or it is busy): the requester queues it.
            _ => match rt.store.steer(id)? {
                Some(pending) => {
                    settle(rt, &pending, false)?;
                    rt.store.steer(id)?
                }
                None => None,
            },
        };
        let steer = steer.ok_or_else(cancelled_first)?;
        Ok(match steer.state {
            SteerState::Steered => Steered { disposition: Disposition::Steered, run_id: steer.run_id, joined: false },
            _ => {
                let joined = steer.queued_run.as_ref().is_some_and(|run| *run != turn_id(steer.id));
                Steered { disposition: Disposition::Queued, run_id: steer.queued_run, joined }
            }
        })
    }
}

/// Why a steer reached nothing: an ancestor cancelled the child's work before it could.
fn cancelled_first() -> ToolError {
    ToolError::invalid(
        "childSessionKey: the sub-agent's work was cancelled, so it takes no steer; nothing was queued — spawn a new one",
    )
}

/// Records the steer: pending for the child's running run, or queued as its next turn.
///
/// Holds no global lock on a shared database: it takes the idempotency key first
/// (`Tx::claim_key`: a concurrent use of the key waits for this commit and answers with its
/// steer), then the child's session row (`Tx::work_cancelled`), which a claim, a run's end and a
/// cancel take too, so what it reads of the child's runs holds until it commits.
fn record(
    rt: &Scheduler,
    caller: &Caller,
    child: &Child,
    req: &SteerRequest,
    args_hash: &str,
) -> Result<i64, ToolError> {
    let chain = child.spawn_run.as_ref().and_then(|r| r.chain_id.clone());
    let channel = if caller.external { "webchat".to_string() } else { super::channel_of_row(&caller.key, None, rt) };
    let provenance = Provenance::from_session(&caller.key, channel, SourceTool::Subagents, chain.as_deref()).to_json();
    rt.store.write_row_locked(|tx| -> Result<i64, ToolError> {
        if let Some(key) = req.idempotency_key {
            let unknown = json!({"steerId": null});
            let use_of_key = RememberedKey {
                caller: caller.key.as_str(),
                key,
                tool: "subagents",
                args_hash,
                run_id: "",
                result: &unknown,
            };
            if let Some(hit) = tx.claim_key(&use_of_key)? {
                return steer_of(super::chain::same_arguments(hit, key, args_hash, "steer")?);
            }
        }
        // Read in the transaction that records it: a cancel or a run's end cannot slip between.
        if tx.work_cancelled(child.row.id)? {
            return Err(cancelled_first());
        }
        let running = tx.running_run(child.row.id)?;
        let steer = NewSteer {
            session: child.row.id,
            run_id: running.as_deref(),
            requester: &caller.key,
            text: req.text,
            provenance: &provenance,
            state: SteerState::Pending,
            queued_run: None,
        };
        let id = tx.add_steer(&steer)?;
        if running.is_none() {
            let turn = next_turn(child.row.id, child.spawn_run.as_ref(), id, req.text, &provenance);
            tx.queue_steer(id, &turn)?;
        }
        if let Some(key) = req.idempotency_key {
            let result = json!({"steerId": id});
            tx.remember_key(&caller.key, key, "subagents", args_hash, running.as_deref().unwrap_or(""), &result)?;
        }
        Ok(id)
    })
}

/// The steer an earlier use of an idempotency key recorded.
fn steer_of(hit: IdempotencyHit) -> Result<i64, ToolError> {
    hit.result
        .as_ref()
        .and_then(|r| r["steerId"].as_i64())
        .ok_or_else(|| ToolError::invalid("idempotencyKey names an earlier call that was not a steer; use a new key"))
}

/// The run id of the turn steer `steer_id` queues when it joins none.
fn turn_id(steer_id: i64) -> String {
    step_id(&format!("steer/{steer_id}"), "turn")
}

/// The child's next turn carrying a steer: it runs with the child's sub-agent context and, when
/// it ends, the child announces as after any of its turns.
fn next_turn(session: i64, spawn: Option<&RunRow>, steer_id: i64, text: &str, provenance: &Value) -> NewRun {
    NewRun {
        run_id: turn_id(steer_id),
        session,
        mode: RunMode::Steer,
        input: steer_input(&[text.to_string()]),
        provenance: Some(provenance.clone()),
        requester_key: spawn.and_then(|r| r.requester_key.clone()),
        chain_id: spawn.and_then(|r| r.chain_id.clone()),
        hop: spawn.map_or(0, |r| r.hop),
        announce_kind: None,
        model: spawn.and_then(|r| r.model.clone()),
        thinking: spawn.and_then(|r| r.thinking.clone()),
        timeout_ms: spawn.and_then(|r| r.timeout_ms),
        extra: spawn.and_then(|r| r.extra.clone()),
    }
}

/// Settles a pending steer once: `taken` appends the message to the child's transcript, else it
/// becomes (or joins) the child's next turn — or is dropped when the child was cancelled.
fn settle(rt: &Scheduler, steer: &SteerRow, taken: bool) -> Result<(), StoreError> {
    let child = rt.store.session_by_key(&steer.child)?;
    let spawn_run = match child.as_ref().and_then(|c| c.spawn_run.as_deref()) {
        Some(id) => rt.store.run(id)?,
        None => None,
    };
    let provenance = steer.provenance.clone().unwrap_or(Value::Null);
    // No global lock on a shared database: the child's session row first, as every writer of its
    // runs and transcript takes it, then the compare-and-set on the steer's row.
    rt.store.write_row_locked(|tx| -> Result<(), StoreError> {
        tx.lock_sessions(&[steer.session])?;
        if taken {
            if tx.settle_steer(steer.id, SteerState::Steered, None)? {
                let chain_id = spawn_run.as_ref().and_then(|r| r.chain_id.clone());
                let message = NewMessage::user_text(&steer.text, steer.run_id.clone(), provenance.clone(), chain_id);
                tx.append_message(steer.session, &message)?;
            }
            return Ok(());
        }
        let turn = next_turn(steer.session, spawn_run.as_ref(), steer.id, &steer.text, &provenance);
        if tx.queue_steer(steer.id, &turn)? == SteerQueued::ChildCancelled {
            tracing::info!(steer = steer.id, child = %steer.child, "a steer was dropped: its child was cancelled");
        }
        Ok(())
    })?;
    rt.wake();
    Ok(())
}

/// Waits (at most `STEERS_SETTLE`) until no steer offered to `run_id` is still being settled, so a
/// steer the agent took is in the transcript before the turn's own answer is recorded after it.
pub async fn settled_for(rt: &Scheduler, run_id: &str) {
    let deadline = tokio::time::Instant::now() + STEERS_SETTLE;
    while rt.offered.lock().expect("offered").values().any(|r| r == run_id) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// How long a turn's end waits for its steers to be recorded (a settle is one store write).
const STEERS_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// The owner offers the pending steers of its running runs to their turns (each once), and
/// queues those whose run ended before it could.
pub fn offer_pending(rt: &Arc<Scheduler>) {
    if !rt.is_owner() {
        return;
    }
    let pending = rt.store.pending_steers(rt.owner_id.as_str()).unwrap_or_default();
    for steer in pending {
        let run_id = steer.run_id.clone().unwrap_or_default();
        if rt.offered.lock().expect("offered").insert(steer.id, run_id).is_some() {
            continue;
        }
        let (taken, answer) = tokio::sync::oneshot::channel();
        let sent = rt
            .steers
            .lock()
            .expect("steers")
            .get(steer.run_id.as_deref().unwrap_or_default())
            .map(|tx| tx.send(Steer { text: steer.text.clone(), taken }).is_ok());
        let rt = rt.clone();
        tokio::spawn(async move {
            let took = sent == Some(true) && answer.await.unwrap_or(false);
            if let Err(e) = settle(&rt, &steer, took) {
                tracing::error!(steer = steer.id, error = %e, "settling a steer failed");
            }
            rt.offered.lock().expect("offered").remove(&steer.id);
        });
    }
    for steer in rt.store.stranded_steers().unwrap_or_default() {
        if !rt.offered.lock().expect("offered").contains_key(&steer.id)
            && let Err(e) = settle(rt, &steer, false)
        {
            tracing::error!(steer = steer.id, error = %e, "queueing a stranded steer failed");
        }
    }
}
