//! A running turn asks, at the runner level (`Runner::execute` with an input-request channel),
//! through the scripted `jsonl/1` agent: each `input_request` reaches the channel as an
//! `InputRequest`, and its answer goes back into the same turn as an `input_response` (allow,
//! deny, two open at once answered out of order). While a request is open the idle timer is
//! paused (the run's deadline is not); a malformed request, or one made where nobody can answer,
//! is answered deny at once and the turn goes on; a cancel, or the deadline, ends a turn waiting
//! for an answer and drops the open request.

use crate::common;

use std::time::Duration;

use common::runner::{execute_asking, request, scripted};
use serde_json::{Value, json};
use sessions_mcp::runner::{Decision, InputAnswer, InputKind, InputRequest, Outcome, RunStatus};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A turn of a scripted agent answering with `actions` under `limits`, asking on a channel.
struct AskingRun {
    asks: UnboundedReceiver<InputRequest>,
    run: JoinHandle<Outcome>,
    cancel: CancellationToken,
    _dir: tempfile::TempDir,
}

impl AskingRun {
    fn start(actions: Value, limits: Value) -> Self {
        let (dir, spec) = scripted(actions, limits);
        let (tx, asks) = tokio::sync::mpsc::unbounded_channel();
        let (_steers, steer_rx) = tokio::sync::mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        let run = tokio::spawn(async move {
            execute_asking(&spec, request("notes.txt"), vec![], steer_rx, Some(tx), token).await
        });
        AskingRun { asks, run, cancel, _dir: dir }
    }

    /// The next request the turn makes.
    async fn next(&mut self) -> InputRequest {
        tokio::time::timeout(Duration::from_secs(20), self.asks.recv())
            .await
            .expect("the turn asked in time")
            .expect("the turn asked")
    }

    async fn outcome(self) -> Outcome {
        self.run.await.unwrap()
    }
}

fn answer(request: InputRequest, decision: Decision, text: Option<&str>) {
    let sent = request.answer.send(InputAnswer { decision, text: text.map(String::from) });
    assert!(sent.is_ok(), "the turn still waited for the answer");
}

/// Reports each answer the turn got: its decisions and its texts, one per line, in the order asked.
const REPORT: &str = "decision: {decision}; answer: {answer}";

#[tokio::test]
async fn an_approval_answered_allow_reaches_the_agent_in_the_same_turn() {
    let ask = json!({"kind": "approval", "text": "May I write {input}?", "details": {"path": "notes.txt"}});
    let mut run = AskingRun::start(json!({"ask": ask, "reply": REPORT}), json!({}));
    let request = run.next().await;
    assert_eq!((request.id.as_str(), request.kind), ("ask1", InputKind::Approval));
    assert_eq!(request.text, "May I write notes.txt?");
    assert_eq!((request.options.as_ref(), request.details.as_ref()), (None, Some(&json!({"path": "notes.txt"}))));
    answer(request, Decision::Allow, Some("go ahead"));
    let outcome = run.outcome().await;
    assert_eq!(outcome.status, RunStatus::Ok, "{outcome:?}");
    assert_eq!(outcome.reply.as_deref(), Some("decision: allow; answer: go ahead"));
    // The runner records no message for the request: the engine does.
    let texts: Vec<String> = outcome.messages.iter().map(|m| m.content.to_string()).collect();
    assert_eq!(texts, [json!("decision: allow; answer: go ahead").to_string()]);
}

#[tokio::test]
async fn an_approval_answered_deny_reaches_the_agent() {
    let mut run =
        AskingRun::start(json!({"ask": {"kind": "approval", "text": "Delete it?"}, "reply": REPORT}), json!({}));
    answer(run.next().await, Decision::Deny, Some("not today"));
    let outcome = run.outcome().await;
    assert_eq!(outcome.status, RunStatus::Ok, "{outcome:?}");
    assert_eq!(outcome.reply.as_deref(), Some("decision: deny; answer: not today"));
}

#[tokio::test]
async fn two_requests_open_at_once_are_answered_out_of_order_each_by_its_id() {
    let asks = json!([{"id": "colour", "kind": "question", "text": "Which colour?", "options": ["red", "blue"]},
                      {"id": "go", "kind": "approval", "text": "Go on?"}]);
    let mut run = AskingRun::start(json!({"ask": asks, "reply": REPORT}), json!({}));
    let (colour, go) = (run.next().await, run.next().await);
    assert_eq!((colour.id.as_str(), colour.kind, go.id.as_str()), ("colour", InputKind::Question, "go"));
    assert_eq!(colour.options, Some(json!(["red", "blue"])));
    answer(go, Decision::Deny, None);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!run.run.is_finished(), "one answer is not all the turn waits for");
    answer(colour, Decision::Allow, Some("blue"));
    let outcome = run.outcome().await;
    assert_eq!(outcome.status, RunStatus::Ok, "{outcome:?}");
    // In the order asked: colour (allow, "blue"), then go (deny, no text).
    assert_eq!(outcome.reply.as_deref(), Some("decision: allow\ndeny; answer: blue\n"));
}

