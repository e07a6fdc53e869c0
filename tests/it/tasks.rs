//! MCP Tasks (SEP-2663) over stdio, black-box: with the extension declared, sessions_send with a
//! wait and sessions_spawn answer with a task whose state is the run's row. A task survives the
//! server process (a restart reports the run's final status), `tasks/cancel` stops the run (queued
//! or running), and a task is visible only to the session that created it — for anyone else its
//! id is answered exactly like an id that never existed.

use crate::common;

use std::time::Duration;

use common::{Client, TestEnv, agents_config, runs_of, scripted_agent, start_daemon, terminate_pid, wait_child};
use serde_json::{Value, json};

const WORKER: &str = "agent:worker:main";

fn tasks_capabilities() -> Value {
    json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
}

/// A worker that sleeps `ms` and answers `done: <input>`.
fn env_with_worker(ms: u64) -> TestEnv {
    let mut env = TestEnv::new();
    let script = json!({"rules": [{"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"}],
                        "default": {"sleepMs": ms, "reply": "done: {input}"}});
    let worker = scripted_agent(&env, "worker", &script, json!({}));
    let main = scripted_agent(&env, "main", &json!({"default": {"sleepMs": ms, "reply": "child: {input}"}}), json!({}));
    let mut config: Value = serde_json::from_str(&agents_config(vec![main, worker], json!({}))).unwrap();
    config["agents"]["defaults"] = json!({"subagents": {"maxConcurrent": 1}});
    env.set_config(&config.to_string());
    env.seed(json!({"sessions": [{"key": WORKER}]}));
    env
}

/// `serve` acting as `as_key` (default `main`), declaring the tasks extension.
fn serve_tasks(env: &TestEnv, as_key: Option<&str>) -> Client {
    let mut cmd = env.command(&["serve"]);
    if let Some(k) = as_key {
        cmd.arg("--as").arg(k);
    }
    Client::start_declaring(cmd, tasks_capabilities())
}

/// Calls `tool` and returns the CreateTaskResult.
fn call_as_task(c: &mut Client, tool: &str, args: Value) -> Value {
    let resp = c.request("tools/call", json!({"name": tool, "arguments": args}));
    let r = resp["result"].clone();
    assert_eq!(r["resultType"], "task", "{tool} {args} → {resp}");
    assert!(r["taskId"].as_str().is_some_and(|s| !s.is_empty()), "{r}");
    assert!(r["pollIntervalMs"].as_u64().is_some(), "{r}");
    r
}

fn get(c: &mut Client, task_id: &str) -> Value {
    let resp = c.request("tasks/get", json!({"taskId": task_id}));
    assert!(resp.get("error").is_none(), "tasks/get {task_id} → {resp}");
    resp["result"].clone()
}

/// Polls `tasks/get` until the task is terminal.
fn wait_terminal(c: &mut Client, task_id: &str) -> Value {
    common::wait_until(Duration::from_secs(20), "the task to end", || {
        let t = get(c, task_id);
        (t["status"] != "working").then_some(t)
    })
}

#[test]
fn a_send_task_survives_a_restart_of_its_server_and_reports_the_final_status() {
    let env = env_with_worker(1500);
    let mut daemon = start_daemon(&env);
    let mut first = serve_tasks(&env, None);
    let task = call_as_task(&mut first, "sessions_send", json!({"sessionKey": WORKER, "message": "ping"}));
    let task_id = task["taskId"].as_str().unwrap().to_string();
    assert_eq!(task["status"], "working", "{task}");
    // strong consistency: the task is durable before its id is returned
    assert_eq!(get(&mut first, &task_id)["status"], "working");
    first.kill_now();

    let mut second = serve_tasks(&env, None);
    let done = wait_terminal(&mut second, &task_id);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["taskId"], task_id.as_str());
    let result = &done["result"];
    assert_eq!(result["isError"], false, "{done}");
    assert_eq!(result["structuredContent"]["status"], "ok", "{done}");
    assert_eq!(result["structuredContent"]["reply"], "done: ping", "{done}");
    assert_eq!(result["structuredContent"]["runId"], task_id.as_str());
    common::assert_conforms("sessions_send", &result["structuredContent"]);
    terminate_pid(daemon.id());
    assert!(wait_child(&mut daemon, Duration::from_secs(10)).success());
}

#[test]
fn a_task_whose_owner_died_reports_interrupted_after_the_restart() {
    let env = env_with_worker(30_000);
    let mut first = serve_tasks(&env, None);
    let task = call_as_task(&mut first, "sessions_send", json!({"sessionKey": WORKER, "message": "slow"}));
    let task_id = task["taskId"].as_str().unwrap().to_string();
    common::wait_until(Duration::from_secs(10), "the run to start", || {
        (get(&mut first, &task_id)["statusMessage"] == "run running").then_some(())
    });
    first.kill_now();

    let mut second = serve_tasks(&env, None);
    let done = wait_terminal(&mut second, &task_id);
    assert_eq!(done["status"], "completed", "a tool error is a completed task: {done}");
    assert_eq!(done["result"]["isError"], true, "{done}");
    let out = &done["result"]["structuredContent"];
    assert_eq!(out["status"], "error", "{done}");
    assert!(out["error"].as_str().unwrap().contains("interrupted"), "{done}");
    common::assert_no_process_carries(std::slice::from_ref(&task_id), Duration::from_secs(5));
}

