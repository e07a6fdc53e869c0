//! A send, from admission to the reply. Admission checks in the documented order: the caller
//! may act → idempotency replay → send policy → chain limits → deadlock guard → the target's runner; then one
//! transaction either appends the message to an external target's inbox, or queues the primary
//! run in a driven target with its reply delivery and the caller's idempotency key (`accepted` is
//! answered only after it commits, `synchronous=FULL`). A wait for the reply watches the run; the
//! reply-back, announce step and deliveries happen in the steps after the run, for late replies too.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::chain::{self, Limits, Provenance, SourceTool};
use super::context::Parties;
use super::flow::{Exchange, Flow};
use super::scheduler::{Scheduler, Waited};
use super::{Engine, Progress};
use crate::access::caller::Caller;
use crate::access::{Target, ToolError};
use crate::config::key_scope;
use crate::keys::{self, SessionKey};
use crate::store::{
    DeliveryKind, DeliveryMode, DeliveryStatus, IdempotencyHit, NewDelivery, NewMessage, NewRun, NewSession,
    RememberedKey, RunMode, RunRow, Store, StoreError,
};

/// What a caller asks to send (the target already resolved by access).
pub struct SendRequest<'r> {
    pub target: &'r Target,
    pub message: &'r str,
    /// Seconds the caller will wait for the reply (0: it will not).
    pub timeout: u64,
    pub idempotency_key: Option<&'r str>,
}

/// A send the engine accepted (or the earlier one its idempotency key names).
#[derive(Debug, Clone)]
pub struct SendStarted {
    /// The run in the target; None when the message went to an external target's inbox.
    pub run_id: Option<String>,
    /// For an external caller: its newest seq before the send (its replies land after it).
    pub inbox_after: Option<i64>,
}

/// How a send ended for its caller.
#[derive(Debug)]
pub enum SendOutcome {
    /// The message sits in an external target's inbox; no reply will come.
    Inbox,
    /// Queued; the caller did not wait.
    Accepted {
        run_id: String,
    },
    /// The target's run ended within the wait.
    Finished {
        run: Box<RunRow>,
    },
    TimedOut {
        run_id: String,
    },
    /// The client cancelled the wait (never the run).
    Cancelled {
        run_id: String,
    },
}

