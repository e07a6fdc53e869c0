//! Run callbacks: the owner's Unix socket (bearer auth, 401 rules), `sessions-mcp connect`, and
//! agents calling the session tools back as themselves — the loop guard and the deadlock guard.

use crate::common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Client, TestEnv, tool_results};
use serde_json::{Value, json};

/// A `daemon` owning the runtime for the test's state dir; killed on drop.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn daemon(env: &TestEnv) -> Daemon {
    let child = env.command(&["daemon"]).stdin(Stdio::null()).stderr(Stdio::null()).spawn().expect("daemon");
    let socket = socket_path(env);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "the daemon's socket did not appear");
        std::thread::sleep(Duration::from_millis(20));
    }
    Daemon(child)
}

fn socket_path(env: &TestEnv) -> PathBuf {
    env.state_dir().join("run/mcp.sock")
}

/// One raw HTTP/1.1 request on the socket; returns the status line and headers.
fn raw_http(socket: &Path, auth: Option<&str>) -> String {
    let mut s = UnixStream::connect(socket).unwrap();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // The server may answer 401 (and close) before reading the body: a failed write is fine.
    let _ = s.write_all(request.as_bytes());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split("\r\n\r\n").next().unwrap_or("").to_string()
}

fn world_with_tokens(env: &TestEnv) {
    env.seed(json!({"sessions": [{"key": "agent:main:worker"}, {"key": "agent:main:other"}],
    "runTokens": [
        {"token": "smcp_run_live", "sessionKey": "agent:main:worker", "runId": "r-live"},
        {"token": "smcp_run_ended", "sessionKey": "agent:main:worker", "runId": "r-ended", "expiresAt": 1}
    ]}));
}

#[test]
fn the_socket_answers_401_without_a_valid_token() {
    let env = TestEnv::new();
    world_with_tokens(&env);
    let _d = daemon(&env);
    let socket = socket_path(&env);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600);
    for auth in [None, Some("Bearer nope"), Some("Bearer smcp_run_ended"), Some("Basic abc"), Some("Bearer ")] {
        let head = raw_http(&socket, auth);
        assert!(head.starts_with("HTTP/1.1 401"), "{auth:?}: {head}");
        assert!(head.to_ascii_lowercase().contains("www-authenticate: bearer"), "{auth:?}: {head}");
        assert!(!head.contains("worker"), "no other information");
    }
    let ok = raw_http(&socket, Some("Bearer smcp_run_live"));
    assert!(!ok.starts_with("HTTP/1.1 401"), "{ok}");
}

#[test]
fn connect_proxies_stdio_to_the_socket_as_the_tokens_session() {
    let env = TestEnv::with_config("{tools: {sessions: {visibility: 'self'}}}");
    world_with_tokens(&env);
    let _d = daemon(&env);
    let mut cmd = Command::new(common::bin());
    cmd.arg("connect")
        .env_clear()
        .env("SESSIONS_MCP_TOKEN", "smcp_run_live")
        .env("SESSIONS_MCP_SOCKET", socket_path(&env));
    let mut c = Client::start(cmd);
    let list = c.call("sessions_list", json!({}));
    assert_eq!(common::keys_of(&list), ["agent:main:worker"], "the token's session is the caller: {list}");
    let h = c.call("sessions_history", json!({"sessionKey": "agent:main:other"}));
    assert_eq!(h["status"], "forbidden", "visibility self applies to the token's session");
    c.close();

    let mut cmd = Command::new(common::bin());
    cmd.arg("connect")
        .env_clear()
        .env("SESSIONS_MCP_TOKEN", "smcp_run_ended")
        .env("SESSIONS_MCP_SOCKET", socket_path(&env))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    writeln!(
        child.stdin.as_mut().unwrap(),
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-11-25","capabilities":{{}},"clientInfo":{{"name":"t","version":"1"}}}}}}"#
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));
}