#[test]
fn tasks_cancel_stops_a_running_send_and_a_queued_spawn() {
    let env = env_with_worker(30_000);
    let mut c = serve_tasks(&env, None);
    let send = call_as_task(&mut c, "sessions_send", json!({"sessionKey": WORKER, "message": "long"}));
    let send_id = send["taskId"].as_str().unwrap().to_string();
    // maxConcurrent 1: the second spawn waits for the first
    let first_child = call_as_task(&mut c, "sessions_spawn", json!({"task": "one"}));
    let queued_child = call_as_task(&mut c, "sessions_spawn", json!({"task": "two"}));
    let queued_id = queued_child["taskId"].as_str().unwrap().to_string();
    assert_eq!(get(&mut c, &queued_id)["statusMessage"], "run queued");
    common::wait_until(Duration::from_secs(10), "the send's run to start", || {
        (get(&mut c, &send_id)["statusMessage"] == "run running").then_some(())
    });

    for id in [&queued_id, &send_id] {
        let ack = c.request("tasks/cancel", json!({"taskId": id}));
        assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
    }
    // the queued run is cancelled at once, never started
    let queued = get(&mut c, &queued_id);
    assert_eq!(queued["status"], "cancelled", "{queued}");
    let cancelled = wait_terminal(&mut c, &send_id);
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert!(cancelled.get("result").is_none(), "{cancelled}");
    let worker_runs = runs_of(&env.show(WORKER), Some("send"));
    assert_eq!(worker_runs[0]["status"], "cancelled", "{worker_runs:?}");
    common::assert_no_process_carries(std::slice::from_ref(&send_id), Duration::from_secs(5));
    // cancelling an ended task is the same empty acknowledgement
    let again = c.request("tasks/cancel", json!({"taskId": send_id}));
    assert_eq!(again["result"]["resultType"], "complete", "{again}");

    // the first child was not touched: it is still working
    let first_id = first_child["taskId"].as_str().unwrap();
    assert_eq!(get(&mut c, first_id)["status"], "working");
}

#[test]
fn a_spawn_task_completes_with_the_childs_reply() {
    let env = env_with_worker(200);
    let mut c = serve_tasks(&env, None);
    let task = call_as_task(&mut c, "sessions_spawn", json!({"task": "count the sheep"}));
    let done = wait_terminal(&mut c, task["taskId"].as_str().unwrap());
    assert_eq!(done["status"], "completed", "{done}");
    let out = &done["result"]["structuredContent"];
    assert_eq!(out["status"], "ok", "{done}");
    assert!(out["reply"].as_str().unwrap().starts_with("child: "), "{done}");
    assert!(out["childSessionKey"].as_str().unwrap().starts_with("agent:main:subagent:"), "{done}");
    common::assert_conforms("sessions_spawn", out);
}

#[test]
fn a_task_is_unknown_to_every_other_session_exactly_like_a_missing_one() {
    let env = env_with_worker(30_000);
    let mut owner = serve_tasks(&env, None);
    let task = call_as_task(&mut owner, "sessions_send", json!({"sessionKey": WORKER, "message": "mine"}));
    let task_id = task["taskId"].as_str().unwrap().to_string();

    let mut other = serve_tasks(&env, Some("agent:main:other"));
    let empty = env_with_worker(30_000);
    let mut elsewhere = serve_tasks(&empty, Some("agent:main:other"));
    for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
        let params = json!({"taskId": task_id, "inputResponses": {}});
        let denied = other.request(method, params.clone());
        let missing = elsewhere.request(method, params);
        assert_eq!(denied["error"]["code"], -32602, "{method}: {denied}");
        assert_eq!(denied["error"], missing["error"], "{method}: byte-identical to a missing task");
    }
    assert_eq!(get(&mut owner, &task_id)["status"], "working", "another session's cancel changed nothing");
}

#[test]
fn without_the_declaration_calls_wait_as_usual_and_tasks_methods_are_refused() {
    let env = env_with_worker(100);
    let mut c = env.serve(None);
    let r = c.call("sessions_send", json!({"sessionKey": WORKER, "message": "plain", "timeoutSeconds": 20}));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["reply"], "done: plain");
    let refused = c.request("tasks/get", json!({"taskId": r["runId"]}));
    assert_eq!(refused["error"]["code"], -32021, "{refused}");

    // declared, but a fire-and-forget send has nothing to wait for: an ordinary answer
    let mut t = serve_tasks(&env, None);
    let resp = t.request(
        "tools/call",
        json!({"name": "sessions_send", "arguments": {"sessionKey": WORKER, "message": "ff", "timeoutSeconds": 0}}),
    );
    assert_eq!(resp["result"]["structuredContent"]["status"], "accepted", "{resp}");
    // and a refused call is a tool error, not a task
    let resp = t.request(
        "tools/call",
        json!({"name": "sessions_send", "arguments": {"sessionKey": "agent:nobody:main", "message": "x"}}),
    );
    assert_eq!(resp["result"]["isError"], true, "{resp}");
    assert!(resp["result"].get("taskId").is_none(), "{resp}");
}

