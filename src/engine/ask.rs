//! Questions and approvals from any depth of the tree (docs/BEHAVIOUR.md, Asking): a running
//! turn asks (`input_request`, [`crate::runner::InputRequest`]); a rule may decide at once;
//! otherwise the ask is put to the nearest ancestor that can answer — an external root finds it
//! in its session, in `subagents list` and `wait`; a driven parent gets it as the input of a new
//! run — and the operator can always answer (`sessions-mcp respond`). The first answer wins
//! (compare-and-set in the store, from any process); the owner of the asking run hands it to the
//! turn. Unanswered asks end at `approvals.timeoutSeconds` with `onTimeout`; asks whose run ended
//! first are withdrawn. Every ask and its answer are messages of the asking session.
//!
//! Asks are bounded: a run has at most `approvals.maxOpenPerRun` open; a further one is denied
//! at once, with the reason, and put to no one. A driven parent gets the open asks of one child
//! in one turn: while its ask turn for that child is queued and not started, a further ask joins
//! it (its input lists them, one text block each, with their ids beside in `requestIds`), and an
//! answered ask leaves it (the turn is withdrawn once none is left).

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use super::chain::{Provenance, SourceTool};
use super::scheduler::Scheduler;
use super::{Engine, step_id};
use crate::access::ToolError;
use crate::access::caller::Caller;
use crate::config::ApprovalDecision;
use crate::keys::SessionKey;
use crate::policy::{CallerRole, ToolName};
use crate::runner::{Decision, InputAnswer, InputKind, InputRequest};
use crate::store::{
    Answer, AnsweredVia, AskDecision, AskKind, AskRow, AskState, NewAsk, NewMessage, NewRun, RunMode, RunRow,
    SessionRow, Store, StoreError, Tx, now_ms,
};

/// Who answers when no session above the asking one can: only the operator.
pub const OPERATOR: &str = "operator";

/// Serves the asks of one running turn until it ends; then withdraws those left open.
pub async fn serve_asks(rt: Arc<Scheduler>, run: RunRow, mut requests: UnboundedReceiver<InputRequest>) {
    while let Some(request) = requests.recv().await {
        if let Err(e) = open(&rt, &run, request) {
            tracing::error!(run = %run.run_id, error = %e, "recording an input request failed");
        }
    }
}

/// Records one ask: decided by a rule at once, or open and put to whoever can answer.
fn open(rt: &Arc<Scheduler>, run: &RunRow, request: InputRequest) -> Result<(), StoreError> {
    let kind = match request.kind {
        InputKind::Approval => AskKind::Approval,
        InputKind::Question => AskKind::Question,
    };
    let approvals = &rt.config.agents.defaults.subagents.approvals;
    let tool = tool_name(request.details.as_ref());
    let rule = (kind == AskKind::Approval)
        .then(|| crate::policy::approval_by_rule(&rt.config, &run.agent_id, tool.as_deref()))
        .flatten();
    let Some(child) = rt.store.session_by_key(&run.session_key)? else { return Ok(()) };
    let target = answerer(rt, &child)?;
    let cap = approvals.max_open_per_run;
    let id = uuid::Uuid::new_v4().to_string();
    let ask = NewAsk {
        id: &id,
        run_id: &run.run_id,
        session: child.id,
        agent_request_id: &request.id,
        kind,
        text: &request.text,
        options: request.options.as_ref(),
        details: request.details.as_ref(),
        target: target.as_ref().map_or(&child.key, |t| &t.key),
        deadline_at: now_ms() + (approvals.timeout_seconds * 1000) as i64,
    };
    let recorded = rt.store.write(|tx| -> Result<bool, StoreError> {
        if tx.open_asks_of_run(&run.run_id)? >= i64::from(cap) {
            return Ok(false);
        }
        tx.add_ask(&ask)?;
        tx.append_message(child.id, &asked_message(run, &ask))?;
        if rule.is_none()
            && let Some(target) = &target
        {
            put_to(tx, run, &child, target, &ask)?;
        }
        Ok(true)
    })?;
    if !recorded {
        tracing::warn!(run = %run.run_id, cap, "an input request past approvals.maxOpenPerRun was denied at once");
        let why = format!(
            "denied at once: this run already has {cap} requests open (agents.defaults.subagents.approvals.maxOpenPerRun); wait for their answers before asking again"
        );
        let _ = request.answer.send(InputAnswer { decision: Decision::Deny, text: Some(why) });
        return Ok(());
    }
    rt.asks.lock().expect("asks").insert(id.clone(), request.answer);
    if let Some(decision) = rule {
        let answer = Answer {
            decision: decided(decision),
            text: Some("decided by approvals.rules"),
            by: "rule",
            via: AnsweredVia::Rule,
        };
        close(rt, &id, AskState::Answered, &answer)?;
    }
    rt.wake();
    Ok(())
}

