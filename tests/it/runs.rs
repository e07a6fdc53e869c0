//! Runs, black-box: per-session FIFO, concurrency caps, process hygiene of misbehaving agents,
//! crash recovery of a killed owner, draining on stdin EOF, and two `serve` processes on one
//! state dir (docs/BEHAVIOUR.md, Runs; docs/RUNNER-PROTOCOL.md, Supervision).

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use common::{
    TestEnv, agents_config, assert_no_process_carries, max_overlap, pids_with_env, runs_of, scripted_agent,
    shell_agent, terminate_pid, text_of, wait_child, wait_until,
};
use serde_json::{Value, json};

const WORKER: &str = "agent:worker:main";

/// An env with agent `main` (echo) and `worker` (the given agent entry), and these sessions.
fn env_with_worker(worker: impl FnOnce(&TestEnv) -> Value, sessions: &[String]) -> TestEnv {
    let mut env = TestEnv::new();
    let w = worker(&env);
    env.set_config(&agents_config(vec![json!({"id": "main"}), w], json!({})));
    let sessions: Vec<Value> = sessions.iter().map(|k| json!({"key": k})).collect();
    env.seed(json!({"sessions": sessions}));
    env
}

/// A `worker` running the shell `body`, with short limits (a 2 s deadline, 1 s idle and grace),
/// and its session.
fn env_with_short_lived_shell_worker(body: &str) -> TestEnv {
    let limits = json!({"timeoutSeconds": 2, "idleTimeoutSeconds": 1, "cancelGraceSeconds": 1});
    env_with_worker(|e| shell_agent(e, "worker", body, &[], limits), &[WORKER.to_string()])
}

/// A worker script: sleep `ms`, answer `done: <input>`; announce steps answer ANNOUNCE_SKIP at once.
fn sleepy(ms: u64) -> Value {
    json!({"rules": [{"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"}],
           "default": {"sleepMs": ms, "reply": "done: {input}"}})
}

#[test]
fn runs_in_one_session_never_overlap() {
    let env = env_with_worker(|e| scripted_agent(e, "worker", &sleepy(700), json!({})), &[WORKER.to_string()]);
    let mut c = env.serve(None);
    let id1 = c.start_call("sessions_send", json!({"sessionKey": WORKER, "message": "first", "timeoutSeconds": 20}));
    let id2 = c.start_call("sessions_send", json!({"sessionKey": WORKER, "message": "second", "timeoutSeconds": 20}));
    let r1 = c.finish_call("sessions_send", id1);
    let r2 = c.finish_call("sessions_send", id2);
    assert_eq!((r1["status"].as_str(), r2["status"].as_str()), (Some("ok"), Some("ok")), "{r1} {r2}");
    assert_eq!(r1["reply"], "done: first");
    assert_eq!(r2["reply"], "done: second");
    env.wait_idle(Duration::from_secs(10));
    let runs = runs_of(&env.show(WORKER), None);
    assert!(runs.len() >= 2, "{runs:?}");
    assert_eq!(max_overlap(&runs), 1, "runs of one session are serialized: {runs:?}");
    let sends = runs_of(&env.show(WORKER), Some("send"));
    assert!(sends[0]["endedAt"].as_i64() <= sends[1]["startedAt"].as_i64(), "FIFO: {sends:?}");
}

#[test]
fn max_concurrent_caps_the_running_runs_of_an_agent() {
    let keys: Vec<String> = (0..20).map(|i| format!("agent:worker:s{i}")).collect();
    let env = env_with_worker(|e| scripted_agent(e, "worker", &sleepy(1000), json!({"maxConcurrent": 2})), &keys);
    let mut c = env.serve(None);
    for k in &keys {
        let r = c.call("sessions_send", json!({"sessionKey": k, "message": "work", "timeoutSeconds": 0}));
        assert_eq!(r["status"], "accepted", "{r}");
    }
    env.wait_idle(Duration::from_secs(30));
    let mut runs = Vec::new();
    for k in &keys {
        let show = env.show(k);
        let sends = runs_of(&show, Some("send"));
        assert_eq!(sends.len(), 1, "{k}: {sends:?}");
        assert_eq!(sends[0]["status"], "ok", "{k}: {sends:?}");
        runs.extend(runs_of(&show, None));
    }
    assert_eq!(max_overlap(&runs), 2, "maxConcurrent 2: never more, and the cap is used");
}

