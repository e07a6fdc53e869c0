//! A sub-agent's question or approval put to an external root, shown to the person at its host as
//! an MCP elicitation (docs/BEHAVIOUR.md, Asking). Only for a client that declared the
//! `elicitation` capability (form mode), by the route its protocol allows:
//!
//! - **push** (a client with the `initialize` handshake, up to 2025-11-25): one watcher per MCP
//!   session sends `elicitation/create` as soon as an ask is put to the caller, and cancels it
//!   (`notifications/cancelled`) when someone else answers first or the ask ends;
//! - **round trip** (2026-07-28, which forbids server-to-client requests): the caller's next tool
//!   call — or a `subagents wait` that would return `attention` — answers `input_required` with
//!   the asks as `inputRequests`; the client retries the call with `inputResponses`, which answer
//!   them, and the call then runs. Each ask is shown once per caller and process.
//!
//! A task (`tasks/get`) whose run waits on an ask reports `input_required` with the same requests;
//! `tasks/update` answers them.
//!
//! Answers go through the engine as the caller, `via: elicitation`, recording the host
//! (`clientInfo.name`): the first answer wins, as with `subagents respond`. Accept answers (an
//! approval's decision, a question's answer); decline denies; cancel (dismissed) leaves the ask
//! open for the other ways to answer, and ends this host's route to a person. A decline or cancel
//! faster than `approvals.autoAnswerMs` came from the host, not a person who read it (Codex `exec`
//! declines at once, Claude Code `-p` cancels): it is recorded as no person there and changes
//! nothing else — the ask goes to the next way to answer (docs/APPROVALS.md). Hosts known to do
//! so (`approvals.autoAnsweringClients`) are not asked at all (`SessionsServer::elicitation_route`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolResult, ClientResult, ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationSchema, InputRequest, InputRequests, InputResponses, ServerRequest,
};
use rmcp::service::{Peer, PeerRequestOptions, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::subscriptions::Hub;
use crate::access::Access;
use crate::access::caller::Caller;
use crate::engine::Engine;
use crate::engine::ask::{Host, HostOutcome};
use crate::engine::scheduler::Scheduler;
use crate::store::{AnsweredVia, AskDecision, AskKind, AskRow, now_ms};

/// How a client can be shown an ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Push,
    RoundTrip,
}

/// The route for the client of this request; None when it declared no form elicitation.
pub fn route(context: &RequestContext<RoleServer>) -> Option<Route> {
    let elicitation = context.client_capabilities()?.elicitation?;
    if elicitation.form.is_none() && elicitation.url.is_some() {
        return None;
    }
    match context.protocol_version() {
        Some(v) if !v.has_initialize() => Some(Route::RoundTrip),
        _ => Some(Route::Push),
    }
}

/// What the person reads, and the form they fill in.
pub fn request_params(access: &Access, caller: &Caller, ask: &AskRow) -> ElicitRequestParams {
    let child = access.scope(caller).display(&ask.child);
    let ask = &masked(ask);
    let message = match ask.kind {
        AskKind::Approval => format!("Your sub-agent {child} asks for approval: {}{}", ask.text, details_line(ask)),
        AskKind::Question => format!("Your sub-agent {child} asks: {}{}", ask.text, details_line(ask)),
    };
    ElicitRequestParams::FormElicitationParams { meta: None, message, requested_schema: form(ask) }
}

/// The ask with its words masked, as every other place that shows an ask has them: the person
/// reads them in an MCP client's window and logs, no safer than a `subagents list` answer.
fn masked(ask: &AskRow) -> AskRow {
    let words = crate::sanitize::ask_words(&ask.text, ask.options.as_ref(), ask.details.as_ref());
    AskRow { text: words.text, options: words.options, details: words.details, ..ask.clone() }
}

/// The request's details, cut to a line a person can read.
fn details_line(ask: &AskRow) -> String {
    const MAX: usize = 600;
    let Some(details) = &ask.details else { return String::new() };
    let mut text = details.to_string();
    if text.len() > MAX {
        let cut = (0..=MAX).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        text.truncate(cut);
        text.push('…');
    }
    format!("\nDetails: {text}")
}

/// The options of a question, when it offers a closed set.
fn options(ask: &AskRow) -> Option<Vec<String>> {
    let list: Vec<String> =
        ask.options.as_ref()?.as_array()?.iter().filter_map(|o| o.as_str().map(String::from)).collect();
    (!list.is_empty()).then_some(list)
}