/// The tool an approval is for, when the request names it (`details.toolName`, or Claude Code's
/// `tool_name`).
fn tool_name(details: Option<&Value>) -> Option<String> {
    let d = details?;
    d.get("toolName").or_else(|| d.get("tool_name")).and_then(Value::as_str).map(String::from)
}

fn decided(d: ApprovalDecision) -> AskDecision {
    match d {
        ApprovalDecision::Allow => AskDecision::Allow,
        ApprovalDecision::Deny => AskDecision::Deny,
    }
}

/// The nearest ancestor that can answer: offered `subagents` (which carries `respond`). None:
/// only the operator can.
fn answerer(rt: &Scheduler, child: &SessionRow) -> Result<Option<SessionRow>, StoreError> {
    let mut at = child.spawned_by.clone();
    while let Some(key) = at {
        let Some(row) = rt.store.session_by_key(&key)? else { return Ok(None) };
        let role = match row.spawn_depth {
            0 => CallerRole::TopLevel,
            d => CallerRole::Subagent { depth: d as u32 },
        };
        if crate::policy::tools_for(role, &rt.config).contains(&ToolName::Subagents) {
            return Ok(Some(row));
        }
        at = row.spawned_by.clone();
    }
    Ok(None)
}

/// How an answerer is told: a line in an external session; in a driven one the input of a run,
/// the queued ask turn this child's asks already wait in, else a new one.
fn put_to(tx: &Tx, run: &RunRow, child: &SessionRow, target: &SessionRow, ask: &NewAsk) -> Result<(), StoreError> {
    let text = question_text(&child.key, ask);
    let provenance =
        Provenance::from_session(&child.key, "internal", SourceTool::InputRequest, run.chain_id.as_deref()).to_json();
    if target.external {
        let message = NewMessage::user_text(&text, Some(run.run_id.clone()), provenance, run.chain_id.clone());
        tx.append_message(target.id, &message)?;
        return Ok(());
    }
    // Only a turn with the same provenance: its marker names the one child whose words it carries.
    let queued = tx
        .queued_runs(target.id, RunMode::Ask)?
        .into_iter()
        .find(|r| r.provenance.as_ref() == Some(&provenance) && r.input.get(REQUEST_IDS).is_some());
    let block = json!({"type": "text", "text": text});
    match queued {
        Some(turn) => {
            let mut input = turn.input;
            push(&mut input, "content", block);
            push(&mut input, REQUEST_IDS, json!(ask.id));
            tx.set_queued_input(&turn.run_id, &input)?;
        }
        None => {
            let input = json!({"role": "user", "content": [block], REQUEST_IDS: [ask.id]});
            tx.enqueue(&NewRun {
                provenance: Some(provenance),
                chain_id: run.chain_id.clone(),
                hop: run.hop,
                ..NewRun::new(step_id(ask.id, "ask"), target.id, RunMode::Ask, input)
            })?;
        }
    }
    Ok(())
}

/// The field of an ask turn's input listing the ids of the asks it carries, one per text block
/// of its `content`, in the same order (only `role` and `content` reach the transcript).
const REQUEST_IDS: &str = "requestIds";

fn push(input: &mut Value, field: &str, item: Value) {
    match input.get_mut(field).and_then(Value::as_array_mut) {
        Some(items) => items.push(item),
        None => input[field] = json!([item]),
    }
}

