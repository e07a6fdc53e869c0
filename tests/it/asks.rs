//! Questions and approvals from the tree (issue 18), black-box over stdio: a child asks, the
//! external root sees it in `subagents wait` (attention) and answers with `respond`, and the child
//! continues in the same run; the first answer wins; a rule decides without asking; an unanswered
//! ask times out with `onTimeout`; a driven parent answers its child's question by its own run;
//! a run past `maxOpenPerRun` open asks is denied at once, and a driven parent gets a child's
//! burst of asks in one turn.

use crate::common;

use std::time::Duration;

use common::{TestEnv, runs_of, scripted_agent, text_of, wait_until};
use serde_json::{Value, json};

pub(crate) fn script() -> Value {
    json!({"rules": [
        {"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"},
        {"match": {"mode": "ask", "inputRegex": "\"requestId\": \"([0-9a-f-]+)\""},
         "call": {"tool": "subagents", "arguments": {"action": "respond", "requestId": "{1}", "decision": "allow", "text": "parent says ok"}},
         "reply": "answered: {result}"},
        {"match": {"mode": "completion"}, "reply": "noted"},
        {"match": {"mode": "spawn", "inputRegex": "^spawn (.*)$"},
         "call": {"tool": "sessions_spawn", "arguments": {"task": "{1}"}}, "reply": "spawned"},
        {"match": {"input": "ask"},
         "ask": {"kind": "approval", "text": "May I write {input}?", "details": {"toolName": "Write"}},
         "reply": "decision={decision} answer={answer}"}
    ], "default": {"reply": "RESULT: {input}"}})
}

pub(crate) fn env_with(subagents: Value) -> TestEnv {
    let mut env = TestEnv::new();
    let main = scripted_agent(&env, "main", &script(), json!({}));
    env.set_config(&json!({"agents": {"list": [main], "defaults": {"subagents": subagents}}}).to_string());
    env
}

fn outcome_of(w: &Value) -> String {
    w["finished"][0]["outcome"].as_str().unwrap_or_else(|| panic!("{w}")).to_string()
}

#[test]
fn a_child_asks_the_root_answers_with_respond_and_the_child_continues_in_the_same_run() {
    let env = env_with(json!({}));
    let mut c = env.serve(None);
    let r = c.call("sessions_spawn", json!({"task": "ask for a.txt"}));
    let child = r["childSessionKey"].as_str().unwrap().to_string();
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    assert_eq!(w["status"], "attention", "{w}");
    let request = &w["requests"][0];
    assert_eq!(request["childSessionKey"], child.as_str(), "{w}");
    assert_eq!(request["kind"], "approval");
    assert_eq!(request["text"], "May I write ask for a.txt?");
    let id = request["requestId"].as_str().unwrap().to_string();
    let l = c.call("subagents", json!({"action": "list"}));
    assert_eq!(l["children"][0]["runState"], "waiting", "{l}");
    assert_eq!(l["children"][0]["pendingRequests"][0]["requestId"], id.as_str(), "{l}");
    // The question is in main's own session too.
    let h = c.call("sessions_history", json!({"sessionKey": "main"}));
    assert!(h["messages"].as_array().unwrap().iter().any(|m| text_of(&m["content"]).contains(&id)), "{h}");

    let ok = c.call("subagents", json!({"action": "respond", "requestId": id, "decision": "allow", "text": "yes, go"}));
    assert_eq!(ok["status"], "ok", "{ok}");
    let again = c.call("subagents", json!({"action": "respond", "requestId": id, "decision": "deny"}));
    assert_eq!(again["status"], "invalid", "{again}");
    assert!(
        again["error"].as_str().unwrap().contains("already answered (allow) by agent:main:main via subagents"),
        "{again}"
    );

    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    let outcome = outcome_of(&w);
    assert!(
        outcome.starts_with("Status: completed successfully\nResult: decision=allow answer=yes, go\n"),
        "{outcome}"
    );
    let show = env.show(&child);
    assert_eq!(runs_of(&show, Some("spawn")).len(), 1, "one run: {}", show["runs"]);
    let texts: Vec<String> = show["messages"].as_array().unwrap().iter().map(|m| text_of(&m["content"])).collect();
    assert!(texts.iter().any(|t| t.starts_with(&format!("[input request {id} (approval)]"))), "{texts:?}");
    assert!(
        texts
            .iter()
            .any(|t| t
                .starts_with(&format!("[answer to {id} by agent:main:main via subagents, the model] allow: yes, go"))),
        "{texts:?}"
    );
    c.close();
}