#[tokio::test]
async fn the_idle_timeout_does_not_fire_while_a_request_is_open() {
    let limits = json!({"idleTimeoutSeconds": 1});
    let mut run =
        AskingRun::start(json!({"ask": {"kind": "question", "text": "Name?"}, "reply": REPORT}), limits.clone());
    let request = run.next().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    answer(request, Decision::Allow, Some("Ada"));
    let outcome = run.outcome().await;
    assert_eq!(outcome.status, RunStatus::Ok, "3 s of silence with a request open: {outcome:?}");
    assert_eq!(outcome.reply.as_deref(), Some("decision: allow; answer: Ada"));

    // The same silence with nothing asked is an idle timeout.
    let silent = AskingRun::start(json!({"sleepMs": 3000, "reply": "late"}), limits);
    let outcome = silent.outcome().await;
    assert_eq!(outcome.error.as_deref(), Some("idle timeout: no output for 1s"), "{outcome:?}");
}

/// Waiting for a person is not the run's time (issue 36): the deadline stands still while a
/// request is open (the ask's own timeout bounds the wait, in the engine), and a turn answered
/// after its deadline would have passed goes on; before its request the deadline still ends it.
#[tokio::test]
async fn the_deadline_stands_still_while_a_request_is_open_and_still_ends_a_turn_before_it() {
    let limits = json!({"timeoutSeconds": 2});
    let mut run = AskingRun::start(json!({"ask": {"kind": "approval", "text": "?"}, "reply": REPORT}), limits.clone());
    let request = run.next().await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    answer(request, Decision::Allow, Some("late"));
    let outcome = run.outcome().await;
    assert_eq!(outcome.status, RunStatus::Ok, "answered 3 s into a 2 s deadline: {outcome:?}");
    assert_eq!(outcome.reply.as_deref(), Some("decision: allow; answer: late"));

    let slow = AskingRun::start(json!({"sleepMs": 3000, "ask": {"kind": "approval", "text": "?"}}), limits);
    let outcome = slow.outcome().await;
    assert_eq!(outcome.status, RunStatus::Timeout, "{outcome:?}");
}

#[tokio::test]
async fn malformed_requests_are_answered_deny_at_once_and_the_turn_goes_on_asking() {
    let asks = json!([{"id": "", "kind": "approval", "text": "no id"},
                      {"kind": "vote", "text": "bad kind"},
                      {"kind": "question", "text": "fine"}]);
    let mut run = AskingRun::start(json!({"ask": asks, "reply": REPORT}), json!({}));
    let request = run.next().await;
    assert_eq!((request.id.as_str(), request.text.as_str()), ("ask3", "fine"), "only the good one reaches the engine");
    answer(request, Decision::Allow, Some("ok"));
    let outcome = run.outcome().await;
    assert_eq!(outcome.status, RunStatus::Ok, "{outcome:?}");
    let expected = "decision: deny\ndeny\nallow; answer: input_request has no id\n\
                    input_request kind is \"vote\", not \"approval\" or \"question\"\nok";
    assert_eq!(outcome.reply.as_deref(), Some(expected));
}

#[tokio::test]
async fn a_run_nobody_can_ask_gets_every_request_denied() {
    let (_dir, spec) = scripted(json!({"ask": {"kind": "approval", "text": "?"}, "reply": REPORT}), json!({}));
    let (_steers, steer_rx) = tokio::sync::mpsc::unbounded_channel();
    let outcome = execute_asking(&spec, request("x"), vec![], steer_rx, None, CancellationToken::new()).await;
    assert_eq!(outcome.status, RunStatus::Ok, "{outcome:?}");
    assert_eq!(outcome.reply.as_deref(), Some("decision: deny; answer: this run cannot ask"));
}

#[tokio::test]
async fn a_cancel_ends_a_turn_waiting_for_an_answer_and_drops_the_request() {
    let mut run = AskingRun::start(json!({"ask": {"kind": "approval", "text": "?"}, "reply": "never"}), json!({}));
    let request = run.next().await;
    let started = std::time::Instant::now();
    run.cancel.cancel();
    let outcome = run.outcome().await;
    assert_eq!(outcome.status, RunStatus::Cancelled, "{outcome:?}");
    assert_eq!(outcome.stop_reason.as_deref(), Some("cancelled"), "the agent's own final within the grace");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    let late = request.answer.send(InputAnswer { decision: Decision::Allow, text: None });
    assert!(late.is_err(), "the ended run dropped the open request");
}
