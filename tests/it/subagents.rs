//! The `subagents` tool over stdio and HTTP, black-box: list (the tree, run and announce state,
//! totals, paging), wait (as soon as a child finishes, its outcome inline and read, any / all,
//! timeout, 100 at once, through a daemon, after a dropped connection), cancel (a queued child
//! never starts, a three-level tree with cascade leaves no process and every level cancelled,
//! idempotent, only an ancestor), and every bad input by name.

use crate::common;

use std::time::{Duration, Instant};

use common::{Client, TestEnv, assert_no_process_carries, runs_of, scripted_agent, wait_until};
use serde_json::{Value, json};

/// Children answer `RESULT: <task>` (after 1.5 s for a task with "slow", after two minutes for
/// one with "forever"); one with "steerable" declares steering and answers `GOT: <steers>` once
/// a steer came; a task `spawn <rest>` spawns a child with task `<rest>` and ends at once;
/// the Notes step writes `NOTES: done`.
fn script() -> Value {
    json!({"rules": [
        {"match": {"mode": "announce"}, "reply": "NOTES: done"},
        {"match": {"mode": "completion"}, "reply": "noted"},
        {"match": {"mode": "spawn", "inputRegex": "^spawn (.*)$"},
         "call": {"tool": "sessions_spawn", "arguments": {"task": "{1}"}}, "reply": "spawned: {result}"},
        {"match": {"input": "steerable"}, "steer": true, "awaitSteerMs": 30_000, "reply": "GOT: {steer}"},
        {"match": {"input": "forever"}, "sleepMs": 120_000, "reply": "RESULT: {input}"},
        {"match": {"input": "slow"}, "sleepMs": 1_500, "reply": "RESULT: {input}"}
    ], "default": {"reply": "RESULT: {input}"}})
}

/// The bearer token of session main over HTTP.
const TOKEN: &str = "main-token-0123456789";

/// An env whose agent `main` runs [`script`], with `agents.defaults.subagents = subagents`, and
/// [`TOKEN`] for main over HTTP.
fn env_with(subagents: Value) -> TestEnv {
    use sha2::Digest;
    let mut env = TestEnv::new();
    let main = scripted_agent(&env, "main", &script(), json!({}));
    let sha = hex::encode(sha2::Sha256::digest(TOKEN.as_bytes()));
    env.set_config(
        &json!({"agents": {"list": [main], "defaults": {"subagents": subagents}},
                "server": {"tokens": [{"sha256": sha, "sessionKey": "agent:main:main"}]}})
        .to_string(),
    );
    env
}

fn spawn(c: &mut Client, task: &str) -> String {
    let r = c.call("sessions_spawn", json!({"task": task, "label": task}));
    assert_eq!(r["status"], "accepted", "{r}");
    let note = r["note"].as_str().unwrap();
    assert!(note.contains("subagents {\"action\": \"wait\"}"), "the note points at wait: {note}");
    r["childSessionKey"].as_str().unwrap().to_string()
}

fn subagents(c: &mut Client, args: Value) -> Value {
    c.call("subagents", args)
}

fn list(c: &mut Client) -> Value {
    let l = subagents(c, json!({"action": "list"}));
    assert_eq!(l["status"], "ok", "{l}");
    l
}

/// The row of `key` in a `subagents list` answer.
pub(crate) fn row<'a>(list: &'a Value, key: &str) -> &'a Value {
    list["children"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["sessionKey"] == key)
        .unwrap_or_else(|| panic!("{key} in {list}"))
}

fn keys(v: &Value, field: &str, key_field: &str) -> Vec<String> {
    v[field].as_array().unwrap().iter().map(|r| r[key_field].as_str().unwrap().to_string()).collect()
}

/// The spawn run of `key` (as the operator's `show` reports it).
fn spawn_run(env: &TestEnv, key: &str) -> Value {
    runs_of(&env.show(key), Some("spawn")).first().cloned().unwrap_or_else(|| panic!("a spawn run of {key}"))
}

// ---- list ---------------------------------------------------------------------------------------