/// A claimed run whose start path hangs (a fault hook holds its task before the agent starts,
/// as a task that is never polled again would) ends `interrupted` once
/// `runtime.startTimeoutSeconds` passed, says why, and is never re-run; the node goes on
/// running its other agents' runs.
#[test]
fn a_claimed_run_whose_agent_never_starts_is_ended_within_the_start_bound() {
    let mut env = TestEnv::new();
    let worker = scripted_agent(&env, "worker", &sleepy(10), json!({}));
    let config = agents_config(vec![json!({"id": "main"}), worker], json!({"runtime": {"startTimeoutSeconds": 2}}));
    env.set_config(&config);
    env.seed(json!({"sessions": [{"key": WORKER}, {"key": "agent:main:side"}]}));
    let mut c = env.serve_with(None, &[("SESSIONS_MCP_FAULT_STALL_START", "worker")]);
    let started = Instant::now();
    let r = c.call("sessions_send", json!({"sessionKey": WORKER, "message": "go", "timeoutSeconds": 60}));
    assert!(r["error"].as_str().is_some_and(|e| e.starts_with("interrupted")), "the waiting send learns it: {r}");
    assert!(started.elapsed() < Duration::from_secs(30), "ended near its bound, not at the send's timeout");
    let sends = runs_of(&env.show(WORKER), Some("send"));
    assert_eq!(sends.len(), 1, "never re-run: {sends:?}");
    assert_eq!(sends[0]["status"], "interrupted", "{sends:?}");
    let needle = "but its agent did not start within 2 s; it was not re-run";
    assert!(sends[0]["error"].as_str().is_some_and(|e| e.contains(needle)), "the run says why: {sends:?}");
    let other =
        c.call("sessions_send", json!({"sessionKey": "agent:main:side", "message": "hi", "timeoutSeconds": 20}));
    assert_eq!(other["status"], "ok", "the node runs its other runs: {other}");
}

// ---- process hygiene ---------------------------------------------------------------------------

/// Sends one message to a misbehaving worker and returns (send result, the run row).
/// Afterwards no process may carry the run's id.
fn misbehave(worker: impl FnOnce(&TestEnv) -> Value, timeout_s: u64) -> (Value, Value) {
    let env = env_with_worker(worker, &[WORKER.to_string()]);
    let mut c = env.serve(None);
    let r = c.call("sessions_send", json!({"sessionKey": WORKER, "message": "go", "timeoutSeconds": timeout_s}));
    let run_id = r["runId"].as_str().unwrap_or_else(|| panic!("a run id: {r}")).to_string();
    let run = wait_until(Duration::from_secs(20), "the run to end", || {
        let show = env.show(WORKER);
        runs_of(&show, Some("send")).into_iter().find(|x| x["runId"] == run_id.as_str() && x["endedAt"].is_i64())
    });
    assert_no_process_carries(&[run_id], Duration::from_secs(5));
    drop(c);
    (r, run)
}

fn assert_failed(r: &Value, run: &Value, status: &str, needle: &str) {
    assert_eq!(r["status"], "error", "the waiting send reports the failure: {r}");
    assert!(r["error"].as_str().is_some_and(|e| e.contains(needle)), "send error names {needle:?}: {r}");
    assert_eq!(run["status"], status, "{run}");
    assert!(run["error"].as_str().is_some_and(|e| e.contains(needle)), "run error names {needle:?}: {run}");
}

#[test]
fn a_hanging_agent_is_stopped_by_the_idle_timeout() {
    let (r, run) = misbehave(
        |e| {
            shell_agent(
                e,
                "worker",
                "IFS= read -r line\nsleep 300\n",
                &[],
                json!({"idleTimeoutSeconds": 1, "cancelGraceSeconds": 1}),
            )
        },
        20,
    );
    assert_failed(&r, &run, "error", "idle timeout");
}

#[test]
fn a_hanging_agent_is_stopped_by_the_run_timeout() {
    let (r, run) = misbehave(
        |e| {
            let body = "IFS= read -r line\nprintf '%s\\n' '{\"type\":\"start\"}'\nwhile :; do printf '%s\\n' '{\"type\":\"text_delta\",\"text\":\".\"}'; sleep 0.2; done\n";
            shell_agent(e, "worker", body, &[], json!({"timeoutSeconds": 1, "cancelGraceSeconds": 1}))
        },
        20,
    );
    assert_failed(&r, &run, "timeout", "timed out");
}

#[test]
fn an_agent_ignoring_sigint_and_sigterm_is_killed() {
    let t0 = Instant::now();
    let (r, run) = misbehave(
        |e| {
            let body = "trap '' INT TERM HUP\nIFS= read -r line\nwhile :; do sleep 0.2; done\n";
            shell_agent(e, "worker", body, &[], json!({"timeoutSeconds": 1, "cancelGraceSeconds": 1}))
        },
        20,
    );
    assert_failed(&r, &run, "timeout", "timed out");
    assert!(t0.elapsed() < Duration::from_secs(15), "SIGKILL follows within the escalation steps");
}

