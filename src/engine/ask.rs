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
//!
//! Who answers (docs/APPROVALS.md): a question may go to the requester's model; an approval goes to
//! a person while one is reachable — the answerer's host shows it (elicitation), it was posted to
//! the chat the tree is bound to ([`super::ask_chat`]), or an operator watches
//! (`approvals.operatorWatches`) — and the model answers it only as
//! `approvals.modelMayAnswer` (per rule or for all) allows ([`pending`]). A host that declines or
//! cancels faster than a person reads is no person: that route ends ([`note_route`]) and the ask
//! falls to the next. Every answer records who gave it (the model, a person at which host, the
//! operator, a rule, the timeout), in the ask and in the asking session.

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
use crate::policy::{Answerer, CallerRole, HostRoute, PersonRoutes, ToolName};
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
    let target = answering_session(rt, &child)?;
    // An approval no rule decided goes to the chat the tree is bound to, when there is one.
    let chat = match kind == AskKind::Approval && rule.is_none() {
        true => super::ask_chat::chat_of(rt, &child)?,
        false => None,
    };
    // The peer of an A2A tree sees every open ask of its task (`input-required`): a person route.
    let peer = rule.is_none() && super::a2a::in_a2a_tree(rt, &child)?;
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
    let by_rule = rule.map(|decision| Answer {
        decision: decided(decision),
        text: Some("decided by approvals.rules"),
        by: "rule",
        via: AnsweredVia::Rule,
        host: None,
    });
    // No global lock on a shared database: the sessions it writes in (the child's transcript and
    // the answerer's, or its queued ask turn) are locked first, root to leaf, so the count of the
    // run's open asks and the answerer's queued turn hold until the commit.
    let sessions: Vec<i64> = std::iter::once(child.id).chain(target.as_ref().map(|t| t.id)).collect();
    let recorded = rt.store.write_row_locked(|tx| -> Result<bool, StoreError> {
        tx.lock_sessions(&sessions)?;
        if tx.open_asks_of_run(&run.run_id)? >= i64::from(cap) {
            return Ok(false);
        }
        tx.add_ask(&ask)?;
        tx.append_message(child.id, &asked_message(run, &ask))?;
        // Decided in the same transaction, so no wait ever sees it open.
        if let Some(answer) = &by_rule {
            tx.close_ask(&id, AskState::Answered, answer)?;
            tx.append_message(child.id, &answer_message(&id, &run.run_id, AskState::Answered, answer))?;
        } else {
            if let Some(chat) = &chat {
                super::ask_chat::post(tx, run, &ask, chat)?;
            }
            if peer {
                tx.add_ask_route(&id, &super::a2a::route_event())?;
            }
            let person = chat.is_some() || peer;
            if let Some(target) = &target
                && (target.external
                    || model_may_answer_driven(&rt.config, &run.agent_id, kind, tool.as_deref(), person))
            {
                put_to(tx, run, &child, target, &ask, &rt.config)?;
            }
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
    rt.wake();
    Ok(())
}

/// Whether a driven answerer's model may be given the ask: it has no host, so only the operator
/// and the people of the chat it was posted to, or the A2A peer of the tree (`in_chat`), are
/// persons to wait for.
fn model_may_answer_driven(
    config: &crate::config::Config,
    agent: &crate::keys::AgentId,
    kind: AskKind,
    tool: Option<&str>,
    in_chat: bool,
) -> bool {
    let may = crate::policy::model_may_answer(config, agent, tool);
    let routes = PersonRoutes {
        host: HostRoute::None,
        operator: config.agents.defaults.subagents.approvals.operator_watches,
        channel: in_chat,
        timed_out: false,
    };
    crate::policy::who_answers(kind == AskKind::Approval, may, routes) == Answerer::Model
}

/// The answerer's MCP host as one tool call sees it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Host<'a> {
    /// `clientInfo.name`, when the client said.
    pub client: Option<&'a str>,
    /// The client shows elicitations to a person (form mode, not a host known to answer them by
    /// itself).
    pub elicits: bool,
}

/// Who may answer `ask` when `caller` (at `host`) looks at it, and why.
pub fn pending(config: &crate::config::Config, caller: &SessionKey, host: Host, ask: AskRow) -> Pending {
    let approvals = &config.agents.defaults.subagents.approvals;
    let host_route = if ask.target != *caller || !host.elicits {
        HostRoute::None
    } else if ask.routes.iter().any(route_ended) {
        HostRoute::Ended
    } else {
        HostRoute::Asked
    };
    let timed_out = approvals.person_timeout_seconds.is_some_and(|s| now_ms() - ask.created_at >= (s * 1000) as i64);
    let chat = super::ask_chat::posted_to(&ask).map(String::from).or_else(|| super::a2a::shown_to_peer(&ask));
    let routes =
        PersonRoutes { host: host_route, operator: approvals.operator_watches, channel: chat.is_some(), timed_out };
    let agent = ask.child.agent_id(&config.default_agent());
    let may = crate::policy::model_may_answer(config, &agent, tool_name(ask.details.as_ref()).as_deref());
    let approval = ask.kind == AskKind::Approval;
    let who = crate::policy::who_answers(approval, may, routes);
    let why = approval.then(|| why_words(who, routes, may, host, chat.as_deref()));
    Pending { ask, who, why }
}

/// Why an approval waits for whom it waits for, in words for the model.
fn why_words(
    who: Answerer,
    routes: PersonRoutes,
    may: crate::config::ModelMayAnswer,
    host: Host,
    chat: Option<&str>,
) -> String {
    use crate::config::ModelMayAnswer;
    if who == Answerer::Person {
        let mut ways = Vec::new();
        if routes.host == HostRoute::Asked {
            ways.push(format!("it is shown to the person at your host ({})", host.client.unwrap_or("your MCP client")));
        }
        if let Some(channel) = chat {
            ways.push(format!("it is posted to the chat on {channel}, where a person answers it"));
        }
        if routes.operator {
            ways.push("the operator answers it (dashboard, sessions-mcp respond)".to_string());
        }
        if ways.is_empty() {
            ways.push("no person can be reached, and approvals.modelMayAnswer is never for it: it ends at approvals.timeoutSeconds with onTimeout".to_string());
        }
        return ways.join("; ");
    }
    match (may, routes.host) {
        (ModelMayAnswer::Always, _) => "approvals.modelMayAnswer is always for it: you may answer it".into(),
        _ if routes.timed_out => "no person answered within approvals.personTimeoutSeconds: you may answer it (a person still may, first)".into(),
        (_, HostRoute::Ended) => format!(
            "no person answered at your host ({}): it answered the form by itself or the person dismissed it; you may answer it",
            host.client.unwrap_or("your MCP client")
        ),
        _ => "no person was asked: your host shows no elicitations (or is known to answer them by itself) and no operator watches; you may answer it".into(),
    }
}

/// A host route event after which no person there will answer.
fn route_ended(event: &Value) -> bool {
    let ended = [HostOutcome::Unseen, HostOutcome::Dismissed].map(HostOutcome::as_str);
    event["route"] == "host" && event["outcome"].as_str().is_some_and(|o| ended.contains(&o))
}

/// How showing an ask to the person at a host went (an ask's `routes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostOutcome {
    /// Shown (pushed) to the person at the host.
    Shown,
    /// The host declined or cancelled it faster than a person reads: nobody saw it.
    Unseen,
    /// The person at the host dismissed it unanswered.
    Dismissed,
}