impl Engine<'_> {
    /// Admits and commits a send, then wakes the scheduler.
    pub fn send(&self, caller: &Caller, req: &SendRequest) -> Result<SendStarted, ToolError> {
        let access = self.access;
        let target = req.target;
        access.check_can_act(caller)?;
        let inbox_after = if caller.external { Some(access.last_seq_of(&caller.key)?) } else { None };
        let args_hash = args_hash(&target.key, req.message);
        if let Some(hit) = chain::replay(access, caller, req.idempotency_key, &args_hash, "message")? {
            self.runtime("sessions_send")?;
            return Ok(replayed(hit, inbox_after));
        }
        let decision = access.send_decision(&target.key, target.row.as_ref());
        if !decision.allowed() {
            return Err(ToolError::forbidden(decision.refusal(access.config().session.send_policy.as_ref())));
        }
        let hop = chain::next_hop(access, caller, Limits::HopsAndMessages)?;
        let target_external = target.row.as_ref().is_some_and(|r| r.external);
        if req.timeout > 0 && !target_external {
            self.check_deadlock(caller, target)?;
        }
        let rt = self.runtime("sessions_send")?;
        if !target_external {
            let agent = target.key.agent_id(&rt.config.default_agent());
            crate::runner::resolve_runner(&rt.config, &agent, &rt.state_dir, &rt.runner.exe)
                .map_err(ToolError::invalid)?;
        }
        let plan = SendPlan {
            caller,
            caller_channel: caller_channel(rt, caller),
            target: &target.key,
            target_channel: super::channel_of_row(&target.key, target.row.as_ref(), rt),
            target_external,
            message: req.message,
            chain_id: hop.chain_id,
            hop: hop.hop,
            max_turns: rt.config.session.agent_to_agent.max_ping_pong_turns,
            idempotency: req.idempotency_key.map(|k| (k, args_hash.as_str())),
        };
        let started = start(&rt.store, &rt.config, &plan)?;
        rt.wake();
        let run_id = match started {
            Started::Run { run_id } => Some(run_id),
            Started::Inbox => None,
            // The same key's send committed on another node (or request) since the look above.
            Started::Replayed(hit) => {
                let key = req.idempotency_key.unwrap_or_default();
                return Ok(replayed(chain::same_arguments(hit, key, &args_hash, "message")?, inbox_after));
            }
        };
        Ok(SendStarted { run_id, inbox_after })
    }

    /// Waits up to `timeout` seconds for the send's run to end, forwarding its streamed text as
    /// progress when the client asked for it.
    pub async fn await_reply(
        &self,
        caller: &Caller,
        started: &SendStarted,
        timeout: u64,
        cancel: &CancellationToken,
        progress: Option<Progress>,
    ) -> Result<SendOutcome, ToolError> {
        let Some(run_id) = started.run_id.clone() else { return Ok(SendOutcome::Inbox) };
        if timeout == 0 {
            return Ok(SendOutcome::Accepted { run_id });
        }
        let rt = self.runtime("sessions_send")?;
        if let Some(own) = &caller.run {
            let _ = rt.store.set_waiting(&own.run_id, Some(&run_id));
        }
        let forward = progress.map(|p| forward_progress(rt, &run_id, p));
        let waited = rt.wait(&run_id, Duration::from_secs(timeout), cancel).await;
        if let Some(f) = forward {
            f.abort();
        }
        if let Some(own) = &caller.run {
            let _ = rt.store.set_waiting(&own.run_id, None);
        }
        Ok(match waited? {
            Waited::Finished(run) => SendOutcome::Finished { run },
            Waited::TimedOut => SendOutcome::TimedOut { run_id },
            Waited::Cancelled => SendOutcome::Cancelled { run_id },
        })
    }

    /// A wait is refused at once when it would close a cycle (docs/BEHAVIOUR.md, sessions_send).
    fn check_deadlock(&self, caller: &Caller, target: &Target) -> Result<(), ToolError> {
        let Some(run) = &caller.run else { return Ok(()) };
        let refuse = || {
            ToolError::invalid(format!(
                "would deadlock: {} cannot answer while run {} waits on it; send with timeoutSeconds: 0",
                target.display, run.run_id
            ))
        };
        if target.key == caller.key {
            return Err(refuse());
        }
        let (Some(caller_row), Some(target_row)) = (self.access.own_row(caller)?, target.row.as_ref()) else {
            return Ok(());
        };
        if self.access.wait_would_deadlock(&caller_row, target_row)? { Err(refuse()) } else { Ok(()) }
    }
}

fn args_hash(target: &SessionKey, message: &str) -> String {
    hex::encode(Sha256::digest(format!("{target}\u{0}{message}").as_bytes()))
}

fn caller_channel(rt: &Scheduler, caller: &Caller) -> String {
    if caller.external {
        return "webchat".into();
    }
    let row = rt.store.session_by_key(&caller.key).ok().flatten();
    super::channel_of_row(&caller.key, row.as_ref(), rt)
}

/// Forwards the run's streamed text as MCP progress while the caller waits (this process only).
/// The run may not be claimed yet: subscribe as soon as it is.
fn forward_progress(rt: &Arc<Scheduler>, run_id: &str, progress: Progress) -> tokio::task::JoinHandle<()> {
    let (rt, run_id) = (rt.clone(), run_id.to_string());
    tokio::spawn(async move {
        let mut pause = Duration::from_millis(10);
        let mut rx = loop {
            if let Some(rx) = rt.subscribe(&run_id) {
                break rx;
            }
            if rt.store.run(&run_id).ok().flatten().is_none_or(|r| r.is_finished()) {
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        };
        let mut n = 0.0;
        while let Ok(text) = rx.recv().await {
            n += 1.0;
            progress(n, text);
        }
    })
}

/// The answer to a send its idempotency key names: the run it started, none if it went to an inbox.
fn replayed(hit: IdempotencyHit, inbox_after: Option<i64>) -> SendStarted {
    let inbox = hit.result.and_then(|r| r.get("inbox").and_then(Value::as_bool)).unwrap_or(false);
    SendStarted { run_id: hit.run_id.filter(|_| !inbox), inbox_after }
}

/// What the send committed.
#[derive(Debug, Clone)]
enum Started {
    /// The primary run was queued in a driven target.
    Run { run_id: String },
    /// The target is external: the message sits in its inbox; no reply will come.
    Inbox,
    /// Nothing: a send with the same idempotency key holds it (committed meanwhile).
    Replayed(IdempotencyHit),
}

/// Everything a send commits.
struct SendPlan<'a> {
    caller: &'a Caller,
    caller_channel: String,
    target: &'a SessionKey,
    target_channel: String,
    target_external: bool,
    message: &'a str,
    chain_id: String,
    hop: i64,
    max_turns: u32,
    idempotency: Option<(&'a str, &'a str)>,
}