#[test]
fn a_setsid_grandchild_does_not_outlive_its_run() {
    let (r, run) = misbehave(
        |e| {
            let body = "IFS= read -r line\nsetsid sleep 300 &\nsetsid sh -c 'sleep 301' </dev/null >/dev/null 2>&1 &\nprintf '%s\\n' '{\"type\":\"final\",\"text\":\"spawned\"}'\n";
            shell_agent(e, "worker", body, &[], json!({}))
        },
        20,
    );
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["reply"], "spawned");
    assert_eq!(run["status"], "ok", "{run}");
}

#[test]
fn an_escaper_that_clears_its_environment_does_not_outlive_its_run() {
    // Without the run id in their environment only the supervisor's subreaper finds these: one
    // leaves the group with setsid, the other is orphaned by a daemon-style double fork.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let mark = format!("SESSIONS_MCP_TEST_MARK={}-{nanos}", std::process::id());
    let body = r#"IFS= read -r line
env -i MARK "$(command -v setsid)" /bin/sleep 300 </dev/null >/dev/null 2>&1 &
env -i MARK /bin/sh -c '/bin/sleep 301 &' </dev/null >/dev/null 2>&1
printf '%s\n' '{"type":"final","text":"escaped"}'
"#
    .replace("MARK", &mark);
    let (r, _) = misbehave(|e| shell_agent(e, "worker", &body, &[], json!({})), 20);
    assert_eq!(r["reply"], "escaped", "{r}");
    wait_until(Duration::from_secs(5), "the escapers to be gone", || pids_with_env(&mark).is_empty().then_some(()));
}

#[test]
fn a_process_outside_the_tree_that_carries_the_run_id_is_killed_when_its_run_ends() {
    // What left the tree through some other service (here: this test, a stranger to the run's
    // tree, starts it with the run's id) is found only by the run-id sweep, which the server runs
    // (batched with other runs') before it records the run's outcome.
    let dir = tempfile::tempdir().unwrap();
    let (id_file, started) = (dir.path().join("run-id"), dir.path().join("started"));
    let body = format!(
        "IFS= read -r line\nprintf '%s' \"$SESSIONS_MCP_RUN_ID\" > {id}.tmp && mv {id}.tmp {id}\n\
         while [ ! -e {started} ]; do sleep 0.05; done\n\
         printf '%s\\n' '{{\"type\":\"final\",\"text\":\"done\"}}'\n",
        id = id_file.display(),
        started = started.display()
    );
    let stranger = std::thread::spawn(move || {
        let run_id = wait_until(Duration::from_secs(20), "the agent to write its run id", || {
            std::fs::read_to_string(&id_file).ok().filter(|id| !id.is_empty())
        });
        let child = std::process::Command::new("sleep").arg("300").env("SESSIONS_MCP_RUN_ID", &run_id).spawn().unwrap();
        std::fs::write(&started, "").unwrap();
        child
    });
    let (r, _) = misbehave(|e| shell_agent(e, "worker", &body, &[], json!({})), 20);
    assert_eq!(r["reply"], "done", "{r}");
    let mut child = stranger.join().unwrap();
    use std::os::unix::process::ExitStatusExt;
    let status = wait_until(Duration::from_secs(5), "the stranger to be killed", || child.try_wait().unwrap());
    assert_eq!(status.signal(), Some(libc::SIGKILL), "the sweep killed it: {status:?}");
}

/// An agent that ignores SIGINT/SIGTERM, does `what` to its supervisor (`$PPID`), then sleeps far
/// past every limit. The server must end the run at its limits without the supervisor's help and
/// leave no process behind; the session's queue is free again (a second send runs).
fn harm_the_supervisor_then_hang(what: &str) {
    let body = format!("trap '' INT TERM HUP\nIFS= read -r line\nkill -{what} $PPID\nsleep 300\n");
    let env = env_with_short_lived_shell_worker(&body);
    let mut c = env.serve(None);
    let t0 = Instant::now();
    for round in 0..2 {
        let r = c.call("sessions_send", json!({"sessionKey": WORKER, "message": "go", "timeoutSeconds": 30}));
        assert_eq!(r["status"], "error", "round {round}: the run ends at its idle timeout: {r}");
        assert!(r["error"].as_str().is_some_and(|e| e.contains("idle timeout")), "round {round}: {r}");
        let run_id = r["runId"].as_str().unwrap_or_else(|| panic!("a run id: {r}")).to_string();
        assert_no_process_carries(&[run_id], Duration::from_secs(5));
    }
    assert!(t0.elapsed() < Duration::from_secs(60), "both runs ended long before the agents' 300 s sleep");
}

