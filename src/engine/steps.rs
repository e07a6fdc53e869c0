//! The steps after a run (docs/BEHAVIOUR.md, Steps): the reply to an external requester's inbox, the
//! reply-back ping-pong between driven sessions, the announce step and its delivery to the
//! target's channel. Steps are queued runs: nothing blocks inside a run, and late replies get the
//! same steps as prompt ones. Every cross-session effect is a ledger row.
//!
//! The steps of a run are recorded as taken (`take_steps`) and are idempotent, so an owner that
//! dies between recording a run's end and taking its steps loses nothing: the next owner
//! `catch_up`s.

use serde_json::json;

use crate::engine::scheduler::Scheduler;
use crate::keys::SessionKey;
use crate::runner::RunStatus;
use crate::store::{AnnounceKind, DeliveryKind, DeliveryStatus, NewMessage, NewRun, RunMode, RunRow, StoreError};

use super::chain::{Provenance, SourceTool, chain_is_full};
use super::context::{ANNOUNCE_INPUT, is_skip};
use super::flow::{Exchange, Flow};
use super::turn::{TurnResult, channel_of_row};
use super::{deliver, spawn};

/// Takes the steps after a run's end and records them as taken. Every step is idempotent (derived
/// run ids, one delivery per run and kind, final delivery statuses stay final), so taking them
/// again — after an owner died between recording the end and taking the steps — adds nothing.
pub fn take_steps(rt: &Scheduler, run: &RunRow, result: &TurnResult) {
    if let Err(e) = after_run(rt, run, result).and_then(|()| rt.store.steps_taken(&run.run_id)) {
        tracing::error!(run = %run.run_id, error = %e, "a flow step failed; the next owner takes it again");
    }
}

/// Takes the steps of runs that ended at least `min_age_ms` ago and never got them (their owner
/// died first, or a step failed), e.g. runs that recovery just marked `interrupted`: an
/// interrupted child still announces (`Status: interrupted`).
pub fn catch_up(rt: &Scheduler, min_age_ms: i64) {
    let runs = match rt.store.runs_with_steps_pending(min_age_ms) {
        Ok(runs) => runs,
        Err(e) => return tracing::error!(error = %e, "reading runs whose steps are pending failed"),
    };
    for run in runs {
        let silent = run.reply.as_deref().is_some_and(is_skip);
        let result = TurnResult { status: run.status, reply: run.reply.clone(), silent };
        tracing::info!(run = %run.run_id, status = %run.status, "taking the steps a dead owner left");
        take_steps(rt, &run, &result);
    }
}

/// The next step after a run ended. Whatever the run was, when it ran in a sub-agent's session
/// it may have been that child's last run: the child's announce check follows every run.
fn after_run(rt: &Scheduler, run: &RunRow, result: &TurnResult) -> Result<(), StoreError> {
    match run.mode {
        RunMode::Send | RunMode::Reply => reply_back(rt, run, result)?,
        RunMode::Announce if run.announce_kind == Some(AnnounceKind::Subagent) => {}
        RunMode::Announce => announce_delivery(rt, run, result)?,
        // An ask turn answers through the tool; its reply goes nowhere of its own.
        RunMode::Spawn | RunMode::Steer | RunMode::Ask => {}
        RunMode::Completion => {
            spawn::completion_read(rt, run, result)?;
            completion_delivery(rt, run, result)?;
        }
        RunMode::Inject => inject_reply(rt, run, result)?,
    }
    spawn::after_child_run(rt, run, result)
}

/// The id of the run that step `step` of run `run_id` queues: the same every time the step is
/// taken, so that taking it again queues nothing new.
pub fn step_id(run_id: &str, step: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{run_id}/{step}").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes).into_uuid().to_string()
}