#[test]
fn secrets_an_agent_echoes_are_masked_in_a_waiting_send_in_tasks_get_and_in_history_alike() {
    let env = env_with_worker(0);
    let secret = "OPENAI_API_KEY=sk-abcdefghijklmnopqrstuvwxyz and smcp_run_0123456789abcdef0123";
    let masked = |v: &Value, what: &str| {
        let text = v.to_string();
        assert!(!text.contains("sk-abcdefghijklmnopqrstuvwxyz"), "{what} leaks the API key: {text}");
        assert!(!text.contains("smcp_run_0123456789abcdef0123"), "{what} leaks the run token: {text}");
        assert!(text.contains("sk-abc") && text.contains("smcp_r…0123"), "{what} keeps the masked form: {text}");
    };
    let mut plain = env.serve(None);
    let sent = plain.call("sessions_send", json!({"sessionKey": WORKER, "message": secret, "timeoutSeconds": 20}));
    assert_eq!(sent["status"], "ok", "{sent}");
    masked(&sent["reply"], "the waiting send's reply");
    let history = plain.call("sessions_history", json!({"sessionKey": WORKER}));
    masked(&history["messages"], "sessions_history");

    let mut tasks = serve_tasks(&env, None);
    let task = call_as_task(&mut tasks, "sessions_send", json!({"sessionKey": WORKER, "message": secret}));
    let done = wait_terminal(&mut tasks, task["taskId"].as_str().unwrap());
    assert_eq!(done["status"], "completed", "{done}");
    masked(&done, "tasks/get");
    let task = call_as_task(&mut tasks, "sessions_spawn", json!({"task": secret}));
    let done = wait_terminal(&mut tasks, task["taskId"].as_str().unwrap());
    assert_eq!(done["status"], "completed", "{done}");
    masked(&done, "tasks/get of a spawn");
}

/// A spawn task whose child asks is `input_required`, its input request the elicitation a person
/// fills in; `tasks/update` answers it (a key that is not outstanding is refused), and the task
/// completes with the child's result. The elicitation pushed meanwhile is cancelled once answered.
#[test]
fn a_task_whose_child_asks_is_input_required_and_tasks_update_answers_it() {
    let env = crate::asks::env_with(json!({}));
    let capabilities = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}, "elicitation": {"form": {}}});
    let mut c = Client::start_declaring(env.command(&["serve"]), capabilities);
    let task = call_as_task(&mut c, "sessions_spawn", json!({"task": "ask for a.txt"}));
    let task_id = task["taskId"].as_str().unwrap().to_string();
    let asking = common::wait_until(Duration::from_secs(20), "the task to need input", || {
        let t = get(&mut c, &task_id);
        (t["status"] == "input_required").then_some(t)
    });
    let requests = asking["inputRequests"].as_object().unwrap_or_else(|| panic!("{asking}"));
    assert_eq!(requests.len(), 1, "{asking}");
    let (key, request) = requests.iter().next().unwrap();
    assert_eq!(request["method"], "elicitation/create", "{asking}");
    assert!(request["params"]["message"].as_str().unwrap().contains("asks for approval: May I write ask for a.txt?"));
    assert_eq!(request["params"]["requestedSchema"]["properties"]["decision"]["enum"], json!(["allow", "deny"]));

    let stray = c.request("tasks/update", json!({"taskId": task_id, "inputResponses": {"nope": {"action": "accept"}}}));
    assert_eq!(stray["error"]["code"], -32602, "{stray}");
    assert!(stray["error"]["message"].as_str().unwrap().contains(&format!("outstanding: {key}")), "{stray}");
    let answer = json!({key.as_str(): {"action": "accept", "content": {"decision": "deny", "text": "not now"}}});
    let ok = c.request("tasks/update", json!({"taskId": task_id, "inputResponses": answer}));
    assert!(ok.get("error").is_none(), "{ok}");
    let done = wait_terminal(&mut c, &task_id);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["structuredContent"]["reply"], "decision=deny answer=not now", "{done}");

    c.pump(Duration::from_millis(300));
    let pushed = c.take_notification("elicitation/create").expect("the elicitation pushed to the host");
    let cancelled = c.take_notification("notifications/cancelled").expect("and cancelled once answered");
    assert_eq!(cancelled["params"]["requestId"], pushed["id"], "{cancelled}");
}