#[test]
fn list_shows_the_tree_newest_first_with_run_and_announce_state_and_totals() {
    let env = env_with(json!({}));
    let mut c = env.serve(None);
    let quick = spawn(&mut c, "quick one");
    let slow = spawn(&mut c, "forever one");
    wait_until(Duration::from_secs(20), "the quick child to be announced", || {
        (row(&list(&mut c), &quick)["announce"] == "delivered").then_some(())
    });
    let l = wait_until(Duration::from_secs(20), "the slow child to run", || {
        let l = list(&mut c);
        (row(&l, &slow)["runState"] == "running").then_some(l)
    });
    assert_eq!(keys(&l, "children", "sessionKey"), [slow.as_str(), quick.as_str()], "newest first: {l}");
    let q = row(&l, &quick);
    assert_eq!(q["runState"], "completed", "{q}");
    assert_eq!(q["parent"], "main");
    assert_eq!(q["depth"], 1);
    assert_eq!(q["agentId"], "main");
    assert_eq!(q["label"], "quick one");
    assert!(q["startedAt"].is_i64() && q["endedAt"].is_i64() && q["runtimeMs"].is_i64(), "{q}");
    assert!(q["lastActivity"].as_str().is_some_and(|a| !a.is_empty()), "{q}");
    let s = row(&l, &slow);
    assert_eq!(s["announce"], "pending", "{s}");
    assert!(s["endedAt"].is_null() && s["runtimeMs"].is_i64(), "a running child has a runtime so far: {s}");
    assert_eq!(l["totals"]["children"], 2, "{l}");
    assert_eq!(l["totals"]["unfinished"], 1, "{l}");
    assert_eq!(l["hasMore"], false);

    // Paging: one row a page, the cursor continues below it, nothing twice.
    let first = subagents(&mut c, json!({"action": "list", "limit": 1}));
    assert_eq!(keys(&first, "children", "sessionKey"), [slow.as_str()], "{first}");
    assert_eq!(first["hasMore"], true);
    let next = subagents(&mut c, json!({"action": "list", "limit": 1, "cursor": first["nextCursor"]}));
    assert_eq!(keys(&next, "children", "sessionKey"), [quick.as_str()], "{next}");
    assert_eq!(next["hasMore"], false, "{next}");
    c.call("subagents", json!({"action": "cancel", "childSessionKey": slow}));
    c.close();
}

// ---- wait ---------------------------------------------------------------------------------------

#[test]
fn wait_returns_when_the_child_finishes_with_its_outcome_and_marks_it_read() {
    let env = env_with(json!({}));
    let mut c = env.serve(None);
    let child = spawn(&mut c, "slow task");
    let started = Instant::now();
    let w = subagents(&mut c, json!({"action": "wait"}));
    let took = started.elapsed();
    assert_eq!(w["status"], "ok", "{w}");
    assert!(took >= Duration::from_millis(1_000), "it waited for the child: {took:?}");
    assert_eq!(keys(&w, "finished", "childSessionKey"), [child.as_str()], "{w}");
    let f = &w["finished"][0];
    assert_eq!(f["runState"], "completed");
    assert_eq!(f["announce"], "read");
    let outcome = f["outcome"].as_str().unwrap();
    assert!(outcome.starts_with("Status: completed successfully\nResult: RESULT: slow task\n"), "{outcome}");
    assert!(outcome.contains("\nNotes: NOTES: done\n") && outcome.contains("Stats: runtime "), "{outcome}");
    assert!(w["unfinished"].as_array().unwrap().is_empty());
    // The announce is read: list says so, and a second default wait has nothing left to wait for.
    assert_eq!(row(&list(&mut c), &child)["announce"], "read");
    let again = subagents(&mut c, json!({"action": "wait", "timeoutSeconds": 5}));
    assert!(again["finished"].as_array().unwrap().is_empty(), "{again}");
    assert!(again["note"].as_str().unwrap().contains("no children"), "{again}");
    // Naming it returns its outcome again, at once.
    let named = subagents(&mut c, json!({"action": "wait", "childSessionKeys": [child]}));
    assert_eq!(named["finished"][0]["outcome"], f["outcome"], "{named}");
    c.close();
}