impl SendPlan<'_> {
    fn provenance(&self) -> Value {
        Provenance::from_session(&self.caller.key, &self.caller_channel, SourceTool::SessionsSend, Some(&self.chain_id))
            .to_json()
    }

    fn flow(&self) -> Value {
        let parties = Parties {
            requester: self.caller.key.to_string(),
            requester_channel: self.caller_channel.clone(),
            target: self.target.to_string(),
            target_channel: self.target_channel.clone(),
        };
        Flow::Exchange(Exchange {
            requester: self.caller.key.to_string(),
            target: self.target.to_string(),
            request: self.message.to_string(),
            turn: 0,
            max: self.max_turns,
            parties,
            round_one: None,
            latest: None,
        })
        .to_json()
    }
}

/// Commits the send. A configured agent's main session that exists only virtually is written now.
/// Holds no global lock on a shared database: its writes are inserts under unique keys, the
/// idempotency key claimed first (`Tx::claim_key`), and the transcript rows `append_message`
/// locks.
fn start(store: &Store, config: &crate::config::Config, plan: &SendPlan) -> Result<Started, StoreError> {
    store.write_row_locked(|tx| -> Result<Started, StoreError> {
        let run_id = uuid::Uuid::new_v4().to_string();
        if let Some((key, args_hash)) = plan.idempotency {
            let result = json!({"inbox": plan.target_external});
            let caller = plan.caller.key.as_str();
            let use_of_key =
                RememberedKey { caller, key, tool: "sessions_send", args_hash, run_id: &run_id, result: &result };
            if let Some(hit) = tx.claim_key(&use_of_key)? {
                return Ok(Started::Replayed(hit));
            }
        }
        let agent = plan.target.agent_id(&config.default_agent());
        let scope = key_scope(config, &agent);
        let new = NewSession::new(plan.target.clone(), agent, keys::kind_of(plan.target, &scope, None), false);
        tx.insert_session(&new)?;
        let target_id: i64 = tx.session_id(plan.target)?;
        let started = if plan.target_external {
            tx.append_message(
                target_id,
                &NewMessage::user_text(
                    plan.message,
                    Some(run_id.clone()),
                    plan.provenance(),
                    Some(plan.chain_id.clone()),
                ),
            )?;
            tx.add_delivery(&NewDelivery {
                run_id: &run_id,
                kind: DeliveryKind::Inbox,
                mode: DeliveryMode::Inbox,
                status: DeliveryStatus::Delivered,
                target_key: plan.target.as_str(),
                channel: Some("webchat"),
                last_error: None,
            })?;
            Started::Inbox
        } else {
            tx.enqueue(&NewRun {
                run_id: run_id.clone(),
                session: target_id,
                mode: RunMode::Send,
                input: json!({"role": "user", "content": plan.message}),
                provenance: Some(plan.provenance()),
                requester_key: Some(plan.caller.key.clone()),
                chain_id: Some(plan.chain_id.clone()),
                hop: plan.hop,
                announce_kind: None,
                model: None,
                thinking: None,
                timeout_ms: None,
                extra: Some(plan.flow()),
            })?;
            tx.add_delivery(&NewDelivery {
                run_id: &run_id,
                kind: DeliveryKind::Reply,
                mode: DeliveryMode::Inbox,
                status: DeliveryStatus::Queued,
                target_key: plan.caller.key.as_str(),
                channel: None,
                last_error: None,
            })?;
            Started::Run { run_id: run_id.clone() }
        };
        Ok(started)
    })
}