/// After a send's primary run or a reply step: hand the reply to the other side.
fn reply_back(rt: &Scheduler, run: &RunRow, result: &TurnResult) -> Result<(), StoreError> {
    let store = &rt.store;
    let Some(requester) = run.requester_key.clone() else { return Ok(()) };
    let Some(mut flow) = Flow::of(run.extra.as_ref()).and_then(Flow::into_exchange) else {
        return Err(StoreError::Corrupt(format!("run {} carries no exchange", run.run_id)));
    };
    let target = flow.target_key();
    let reply = result.ok_reply().map(String::from);
    let turn = flow.turn;
    let max = rt.config.session.agent_to_agent.max_ping_pong_turns;
    if run.mode == RunMode::Send {
        flow.round_one = reply.clone();
    }
    flow.latest = reply.clone().or(flow.latest.take());
    // The reply goes to the other side of the exchange: a run's requester is always the side
    // whose message was its input.
    let other = requester.clone();
    let other_row = store.session_by_key(&other)?;
    let delivery_id: Option<i64> = store.pending_delivery(&run.run_id)?;
    let Some(text) = reply else {
        if let Some(id) = delivery_id {
            let (status, why) = if result.silent {
                (DeliveryStatus::Skipped, "silent: the reply was a skip token".to_string())
            } else {
                (DeliveryStatus::Failed, format!("the run ended {}", result.status))
            };
            store.write_row_locked(|tx| tx.set_delivery_status(id, status, Some(&why)))?;
        }
        if result.status == RunStatus::Ok && run.session_key != requester {
            return queue_announce(rt, run, &target, &flow);
        }
        return Ok(());
    };
    let external = other_row.as_ref().is_some_and(|r| r.external);
    if other == run.session_key {
        // A send to oneself: no ping-pong, only the announce step.
        return queue_announce(rt, run, &target, &flow);
    }
    if external {
        append_inbox(rt, &other, run, &text, delivery_id)?;
        return queue_announce(rt, run, &target, &flow);
    }
    if turn >= max || !rt.access.send_decision(&other, other_row.as_ref()).allowed() {
        if let Some(id) = delivery_id {
            let why =
                if turn >= max { "ping-pong limit reached (session.agentToAgent.maxPingPongTurns)" } else { "policy" };
            store.write_row_locked(|tx| tx.set_delivery_status(id, DeliveryStatus::Skipped, Some(why)))?;
        }
        return queue_announce(rt, run, &target, &flow);
    }
    if chain_full(rt, run)? {
        // The exchange stops here; its reply delivery says why instead of waiting forever.
        if let Some(id) = delivery_id {
            let why = "chain limit reached (session.agentToAgent.maxChainMessages)";
            store.write_row_locked(|tx| tx.set_delivery_status(id, DeliveryStatus::Skipped, Some(why)))?;
        }
        return Ok(());
    }
    // The other side answers in its own session: turn k+1.
    let next = Exchange { turn: turn + 1, max, ..flow.clone() };
    let other_id = other_row.as_ref().map(|r| r.id).ok_or_else(|| StoreError::Corrupt(format!("{other} vanished")))?;
    let provenance = Provenance::from_session(
        &run.session_key,
        channel_of_row(&run.session_key, None, rt),
        SourceTool::SessionsSend,
        run.chain_id.as_deref(),
    )
    .to_json();
    let step = NewRun {
        run_id: step_id(&run.run_id, "reply"),
        session: other_id,
        mode: RunMode::Reply,
        input: json!({"role": "user", "content": text}),
        provenance: Some(provenance),
        requester_key: Some(run.session_key.clone()),
        chain_id: run.chain_id.clone(),
        hop: run.hop,
        announce_kind: None,
        model: None,
        thinking: None,
        timeout_ms: None,
        extra: Some(Flow::Exchange(next).to_json()),
    };
    store.queue_reply_step(&step, delivery_id, run.session_key.as_str())?;
    rt.wake();
    Ok(())
}

/// Whether the chain has reached `session.agentToAgent.maxChainMessages` (steps stop there).
fn chain_full(rt: &Scheduler, run: &RunRow) -> Result<bool, StoreError> {
    let Some(chain) = &run.chain_id else { return Ok(false) };
    Ok(chain_is_full(&rt.config, rt.store.chain_messages(chain)?))
}

/// Appends `text` to an external session (its inbox) as an inter-session message, handing over
/// the run's pending reply delivery in the same transaction: once delivered, never appended again.
fn append_inbox(
    rt: &Scheduler,
    to: &SessionKey,
    run: &RunRow,
    text: &str,
    delivery: Option<i64>,
) -> Result<(), StoreError> {
    let Some(delivery) = delivery else { return Ok(()) };
    let from = &run.session_key;
    let provenance = Provenance::from_session(
        from,
        channel_of_row(from, None, rt),
        SourceTool::SessionsSend,
        run.chain_id.as_deref(),
    )
    .to_json();
    let message = NewMessage::user_text(text, Some(run.run_id.clone()), provenance, run.chain_id.clone());
    rt.store.hand_over_to_inbox(delivery, to, &message)?;
    Ok(())
}