#[test]
fn reading_the_announce_in_history_marks_it_read_too() {
    let env = env_with(json!({}));
    let mut c = env.serve(None);
    let child = spawn(&mut c, "quick");
    wait_until(Duration::from_secs(20), "the announce", || {
        (row(&list(&mut c), &child)["announce"] == "delivered").then_some(())
    });
    let h = c.call("sessions_history", json!({"sessionKey": "main"}));
    assert!(h["messages"].as_array().unwrap().iter().any(|m| m["provenance"]["sourceTool"] == "subagent_announce"));
    assert_eq!(row(&list(&mut c), &child)["announce"], "read");
    c.close();
}

#[test]
fn wait_any_all_and_timeout() {
    let env = env_with(json!({"maxConcurrent": 4}));
    let mut c = env.serve(None);
    let slow = spawn(&mut c, "slow a");
    let forever = spawn(&mut c, "forever b");
    let both = json!([slow.clone(), forever.clone()]);
    // any: back when the slow one finished, with the other still running.
    let any = subagents(&mut c, json!({"action": "wait", "childSessionKeys": both, "timeoutSeconds": 60}));
    assert_eq!(any["status"], "ok", "{any}");
    assert_eq!(keys(&any, "finished", "childSessionKey"), [slow.as_str()], "{any}");
    assert_eq!(keys(&any, "unfinished", "childSessionKey"), [forever.as_str()], "{any}");
    assert_eq!(any["unfinished"][0]["runState"], "running");
    // all: times out (not an error) with the one still running.
    let started = Instant::now();
    let all = c.call_result(
        "subagents",
        json!({"action": "wait", "childSessionKeys": both, "until": "all", "timeoutSeconds": 1}),
    );
    assert_eq!(all["isError"], false, "a timeout is no error: {all}");
    let all = &all["structuredContent"];
    assert_eq!(all["status"], "timeout", "{all}");
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(keys(all, "finished", "childSessionKey"), [slow.as_str()], "{all}");
    assert_eq!(keys(all, "unfinished", "childSessionKey"), [forever.as_str()], "{all}");
    // timeoutSeconds 0 looks once.
    let look = subagents(&mut c, json!({"action": "wait", "childSessionKeys": [forever], "timeoutSeconds": 0}));
    assert_eq!(look["status"], "timeout", "{look}");
    subagents(&mut c, json!({"action": "cancel", "childSessionKey": forever}));
    c.close();
}

#[test]
fn a_hundred_concurrent_waits_on_one_server_all_return_the_outcome() {
    let env = env_with(json!({}));
    let mut c = env.serve(None);
    let child = spawn(&mut c, "slow shared");
    let ids: Vec<u64> = (0..100)
        .map(|_| {
            c.start_call("subagents", json!({"action": "wait", "childSessionKeys": [child], "timeoutSeconds": 60}))
        })
        .collect();
    for id in ids {
        let w = c.finish_call("subagents", id);
        assert_eq!(w["status"], "ok", "{w}");
        assert!(w["finished"][0]["outcome"].as_str().unwrap().starts_with("Status: completed successfully"), "{w}");
    }
    c.close();
}