#[test]
fn another_trees_request_id_gets_the_same_answer_as_one_that_does_not_exist() {
    let env = env_with(json!({}));
    let mut c = env.serve(None);
    let a = c.call(
        "subagents",
        json!({"action": "respond", "requestId": "00000000-0000-4000-8000-000000000000", "decision": "allow"}),
    );
    assert_eq!(a["status"], "not_found", "{a}");
    assert!(a["error"].as_str().unwrap().starts_with("Input request not found: 00000000-"), "{a}");
    let bad = c.call("subagents", json!({"action": "respond", "requestId": "x", "decision": "maybe"}));
    assert_eq!(bad["status"], "invalid", "{bad}");
    assert!(bad["error"].as_str().unwrap().contains("allowed: allow, deny"), "{bad}");
    c.close();
}

#[test]
fn a_rule_decides_without_asking_and_an_unanswered_ask_times_out_with_on_timeout() {
    let env = env_with(json!({"approvals": {"rules": [{"decision": "allow", "tool": "Wri*"}]}}));
    let mut c = env.serve(None);
    c.call("sessions_spawn", json!({"task": "ask by rule"}));
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    assert_eq!(w["status"], "ok", "no one was asked: {w}");
    assert!(outcome_of(&w).contains("Result: decision=allow answer=decided by approvals.rules\n"), "{w}");
    c.close();

    let env = env_with(json!({"approvals": {"timeoutSeconds": 1}}));
    let mut c = env.serve(None);
    c.call("sessions_spawn", json!({"task": "ask and wait"}));
    let finished = wait_until(Duration::from_secs(30), "the ask to time out", || {
        let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 5}));
        (w["status"] == "ok" && !w["finished"].as_array().unwrap().is_empty()).then_some(w)
    });
    let outcome = outcome_of(&finished);
    assert!(
        outcome.contains("Result: decision=deny answer=no answer within approvals.timeoutSeconds (1 s)\n"),
        "{outcome}"
    );
    c.close();
}

#[test]
fn a_driven_parent_answers_its_childs_question_by_its_own_run() {
    let env = env_with(json!({"maxSpawnDepth": 2}));
    let mut c = env.serve(None);
    let r = c.call("sessions_spawn", json!({"task": "spawn ask deep"}));
    let parent = r["childSessionKey"].as_str().unwrap().to_string();
    let w = c.call("subagents", json!({"action": "wait", "childSessionKeys": [parent], "timeoutSeconds": 60}));
    assert_eq!(w["status"], "ok", "the root was not asked: {w}");
    let l = c.call("subagents", json!({"action": "list"}));
    let leaf =
        l["children"].as_array().unwrap().iter().find(|r| r["depth"] == 2).cloned().unwrap_or_else(|| panic!("{l}"));
    let leaf_show = env.show(leaf["sessionKey"].as_str().unwrap());
    let replies: Vec<String> = leaf_show["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "assistant")
        .map(|m| text_of(&m["content"]))
        .collect();
    assert!(replies.iter().any(|t| t == "decision=allow answer=parent says ok"), "{replies:?}");
    assert_eq!(runs_of(&leaf_show, Some("spawn")).len(), 1, "in the same run");
    let asks = runs_of(&env.show(&parent), Some("ask"));
    assert_eq!(asks.len(), 1, "the parent's ask turn");
    c.close();
}

/// Depth 2, answered from the top: the leaf's ask is put to its driven parent, whose ask turn
/// leaves it open; the external root sees it in `subagents list` and answers it directly, and the
/// leaf continues in the same run.
#[test]
fn the_external_root_answers_a_depth_two_ask_directly_and_the_leaf_continues_in_the_same_run() {
    let mut script = script();
    script["rules"][1] = json!({"match": {"mode": "ask"}, "reply": "I leave it to the root"});
    let mut env = TestEnv::new();
    let main = scripted_agent(&env, "main", &script, json!({}));
    env.set_config(&json!({"agents": {"list": [main], "defaults": {"subagents": {"maxSpawnDepth": 2}}}}).to_string());
    let mut c = env.serve(None);
    let r = c.call("sessions_spawn", json!({"task": "spawn ask deep"}));
    let parent = r["childSessionKey"].as_str().unwrap().to_string();
    let (leaf, id) = wait_until(Duration::from_secs(30), "the leaf's ask", || {
        let l = c.call("subagents", json!({"action": "list"}));
        let row = l["children"].as_array()?.iter().find(|r| r["depth"] == 2)?.clone();
        let id = row["pendingRequests"][0]["requestId"].as_str()?.to_string();
        Some((row["sessionKey"].as_str()?.to_string(), id))
    });
    let ok =
        c.call("subagents", json!({"action": "respond", "requestId": id, "decision": "allow", "text": "root says go"}));
    assert_eq!(ok["status"], "ok", "{ok}");
    let w = c.call("subagents", json!({"action": "wait", "childSessionKeys": [parent], "timeoutSeconds": 60}));
    assert_eq!(w["status"], "ok", "{w}");
    let show = env.show(&leaf);
    let texts: Vec<String> = show["messages"].as_array().unwrap().iter().map(|m| text_of(&m["content"])).collect();
    assert!(texts.iter().any(|t| t == "decision=allow answer=root says go"), "{texts:?}");
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with(&format!("[answer to {id} by agent:main:main via subagents, the model] allow"))),
        "{texts:?}"
    );
    assert_eq!(runs_of(&show, Some("spawn")).len(), 1, "in the same run");
    c.close();
}