/// Takes closed ask `id` out of the queued ask turn that carries it; withdraws the turn when it
/// carried nothing else.
fn leave_turn(tx: &Tx, ask: &AskRow) -> Result<(), StoreError> {
    let Some(target) = tx.find_session_id(&ask.target)? else { return Ok(()) };
    for turn in tx.queued_runs(target, RunMode::Ask)? {
        let ids = turn.input.get(REQUEST_IDS).and_then(Value::as_array).cloned().unwrap_or_default();
        let Some(at) = ids.iter().position(|i| i.as_str() == Some(ask.id.as_str())) else { continue };
        if ids.len() == 1 {
            tx.withdraw_queued_run(&turn.run_id, "the question was answered before this run started")?;
            return Ok(());
        }
        let mut input = turn.input;
        for field in [REQUEST_IDS, "content"] {
            if let Some(items) = input.get_mut(field).and_then(Value::as_array_mut)
                && at < items.len()
            {
                items.remove(at);
            }
        }
        tx.set_queued_input(&turn.run_id, &input)?;
        return Ok(());
    }
    Ok(())
}

/// What the answerer reads: the ask's words masked, as `subagents list` shows them.
fn question_text(child: &SessionKey, ask: &NewAsk) -> String {
    let words = crate::sanitize::ask_words(ask.text, ask.options, ask.details);
    let options = words.options.map(|o| format!("\nOptions: {o}")).unwrap_or_default();
    let details = words.details.map(|d| format!("\nDetails: {d}")).unwrap_or_default();
    format!(
        "Your sub-agent {child} asks ({kind}): {text}{options}{details}\nAnswer with subagents {{\"action\": \"respond\", \"requestId\": \"{id}\", \"decision\": \"allow\" | \"deny\", \"text\": \"…\"}}.",
        kind = ask.kind.as_str(),
        text = words.text,
        id = ask.id,
    )
}

/// The ask, in the asking session's transcript.
fn asked_message(run: &RunRow, ask: &NewAsk) -> NewMessage {
    NewMessage {
        role: "system".into(),
        content: json!([{"type": "text", "text": format!("[input request {} ({})] {}", ask.id, ask.kind.as_str(), ask.text)}]),
        run_id: Some(run.run_id.clone()),
        provenance: Some(
            Provenance::InternalSystem { tool: SourceTool::InputRequest, chain: run.chain_id.clone() }.to_json(),
        ),
        chain_id: run.chain_id.clone(),
        extra: Some(serde_json::Map::from_iter([("requestId".to_string(), Value::from(ask.id))])),
        ..Default::default()
    }
}

/// Closes an open ask with `answer` and records the answer in the asking session, in one
/// transaction; it leaves the queued run that put it to a driven parent. False when it was
/// closed already (the first answer wins).
pub fn close(rt: &Scheduler, id: &str, state: AskState, answer: &Answer) -> Result<bool, StoreError> {
    let closed = close_in(&rt.store, id, state, answer)?;
    rt.wake();
    Ok(closed)
}

/// [`close`] from a process without a runtime (the operator's `respond`): the owner of the run
/// sees the answer at its next tick.
pub fn close_in(store: &Store, id: &str, state: AskState, answer: &Answer) -> Result<bool, StoreError> {
    let Some(ask) = store.ask(id)? else { return Ok(false) };
    store.write(|tx| -> Result<bool, StoreError> {
        if !tx.close_ask(id, state, answer)? {
            return Ok(false);
        }
        tx.append_message(ask.session, &answer_message(&ask, state, answer))?;
        leave_turn(tx, &ask)?;
        Ok(true)
    })
}

/// The record that closes an ask in the asking session: who answered and how, or that it was
/// withdrawn (so a transcript never ends on a question nobody closed).
fn answer_message(ask: &AskRow, state: AskState, answer: &Answer) -> NewMessage {
    let text = answer.text.map(|t| format!(": {t}")).unwrap_or_default();
    let line = match state {
        AskState::Withdrawn => format!("[input request {} withdrawn{text}]", ask.id),
        _ => format!(
            "[answer to {} by {} via {}] {}{text}",
            ask.id,
            answer.by,
            answer.via.as_str(),
            answer.decision.as_str()
        ),
    };
    let provenance = match answer.via {
        AnsweredVia::Subagents | AnsweredVia::Elicitation | AnsweredVia::Dashboard if answer.by != "operator" => {
            Provenance::from_session(
                &SessionKey::from_canonical(answer.by),
                answer.via.as_str(),
                SourceTool::Subagents,
                None,
            )
        }
        _ => Provenance::InternalSystem { tool: SourceTool::InputRequest, chain: None },
    };
    NewMessage {
        role: "user".into(),
        content: json!([{"type": "text", "text": line}]),
        run_id: Some(ask.run_id.clone()),
        provenance: Some(provenance.to_json()),
        extra: Some(serde_json::Map::from_iter([("requestId".to_string(), Value::from(ask.id.clone()))])),
        ..Default::default()
    }
}