impl HostOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            HostOutcome::Shown => "shown",
            HostOutcome::Unseen => "unseen",
            HostOutcome::Dismissed => "dismissed",
        }
    }
}

/// Records how the host route of open ask `ask` went: in the ask, and, when it ended the route,
/// in the asking session's transcript; wakes the waiters (the ask may now fall to the model).
/// False when the ask closed first.
fn note_route(
    rt: &Scheduler,
    ask: &AskRow,
    outcome: HostOutcome,
    client: Option<&str>,
    ms: Option<u64>,
) -> Result<bool, StoreError> {
    let event = json!({"route": "host", "outcome": outcome.as_str(), "client": client, "ms": ms, "at": now_ms()});
    let at = client.unwrap_or("the host");
    let line = match outcome {
        HostOutcome::Unseen => Some(format!(
            "[input request {}: {at} answered it by itself in {} ms, faster than a person reads: no person there; it goes to the next way to answer]",
            ask.id,
            ms.unwrap_or(0)
        )),
        HostOutcome::Dismissed => {
            Some(format!("[input request {}: the person at {at} dismissed it unanswered]", ask.id))
        }
        HostOutcome::Shown => None,
    };
    // The asking session's row before the ask's (`add_ask_route`), as every writer of both.
    let noted = rt.store.write_row_locked(|tx| -> Result<bool, StoreError> {
        tx.lock_sessions(&[ask.session])?;
        if !tx.add_ask_route(&ask.id, &event)? {
            return Ok(false);
        }
        if let Some(line) = &line {
            tx.append_message(ask.session, &route_message(ask, line))?;
        }
        Ok(true)
    })?;
    rt.wake();
    Ok(noted)
}