/// Queues the announce step in the target, once per exchange.
fn queue_announce(rt: &Scheduler, run: &RunRow, target: &SessionKey, flow: &Exchange) -> Result<(), StoreError> {
    let store = &rt.store;
    let Some(row) = store.session_by_key(target)? else { return Ok(()) };
    if row.external || !rt.access.send_decision(target, Some(&row)).allowed() || chain_full(rt, run)? {
        return Ok(());
    }
    let requester = flow.requester_key();
    let step = NewRun {
        run_id: step_id(&run.run_id, "announce"),
        session: row.id,
        mode: RunMode::Announce,
        input: json!({"role": "user", "content": ANNOUNCE_INPUT}),
        provenance: Some(
            Provenance::from_session(
                &requester,
                &flow.parties.requester_channel,
                SourceTool::SessionsSend,
                run.chain_id.as_deref(),
            )
            .to_json(),
        ),
        requester_key: Some(requester),
        chain_id: run.chain_id.clone(),
        hop: run.hop,
        announce_kind: Some(AnnounceKind::AgentToAgent),
        model: None,
        thinking: None,
        timeout_ms: None,
        extra: Some(Flow::Exchange(flow.clone()).to_json()),
    };
    // One insert under the step's derived run id: no global lock, queued once.
    store.write_row_locked(|tx| tx.enqueue(&step))?;
    rt.wake();
    Ok(())
}

/// After the announce step: deliver its reply to the target's channel, unless it stays silent.
fn announce_delivery(rt: &Scheduler, run: &RunRow, result: &TurnResult) -> Result<(), StoreError> {
    to_channel(rt, run, result, DeliveryKind::Announce)
}

/// After a completion run in a driven requester: its reply goes to the requester's channel.
fn completion_delivery(rt: &Scheduler, run: &RunRow, result: &TurnResult) -> Result<(), StoreError> {
    to_channel(rt, run, result, DeliveryKind::Completion)
}

/// After a message from outside ran: its reply goes out through the session's channel deliverer
/// when the channel has one (a channel user wrote it there); otherwise it stays in the transcript.
fn inject_reply(rt: &Scheduler, run: &RunRow, result: &TurnResult) -> Result<(), StoreError> {
    let row = rt.store.session_by_key(&run.session_key)?;
    if let Some(r) = &row {
        rt.store.touch_binding(r.id)?; // a thread's follow-up keeps a session-mode child alive
    }
    let channel = channel_of_row(&run.session_key, row.as_ref(), rt);
    if rt.config.channels.get(&channel).and_then(|c| c.deliver.as_ref()).is_none_or(Vec::is_empty) {
        return Ok(());
    }
    to_channel(rt, run, result, DeliveryKind::Reply)
}

/// Delivers a run's reply to its session's channel, under the send policy.
pub(super) fn to_channel(
    rt: &Scheduler,
    run: &RunRow,
    result: &TurnResult,
    kind: DeliveryKind,
) -> Result<(), StoreError> {
    let row = rt.store.session_by_key(&run.session_key)?;
    let channel = channel_of_row(&run.session_key, row.as_ref(), rt);
    let Some(text) = result.ok_reply().map(String::from) else {
        let why = if result.silent { "silent: the reply was a skip token" } else { "the run produced no reply" };
        return deliver::record(rt, run, kind, &channel, DeliveryStatus::Skipped, Some(why), None);
    };
    let decision = rt.access.send_decision(&run.session_key, row.as_ref());
    if !decision.allowed() {
        let why = match decision.rule {
            Some(i) => format!("policy: rule {i}"),
            None => "policy".to_string(),
        };
        return deliver::record(rt, run, kind, &channel, DeliveryStatus::Skipped, Some(&why), None);
    }
    deliver::channel_delivery(rt, run, row.as_ref(), &channel, &text, kind)
}
