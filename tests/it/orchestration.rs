//! A child announces exactly once, after its last run of any kind, with the result of its last
//! work (issue 34, points 2 and 3), black-box: an orchestrator's answer written after its own
//! child's result reaches the top, and a child that is sent messages (and steered) while it works
//! still reports when it is done.

use crate::common;

use common::{Client, TestEnv, runs_of, scripted_agent};
use serde_json::{Value, json};

/// `orchestrate <rest>` spawns a child with task `<rest>` and ends its turn; when that child's
/// result comes (a completion run) it answers `ORCHESTRATED: <what it read>`; `slow` answers after
/// 1.5 s; anything else `RESULT: <input>` at once; the Notes step writes `NOTES: done`.
fn env(announce_step: bool) -> TestEnv {
    let script = json!({"rules": [
        {"match": {"mode": "announce"}, "reply": "NOTES: done"},
        {"match": {"mode": "completion"}, "reply": "ORCHESTRATED: {input}"},
        {"match": {"mode": "spawn", "inputRegex": "^orchestrate (.*)$"},
         "call": {"tool": "sessions_spawn", "arguments": {"task": "{1}"}}, "reply": "spawned: {result}"},
        {"match": {"input": "slow"}, "sleepMs": 1_500, "reply": "RESULT: slow"}
    ], "default": {"reply": "RESULT: {input}"}});
    let mut env = TestEnv::new();
    let main = scripted_agent(&env, "main", &script, json!({}));
    let extra = json!({"agents": {"list": [main], "defaults": {"subagents":
        {"maxSpawnDepth": 2, "announceStep": announce_step}}}});
    env.set_config(&common::agents_config(Vec::new(), extra));
    env
}

fn spawn(c: &mut Client, task: &str) -> String {
    let r = c.call("sessions_spawn", json!({"task": task}));
    assert_eq!(r["status"], "accepted", "{r}");
    r["childSessionKey"].as_str().unwrap().to_string()
}

/// Waits for `key`'s announce and returns its outcome text.
fn outcome(c: &mut Client, key: &str) -> String {
    let w = c.call("subagents", json!({"action": "wait", "childSessionKeys": [key], "timeoutSeconds": 30}));
    assert_eq!(w["status"], "ok", "{w}");
    assert_eq!(w["finished"].as_array().map(Vec::len), Some(1), "the child reported: {w}");
    w["finished"][0]["outcome"].as_str().unwrap().to_string()
}

/// How many announces `key` made, over all its runs.
fn announces(env: &TestEnv, key: &str) -> usize {
    let runs = runs_of(&env.show(key), None);
    let deliveries = runs.iter().flat_map(|r| r["deliveries"].as_array().cloned().unwrap_or_default());
    deliveries.filter(|d: &Value| d["kind"] == "announce" && d["status"] == "delivered").count()
}

#[test]
fn an_orchestrators_answer_after_its_childs_result_is_what_reaches_the_top() {
    for announce_step in [true, false] {
        let env = env(announce_step);
        let mut c = env.serve(None);
        let a = spawn(&mut c, "orchestrate find the answer");
        let top = outcome(&mut c, &a);
        let result = top.lines().find(|l| l.starts_with("Result: ")).unwrap_or_default();
        assert!(
            result.starts_with("Result: ORCHESTRATED: ") && top.contains("RESULT: find the answer"),
            "the orchestrator's last reply, with its child's finding in it (Notes step {announce_step}): {top}"
        );
        assert!(!result.contains("spawned:"), "not its first reply: {top}");
        assert_eq!(announces(&env, &a), 1, "announced once");
        c.close();
    }
}

#[test]
fn a_child_sent_messages_and_steered_while_it_works_still_reports_once_with_its_work() {
    let env = env(true);
    let mut c = env.serve(None);
    let a = spawn(&mut c, "slow");
    let sent = c.call("sessions_send", json!({"sessionKey": a, "message": "ping", "timeoutSeconds": 0}));
    assert_eq!(sent["status"], "accepted", "{sent}");
    let answered = c.call("sessions_send", json!({"sessionKey": a, "message": "pong", "timeoutSeconds": 30}));
    assert_eq!(answered["reply"], "RESULT: pong", "every message is answered: {answered}");
    let top = outcome(&mut c, &a);
    assert!(top.contains("Result: RESULT: slow"), "its task's result, not a message's reply: {top}");
    assert_eq!(announces(&env, &a), 1, "announced once");

    // With a steer in the mix: the steer turn's reply is the child's result.
    let b = spawn(&mut c, "slow");
    let steer = c.call("subagents", json!({"action": "steer", "childSessionKey": b, "message": "then this"}));
    assert_eq!(steer["status"], "ok", "{steer}");
    let sent = c.call("sessions_send", json!({"sessionKey": b, "message": "ping", "timeoutSeconds": 0}));
    assert_eq!(sent["status"], "accepted", "{sent}");
    let top = outcome(&mut c, &b);
    assert!(top.contains("Result: RESULT: then this"), "the steer turn's reply: {top}");
    assert_eq!(announces(&env, &b), 1, "announced once");
    c.close();
}