/// An approval: a decision and an optional note; a question: its answer (one of its options,
/// when it has them).
fn form(ask: &AskRow) -> ElicitationSchema {
    let schema = match ask.kind {
        AskKind::Approval => json!({"type": "object", "required": ["decision"], "properties": {
            "decision": {"type": "string", "title": "Decision", "enum": ["allow", "deny"]},
            "text": {"type": "string", "title": "Note", "description": "Why you deny, or a word for the sub-agent (optional)"},
        }}),
        AskKind::Question => {
            let mut answer = json!({"type": "string", "title": "Answer"});
            if let Some(options) = options(ask) {
                answer["enum"] = json!(options);
            }
            json!({"type": "object", "required": ["answer"], "properties": {"answer": answer}})
        }
    };
    serde_json::from_value(schema).expect("the elicitation forms are valid schemas (unit-tested)")
}

/// The answer an elicitation result gives: None when the person dismissed it (the ask stays open).
fn answer_of(ask: &AskRow, result: &ElicitResult) -> Result<Option<(AskDecision, Option<String>)>, String> {
    let content = result.content.as_ref();
    let field = |name: &str| content.and_then(|c| c.get(name)).and_then(Value::as_str).map(str::trim);
    match result.action {
        ElicitationAction::Decline => Ok(Some((AskDecision::Deny, Some("declined at the host".into())))),
        ElicitationAction::Accept => match ask.kind {
            AskKind::Approval => {
                let decision = match field("decision").map(str::to_ascii_lowercase).as_deref() {
                    Some("allow") => AskDecision::Allow,
                    Some("deny") => AskDecision::Deny,
                    other => return Err(format!("content.decision {other:?} is not allowed; allowed: allow, deny")),
                };
                Ok(Some((decision, field("text").filter(|t| !t.is_empty()).map(String::from))))
            }
            AskKind::Question => match field("answer").filter(|t| !t.is_empty()) {
                Some(answer) => Ok(Some((AskDecision::Allow, Some(answer.to_string())))),
                None => Err("content.answer is missing: a question's answer is its text".into()),
            },
        },
        // Cancel, and any action a later revision adds: dismissed, not answered.
        _ => Ok(None),
    }
}

/// Answers `ask` from an elicitation result `shown_for` after it was shown (None: unknown), as
/// the person at `client`. A decline or cancel faster than a person reads is the host's, not a
/// person's: recorded, nothing answered. A dismissed form ends the host's route; an ask answered
/// first by someone else keeps that answer.
fn apply(
    access: &Access,
    runtime: Option<&Arc<Scheduler>>,
    caller: &Caller,
    ask: &AskRow,
    result: &ElicitResult,
    client: Option<&str>,
    shown_for: Option<Duration>,
) -> Result<(), String> {
    let ms = shown_for.map(|d| d.as_millis() as u64);
    let refused = matches!(result.action, ElicitationAction::Decline | ElicitationAction::Cancel);
    let unseen = refused && ms.is_some_and(|ms| crate::policy::answered_unseen(ms, access.config()));
    let engine = Engine::new(access, runtime);
    let route = |outcome: HostOutcome| engine.note_host_route(ask, outcome, client, ms).map_err(|e| e.message);
    if unseen {
        tracing::info!(ask = %ask.id, ?client, ?ms, "the host answered an elicitation by itself: no person there");
        return route(HostOutcome::Unseen);
    }
    let Some((decision, text)) = answer_of(ask, result)? else { return route(HostOutcome::Dismissed) };
    engine
        .respond(caller, ask, decision, text.as_deref(), AnsweredVia::Elicitation, Host { client, elicits: true })
        .map(|_| ())
        .map_err(|e| e.message)
}

/// Applies a round trip's `inputResponses` (keys are request ids the caller may answer) from the
/// person at `client`; `shown` tells when each was shown (a task's requests: not known).
pub fn apply_responses(
    access: &Access,
    runtime: Option<&Arc<Scheduler>>,
    caller: &Caller,
    responses: &InputResponses,
    client: Option<&str>,
    shown: Option<&Shown>,
) -> Result<(), McpError> {
    for (id, value) in responses {
        let bad = |why: String| McpError::invalid_params(format!("inputResponses.{id}: {why}"), None);
        let ask = access.ask_in_tree(caller, id).map_err(|e| bad(e.message))?;
        let result: ElicitResult = serde_json::from_value(value.clone())
            .map_err(|e| bad(format!("not an elicitation result ({{action, content?}}): {e}")))?;
        let shown_for = shown.and_then(|s| s.shown_for(caller, id));
        apply(access, runtime, caller, &ask, &result, client, shown_for).map_err(bad)?;
    }
    Ok(())
}

/// The asks as a round trip's (or a task's) input requests, keyed by request id.
pub fn input_requests(access: &Access, caller: &Caller, asks: &[AskRow]) -> InputRequests {
    asks.iter()
        .map(|ask| {
            let request = ElicitRequest::new(request_params(access, caller, ask));
            (ask.id.clone(), InputRequest::Elicitation(request))
        })
        .collect()
}