/// Polls `show KEY --json` until `pred` holds for it.
fn wait_for(env: &TestEnv, key: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = env.run(&["show", key, "--json"]);
        if out.status.success() {
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            if pred(&v) {
                return v;
            }
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn agent_config(dir: &Path, script: Value, extra: &str) -> String {
    let path = dir.join("script.json");
    std::fs::write(&path, script.to_string()).unwrap();
    format!(
        "{{agents: {{list: [{{id: 'main', runner: {{command: '{}', args: ['agent', '--script', '{}']}}}}]}}, tools: {{sessions: {{visibility: 'agent'}}}}, {extra}}}",
        common::bin(),
        path.display()
    )
}

#[test]
fn three_agents_forwarding_to_each_other_are_stopped_at_max_hops() {
    let mut env = TestEnv::new();
    // Each session forwards what it is sent (or injected) to the next; other runs (announce
    // steps) just answer.
    let forward = |from: &str, mode: &str, to: &str| {
        json!({"match": {"session": from, "mode": mode},
               "call": {"tool": "sessions_send", "arguments": {"sessionKey": to, "message": "{input}", "timeoutSeconds": 0}},
               "reply": "forwarded"})
    };
    let script = json!({"rules": [
        forward("agent:main:a", "inject", "agent:main:b"),
        forward("agent:main:a", "send", "agent:main:b"),
        forward("agent:main:b", "send", "agent:main:c"),
        forward("agent:main:c", "send", "agent:main:a"),
    ], "default": {"reply": "ok"}});
    let config = agent_config(env.dir.path(), script, "session: {agentToAgent: {maxPingPongTurns: 0, maxHops: 3}}");
    env.set_config(&config);
    env.seed(json!({"sessions": [{"key": "agent:main:a"}, {"key": "agent:main:b"}, {"key": "agent:main:c"}]}));
    let _d = daemon(&env);
    let out = env.run(&["inject", "agent:main:a", "loop", "--timeout", "0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // a (hop 0) → b (hop 1) → c (hop 2) → a (hop 3) → b would be hop 4 > maxHops 3.
    let a = wait_for(&env, "agent:main:a", "the refused hop", |v| {
        tool_results(v).iter().any(|r| r["status"] == "forbidden")
    });
    let refused = tool_results(&a).into_iter().find(|r| r["status"] == "forbidden").unwrap();
    assert!(refused["error"].as_str().unwrap().contains("maxHops=3"), "{refused}");
    let accepted = |key: &str| {
        let v: Value = serde_json::from_slice(&env.run(&["show", key, "--json"]).stdout).unwrap();
        tool_results(&v).iter().filter(|r| r["status"] == "accepted").count()
    };
    assert_eq!((accepted("agent:main:a"), accepted("agent:main:b"), accepted("agent:main:c")), (1, 1, 1));
    let b: Value = serde_json::from_slice(&env.run(&["show", "agent:main:b", "--json"]).stdout).unwrap();
    assert_eq!(b["messages"][0]["provenance"]["sourceSessionKey"], "agent:main:a");
    assert_eq!(b["messages"][0]["provenance"]["kind"], "inter_session");
}

#[test]
fn a_mutual_wait_is_refused_at_once() {
    let mut env = TestEnv::new();
    let script = json!({"rules": [
        {"match": {"session": "agent:main:a", "mode": "inject"},
         "call": {"tool": "sessions_send", "arguments": {"sessionKey": "agent:main:b", "message": "ping", "timeoutSeconds": 20}},
         "reply": "a got {result}"},
        {"match": {"session": "agent:main:b", "mode": "send"},
         "call": {"tool": "sessions_send", "arguments": {"sessionKey": "agent:main:a", "message": "pong?", "timeoutSeconds": 20}},
         "reply": "b done"}
    ], "default": {"reply": "ok"}});
    let config = agent_config(env.dir.path(), script, "session: {agentToAgent: {maxPingPongTurns: 0}}");
    env.set_config(&config);
    env.seed(json!({"sessions": [{"key": "agent:main:a"}, {"key": "agent:main:b"}]}));
    let _d = daemon(&env);
    let started = Instant::now();
    let out = env.run(&["inject", "agent:main:a", "go", "--timeout", "30"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(15), "no run waited for its full timeout");
    let b: Value = serde_json::from_slice(&env.run(&["show", "agent:main:b", "--json"]).stdout).unwrap();
    let refused = tool_results(&b).into_iter().next().unwrap();
    assert_eq!(refused["status"], "invalid", "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("would deadlock"), "{refused}");
    let reply = String::from_utf8(out.stdout).unwrap();
    assert!(reply.contains("\"status\":\"ok\"") && reply.contains("b done"), "{reply}");
}

#[test]
fn an_idempotent_replay_after_a_lost_client_gets_the_same_run() {
    let mut env = TestEnv::new();
    let script = json!({"rules": [{"match": {"mode": "send"}, "sleepMs": 3000, "reply": "slow answer"}], "default": {"reply": "ok"}});
    let config = agent_config(env.dir.path(), script, "session: {agentToAgent: {maxPingPongTurns: 0}}");
    env.set_config(&config);
    env.seed(json!({"sessions": [{"key": "agent:main:slow"}]}));
    let _d = daemon(&env);
    let args = json!({"sessionKey": "agent:main:slow", "message": "take your time", "timeoutSeconds": 30, "idempotencyKey": "k-1"});
    // Client 1 starts waiting, then dies without a word.
    let mut c1 = env.serve(None);
    c1.send_raw(&json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {"name": "sessions_send", "arguments": args}}).to_string());
    std::thread::sleep(Duration::from_secs(1));
    drop(c1); // SIGKILL
    // Client 2 replays the key and gets the first run's answer.
    let mut c2 = env.serve(None);
    let r = c2.call("sessions_send", args.clone());
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["reply"], "slow answer");
    let show: Value = serde_json::from_slice(&env.run(&["show", "agent:main:slow", "--json"]).stdout).unwrap();
    let sends: Vec<&Value> = show["runs"].as_array().unwrap().iter().filter(|r| r["mode"] == "send").collect();
    assert_eq!(sends.len(), 1, "one run row: {show}");
    assert_eq!(sends[0]["runId"], r["runId"]);
    // The same key with another message is refused.
    let mut other = args.clone();
    other["message"] = json!("something else");
    let bad = c2.call("sessions_send", other);
    assert_eq!(bad["status"], "invalid");
    assert!(bad["error"].as_str().unwrap().contains("idempotencyKey"));
}

#[test]
fn a_run_token_is_refused_as_soon_as_its_run_has_ended() {
    let body = "IFS= read -r line\nprintf '%s' \"$SESSIONS_MCP_TOKEN\" > token.tmp && mv token.tmp token\nsleep 2\nprintf '%s\\n' '{\"type\":\"final\",\"text\":\"done\"}'\n";
    let env = common::env_with_shell_worker(body);
    let _d = daemon(&env);
    let mut c = env.serve(None);
    let id = c
        .start_call("sessions_send", json!({"sessionKey": "agent:worker:main", "message": "go", "timeoutSeconds": 30}));
    let token_file = env.state_dir().join("workspaces/worker/token");
    let token = common::wait_until(Duration::from_secs(20), "the agent to write its token", || {
        std::fs::read_to_string(&token_file).ok().filter(|t| !t.is_empty())
    });
    let bearer = format!("Bearer {token}");
    let during = raw_http(&socket_path(&env), Some(&bearer));
    assert!(!during.starts_with("HTTP/1.1 401"), "the token is valid while its run runs: {during}");
    let r = c.finish_call("sessions_send", id);
    assert_eq!(r["reply"], "done", "{r}");
    let after = raw_http(&socket_path(&env), Some(&bearer));
    assert!(after.starts_with("HTTP/1.1 401"), "refused once the run has ended, not 30 s later: {after}");
}
