//! A `daemon` owning the runtime and `serve` processes that do not (the setup docs/AGENTS.md recommends
//! for desktop hosts): a serve's send with a wait, a wait whose owner dies, a transcript
//! subscription in a serve that the daemon's writes reach, a `subagents` wait in a serve for a
//! child the daemon runs, and the owner's internal endpoints on
//! its run socket, which admit only the owner's key. Correctness only: how fast is BENCHMARKS.md's
//! `daemon` group.

use crate::common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Child;
use std::time::Duration;

use common::{TestEnv, agents_config, runs_of, scripted_agent, start_daemon, text_of, wait_until};
use serde_json::{Value, json};

const WORKER: &str = "agent:worker:main";

/// A daemon killed (SIGKILL) on drop, unless the test killed it first.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An env with agent `worker` answering `done: <input>` after `ms` (announce steps skip at once),
/// the `world` seeded, and a daemon owning the runtime.
fn env_with_daemon(ms: u64, world: Value) -> (TestEnv, Daemon) {
    let mut env = TestEnv::new();
    let script = json!({"rules": [{"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"}],
                        "default": {"sleepMs": ms, "reply": "done: {input}"}});
    let worker = scripted_agent(&env, "worker", &script, json!({}));
    env.set_config(&agents_config(vec![json!({"id": "main"}), worker], json!({})));
    env.seed(world);
    let daemon = Daemon(start_daemon(&env));
    (env, daemon)
}

fn worker_session() -> Value {
    json!({"sessions": [{"key": WORKER}]})
}

#[test]
fn sends_with_a_wait_through_a_daemon_get_their_replies() {
    let (env, _daemon) = env_with_daemon(0, worker_session());
    let mut c = env.serve(None);
    for i in 0..5 {
        let r =
            c.call("sessions_send", json!({"sessionKey": WORKER, "message": format!("m{i}"), "timeoutSeconds": 60}));
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["reply"], format!("done: m{i}"), "{r}");
    }
    let sends = runs_of(&env.show(WORKER), Some("send"));
    assert_eq!(sends.len(), 5, "one run per send: {sends:?}");
    assert!(sends.iter().all(|r| r["status"] == "ok"), "{sends:?}");
}

#[test]
fn a_wait_through_a_daemon_ends_when_the_daemon_dies() {
    let (env, mut daemon) = env_with_daemon(600_000, worker_session());
    let mut c = env.serve(None);
    let id = c.start_call("sessions_send", json!({"sessionKey": WORKER, "message": "never", "timeoutSeconds": 600}));
    wait_until(Duration::from_secs(15), "the daemon to run it", || {
        runs_of(&env.show(WORKER), Some("send")).first().is_some_and(|r| r["status"] == "running").then_some(())
    });
    let _ = daemon.0.kill();
    let _ = daemon.0.wait();
    // Nobody tells the waiter: the serve takes the runtime over, interrupts the orphan, and the
    // wait reads that from the store.
    let r = c.finish_call("sessions_send", id);
    assert_eq!(r["status"], "error", "the wait ends with its run: {r}");
    assert!(r["error"].as_str().is_some_and(|e| e.contains("interrupted")), "{r}");
}

#[test]
fn a_subscription_in_a_serve_hears_what_the_daemon_appends() {
    let (env, _daemon) = env_with_daemon(0, worker_session());
    let mut c = env.serve(None);
    let r = c.request("resources/subscribe", json!({"uri": "sessions://history/main"}));
    assert!(r.get("result").is_some(), "{r}");
    // The daemon runs it and appends the reply to main's inbox.
    let r = c.call("sessions_send", json!({"sessionKey": WORKER, "message": "hello", "timeoutSeconds": 0}));
    assert_eq!(r["status"], "accepted", "{r}");
    let updated = wait_until(Duration::from_secs(15), "an update notification for main", || {
        c.pump(Duration::from_millis(100));
        c.take_notification("notifications/resources/updated")
    });
    assert_eq!(updated["params"]["uri"], "sessions://history/main");
    let read = c.request("resources/read", json!({"uri": "sessions://history/main"}));
    let history: Value = serde_json::from_str(read["result"]["contents"][0]["text"].as_str().unwrap()).unwrap();
    let texts: Vec<String> = history["messages"].as_array().unwrap().iter().map(|m| text_of(&m["content"])).collect();
    assert!(texts.contains(&"done: hello".to_string()), "the update was the reply: {texts:?}");
}

/// The status line of one raw HTTP/1.1 request on the daemon's socket.
fn status_of(env: &TestEnv, method: &str, path: &str, auth: Option<&str>) -> String {
    let mut s = UnixStream::connect(env.state_dir().join("run/mcp.sock")).unwrap();
    let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    let request =
        format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).unwrap();
    let mut head = [0u8; 12];
    let _ = s.read_exact(&mut head);
    String::from_utf8_lossy(&head).to_string()
}

#[test]
fn the_owner_endpoints_admit_only_the_owner_key() {
    let world = json!({"sessions": [{"key": WORKER}],
                       "runTokens": [{"token": "smcp_run_live", "sessionKey": WORKER, "runId": "r-live"}]});
    let (env, _daemon) = env_with_daemon(0, world);
    let key = std::fs::read_to_string(env.state_dir().join("run/owner.key")).unwrap();
    let key = format!("Bearer {}", key.trim());
    for path in ["/owner/wake", "/owner/events"] {
        let method = if path.ends_with("wake") { "POST" } else { "GET" };
        for refused in [None, Some("Bearer smcp_run_live"), Some("Bearer not-the-key")] {
            let status = status_of(&env, method, path, refused);
            assert_eq!(status, "HTTP/1.1 401", "{method} {path} with {refused:?}");
        }
    }
    assert_eq!(status_of(&env, "POST", "/owner/wake", Some(&key)), "HTTP/1.1 204");
    assert_eq!(status_of(&env, "GET", "/owner/events", Some(&key)), "HTTP/1.1 200");
}

#[test]
fn a_subagents_wait_in_a_serve_returns_when_the_daemon_finishes_the_child() {
    let (env, _daemon) = env_with_daemon(0, worker_session());
    let mut c = env.serve(None);
    let r = c.call("sessions_spawn", json!({"task": "work"}));
    assert_eq!(r["status"], "accepted", "{r}");
    let child = r["childSessionKey"].as_str().unwrap().to_string();
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 60}));
    assert_eq!(w["status"], "ok", "{w}");
    assert_eq!(w["finished"][0]["childSessionKey"], child, "{w}");
    let outcome = w["finished"][0]["outcome"].as_str().unwrap();
    assert!(outcome.starts_with("Status: completed successfully\nResult: ECHO: work\n"), "{outcome}");
    // The daemon ran it, not this serve.
    let run = &runs_of(&env.show(&child), Some("spawn"))[0];
    assert_eq!(run["status"], "ok", "{run}");
    c.close();
}