#[test]
fn a_wait_over_http_returns_the_outcome_and_a_dropped_wait_consumes_nothing() {
    use common::http_client::Mcp;
    let env = env_with(json!({}));
    let server = env.serve_http(&[]);
    let token = TOKEN;
    let mut first = Mcp::legacy(server.port, token);
    let r = first.call("sessions_spawn", json!({"task": "slow over http"}));
    let child = r["childSessionKey"].as_str().unwrap().to_string();
    // A wait whose client goes away before the child finishes.
    let body = json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call",
                      "params": {"name": "subagents", "arguments": {"action": "wait", "timeoutSeconds": 60}}});
    common::http_client::abandon_request(
        server.port,
        token,
        first.session.as_deref(),
        &body,
        Duration::from_millis(300),
    );
    // The child finishes while no one waits any more…
    wait_until(Duration::from_secs(20), "the child to be announced", || {
        let l = first.call("subagents", json!({"action": "list"}));
        (l["children"][0]["runState"] == "completed" && l["children"][0]["announce"] != "pending").then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    // …and the client reconnects (a new MCP session) and waits: the outcome is still there.
    let mut second = Mcp::legacy(server.port, token);
    let w = second.call("subagents", json!({"action": "wait", "timeoutSeconds": 60}));
    assert_eq!(keys(&w, "finished", "childSessionKey"), [child.as_str()], "{w}");
    assert!(w["finished"][0]["outcome"].as_str().unwrap().contains("Result: RESULT: slow over http"), "{w}");
}

// ---- cancel -------------------------------------------------------------------------------------

#[test]
fn cancel_with_cascade_stops_a_three_level_tree_leaving_no_process_and_every_level_cancelled() {
    let env = env_with(json!({"maxSpawnDepth": 3}));
    let mut c = env.serve(None);
    let top = spawn(&mut c, "spawn spawn forever leaf");
    // The orchestrators' spawn runs end just after their children start: wait for both.
    let tree = wait_until(Duration::from_secs(30), "three levels, the leaf running, its parents waiting", || {
        let l = list(&mut c);
        let rows = l["children"].as_array().unwrap().clone();
        let state = |d: i64| rows.iter().find(|r| r["depth"] == d).map(|r| r["runState"].clone());
        (rows.len() == 3
            && state(3) == Some(json!("running"))
            && state(2) == Some(json!("waiting"))
            && state(1) == Some(json!("waiting")))
        .then_some(rows)
    });
    let run_ids: Vec<String> = tree.iter().map(|r| r["runId"].as_str().unwrap().to_string()).collect();
    let by_depth = |d: i64| tree.iter().find(|r| r["depth"] == d).unwrap()["sessionKey"].as_str().unwrap().to_string();
    assert_eq!(by_depth(1), top);
    for d in [1, 2] {
        assert_eq!(
            tree.iter().find(|r| r["depth"] == d).unwrap()["runState"],
            "waiting",
            "an orchestrator waits: {tree:?}"
        );
    }

    let x = subagents(&mut c, json!({"action": "cancel", "childSessionKey": top}));
    assert_eq!(x["status"], "ok", "{x}");
    assert_eq!(x["runState"], "cancelled", "{x}");
    assert_eq!(x["alreadyEnded"], false);
    assert_eq!(x["cancelled"].as_array().unwrap().len(), 3, "{x}");
    assert_no_process_carries(&run_ids, Duration::from_secs(10));
    let l = list(&mut c);
    for r in l["children"].as_array().unwrap() {
        assert_eq!(r["runState"], "cancelled", "every level: {l}");
    }
    assert_eq!(spawn_run(&env, &by_depth(3))["status"], "cancelled", "the running leaf's run");
    assert_eq!(l["totals"]["unfinished"], 0, "{l}");
    // Main hears of its own child only, as cancelled.
    let w = subagents(&mut c, json!({"action": "wait", "childSessionKeys": [top]}));
    let outcome = w["finished"][0]["outcome"].as_str().unwrap();
    assert!(outcome.starts_with("Status: cancelled\n"), "{outcome}");
    let h = c.call("sessions_history", json!({"sessionKey": "main"}));
    let announces: Vec<&Value> = h["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["provenance"]["sourceTool"] == "subagent_announce")
        .collect();
    assert_eq!(announces.len(), 1, "{announces:?}");
    // Cancelling again answers what it ended with.
    let again = subagents(&mut c, json!({"action": "cancel", "childSessionKey": top}));
    assert_eq!(again["alreadyEnded"], true, "{again}");
    assert_eq!(again["runState"], "cancelled");
    assert!(again["cancelled"].as_array().unwrap().is_empty());
    env.wait_idle(Duration::from_secs(15));
    c.close();
}

#[test]
fn a_queued_child_cancelled_never_starts_and_a_running_one_stops() {
    let env = env_with(json!({"maxConcurrent": 1}));
    let mut c = env.serve(None);
    let running = spawn(&mut c, "forever first");
    let queued = spawn(&mut c, "quick second");
    wait_until(Duration::from_secs(20), "the first to run", || {
        (row(&list(&mut c), &running)["runState"] == "running").then_some(())
    });
    assert_eq!(row(&list(&mut c), &queued)["runState"], "queued");
    let x = subagents(&mut c, json!({"action": "cancel", "childSessionKey": queued}));
    assert_eq!(x["runState"], "cancelled", "{x}");
    let run = spawn_run(&env, &queued);
    assert_eq!(run["status"], "cancelled", "{run}");
    assert!(run["startedAt"].is_null(), "it never started: {run}");
    let x = subagents(&mut c, json!({"action": "cancel", "childSessionKey": running, "cascade": false}));
    assert_eq!(x["runState"], "cancelled", "{x}");
    assert_eq!(spawn_run(&env, &running)["status"], "cancelled");
    let w = subagents(&mut c, json!({"action": "wait", "until": "all", "timeoutSeconds": 10}));
    assert_eq!(w["status"], "ok", "{w}");
    for f in w["finished"].as_array().unwrap() {
        assert!(f["outcome"].as_str().unwrap().starts_with("Status: cancelled\n"), "{f}");
    }
    env.wait_idle(Duration::from_secs(15));
    c.close();
}

#[test]
fn a_key_outside_the_callers_tree_gets_the_same_bytes_as_one_that_does_not_exist() {
    let other_child = "agent:main:subagent:0a1b2c3d-4e5f-4a6b-8c7d-8e9f0a1b2c3d";
    let answers = |seeded: bool| -> Vec<String> {
        let env = env_with(json!({}));
        if seeded {
            env.seed(json!({"sessions": [{"key": "agent:main:other"},
                                         {"key": other_child, "spawnedBy": "agent:main:other"}]}));
        }
        let mut c = env.serve(None);
        let out = [
            json!({"action": "cancel", "childSessionKey": other_child}),
            json!({"action": "wait", "childSessionKeys": [other_child]}),
            json!({"action": "cancel", "childSessionKey": "main"}),
        ]
        .into_iter()
        .map(|args| c.call_result("subagents", args)["content"][0]["text"].as_str().unwrap().to_string())
        .collect();
        c.close();
        out
    };
    let (seeded, absent) = (answers(true), answers(false));
    assert_eq!(seeded, absent);
    assert!(seeded[0].contains("\"status\":\"not_found\"") && seeded[0].contains("Sub-agent not found"), "{seeded:?}");
}

// ---- steer --------------------------------------------------------------------------------------

#[test]
fn a_steer_reaches_a_running_jsonl_turn_that_acts_on_it_in_the_same_turn() {
    let env = env_with(json!({}));
    let mut c = env.serve(None);
    let child = spawn(&mut c, "steerable task");
    wait_until(Duration::from_secs(20), "the child to run", || {
        (row(&list(&mut c), &child)["runState"] == "running").then_some(())
    });
    let s = subagents(&mut c, json!({"action": "steer", "childSessionKey": child, "message": "use plan B"}));
    assert_eq!(s["targetDisposition"], "steered", "{s}");
    let w = subagents(&mut c, json!({"action": "wait", "timeoutSeconds": 60}));
    let outcome = w["finished"][0]["outcome"].as_str().unwrap();
    assert!(outcome.starts_with("Status: completed successfully\nResult: GOT: use plan B\n"), "{outcome}");
    let show = env.show(&child);
    assert_eq!(runs_of(&show, Some("steer")).len(), 0, "no extra turn: {}", show["runs"]);
    let spawn_run_id = spawn_run(&env, &child)["runId"].clone();
    let messages = show["messages"].as_array().unwrap();
    let at = |f: &dyn Fn(&Value) -> bool| messages.iter().position(f).unwrap_or_else(|| panic!("{messages:?}"));
    let steer_at = at(&|m| m["provenance"]["sourceTool"] == "subagents");
    assert_eq!(messages[steer_at]["runId"], spawn_run_id, "it belongs to the turn it steered");
    assert!(at(&|m| m["role"] == "user" && m["provenance"]["sourceTool"] == "sessions_spawn") < steer_at);
    assert!(steer_at < at(&|m| m["role"] == "assistant"), "before the turn's answer: {messages:?}");
    c.close();
}

#[test]
fn a_steer_an_agent_cannot_take_mid_turn_becomes_the_childs_next_turn_and_its_result() {
    let env = env_with(json!({}));
    let mut c = env.serve(None);
    let child = spawn(&mut c, "slow first part");
    wait_until(Duration::from_secs(20), "the child to run", || {
        (row(&list(&mut c), &child)["runState"] == "running").then_some(())
    });
    let s = subagents(
        &mut c,
        json!({"action": "steer", "childSessionKey": child, "message": "second part",
                                     "idempotencyKey": "steer-1"}),
    );
    assert_eq!(s["status"], "ok", "{s}");
    assert_eq!(s["targetDisposition"], "queued", "the scripted agent declares no steer: {s}");
    // A retry with the same key steers nothing twice.
    let again = subagents(
        &mut c,
        json!({"action": "steer", "childSessionKey": child, "message": "second part",
                                         "idempotencyKey": "steer-1"}),
    );
    assert_eq!(again["runId"], s["runId"], "{again}");
    let w = subagents(&mut c, json!({"action": "wait", "timeoutSeconds": 60}));
    let outcome = w["finished"][0]["outcome"].as_str().unwrap();
    assert!(
        outcome.starts_with("Status: completed successfully\nResult: RESULT: second part\n"),
        "after its last turn: {outcome}"
    );
    let show = env.show(&child);
    let turns = runs_of(&show, Some("steer"));
    assert_eq!(turns.len(), 1, "one steer turn: {}", show["runs"]);
    let steer_msg = show["messages"].as_array().unwrap().iter().find(|m| m["provenance"]["sourceTool"] == "subagents");
    let steer_msg = steer_msg.unwrap_or_else(|| panic!("the steer in the transcript: {}", show["messages"]));
    assert_eq!(steer_msg["provenance"]["kind"], "inter_session", "{steer_msg}");
    assert_eq!(steer_msg["provenance"]["sourceSessionKey"], "agent:main:main", "{steer_msg}");
    // An ended child takes no steer.
    let ended = subagents(&mut c, json!({"action": "steer", "childSessionKey": child, "message": "more"}));
    assert_eq!(ended["status"], "invalid", "{ended}");
    assert!(ended["error"].as_str().unwrap().contains("has ended (completed)"), "{ended}");
    c.close();
}

/// Steers from two connections into a running child whose agent cannot take them, while a third
/// cancels it: once the cancel answers, no run of the child is queued or starts (a steer that
/// raced it is dropped in the transaction that would have queued it), and a later steer is
/// refused.
#[test]
fn steers_racing_a_cancel_revive_nothing_of_the_cancelled_child() {
    use common::http_client::Mcp;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    let env = env_with(json!({}));
    let server = env.serve_http(&[]);
    let mut c = Mcp::legacy(server.port, TOKEN);
    let r = c.call("sessions_spawn", json!({"task": "forever task"}));
    let child = r["childSessionKey"].as_str().unwrap().to_string();
    wait_until(Duration::from_secs(20), "the child to run", || {
        (row(&c.call("subagents", json!({"action": "list"})), &child)["runState"] == "running").then_some(())
    });
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    // (sent after the cancel answered, the answer) of every steer.
    let answers = Arc::new(Mutex::new(Vec::<(bool, Value)>::new()));
    let cancel_answered = Arc::new(AtomicBool::new(false));
    let steerers: Vec<_> = (0..2)
        .map(|n| {
            let (stop, answered, answers, after) =
                (stop.clone(), answered.clone(), answers.clone(), cancel_answered.clone());
            let (port, child) = (server.port, child.clone());
            std::thread::spawn(move || {
                let mut s = Mcp::legacy(port, TOKEN);
                for i in 0.. {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let sent_after = after.load(Ordering::SeqCst);
                    let message = format!("steer {n}.{i}");
                    let a =
                        s.call("subagents", json!({"action": "steer", "childSessionKey": child, "message": message}));
                    answers.lock().unwrap().push((sent_after, a));
                    answered.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    wait_until(Duration::from_secs(30), "some steers to be answered", || {
        (answered.load(Ordering::SeqCst) >= 6).then_some(())
    });
    let x = c.call("subagents", json!({"action": "cancel", "childSessionKey": child}));
    assert_eq!(x["status"], "ok", "{x}");
    cancel_answered.store(true, Ordering::SeqCst);
    let cancelled_at = answered.load(Ordering::SeqCst);
    wait_until(Duration::from_secs(30), "steers after the cancel", || {
        (answered.load(Ordering::SeqCst) >= cancelled_at + 6).then_some(())
    });
    stop.store(true, Ordering::SeqCst);
    for t in steerers {
        t.join().unwrap();
    }
    std::thread::sleep(Duration::from_secs(3));

    let show = env.show(&child);
    let runs = runs_of(&show, None);
    let revived: Vec<&Value> = runs
        .iter()
        .filter(|r| r["mode"] != "spawn" && (r["status"] != "cancelled" || !r["startedAt"].is_null()))
        .collect();
    assert!(
        revived.is_empty(),
        "{} runs of the cancelled child queued, running or started: {revived:?}",
        revived.len()
    );
    assert_eq!(spawn_run(&env, &child)["status"], "cancelled");
    let answers = answers.lock().unwrap();
    for (_, a) in answers.iter().filter(|(after, _)| *after) {
        assert_eq!(a["status"], "invalid", "a steer after the cancel answered: {a}");
    }
    let l = c.call("subagents", json!({"action": "list"}));
    assert_eq!(row(&l, &child)["runState"], "cancelled", "{l}");
}

/// Steers an agent cannot take mid-turn coalesce: while the child's steer turn is queued and not
/// started, each further steer joins it (the answers say so), and the child gets them all, in
/// order, in that one turn.
#[test]
fn steers_queued_while_a_turn_waits_join_it_and_the_child_gets_them_in_one_turn_in_order() {
    let env = crate::asks::env_with(json!({}));
    let mut c = env.serve(None);
    let r = c.call("sessions_spawn", json!({"task": "ask before the steers"}));
    let child = r["childSessionKey"].as_str().unwrap().to_string();
    // The child's first turn waits for an answer: the steers queue behind it.
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    assert_eq!(w["status"], "attention", "{w}");
    let id = w["requests"][0]["requestId"].as_str().unwrap().to_string();
    let parts: Vec<String> = (1..=30).map(|i| format!("part {i}")).collect();
    let answers: Vec<Value> = parts
        .iter()
        .map(|p| c.call("subagents", json!({"action": "steer", "childSessionKey": child, "message": p})))
        .collect();
    for a in &answers {
        assert_eq!((a["status"].as_str(), a["targetDisposition"].as_str()), (Some("ok"), Some("queued")), "{a}");
        assert_eq!(a["runId"], answers[0]["runId"], "one turn: {a}");
    }
    assert!(!answers[0]["note"].as_str().unwrap().contains("joined"), "{}", answers[0]);
    assert!(answers[1..].iter().all(|a| a["note"].as_str().unwrap().contains("joined the child's next turn")));
    let queued = runs_of(&env.show(&child), Some("steer"));
    assert_eq!(queued.len(), 1, "{queued:?}");

    let ok = c.call("subagents", json!({"action": "respond", "requestId": id, "decision": "allow"}));
    assert_eq!(ok["status"], "ok", "{ok}");
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 60}));
    let outcome = w["finished"][0]["outcome"].as_str().unwrap_or_else(|| panic!("{w}"));
    assert!(outcome.contains(&format!("Result: RESULT: {}\n", parts.join("\n"))), "{outcome}");
    let turns = runs_of(&env.show(&child), Some("steer"));
    assert_eq!(turns.len(), 1, "{turns:?}");
    assert_eq!(turns[0]["status"], "ok", "{turns:?}");
    c.close();
}

// ---- bad input ----------------------------------------------------------------------------------

#[test]
fn bad_input_is_refused_by_name_and_changes_nothing() {
    let env = env_with(json!({}));
    let mut c = env.serve(None);
    for (args, says) in [
        (json!({}), "action"),
        (json!({"action": "stop"}), "action \"stop\" is not allowed; allowed: list, wait, cancel, steer, respond"),
        (json!({"action": "steer", "childSessionKey": "x"}), "message"),
        (json!({"action": "cancel", "message": "x"}), "message is not an argument of action \"cancel\""),
        (json!({"action": "list", "childSessionKey": "x"}), "childSessionKey is not an argument of action \"list\""),
        (json!({"action": "wait", "cascade": true}), "cascade is not an argument of action \"wait\""),
        (json!({"action": "list", "cursor": "nope"}), "cursor is not a cursor"),
        (json!({"action": "list", "limit": 0}), "limit must be at least 1"),
        (json!({"action": "wait", "childSessionKeys": []}), "childSessionKeys is empty"),
        (json!({"action": "wait", "until": "some"}), "until \"some\" is not allowed; allowed: any, all"),
        (json!({"action": "wait", "timeoutSeconds": -1}), "timeoutSeconds must not be negative"),
        (json!({"action": "cancel"}), "childSessionKey"),
        (json!({"action": "list", "bogus": 1}), "unknown argument \"bogus\""),
    ] {
        let r = c.call("subagents", args.clone());
        assert_eq!(r["status"], "invalid", "{args} → {r}");
        assert!(r["error"].as_str().unwrap().contains(says), "{args} → {r}");
    }
    let clamped = subagents(&mut c, json!({"action": "list", "limit": 1000}));
    assert_eq!(clamped["limitApplied"]["limit"], 100, "{clamped}");
    assert_eq!(env.unfinished_runs(), 0);
    c.close();
}

#[test]
fn the_tool_is_listed_with_its_schemas_and_its_description_points_at_wait() {
    let env = env_with(json!({}));
    let mut c = env.serve(None);
    let tools = c.request("tools/list", json!({}));
    let tool = tools["result"]["tools"].as_array().unwrap().iter().find(|t| t["name"] == "subagents").cloned();
    let tool = tool.unwrap_or_else(|| panic!("subagents in {tools}"));
    assert_eq!(tool["inputSchema"]["required"], json!(["action"]), "{tool}");
    assert!(tool["outputSchema"].is_object(), "{tool}");
    assert!(tool["description"].as_str().unwrap().contains("instead of polling"), "{tool}");
    c.close();
}

/// `tree` is "the caller's session and every session it spawned" (docs/BEHAVIOUR.md, Visibility),
/// whatever agent runs the child: a child main spawned under agent `ops` (its allowlist permits
/// it) is listed, read and sent to like any other child, under `tree` and under the wider
/// `agent`, with agent-to-agent off; a session of `ops` that main did not spawn stays out of reach.
#[test]
fn a_child_spawned_under_another_agent_is_in_the_callers_tree() {
    for visibility in ["tree", "agent"] {
        let mut env = TestEnv::new();
        let mut main = scripted_agent(&env, "main", &script(), json!({}));
        main["subagents"] = json!({"allowAgents": ["ops"]});
        let ops = scripted_agent(&env, "ops", &script(), json!({}));
        env.set_config(
            &json!({"agents": {"list": [main, ops]}, "tools": {"sessions": {"visibility": visibility}}}).to_string(),
        );
        env.seed(json!({"sessions": [{"key": "agent:ops:other"}]}));
        let mut c = env.serve(None);
        let r = c.call("sessions_spawn", json!({"task": "first", "agentId": "ops", "label": "op-child"}));
        assert_eq!(r["status"], "accepted", "{visibility}: {r}");
        let child = r["childSessionKey"].as_str().unwrap().to_string();
        assert!(child.starts_with("agent:ops:subagent:"), "{child}");
        wait_until(Duration::from_secs(20), "the child's first run to end", || {
            runs_of(&env.show(&child), Some("spawn")).first().filter(|r| r["endedAt"].is_i64()).map(|_| ())
        });
        assert_eq!(row(&list(&mut c), &child)["label"], "op-child", "{visibility}: subagents lists it");

        let listed = c.call("sessions_list", json!({}));
        let keys = keys(&listed, "sessions", "key");
        assert!(keys.contains(&child), "{visibility}: sessions_list shows it: {listed}");
        assert!(!keys.iter().any(|k| k == "agent:ops:other"), "{visibility}: not another agent's session: {listed}");

        let history = c.call("sessions_history", json!({"sessionKey": child}));
        assert_eq!(history["status"], "ok", "{visibility}: its history is readable: {history}");
        let sent = c.call("sessions_send", json!({"sessionKey": child, "message": "second", "timeoutSeconds": 20}));
        assert_eq!(sent["status"], "ok", "{visibility}: it takes a send: {sent}");
        assert_eq!(sent["reply"], "RESULT: second", "{visibility}: {sent}");

        let other = c.call("sessions_history", json!({"sessionKey": "agent:ops:other"}));
        assert_eq!(other["status"], "forbidden", "{visibility}: another agent's own session stays out: {other}");
        let _ = c.terminate_and_wait(Duration::from_secs(15));
    }
}