/// Whether a tool result is a `subagents wait` that returned only because a sub-agent asks
/// (nothing finished, so nothing was consumed and the call can be retried).
pub fn only_attention(result: &CallToolResult) -> bool {
    let Some(out) = &result.structured_content else { return false };
    let none_finished = out.get("finished").and_then(Value::as_array).is_none_or(Vec::is_empty);
    result.is_error != Some(true) && out.get("status").and_then(Value::as_str) == Some("attention") && none_finished
}

/// The asks each caller was shown by round trip, in this process, and when: shown once, so a
/// dismissed form does not come back on every call; the time tells a host's own answer from a
/// person's.
#[derive(Clone, Default)]
pub struct Shown(Arc<Mutex<HashMap<(String, String), Instant>>>);

impl Shown {
    /// The asks put to the caller that it was not shown yet, marked shown now.
    pub fn take_new(&self, access: &Access, caller: &Caller) -> Vec<AskRow> {
        let open = access.asks_for(caller).unwrap_or_default();
        let me = caller.key.as_str();
        let mut shown = self.0.lock().expect("shown asks");
        // Closed asks leave the map, so it holds no more than the asks open now.
        shown.retain(|(who, id), _| who != me || open.iter().any(|a| &a.id == id));
        let now = Instant::now();
        open.into_iter()
            .filter(|a| {
                let key = (me.to_string(), a.id.clone());
                !shown.contains_key(&key) && shown.insert(key, now).is_none()
            })
            .collect()
    }

    /// How long ago ask `id` was shown to the caller.
    fn shown_for(&self, caller: &Caller, id: &str) -> Option<Duration> {
        let shown = self.0.lock().expect("shown asks");
        shown.get(&(caller.key.to_string(), id.to_string())).map(Instant::elapsed)
    }
}

/// The push watcher of one MCP session: started once, stopped when the session's server drops.
#[derive(Default)]
pub struct Pusher(Mutex<Option<DropGuard>>);

impl Pusher {
    /// Starts the watcher for `caller` at the host `client` unless it runs.
    pub fn start(
        &self,
        hub: &Hub,
        access: &Access,
        runtime: Option<&Arc<Scheduler>>,
        caller: &Caller,
        peer: Peer<RoleServer>,
        client: Option<String>,
    ) {
        let mut started = self.0.lock().expect("pusher");
        if started.is_some() {
            return;
        }
        let stop = CancellationToken::new();
        let watch = Watch { access: access.clone(), runtime: runtime.cloned(), caller: caller.clone(), peer, client };
        tokio::spawn(watch.run(hub.clone(), stop.clone()));
        *started = Some(stop.drop_guard());
    }
}

struct Watch {
    access: Access,
    runtime: Option<Arc<Scheduler>>,
    caller: Caller,
    peer: Peer<RoleServer>,
    /// The host's `clientInfo.name`.
    client: Option<String>,
}

impl Watch {
    /// Looks again whenever the caller's session or an asking child's gained a message (a new ask
    /// appends to the first, an answer to the second), or the feed fell behind.
    async fn run(self, hub: Hub, stop: CancellationToken) {
        let watch = Arc::new(self);
        let mut feed = hub.receiver();
        // Ask id → the asking child's key, and what cancels its elicitation.
        let mut in_flight: HashMap<String, (String, CancellationToken)> = HashMap::new();
        let mut look = true;
        loop {
            if look {
                watch.look(&mut in_flight, &stop);
            }
            let received = tokio::select! {
                _ = stop.cancelled() => return,
                r = feed.recv() => r,
            };
            look = match received {
                Ok(batch) => batch.iter().any(|(key, _)| {
                    key.as_str() == watch.caller.key.as_str() || in_flight.values().any(|(child, _)| child == key)
                }),
                Err(RecvError::Lagged(_)) => true,
                Err(RecvError::Closed) => return,
            };
        }
    }

    fn look(self: &Arc<Self>, in_flight: &mut HashMap<String, (String, CancellationToken)>, stop: &CancellationToken) {
        let open = match self.access.asks_for(&self.caller) {
            Ok(open) => open,
            Err(e) => return tracing::warn!(error = %e.message, "reading the asks put to a caller failed"),
        };
        in_flight.retain(|id, (_, closed)| {
            let still = open.iter().any(|a| &a.id == id);
            if !still {
                closed.cancel();
            }
            still
        });
        for ask in open {
            if in_flight.contains_key(&ask.id) {
                continue;
            }
            let closed = stop.child_token();
            in_flight.insert(ask.id.clone(), (ask.child.to_string(), closed.clone()));
            tokio::spawn(Arc::clone(self).push(ask, closed));
        }
    }

