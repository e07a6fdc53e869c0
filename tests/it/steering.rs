//! Steering a running turn at the runner level (`Runner::execute` with a steer channel), through
//! the scripted `jsonl/1` agent: an agent that declares `"steer": true` in its `start` gets each
//! steer as a `steer` line and acts on it in the same turn; one that does not gets none; a steer
//! sent before the agent's `start` waits for it; a cancel still ends a turn waiting for a steer.
//! Claude Code's steering is in `claude_code.rs` (extended tier).

use crate::common;

use common::runner::{execute, request, steer};
use serde_json::{Value, json};
use sessions_mcp::runner::RunStatus;
use tokio_util::sync::CancellationToken;

/// A scripted agent `a` answering every turn with `actions`, with the default limits.
fn scripted(actions: Value) -> (tempfile::TempDir, sessions_mcp::runner::RunnerSpec) {
    common::runner::scripted(actions, json!({}))
}

#[tokio::test]
async fn a_declared_agent_takes_a_steer_sent_before_its_start_and_acts_on_it_in_the_same_turn() {
    let (_dir, spec) =
        scripted(json!({"steer": true, "awaitSteerMs": 20000, "reply": "task: {input}; steered: {steer}"}));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let run = tokio::spawn(async move { execute(&spec, request("count"), vec![], rx, CancellationToken::new()).await });
    // Sent at once: it waits in the channel until the agent's start declares that it takes steers.
    assert!(steer(&tx, "count backwards").await, "the steer went in");
    let outcome = run.await.unwrap();
    assert_eq!(outcome.status, RunStatus::Ok, "{outcome:?}");
    assert_eq!(outcome.reply.as_deref(), Some("task: count; steered: count backwards"));
    assert!(!steer(&tx, "too late").await, "after the turn no steer goes in");
}

#[tokio::test]
async fn an_agent_that_does_not_declare_steering_gets_no_steer() {
    let (_dir, spec) = scripted(json!({"awaitSteerMs": 1500, "reply": "steered: [{steer}]"}));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let run = tokio::spawn(async move { execute(&spec, request("x"), vec![], rx, CancellationToken::new()).await });
    assert!(!steer(&tx, "ignored").await, "refused once the agent's start declared nothing");
    let outcome = run.await.unwrap();
    assert_eq!((outcome.status, outcome.reply.as_deref()), (RunStatus::Ok, Some("steered: []")), "{outcome:?}");
}

#[tokio::test]
async fn a_cancel_ends_a_turn_that_waits_for_a_steer() {
    let (_dir, spec) = scripted(json!({"steer": true, "awaitSteerMs": 60000, "reply": "never"}));
    let (_tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let token = cancel.clone();
    let started = std::time::Instant::now();
    let run = tokio::spawn(async move { execute(&spec, request("x"), vec![], rx, token).await });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    cancel.cancel();
    let outcome = run.await.unwrap();
    assert_eq!(outcome.status, RunStatus::Cancelled, "{outcome:?}");
    assert_eq!(outcome.stop_reason.as_deref(), Some("cancelled"), "the agent's own final within the grace");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
}