#[test]
fn the_operator_lists_pending_asks_and_answers_one() {
    let env = env_with(json!({}));
    let mut c = env.serve(None);
    c.call("sessions_spawn", json!({"task": "ask the operator"}));
    let pending = wait_until(Duration::from_secs(30), "the ask", || {
        let out = env.run(&["ls", "--pending", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        v["pending"].as_array().filter(|p| !p.is_empty()).cloned()
    });
    assert_eq!(pending[0]["kind"], "approval", "{pending:?}");
    assert_eq!(pending[0]["askedOf"], "agent:main:main", "{pending:?}");
    let id = pending[0]["requestId"].as_str().unwrap();
    let out = env.run(&["respond", id, "deny", "not today"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let again = env.run(&["respond", id, "allow"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already answered (deny) by operator via operator"));
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    assert!(outcome_of(&w).contains("Result: decision=deny answer=not today\n"), "{w}");
    c.close();
}

/// The official Python SDK as the host: the person answers through MCP elicitation, pushed to a
/// handshake-era client and shown by round trip to a 2026-07-28 one (`tests/clients/python_elicit.py`).
#[test]
fn a_host_that_declared_elicitation_answers_its_sub_agent_by_push_and_by_round_trip() {
    let Some(python) = crate::python_sdk::python() else { return };
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/python_elicit.py");
    for mode in ["legacy", "2026-07-28"] {
        let env = env_with(json!({}));
        let serve = env.command(&["serve"]);
        let out = std::process::Command::new(&python)
            .arg(&script)
            .args([std::ffi::OsStr::new(mode), serve.get_program()])
            .args(serve.get_args())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(&format!("ok {mode}")),
            "python elicitation client ({mode}) failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// An ask cannot outlive its run: when the server that owns the run dies, the next one finds the
/// run interrupted and withdraws the ask, records that in the child's transcript, and an answer
/// that comes late is told so. (It could not survive: the turn it would answer is gone.)
#[test]
fn an_open_ask_is_withdrawn_when_its_server_dies_and_nothing_is_left_waiting() {
    let env = env_with(json!({}));
    let mut c = env.serve(None);
    let r = c.call("sessions_spawn", json!({"task": "ask before the crash"}));
    let child = r["childSessionKey"].as_str().unwrap().to_string();
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    assert_eq!(w["status"], "attention", "{w}");
    let id = w["requests"][0]["requestId"].as_str().unwrap().to_string();
    drop(c); // SIGKILL: the owner of the child's run dies with the ask open

    let mut c = env.serve(None);
    let listed = wait_until(Duration::from_secs(30), "the ask to be withdrawn", || {
        let l = c.call("subagents", json!({"action": "list"}));
        l["children"][0]["pendingRequests"].as_array().is_none_or(|p| p.is_empty()).then_some(l)
    });
    assert_ne!(listed["children"][0]["runState"], "waiting", "{listed}");
    let pending: Value = serde_json::from_slice(&env.run(&["ls", "--pending", "--json"]).stdout).unwrap();
    assert_eq!(pending["pending"], json!([]), "{pending}");
    let late = c.call("subagents", json!({"action": "respond", "requestId": id, "decision": "allow"}));
    assert_eq!(late["status"], "invalid", "{late}");
    assert!(late["error"].as_str().unwrap().contains("was withdrawn (its run ended before an answer came)"), "{late}");
    let out = env.run(&["respond", &id, "allow"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("was withdrawn"), "{}", String::from_utf8_lossy(&out.stderr));
    let show = env.show(&child);
    let run = &runs_of(&show, Some("spawn"))[0];
    assert_eq!(run["status"], "interrupted", "{run}");
    let texts: Vec<String> = show["messages"].as_array().unwrap().iter().map(|m| text_of(&m["content"])).collect();
    assert!(
        texts.iter().any(|t| t == &format!("[input request {id} withdrawn: its run ended before an answer came]")),
        "{texts:?}"
    );
    c.close();
}

/// `script()` with the child's "ask" rule asking `n` approvals at once, and the driven parent's
/// ask turn taking `parent_ms` before it answers the first request it reads.
fn script_asking(n: usize, parent_ms: u64) -> Value {
    let mut script = script();
    script["rules"][1]["sleepMs"] = json!(parent_ms);
    let asks: Vec<Value> = (1..=n)
        .map(|i| json!({"kind": "approval", "text": format!("May I write file {i}?"), "id": format!("w{i}")}))
        .collect();
    script["rules"][4] =
        json!({"match": {"input": "ask"}, "ask": asks, "reply": "decision={decision} answer={answer}"});
    script
}

fn env_asking(n: usize, parent_ms: u64, subagents: Value) -> TestEnv {
    let mut env = TestEnv::new();
    let main = scripted_agent(&env, "main", &script_asking(n, parent_ms), json!({}));
    env.set_config(&json!({"agents": {"list": [main], "defaults": {"subagents": subagents}}}).to_string());
    env
}

#[test]
fn a_run_past_max_open_per_run_is_denied_at_once_with_the_reason_and_puts_nothing_to_anyone() {
    let env = env_asking(12, 0, json!({}));
    let mut c = env.serve(None);
    let r = c.call("sessions_spawn", json!({"task": "ask for twelve files"}));
    let child = r["childSessionKey"].as_str().unwrap().to_string();
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    assert_eq!(w["status"], "attention", "{w}");
    // All twelve were asked at once; eight (the default cap) are open, the rest were denied.
    let pending = wait_until(Duration::from_secs(20), "the child's asks to settle", || {
        let l = c.call("subagents", json!({"action": "list"}));
        let p = l["children"][0]["pendingRequests"].as_array()?.clone();
        let asked = env.show(&child)["messages"].as_array()?.iter().filter(|m| m["role"] == "system").count();
        (asked >= 8 && p.len() >= 8).then_some(p)
    });
    // The last four came right after the eighth: give them time to be recorded, were they.
    std::thread::sleep(Duration::from_secs(1));
    let l = c.call("subagents", json!({"action": "list"}));
    assert_eq!(l["children"][0]["pendingRequests"].as_array().map(Vec::len), Some(8), "{l}");
    let h = c.call("sessions_history", json!({"sessionKey": "main", "limit": 100}));
    let questions =
        h["messages"].as_array().unwrap().iter().filter(|m| text_of(&m["content"]).contains("asks (approval)")).count();
    assert_eq!(questions, 8, "only the open ones reached main: {h}");
    for p in &pending {
        let ok = c.call("subagents", json!({"action": "respond", "requestId": p["requestId"], "decision": "allow"}));
        assert_eq!(ok["status"], "ok", "{ok}");
    }
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    let outcome = outcome_of(&w);
    let decisions = ["allow"; 8].iter().chain(["deny"; 4].iter()).copied().collect::<Vec<_>>().join("\n");
    assert!(outcome.contains(&format!("Result: decision={decisions} answer=")), "{outcome}");
    assert_eq!(outcome.matches("approvals.maxOpenPerRun").count(), 4, "the reason, to the agent: {outcome}");
    let show = env.show(&child);
    let recorded = show["messages"].as_array().unwrap().iter().filter(|m| m["role"] == "system").count();
    assert_eq!(recorded, 8, "the denied ones were not recorded as asks");
    c.close();

    let env = env_asking(3, 0, json!({"approvals": {"maxOpenPerRun": 1, "timeoutSeconds": 30}}));
    let mut c = env.serve(None);
    c.call("sessions_spawn", json!({"task": "ask for three files"}));
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    assert_eq!(w["requests"].as_array().map(Vec::len), Some(1), "{w}");
    c.close();
}

#[test]
fn a_driven_parent_gets_a_childs_burst_of_asks_in_one_turn_not_one_turn_each() {
    // The parent's ask turn takes a second, so asks that come while it runs wait in the next one.
    let env = env_asking(6, 1_000, json!({"maxSpawnDepth": 2, "approvals": {"timeoutSeconds": 8}}));
    let mut c = env.serve(None);
    let r = c.call("sessions_spawn", json!({"task": "spawn ask deep"}));
    let parent = r["childSessionKey"].as_str().unwrap().to_string();
    let w = c.call("subagents", json!({"action": "wait", "childSessionKeys": [parent], "timeoutSeconds": 90}));
    assert_eq!(w["status"], "ok", "{w}");
    let asks = runs_of(&env.show(&parent), Some("ask"));
    assert!(asks.len() <= 2, "six asks in at most two parent turns, got {}: {asks:?}", asks.len());
    let first = env.show(&parent)["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user" && text_of(&m["content"]).contains("asks (approval)"))
        .map(|m| text_of(&m["content"]).matches("asks (approval)").count())
        .sum::<usize>();
    assert_eq!(first, 6, "every ask reached the parent once");
    c.close();
}

/// The budget part of an announce's Stats: `budget 0.2s/5.0s`.
fn budget_stat(outcome: &str) -> &str {
    outcome.split(" • ").find(|s| s.starts_with("budget ")).unwrap_or_else(|| panic!("no budget in {outcome}"))
}

#[test]
fn a_run_whose_approval_is_answered_after_its_deadline_would_have_passed_goes_on_and_completes() {
    let env = env_with(json!({}));
    let mut c = env.serve(None);
    let r = c.call(
        "sessions_spawn",
        json!({"task": "ask for slow.txt", "runTimeoutSeconds": 5, "budget": {"runtimeSeconds": 5}}),
    );
    assert_eq!(r["status"], "accepted", "{r}");
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    assert_eq!(w["status"], "attention", "{w}");
    let id = w["requests"][0]["requestId"].as_str().unwrap().to_string();
    // The person takes longer than the run's deadline and its runtime budget.
    std::thread::sleep(Duration::from_secs(8));
    let ok = c.call("subagents", json!({"action": "respond", "requestId": id, "decision": "allow", "text": "go"}));
    assert_eq!(ok["status"], "ok", "the run was still waiting: {ok}");
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    let outcome = outcome_of(&w);
    assert!(outcome.starts_with("Status: completed successfully\nResult: decision=allow answer=go\n"), "{outcome}");
    // `budget 0.2s/5.0s`: the 8 s the person took are not the run's.
    let spent = budget_stat(&outcome).trim_start_matches("budget ").split('s').next().unwrap();
    assert!(spent.parse::<f64>().unwrap() < 5.0, "{outcome}");
    c.close();
}

#[test]
fn an_unanswered_ask_ends_by_its_own_timeout_past_the_runs_deadline_with_its_outcome_in_the_announce() {
    let env = env_with(json!({"approvals": {"timeoutSeconds": 6}}));
    let mut c = env.serve(None);
    let r = c.call("sessions_spawn", json!({"task": "ask for late.txt", "runTimeoutSeconds": 3}));
    let child = r["childSessionKey"].as_str().unwrap().to_string();
    let finished = wait_until(Duration::from_secs(40), "the ask to time out", || {
        let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 5}));
        (w["status"] == "ok" && !w["finished"].as_array().unwrap().is_empty()).then_some(w)
    });
    let outcome = outcome_of(&finished);
    assert!(
        outcome.starts_with(
            "Status: completed successfully\nResult: decision=deny answer=no answer within approvals.timeoutSeconds (6 s)\n"
        ),
        "the ask's timeout ended the wait, not the run's 3 s deadline: {outcome}"
    );
    let texts: Vec<String> =
        env.show(&child)["messages"].as_array().unwrap().iter().map(|m| text_of(&m["content"])).collect();
    assert!(texts.iter().any(|t| t.contains("no answer within approvals.timeoutSeconds (6 s)")), "{texts:?}");
    c.close();
}