pub(super) fn route_message(ask: &AskRow, line: &str) -> NewMessage {
    NewMessage {
        role: "system".into(),
        content: json!([{"type": "text", "text": line}]),
        run_id: Some(ask.run_id.clone()),
        provenance: Some(Provenance::InternalSystem { tool: SourceTool::InputRequest, chain: None }.to_json()),
        extra: Some(serde_json::Map::from_iter([("requestId".to_string(), Value::from(ask.id.clone()))])),
        ..Default::default()
    }
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
fn answering_session(rt: &Scheduler, child: &SessionRow) -> Result<Option<SessionRow>, StoreError> {
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
fn put_to(
    tx: &Tx,
    run: &RunRow,
    child: &SessionRow,
    target: &SessionRow,
    ask: &NewAsk,
    config: &crate::config::Config,
) -> Result<(), StoreError> {
    let may = crate::policy::model_may_answer(config, &run.agent_id, tool_name(ask.details).as_deref());
    let person_first = ask.kind == AskKind::Approval && may != crate::config::ModelMayAnswer::Always;
    let text = question_text(&child.key, ask, person_first && target.external);
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
/// `person_first`: an approval a person at the answerer's host decides when one is there.
fn question_text(child: &SessionKey, ask: &NewAsk, person_first: bool) -> String {
    let words = crate::sanitize::ask_words(ask.text, ask.options, ask.details);
    let options = words.options.map(|o| format!("\nOptions: {o}")).unwrap_or_default();
    let details = words.details.map(|d| format!("\nDetails: {d}")).unwrap_or_default();
    let how = format!(
        "subagents {{\"action\": \"respond\", \"requestId\": \"{id}\", \"decision\": \"allow\" | \"deny\", \"text\": \"…\"}}",
        id = ask.id
    );
    let answer = if person_first {
        format!(
            "A person decides it where one can be reached: answer it yourself only when subagents wait lists it with waitsFor \"you\", with {how}."
        )
    } else {
        format!("Answer with {how}.")
    };
    format!(
        "Your sub-agent {child} asks ({kind}): {text}{options}{details}\n{answer}",
        kind = ask.kind.as_str(),
        text = words.text
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
    // What callers were told of it is left to their next wait, which forgets closed asks. Dropped
    // here, a wait that read the ask open just before this commit would take it for news and
    // return at once, "attention" for an ask already answered.
    rt.wake();
    Ok(closed)
}

/// [`close`] from a process without a runtime (the operator's `respond`): the owner of the run
/// sees the answer at its next tick.
///
/// Holds no global lock on a shared database: it locks the asking session's row and the
/// answerer's (whose queued ask turn it may change), root to leaf, then closes the ask with a
/// compare-and-set on `open`, so of two answers at once on two nodes one closes it and the other
/// finds it closed.
pub fn close_in(store: &Store, id: &str, state: AskState, answer: &Answer) -> Result<bool, StoreError> {
    let Some(ask) = store.ask(id)? else { return Ok(false) };
    store.write_row_locked(|tx| -> Result<bool, StoreError> {
        let target = tx.find_session_id(&ask.target)?;
        tx.lock_sessions(&std::iter::once(ask.session).chain(target).collect::<Vec<_>>())?;
        if !tx.close_ask(id, state, answer)? {
            return Ok(false);
        }
        tx.append_message(ask.session, &answer_message(&ask.id, &ask.run_id, state, answer))?;
        leave_turn(tx, &ask)?;
        Ok(true)
    })
}

/// The record that closes an ask in the asking session: who answered and how, or that it was
/// withdrawn (so a transcript never ends on a question nobody closed).
fn answer_message(id: &str, run_id: &str, state: AskState, answer: &Answer) -> NewMessage {
    let text = answer.text.map(|t| format!(": {t}")).unwrap_or_default();
    let line = match state {
        AskState::Withdrawn => format!("[input request {id} withdrawn{text}]"),
        _ => format!(
            "[answer to {id} by {} via {}, {}] {}{text}",
            answer.by,
            answer.via.as_str(),
            answerer_words(answer.via, answer.by, answer.host),
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
        run_id: Some(run_id.to_string()),
        provenance: Some(provenance.to_json()),
        extra: Some(serde_json::Map::from_iter([("requestId".to_string(), Value::from(id))])),
        ..Default::default()
    }
}

/// Who gave an answer, in words: the model, a person (at which host), the operator, a rule, the
/// timeout.
pub fn answerer_words(via: AnsweredVia, by: &str, host: Option<&str>) -> String {
    match via {
        AnsweredVia::Dashboard if by == OPERATOR => "the operator at the dashboard".into(),
        AnsweredVia::Subagents => "the model".into(),
        AnsweredVia::Elicitation => format!("a person at {}", host.unwrap_or("the host")),
        AnsweredVia::Operator => "the operator".into(),
        AnsweredVia::Dashboard => "a person at the dashboard".into(),
        AnsweredVia::Rule => "a rule".into(),
        AnsweredVia::Timeout => "no one in time".into(),
        AnsweredVia::Channel => format!("a person via {}", host.unwrap_or("a channel")),
        AnsweredVia::A2a => format!("the A2A peer {by}"),
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
            host: None,
        };
        if let Err(e) = close(rt, &ask.id, AskState::Expired, &answer) {
            tracing::error!(ask = %ask.id, error = %e, "expiring an input request failed");
        }
    }
    for ask in rt.store.stranded_asks().unwrap_or_default() {
        let answer = Answer {
            decision: AskDecision::Deny,
            text: Some(WITHDRAWN),
            by: "server",
            via: AnsweredVia::Timeout,
            host: None,
        };
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

/// Withdraws the open asks of a run taken over from a dead owner (a remote agent's run, which
/// goes on): the turn that asked them is gone, and the new one asks again whatever its remote
/// task still waits for.
pub fn withdraw_asks_of_taken_over(rt: &Scheduler, run_id: &str) {
    let asks = rt.store.asks_of_runs(&[run_id.to_string()]).unwrap_or_default();
    for ask in asks.iter().filter(|a| a.state == AskState::Open) {
        let answer = Answer {
            decision: AskDecision::Deny,
            text: Some(TAKEN_OVER),
            by: "server",
            via: AnsweredVia::Timeout,
            host: None,
        };
        if let Err(e) = close(rt, &ask.id, AskState::Withdrawn, &answer) {
            tracing::error!(ask = %ask.id, error = %e, "withdrawing an input request of a run taken over failed");
        }
    }
}

/// Why the open asks of a run taken over are closed.
const TAKEN_OVER: &str = "the server that asked it stopped; the run was taken over and asks again if it still needs to";

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
    /// Records how showing `ask` to the person at the host `client` went, `ms` after it was
    /// shown when known.
    pub fn note_host_route(
        &self,
        ask: &AskRow,
        outcome: HostOutcome,
        client: Option<&str>,
        ms: Option<u64>,
    ) -> Result<(), ToolError> {
        let rt = self.runtime("subagents")?;
        note_route(rt, ask, outcome, client, ms)?;
        Ok(())
    }

    /// Answers `ask` (resolved by the façade among the caller's tree) as the caller, through
    /// `via` (the `subagents` tool: the caller's model; an elicitation: the person at `host`; the
    /// dashboard). The model is refused an approval that waits for a person ([`pending`]).
    pub fn respond(
        &self,
        caller: &Caller,
        ask: &AskRow,
        decision: AskDecision,
        text: Option<&str>,
        via: AnsweredVia,
        host: Host,
    ) -> Result<Responded, ToolError> {
        self.access.check_can_act(caller)?;
        let rt = self.runtime("subagents")?;
        if via == AnsweredVia::Subagents && ask.state == AskState::Open {
            let seen = pending(&rt.config, &caller.key, host, ask.clone());
            if seen.who == Answerer::Person {
                return Err(ToolError::forbidden(format!(
                    "requestId {} is an approval for a person, not for you: {}. Tell the user it waits for them, and wait (subagents {{\"action\": \"wait\"}} returns once the child goes on); your answer was not used",
                    ask.id,
                    seen.why.unwrap_or_default()
                )));
            }
        }
        let client = (via == AnsweredVia::Elicitation).then_some(host.client).flatten();
        let answer = Answer { decision, text, by: caller.key.as_str(), via, host: client };
        let closed = close(rt, &ask.id, AskState::Answered, &answer)?;
        let now = rt.store.ask(&ask.id)?.unwrap_or_else(|| ask.clone());
        Ok(if closed { Responded::Answered(now) } else { Responded::AlreadyAnswered(now) })
    }
}

/// An open ask put to the caller, with who may answer it as the caller sees it now.
#[derive(Debug, Clone)]
pub struct Pending {
    pub ask: AskRow,
    pub who: Answerer,
    /// For an approval: why it waits for whom it waits for.
    pub why: Option<String>,
}

impl Scheduler {
    /// Whether `caller` was already told of each of `pending` as it stands (who may answer it);
    /// remembers them as told. A wait returns for what the caller was not told yet, so a model
    /// told an approval waits for a person is not woken for it again until that changes.
    pub(super) fn tell(&self, caller: &SessionKey, pending: &[Pending], remember: bool) -> bool {
        let mut told = self.told.lock().expect("told asks");
        let me = caller.as_str();
        let news = pending.iter().any(|p| told.get(&(me.to_string(), p.ask.id.clone())) != Some(&p.who));
        if remember {
            // Closed asks leave it, so it holds no more than the asks open now.
            told.retain(|(who, id), _| who != me || pending.iter().any(|p| &p.ask.id == id));
            for p in pending {
                told.insert((me.to_string(), p.ask.id.clone()), p.who);
            }
        }
        news
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{AgentId, SessionKind};
    use crate::store::NewSession;

    /// A child `agent:main:subagent:<name>` of `agent:main:main` with a queued run, and an open
    /// ask of that run put to the main session in a queued ask turn: (ask id, child id, turn id).
    fn open_ask_in_a_turn(store: &Store, name: &str) -> (String, i64, String) {
        let parent = SessionKey::from_canonical("agent:main:main");
        let key = SessionKey::from_canonical(format!("agent:main:subagent:{name}"));
        let ask_id = format!("ask-{name}");
        let turn = step_id(&ask_id, "ask");
        let child = store
            .write(|tx| -> Result<i64, StoreError> {
                tx.insert_session(&NewSession::new(parent.clone(), AgentId::main(), SessionKind::Main, false))?;
                let mut new = NewSession::new(key.clone(), AgentId::main(), SessionKind::Other, false);
                (new.spawned_by, new.spawn_depth) = (Some(parent.clone()), 1);
                tx.insert_session(&new)?;
                let child = tx.session_id(&key)?;
                let run = format!("run-{name}");
                tx.enqueue(&NewRun::new(run.clone(), child, RunMode::Send, json!({"role": "user", "content": "go"})))?;
                tx.add_ask(&NewAsk {
                    id: &ask_id,
                    run_id: &run,
                    session: child,
                    agent_request_id: "q",
                    kind: AskKind::Approval,
                    text: "may I?",
                    options: None,
                    details: None,
                    target: &parent,
                    deadline_at: now_ms() + 600_000,
                })?;
                let input =
                    json!({"role": "user", "content": [{"type": "text", "text": "may I?"}], REQUEST_IDS: [ask_id]});
                tx.enqueue(&NewRun::new(turn.clone(), tx.session_id(&parent)?, RunMode::Ask, input))?;
                Ok(child)
            })
            .unwrap();
        (ask_id, child, turn)
    }

    /// Two nodes answering one ask at the same moment, each from two threads, without the
    /// global write lock: exactly one answer closes it, the asking session records that one
    /// answer once, and the answerer's queued ask turn is withdrawn once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_answers_to_one_ask_from_two_nodes_at_once_close_it_once() {
        crate::store::postgres::with_test_database(async |target| {
            let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
            let nodes: Vec<Store> =
                dirs.iter().map(|d| Store::open_postgres(target.clone(), d.path()).unwrap()).collect();
            for round in 0..8 {
                let (ask_id, child, turn) = open_ask_in_a_turn(&nodes[0], &format!("r{round}"));
                let barrier = Arc::new(std::sync::Barrier::new(4));
                let answers: Vec<_> = (0..4)
                    .map(|i| {
                        let (store, barrier, ask_id) = (nodes[i % 2].clone(), barrier.clone(), ask_id.clone());
                        std::thread::spawn(move || {
                            let text = format!("answer {i}");
                            let answer = Answer {
                                decision: if i % 2 == 0 { AskDecision::Allow } else { AskDecision::Deny },
                                text: Some(&text),
                                by: OPERATOR,
                                via: AnsweredVia::Operator,
                                host: None,
                            };
                            barrier.wait();
                            close_in(&store, &ask_id, AskState::Answered, &answer).unwrap().then_some(text)
                        })
                    })
                    .collect();
                let won: Vec<String> = answers.into_iter().filter_map(|t| t.join().unwrap()).collect();
                assert_eq!(won.len(), 1, "round {round}: one answer closes the ask: {won:?}");
                let ask = nodes[1].ask(&ask_id).unwrap().unwrap();
                assert_eq!((ask.state, ask.answer_text.as_ref()), (AskState::Answered, Some(&won[0])));
                let recorded = nodes[1]
                    .all_messages(child)
                    .unwrap()
                    .into_iter()
                    .filter(|m| m.content.to_string().contains(&format!("[answer to {ask_id}")))
                    .count();
                assert_eq!(recorded, 1, "round {round}: the asking session records the one answer once");
                let turn = nodes[1].run(&turn).unwrap().unwrap();
                assert_eq!(turn.status, crate::store::RunStatus::Cancelled, "the ask turn left with its only ask");
            }
        })
        .await;
    }
}