/// The owner's tick: answered asks go to their turns; due ones expire with `onTimeout`; open
/// asks whose run ended are withdrawn.
pub fn deliver_answers(rt: &Arc<Scheduler>) {
    if !rt.is_owner() {
        return;
    }
    let approvals = &rt.config.agents.defaults.subagents.approvals;
    for ask in rt.store.asks_due(now_ms()).unwrap_or_default() {
        let why = format!("no answer within approvals.timeoutSeconds ({} s)", approvals.timeout_seconds);
        let answer = Answer {
            decision: decided(approvals.on_timeout),
            text: Some(&why),
            by: "timeout",
            via: AnsweredVia::Timeout,
        };
        if let Err(e) = close(rt, &ask.id, AskState::Expired, &answer) {
            tracing::error!(ask = %ask.id, error = %e, "expiring an input request failed");
        }
    }
    for ask in rt.store.stranded_asks().unwrap_or_default() {
        let answer =
            Answer { decision: AskDecision::Deny, text: Some(WITHDRAWN), by: "server", via: AnsweredVia::Timeout };
        let _ = close(rt, &ask.id, AskState::Withdrawn, &answer);
    }
    let held: Vec<String> = rt.asks.lock().expect("asks").keys().cloned().collect();
    for id in held {
        let Ok(Some(ask)) = rt.store.ask(&id) else { continue };
        if ask.state == AskState::Open {
            continue;
        }
        let Some(turn) = rt.asks.lock().expect("asks").remove(&id) else { continue };
        let decision = match ask.decision {
            Some(AskDecision::Allow) => Decision::Allow,
            _ => Decision::Deny,
        };
        let _ = turn.send(InputAnswer { decision, text: ask.answer_text.clone() });
    }
}

/// Why an ask whose run ended first (finished, cancelled, or interrupted at a restart) is closed.
const WITHDRAWN: &str = "its run ended before an answer came";

/// Why an answer to a closed ask was not used: who answered first and how, or that it was withdrawn.
pub fn closed_how(ask: &AskRow) -> String {
    match (ask.state, ask.decision) {
        (AskState::Withdrawn, _) | (_, None) => format!("was withdrawn ({WITHDRAWN})"),
        (_, Some(decision)) => format!(
            "was already answered ({}) by {} via {}",
            decision.as_str(),
            ask.answered_by.as_deref().unwrap_or("nobody"),
            ask.answered_via.map_or("unknown", AnsweredVia::as_str),
        ),
    }
}

/// What a respond did.
#[derive(Debug)]
pub enum Responded {
    Answered(AskRow),
    /// Someone answered first: that answer stands.
    AlreadyAnswered(AskRow),
}

impl Engine<'_> {
    /// Answers `ask` (resolved by the façade among the caller's tree) as the caller, through
    /// `via` (the `subagents` tool, or an elicitation at the caller's host).
    pub fn respond(
        &self,
        caller: &Caller,
        ask: &AskRow,
        decision: AskDecision,
        text: Option<&str>,
        via: AnsweredVia,
    ) -> Result<Responded, ToolError> {
        self.access.check_can_act(caller)?;
        let rt = self.runtime("subagents")?;
        let answer = Answer { decision, text, by: caller.key.as_str(), via };
        let closed = close(rt, &ask.id, AskState::Answered, &answer)?;
        let now = rt.store.ask(&ask.id)?.unwrap_or_else(|| ask.clone());
        Ok(if closed { Responded::Answered(now) } else { Responded::AlreadyAnswered(now) })
    }
}
