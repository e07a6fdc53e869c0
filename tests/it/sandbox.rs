//! Sandboxed sub-agents run in a bubblewrap jail: a read-only system, only their workdir
//! writable, no network, no view of the state dir; they reach the server only through the run
//! socket, as themselves. In CI a jail that cannot start fails the test; on a developer machine
//! without user namespaces the test is skipped with a printed reason.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{TestEnv, bwrap_works};
use serde_json::{Value, json};

fn spawn_and_read_announce(env: &TestEnv, args: Value) -> String {
    let mut c = env.serve(None);
    let r = c.call("sessions_spawn", args);
    assert_eq!(r["status"], "accepted", "{r}");
    let after = r["inbox"]["afterSeq"].as_i64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let h = c.call("sessions_history", json!({"sessionKey": "main", "afterSeq": after}));
        if let Some(m) = h["messages"].as_array().and_then(|m| m.first()) {
            return m["content"][0]["text"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "no announce arrived");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_sandboxed_child_is_confined_to_its_workdir() {
    if !bwrap_works() {
        return;
    }
    let mut env = TestEnv::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let state = env.state_dir();
    let probe = env.dir.path().join("probe.sh");
    std::fs::write(
        &probe,
        format!(
            r#"read -r request
r=""
check() {{ if sh -c "$2" >/dev/null 2>&1; then r="$r $1=yes"; else r="$r $1=no"; fi; }}
check write_workdir 'echo x > ./probe.txt'
check write_etc 'echo x > /etc/probe'
check write_usr 'echo x > /usr/probe'
check see_db 'test -e {state}/sessions.db'
check see_run 'ls {state}/run'
check read_db 'cat {state}/sessions.db'
check net 'python3 -c "import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=2)"'
check uid 'test "$(id -u)" = 65534'
printf '{{"type":"final","text":"%s"}}\n' "$r"
"#,
            state = state.display()
        ),
    )
    .unwrap();
    env.set_config(&format!(
        "{{agents: {{defaults: {{sandbox: {{mode: 'non-main'}}}}, list: [{{id: 'main', runner: {{command: '/bin/sh', args: ['{}']}}}}]}}}}",
        probe.display()
    ));
    let text = spawn_and_read_announce(&env, json!({"task": "probe", "sandbox": "require"}));
    assert!(text.starts_with("Status: completed successfully"), "{text}");
    for expect in [
        "write_workdir=yes",
        "write_etc=no",
        "write_usr=no",
        "see_db=no",
        "see_run=no",
        "read_db=no",
        "net=no",
        "uid=yes",
    ] {
        assert!(text.contains(expect), "{expect} in {text}");
    }
    // The workdir is the session's own directory under the agent workspace.
    let written: Vec<_> =
        walk(&state.join("workspaces/main/.sessions")).into_iter().filter(|p| p.ends_with("probe.txt")).collect();
    assert_eq!(written.len(), 1, "{written:?}");
    drop(listener);
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn scripted(env: &mut TestEnv, script: Value, extra: &str) {
    let path = env.dir.path().join("script.json");
    std::fs::write(&path, script.to_string()).unwrap();
    env.set_config(&format!(
        "{{agents: {{defaults: {{sandbox: {{mode: 'non-main'}}}}, list: [{{id: 'main', runner: {{command: '{}', args: ['agent', '--script', '{}']}}}}]}}{extra}}}",
        common::bin(),
        path.display()
    ));
}

#[test]
fn a_sandboxed_child_calls_back_through_the_socket_as_itself() {
    if !bwrap_works() {
        return;
    }
    let script = json!({"rules": [{"match": {"mode": "spawn"}, "call": {"tool": "sessions_list", "arguments": {}}, "reply": "listed: {result}"}],
                        "default": {"reply": "ANNOUNCE_SKIP"}});
    let mut env = TestEnv::new();
    // sessions_list is among a leaf's default tools.
    scripted(&mut env, script.clone(), ", tools: {sessions: {visibility: 'all'}}");
    let text = spawn_and_read_announce(&env, json!({"task": "list"}));
    let result: Value =
        serde_json::from_str(text.lines().nth(1).unwrap().strip_prefix("Result: listed: ").unwrap()).unwrap();
    assert_eq!(result["status"], "ok");
    assert_eq!(result["scope"]["sandboxed"], true);
    assert_eq!(result["scope"]["effective"], "tree", "clamped to its tree");
    assert_eq!(result["count"], 1, "only its own session: {result}");
    // Denied to sub-agents, the call is forbidden.
    let mut env = TestEnv::new();
    scripted(&mut env, script, ", tools: {subagents: {tools: {deny: ['sessions_list']}}}");
    let text = spawn_and_read_announce(&env, json!({"task": "list"}));
    assert!(text.contains("\"status\":\"forbidden\""), "{text}");
}

#[test]
fn require_fails_fast_without_a_sandboxed_target_or_a_working_jail() {
    let env = TestEnv::new();
    let mut c = env.serve(None);
    let r = c.call("sessions_spawn", json!({"task": "x", "sandbox": "require"}));
    assert_eq!(r["status"], "forbidden", "{r}");
    assert!(r["error"].as_str().unwrap().contains("sandbox.mode"), "{r}");
    // A sandboxed target but no bwrap on PATH: fails fast, creates nothing.
    let env = TestEnv::with_config("{agents: {defaults: {sandbox: {mode: 'non-main'}}}}");
    let before = {
        drop(env.serve(None));
        env.fingerprint()
    };
    let mut c = env.serve_with(None, &[("PATH", "/nonexistent")]);
    let r = c.call("sessions_spawn", json!({"task": "x", "sandbox": "require"}));
    assert_eq!(r["status"], "error", "{r}");
    assert!(r["error"].as_str().unwrap().starts_with("sandbox unavailable"), "{r}");
    drop(c);
    assert_eq!(env.fingerprint(), before);
}