#[test]
fn an_agent_that_sigkills_its_supervisor_is_still_ended_at_its_limits() {
    harm_the_supervisor_then_hang("KILL");
}

#[test]
fn an_agent_that_stops_its_supervisor_is_still_ended_at_its_limits() {
    harm_the_supervisor_then_hang("STOP");
}

/// An agent that starts the installed supervisor around a payload that leaves the group
/// (`setsid`) with a cleared environment, does `to_inner` to that nested supervisor, SIGKILLs its
/// own supervisor and hangs. Both subreapers between the payload and the server are then gone or
/// frozen and no environment sweep can find the payload: only the server can still end it.
fn a_nested_supervisor_then_kill_the_own(to_inner: &str) {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let mark = format!("SESSIONS_MCP_TEST_MARK={}-{nanos}", std::process::id());
    let body = r#"trap '' INT TERM HUP
IFS= read -r line
env -i MARK SUPERVISOR -- /bin/sh -c '"$(command -v setsid)" /bin/sleep 300 & : > READY; /bin/sleep 301' </dev/null >/dev/null 2>&1 &
inner=$!
while [ ! -e READY ]; do sleep 0.05; done
kill -INNER $inner
kill -KILL $PPID
sleep 300
"#
    .replace("MARK", &mark)
    .replace("SUPERVISOR", env!("CARGO_BIN_EXE_sessions-mcp-supervise"))
    .replace("INNER", to_inner);
    let dir = tempfile::tempdir().unwrap();
    let body = body.replace("READY", &dir.path().join("ready").display().to_string());
    let env = env_with_short_lived_shell_worker(&body);
    let mut c = env.serve(None);
    let r = c.call("sessions_send", json!({"sessionKey": WORKER, "message": "go", "timeoutSeconds": 30}));
    assert_eq!(r["status"], "error", "the run ends at its idle timeout: {r}");
    let run_id = r["runId"].as_str().unwrap_or_else(|| panic!("a run id: {r}")).to_string();
    assert_no_process_carries(&[run_id], Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pids_with_env(&mark).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left: Vec<String> = pids_with_env(&mark)
        .into_iter()
        .map(|p| {
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            // SAFETY: kill has no memory-safety preconditions; a failing run leaves nothing behind.
            unsafe { libc::kill(p, libc::SIGKILL) };
            String::from_utf8_lossy(&cmdline).replace('\0', " ")
        })
        .collect();
    assert!(left.is_empty(), "the nested payload outlived its run: {left:?}");
    drop(c);
}

#[test]
fn a_payload_under_a_nested_supervisor_that_was_killed_does_not_outlive_its_run() {
    a_nested_supervisor_then_kill_the_own("KILL");
}

#[test]
fn a_payload_under_a_nested_supervisor_that_was_stopped_does_not_outlive_its_run() {
    a_nested_supervisor_then_kill_the_own("STOP");
}

#[test]
fn an_agent_that_never_reads_its_input_times_out_at_the_run_deadline() {
    // 64 KiB of message (more with the request around it) fills the stdin pipe of an agent that never reads it: the write itself must
    // end at the run's deadline (before, the run waited for the supervisor's own backstop).
    let env = env_with_worker(
        |e| shell_agent(e, "worker", "sleep 300\n", &[], json!({"timeoutSeconds": 1, "cancelGraceSeconds": 1})),
        &[WORKER.to_string()],
    );
    let mut c = env.serve(None);
    let message = "x".repeat(65_536);
    let r = c.call("sessions_send", json!({"sessionKey": WORKER, "message": message, "timeoutSeconds": 30}));
    assert_eq!(r["status"], "error", "{r}");
    assert!(r["error"].as_str().is_some_and(|e| e.contains("timed out")), "{r}");
    assert_no_process_carries(&[r["runId"].as_str().unwrap().to_string()], Duration::from_secs(5));
}

#[test]
fn a_flooding_agent_is_stopped_at_max_stdout_bytes() {
    let (r, run) = misbehave(
        |e| {
            scripted_agent(
                e,
                "worker",
                &json!({"default": {"floodBytes": 50_000_000, "reply": "x"}}),
                json!({"maxStdoutBytes": 100_000}),
            )
        },
        20,
    );
    assert_failed(&r, &run, "error", "maxStdoutBytes");
}

#[test]
fn an_overlong_line_is_stopped_at_max_line_bytes() {
    let (r, run) = misbehave(
        |e| {
            scripted_agent(
                e,
                "worker",
                &json!({"default": {"floodBytes": 50_000_000, "reply": "x"}}),
                json!({"maxLineBytes": 512}),
            )
        },
        20,
    );
    assert_failed(&r, &run, "error", "maxLineBytes");
}

#[test]
fn an_agent_that_exits_0_without_final_fails() {
    let (r, run) =
        misbehave(|e| scripted_agent(e, "worker", &json!({"default": {"noFinal": true, "reply": "x"}}), json!({})), 20);
    assert_failed(&r, &run, "error", "without a final");
}

#[test]
fn an_agent_that_prints_invalid_json_fails() {
    let (r, run) = misbehave(
        |e| {
            scripted_agent(
                e,
                "worker",
                &json!({"default": {"invalidJson": true, "sleepMs": 5000, "reply": "x"}}),
                json!({}),
            )
        },
        20,
    );
    assert_failed(&r, &run, "error", "is not JSON");
}

// ---- crash recovery, drain, several processes ----------------------------------------------------

/// A snapshot of one session's send run: (status, user messages carrying its run id).
fn send_state(env: &TestEnv, key: &str, run_id: &str) -> (String, usize, Value) {
    let show = env.show(key);
    let sends = runs_of(&show, Some("send"));
    assert_eq!(sends.len(), 1, "{key}: one send run, never a second: {sends:?}");
    assert_eq!(sends[0]["runId"], run_id, "{key}");
    let inputs =
        show["messages"].as_array().unwrap().iter().filter(|m| m["role"] == "user" && m["runId"] == run_id).count();
    (sends[0]["status"].as_str().unwrap().to_string(), inputs, show)
}

#[test]
fn a_killed_owner_loses_no_acknowledged_send_and_reruns_nothing() {
    let keys: Vec<String> = (0..12).map(|i| format!("agent:worker:c{i}")).collect();
    // maxConcurrent 3: four batches of ~1 s, so a kill after the first batch finds runs that
    // are done, running and queued.
    let env = env_with_worker(|e| scripted_agent(e, "worker", &sleepy(1000), json!({"maxConcurrent": 3})), &keys);
    let mut owner = env.serve(None);
    let mut acked: Vec<(String, String, String)> = Vec::new(); // (key, message, runId)
    for (i, k) in keys.iter().enumerate() {
        let msg = format!("job-{i}");
        let r = owner.call("sessions_send", json!({"sessionKey": k, "message": msg, "timeoutSeconds": 0}));
        assert_eq!(r["status"], "accepted", "{r}");
        acked.push((k.clone(), msg, r["runId"].as_str().unwrap().to_string()));
    }
    // Kill the owner while some runs are done, some running and some queued.
    wait_until(Duration::from_secs(15), "a finished run and a running one", || {
        let c = env.run_counts();
        (c["ok"].as_i64().unwrap_or(0) >= 1 && c["running"].as_i64().unwrap_or(0) >= 1).then_some(())
    });
    owner.kill_now();
    let at_kill: HashMap<String, String> = acked
        .iter()
        .map(|(k, _, id)| {
            let (status, inputs, _) = send_state(&env, k, id);
            let expected_inputs = if status == "queued" { 0 } else { 1 };
            assert_eq!(
                inputs, expected_inputs,
                "{k}: a {status} run's input is in the transcript once (queued: pending)"
            );
            (id.clone(), status)
        })
        .collect();
    assert!(at_kill.values().any(|s| s == "running"), "some runs were running at the kill: {at_kill:?}");
    assert!(at_kill.values().any(|s| s == "queued"), "some runs were queued at the kill: {at_kill:?}");

    // A new serve takes over: running → interrupted (never re-run), queued → run.
    let mut next = env.serve(None);
    for (k, _, id) in &acked {
        if at_kill[id] != "queued" {
            continue;
        }
        // Before it runs, a queued send shows as a pending entry (or it already ran: a message).
        let h = next.call("sessions_history", json!({"sessionKey": k}));
        let n = h["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["runId"] == id.as_str() && m["role"] == "user")
            .count();
        assert!(n <= 1, "{k}: the input appears at most once: {h}");
    }
    env.wait_idle(Duration::from_secs(20));
    let counts = env.run_counts();
    assert_eq!(counts["running"].as_i64().unwrap_or(0), 0, "{counts}");
    for (k, msg, id) in &acked {
        let (status, inputs, show) = send_state(&env, k, id);
        assert_eq!(inputs, 1, "{k}: every acknowledged send appears exactly once");
        let replies = show["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "assistant" && text_of(&m["content"]) == format!("done: {msg}"))
            .count();
        match at_kill[id].as_str() {
            "running" => {
                assert_eq!(status, "interrupted", "{k}: a run whose owner died is interrupted");
                assert_eq!(replies, 0, "{k}: an interrupted run is never re-run");
                let run = &runs_of(&show, Some("send"))[0];
                assert!(run["error"].as_str().is_some_and(|e| e.contains("interrupted")), "{run}");
            }
            "queued" => {
                assert_eq!(status, "ok", "{k}: a queued run resumes");
                assert_eq!(replies, 1, "{k}");
            }
            _ => {
                assert_eq!(status, "ok", "{k}");
                assert_eq!(replies, 1, "{k}");
            }
        }
    }
    let ids: Vec<String> = acked.iter().map(|(_, _, id)| id.clone()).collect();
    assert_no_process_carries(&ids, Duration::from_secs(10));
    drop(next);
}

#[test]
fn an_owner_whose_stdin_closes_finishes_its_queued_runs_before_exiting() {
    let env = env_with_worker(|e| scripted_agent(e, "worker", &sleepy(400), json!({})), &[WORKER.to_string()]);
    let mut c = env.serve(None);
    let mut ids = Vec::new();
    for i in 0..4 {
        let r = c.call("sessions_send", json!({"sessionKey": WORKER, "message": format!("m{i}"), "timeoutSeconds": 0}));
        assert_eq!(r["status"], "accepted", "{r}");
        ids.push(r["runId"].as_str().unwrap().to_string());
    }
    let t0 = Instant::now();
    c.close();
    assert!(t0.elapsed() >= Duration::from_millis(1000), "serve waited for its queued runs ({:?})", t0.elapsed());
    assert_eq!(env.unfinished_runs(), 0, "{}", env.run_counts());
    let show = env.show(WORKER);
    let sends = runs_of(&show, Some("send"));
    assert_eq!(sends.len(), 4);
    for s in &sends {
        assert_eq!(s["status"], "ok", "{s}");
    }
    let main = env.show("main");
    let replies: Vec<String> = main["messages"].as_array().unwrap().iter().map(|m| text_of(&m["content"])).collect();
    for i in 0..4 {
        assert!(replies.contains(&format!("done: m{i}")), "the reply reached main before exit: {replies:?}");
    }
}

#[test]
fn two_serve_processes_share_one_runtime_and_never_run_twice() {
    let keys: Vec<String> = (0..4).map(|i| format!("agent:worker:m{i}")).collect();
    let env = env_with_worker(|e| scripted_agent(e, "worker", &sleepy(1500), json!({})), &keys);
    let mut p1 = env.serve(None);
    let mut p2 = env.serve(None);
    // A waiting send through the non-owner p2 that the owner p1 starts at once (m0 is idle).
    let first_id =
        p2.start_call("sessions_send", json!({"sessionKey": keys[0], "message": "p2-first", "timeoutSeconds": 30}));
    let mut inputs: Vec<(String, String, String)> = Vec::new(); // (key, message, runId)
    for (i, k) in keys.iter().enumerate() {
        for (name, p) in [("p1", &mut p1), ("p2", &mut p2)] {
            let msg = format!("{name}-{i}");
            let r = p.call("sessions_send", json!({"sessionKey": k, "message": msg, "timeoutSeconds": 0}));
            assert_eq!(r["status"], "accepted", "{r}");
            inputs.push((k.clone(), msg, r["runId"].as_str().unwrap().to_string()));
        }
    }
    // A waiting send through the non-owner, queued behind the others in m0.
    let wait_id =
        p2.start_call("sessions_send", json!({"sessionKey": keys[0], "message": "p2-wait", "timeoutSeconds": 30}));
    wait_until(Duration::from_secs(10), "p2-first to run in p1", || {
        let show = env.show(&keys[0]);
        let running = show["runs"].as_array().unwrap().iter().any(|r| r["status"] == "running");
        let input_there = show["messages"].as_array().unwrap().iter().any(|m| text_of(&m["content"]) == "p2-first");
        (running && input_there).then_some(())
    });
    p1.kill_now();

    // The survivor takes over. The wait on the run that died with p1 learns it: error, interrupted.
    let first = p2.finish_call("sessions_send", first_id);
    assert_eq!(first["status"], "error", "a waiter learns that its run was interrupted: {first}");
    assert!(first["error"].as_str().is_some_and(|e| e.contains("interrupted")), "{first}");
    // The queued run it waits on runs in the survivor.
    let waited = p2.finish_call("sessions_send", wait_id);
    assert_eq!(waited["status"], "ok", "the survivor took over and ran the queued run: {waited}");
    assert_eq!(waited["reply"], "done: p2-wait");
    // And new sends through it still run.
    let late =
        p2.call("sessions_send", json!({"sessionKey": keys[1], "message": "after-takeover", "timeoutSeconds": 20}));
    assert_eq!(late["status"], "ok", "{late}");
    env.wait_idle(Duration::from_secs(20));

    let mut replies: BTreeMap<String, usize> = BTreeMap::new();
    let mut status_of: HashMap<String, String> = HashMap::new();
    for k in &keys {
        let show = env.show(k);
        for m in show["messages"].as_array().unwrap() {
            let text = text_of(&m["content"]);
            if m["role"] == "assistant" && text.starts_with("done: ") {
                *replies.entry(text).or_default() += 1;
            }
        }
        for r in runs_of(&show, Some("send")) {
            status_of.insert(r["runId"].as_str().unwrap().to_string(), r["status"].as_str().unwrap().to_string());
        }
    }
    for (text, n) in &replies {
        assert_eq!(*n, 1, "{text:?} was answered {n} times: no run executed twice");
    }
    for (k, msg, id) in &inputs {
        let status = status_of.get(id).unwrap_or_else(|| panic!("{k}: run {id} exists"));
        let n = replies.get(&format!("done: {msg}")).copied().unwrap_or(0);
        match status.as_str() {
            "ok" => assert_eq!(n, 1, "{k} {msg}"),
            "interrupted" => assert_eq!(n, 0, "{k} {msg}: interrupted, never re-run"),
            s => panic!("{k} {msg}: unexpected final status {s}"),
        }
    }
    assert!(status_of.values().filter(|s| *s == "ok").count() >= inputs.len() - keys.len(), "{status_of:?}");
    assert_eq!(replies.get("done: p2-first"), None, "the interrupted run was never re-run");
    let ids: Vec<String> = status_of.keys().cloned().collect();
    assert_no_process_carries(&ids, Duration::from_secs(10));
}

/// An owner with one running run (10 s agent) and one queued run in the same session gets
/// SIGTERM (after closing stdin first when `close_stdin_first`, as hosts do). The running run
/// must end `interrupted` after cancel + grace + group kill, the queued one must stay `queued`,
/// the process must exit, and the next owner must run the queued run and never the other.
fn sigterm_case(close_stdin_first: bool) {
    let env = env_with_worker(
        |e| scripted_agent(e, "worker", &sleepy(10_000), json!({"cancelGraceSeconds": 1})),
        &[WORKER.to_string()],
    );
    let mut c = env.serve(None);
    let mut ids = Vec::new();
    for i in 0..2 {
        let r = c.call("sessions_send", json!({"sessionKey": WORKER, "message": format!("t{i}"), "timeoutSeconds": 0}));
        assert_eq!(r["status"], "accepted", "{r}");
        ids.push(r["runId"].as_str().unwrap().to_string());
    }
    wait_until(Duration::from_secs(10), "the first run to start", || {
        (runs_of(&env.show(WORKER), Some("send"))[0]["status"] == "running").then_some(())
    });
    if close_stdin_first {
        c.close_stdin();
        std::thread::sleep(Duration::from_millis(300));
    }
    terminate_pid(c.pid());
    let t0 = Instant::now();
    let first = wait_until(Duration::from_secs(8), "SIGTERM to end the running run", || {
        let s = runs_of(&env.show(WORKER), Some("send"));
        (s[0]["status"] != "running").then(|| s[0].clone())
    });
    assert!(
        t0.elapsed() < Duration::from_secs(7),
        "cancel, grace and group kill, not the 10 s run ({:?})",
        t0.elapsed()
    );
    assert_eq!(first["status"], "interrupted", "a run cancelled by shutdown ends interrupted: {first}");
    let sends = runs_of(&env.show(WORKER), Some("send"));
    assert_eq!(sends[1]["status"], "queued", "queued runs stay queued in every case: {sends:?}");
    assert_no_process_carries(&ids, Duration::from_secs(5));
    let exited = c.wait_exit(Duration::from_secs(5));
    assert!(exited.is_some_and(|s| s.success()), "serve exits (0) after SIGTERM: {exited:?}");

    // The next owner runs the queued one and never the interrupted one.
    let next = env.serve(None);
    let second = wait_until(Duration::from_secs(20), "the queued run to start", || {
        let s = runs_of(&env.show(WORKER), Some("send"));
        (s[1]["status"] != "queued").then(|| s[1].clone())
    });
    assert_eq!(second["runId"], ids[1].as_str());
    let sends = runs_of(&env.show(WORKER), Some("send"));
    assert_eq!(sends.len(), 2, "{sends:?}");
    assert_eq!(sends[0]["status"], "interrupted");
    drop(next);
}

#[test]
fn sigterm_interrupts_the_running_run_leaves_queued_runs_queued_and_exits() {
    sigterm_case(false);
}

#[test]
fn sigterm_after_stdin_eof_interrupts_the_running_run_and_exits() {
    sigterm_case(true);
}

/// Owners that leave while runs keep being claimed (the client closes stdin, `drainSeconds` 0)
/// hand every run on: the one leaving finishes what it claimed, the next runs what stayed
/// queued, and no run is ever `interrupted`. CI once caught a claim committed while shutdown
/// looked at the active runs: the leaving owner released the lock with that run `running`, and
/// the next owner interrupted it (now shutdown waits out a claim under way).
#[test]
fn owners_that_leave_mid_queue_hand_every_run_on_and_interrupt_none() {
    let keys: Vec<String> = (0..4).map(|i| format!("agent:worker:w{i}")).collect();
    let mut env = TestEnv::new();
    let worker = scripted_agent(&env, "worker", &sleepy(5), json!({"maxConcurrent": 4}));
    env.set_config(&agents_config(vec![json!({"id": "main"}), worker], json!({"runtime": {"drainSeconds": 0}})));
    env.seed(json!({"sessions": keys.iter().map(|k| json!({"key": k})).collect::<Vec<_>>()}));
    let mut next = env.serve(None);
    for round in 0..8u64 {
        let mut leaving = next;
        for i in 0..16 {
            let to = &keys[i % keys.len()];
            let r = leaving.call(
                "sessions_send",
                json!({"sessionKey": to, "message": format!("r{round}m{i}"), "timeoutSeconds": 0}),
            );
            assert_eq!(r["status"], "accepted", "{r}");
        }
        // leave at a different point of the queue each round
        std::thread::sleep(Duration::from_millis(7 * round));
        leaving.close_stdin();
        next = env.serve(None);
        let exited = leaving.wait_exit(Duration::from_secs(20));
        assert!(exited.is_some_and(|s| s.success()), "round {round}: the leaving owner exits: {exited:?}");
    }
    env.wait_idle(Duration::from_secs(60));
    drop(next);
    let counts = env.run_counts();
    assert_eq!(counts["interrupted"], 0, "no run was interrupted: {counts}");
    let sends: Vec<Value> = keys.iter().flat_map(|k| runs_of(&env.show(k), Some("send"))).collect();
    assert_eq!(sends.len(), 8 * 16, "every send made one run");
    assert!(sends.iter().all(|r| r["status"] == "ok"), "every send's run ended ok: {sends:?}");
}

#[test]
fn a_daemon_owns_the_runtime_and_runs_what_a_short_lived_client_sent() {
    let env = env_with_worker(|e| scripted_agent(e, "worker", &sleepy(800), json!({})), &[WORKER.to_string()]);
    let mut daemon = common::start_daemon(&env);

    let mut c = env.serve(None);
    let r =
        c.call("sessions_send", json!({"sessionKey": WORKER, "message": "while you are away", "timeoutSeconds": 0}));
    assert_eq!(r["status"], "accepted", "{r}");
    let run_id = r["runId"].as_str().unwrap().to_string();
    let t0 = Instant::now();
    c.close();
    assert!(t0.elapsed() < Duration::from_secs(3), "a serve that does not own the runtime exits at once");
    let run = wait_until(Duration::from_secs(15), "the daemon to run it", || {
        let s = runs_of(&env.show(WORKER), Some("send"));
        (s[0]["status"] == "ok").then(|| s[0].clone())
    });
    assert_eq!(run["runId"], run_id.as_str());
    let main = env.show("main");
    wait_until(Duration::from_secs(10), "the reply in main", || {
        let main = env.show("main");
        main["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| text_of(&m["content"]) == "done: while you are away")
            .then_some(())
    });
    let _ = main;
    terminate_pid(daemon.id());
    let status = wait_child(&mut daemon, Duration::from_secs(10));
    assert!(status.success(), "the daemon exits cleanly on SIGTERM: {status}");
}