    /// One `elicitation/create`, until it is answered, the ask closes, or its deadline passes.
    async fn push(self: Arc<Self>, ask: AskRow, closed: CancellationToken) {
        let params = request_params(&self.access, &self.caller, &ask);
        let request = ServerRequest::ElicitRequest(ElicitRequest::new(params));
        let mut handle = match self.peer.send_request_with_option(request, PeerRequestOptions::no_options()).await {
            Ok(handle) => handle,
            Err(e) => return tracing::debug!(ask = %ask.id, error = %e, "the elicitation could not be sent"),
        };
        let sent = Instant::now();
        let client = self.client.as_deref();
        let engine = Engine::new(&self.access, self.runtime.as_ref());
        if let Err(e) = engine.note_host_route(&ask, HostOutcome::Shown, client, None) {
            tracing::warn!(ask = %ask.id, error = %e.message, "recording an elicitation shown failed");
        }
        let left = Duration::from_millis((ask.deadline_at - now_ms()).max(0) as u64);
        let response = tokio::select! {
            r = &mut handle.rx => r,
            _ = closed.cancelled() => {
                let _ = handle.cancel(Some("answered elsewhere, or ended".into())).await;
                return;
            }
            _ = tokio::time::sleep(left) => {
                let _ = handle.cancel(Some("no answer before its deadline".into())).await;
                return;
            }
        };
        let outcome = match response {
            Ok(Ok(ClientResult::ElicitResult(result))) => {
                apply(&self.access, self.runtime.as_ref(), &self.caller, &ask, &result, client, Some(sent.elapsed()))
            }
            Ok(Ok(other)) => Err(format!("the client answered with something else: {other:?}")),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the session ended".into()),
        };
        if let Err(e) = outcome {
            tracing::info!(ask = %ask.id, error = %e, "an elicitation did not answer its ask");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(kind: AskKind, options: Option<Value>) -> AskRow {
        let details = Some(json!({"toolName": "Write", "input": {"path": "x".repeat(700)}}));
        AskRow { options, details, ..AskRow::for_test(kind, "May I?") }
    }

    fn result(action: ElicitationAction, content: Option<Value>) -> ElicitResult {
        serde_json::from_value(json!({"action": action, "content": content})).unwrap()
    }

    #[test]
    fn both_forms_are_valid_elicitation_schemas_and_a_questions_options_are_its_enum() {
        let approval = serde_json::to_value(form(&ask(AskKind::Approval, None))).unwrap();
        assert_eq!(approval["properties"]["decision"]["enum"], json!(["allow", "deny"]));
        assert_eq!(approval["required"], json!(["decision"]));
        let question = serde_json::to_value(form(&ask(AskKind::Question, Some(json!(["red", "blue"]))))).unwrap();
        assert_eq!(question["properties"]["answer"]["enum"], json!(["red", "blue"]));
        let open = serde_json::to_value(form(&ask(AskKind::Question, None))).unwrap();
        assert!(open["properties"]["answer"].get("enum").is_none(), "{open}");
    }

    #[test]
    fn accept_answers_decline_denies_and_cancel_leaves_the_ask_open() {
        let approval = ask(AskKind::Approval, None);
        let allow = result(ElicitationAction::Accept, Some(json!({"decision": "Allow", "text": " fine "})));
        assert_eq!(answer_of(&approval, &allow), Ok(Some((AskDecision::Allow, Some("fine".into())))));
        let deny = result(ElicitationAction::Decline, None);
        assert_eq!(answer_of(&approval, &deny), Ok(Some((AskDecision::Deny, Some("declined at the host".into())))));
        assert_eq!(answer_of(&approval, &result(ElicitationAction::Cancel, None)), Ok(None));
        let bad = result(ElicitationAction::Accept, Some(json!({"decision": "maybe"})));
        assert!(answer_of(&approval, &bad).unwrap_err().contains("allowed: allow, deny"));
        let question = ask(AskKind::Question, None);
        let answered = result(ElicitationAction::Accept, Some(json!({"answer": "blue"})));
        assert_eq!(answer_of(&question, &answered), Ok(Some((AskDecision::Allow, Some("blue".into())))));
        assert!(answer_of(&question, &result(ElicitationAction::Accept, Some(json!({})))).is_err());
    }

    #[test]
    fn long_details_are_cut_for_the_person_reading_them() {
        let line = details_line(&ask(AskKind::Approval, None));
        assert!(line.starts_with("\nDetails: {") && line.ends_with('…') && line.len() < 620, "{line}");
    }
}
