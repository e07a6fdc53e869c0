//! Degraded mode: `serve` that cannot start (a broken config, a store file that is not a
//! database, a state dir holding an OpenClaw store) still answers the MCP client on stdin — every
//! tool call is the tool error naming the exact problem — and exits 2 when stdin closes. Strict
//! (`--strict`, `SESSIONS_MCP_STRICT=1`, stdin a terminal) it exits 2 at once with one line, as
//! does a refused identity (a bad token or `--as`) whatever stdin is.

use crate::common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Client, TestEnv};
use serde_json::{Value, json};

/// One call of every tool, with arguments a healthy server would accept.
const CALLS: [(&str, &str); 5] = [
    ("agents_list", "{}"),
    ("sessions_history", r#"{"sessionKey": "main"}"#),
    ("sessions_list", "{}"),
    ("sessions_send", r#"{"sessionKey": "main", "message": "hi"}"#),
    ("sessions_spawn", r#"{"task": "say hi"}"#),
];

/// A state dir `serve` refuses, and what it is.
struct Broken {
    what: &'static str,
    env: TestEnv,
}

fn broken_worlds() -> Vec<Broken> {
    let config = |text: &str| TestEnv::with_config(text);
    let junk_store = TestEnv::sqlite();
    std::fs::create_dir_all(junk_store.state_dir()).unwrap();
    std::fs::write(junk_store.state_dir().join("sessions.db"), "not SQLite\n".repeat(100)).unwrap();
    let openclaw = TestEnv::new();
    let sessions = openclaw.state_dir().join("agents/main/sessions");
    std::fs::create_dir_all(&sessions).unwrap();
    std::fs::write(sessions.join("sessions.json"), "{}").unwrap();
    vec![
        Broken { what: "config that is not JSON5", env: config("this is not a config") },
        Broken { what: "config with an unknown key", env: config("{ tools: { sesions: { visibility: 'all' } } }") },
        Broken { what: "store file that is not SQLite", env: junk_store },
        Broken { what: "OpenClaw state dir without --force", env: openclaw },
    ]
}

/// Runs `cmd` with stdin an open pipe that is never written or closed (a client that waits):
/// the process must exit on its own within 10 s. Returns (exit code, stdout, stderr).
fn run_with_stdin_open(mut cmd: Command) -> (Option<i32>, String, String) {
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let _stdin = child.stdin.take();
    let status = common::wait_child(&mut child, Duration::from_secs(10));
    let (mut out, mut err) = (String::new(), String::new());
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (status.code(), out, err)
}

/// The problem `serve --strict` exits with: its one stderr line, without the `sessions-mcp: `.
fn strict_problem(b: &Broken) -> String {
    let (code, out, err) = run_with_stdin_open(b.env.command(&["serve", "--strict"]));
    assert_eq!(code, Some(2), "{}: --strict exits 2 at once: {err}", b.what);
    assert!(out.is_empty(), "{}: nothing on stdout: {out}", b.what);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{}: one line: {err}", b.what);
    lines[0].strip_prefix("sessions-mcp: ").unwrap_or_else(|| panic!("{}: {err}", b.what)).to_string()
}

fn tools_of(client: &mut Client) -> Value {
    client.request("tools/list", json!({}))["result"]["tools"].clone()
}

#[test]
fn a_server_that_cannot_start_answers_every_tool_with_the_problem_and_exits_2() {
    let healthy_tools = tools_of(&mut TestEnv::new().serve(None));
    assert_eq!(healthy_tools.as_array().map(Vec::len), Some(6));
    for b in broken_worlds() {
        let problem = strict_problem(&b);
        let expected = format!(
            "sessions-mcp could not start: {problem}. No session tool works until that is fixed and this MCP server \
             is restarted; tell the user."
        );
        let mut cmd = b.env.command(&["serve"]);
        cmd.env("SESSIONS_MCP_STRICT", "0");
        let before = contents(&b.env.state_dir());
        let mut c = Client::start(cmd);
        assert_eq!(tools_of(&mut c), healthy_tools, "{}: the same six tools and schemas", b.what);
        for (tool, args) in CALLS {
            let result = c.call_result(tool, serde_json::from_str(args).unwrap());
            assert_eq!(result["isError"], true, "{}: {tool}: {result}", b.what);
            assert_eq!(
                result["structuredContent"],
                json!({"status": "error", "error": expected}),
                "{}: {tool} answers the problem",
                b.what
            );
        }
        assert_eq!(c.request("resources/list", json!({}))["result"]["resources"], json!([]), "{}", b.what);
        let read = c.request("resources/read", json!({"uri": "sessions://agent/main/main"}));
        assert_eq!(read["error"]["message"], expected.as_str(), "{}: {read}", b.what);
        let unknown = c.request("tools/call", json!({"name": "nope", "arguments": {}}));
        assert_eq!(unknown["error"]["code"], -32602, "{}: an unknown tool is still a protocol error", b.what);
        let (status, stderr) = c.finish();
        assert_eq!(status.code(), Some(2), "{}: exit 2 once the client is gone: {stderr}", b.what);
        let first = stderr.lines().next().unwrap_or_default();
        assert!(first.contains(" ERROR ") && first.ends_with(&expected), "{}: logged at start: {stderr}", b.what);
        assert_eq!(contents(&b.env.state_dir()), before, "{}: the state dir is left as it was", b.what);
    }
}

/// Every file under `dir` with its bytes, in path order (empty when `dir` does not exist).
fn contents(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut all: Vec<_> = entries
        .flatten()
        .flat_map(|e| match e.file_type().unwrap().is_dir() {
            true => contents(&e.path()),
            false => vec![(e.path(), std::fs::read(e.path()).unwrap())],
        })
        .collect();
    all.sort();
    all
}

#[test]
fn the_instructions_state_the_problem() {
    let env = TestEnv::with_config("{ tools: { sesions: {} } }");
    let mut child =
        env.command(&["serve"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    use std::io::Write;
    writeln!(child.stdin.take().unwrap(), "{init}").unwrap();
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert_eq!(common::wait_child(&mut child, Duration::from_secs(10)).code(), Some(2));
    let answer: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    let instructions = answer["result"]["instructions"].as_str().unwrap();
    assert!(instructions.starts_with("sessions-mcp could not start: config file "), "{instructions}");
    assert!(instructions.contains(r#"unknown config key "tools.sesions" (did you mean "tools.sessions"?)"#));
    assert!(answer["result"]["capabilities"]["tools"].is_object(), "{answer}");
}

#[test]
fn the_strict_switches_exit_2_at_once_with_one_line() {
    let env = TestEnv::with_config("{ tools: { sesions: {} } }");
    let mut by_env = env.command(&["serve"]);
    by_env.env("SESSIONS_MCP_STRICT", "1");
    for cmd in [env.command(&["serve", "--strict"]), by_env] {
        let (code, out, err) = run_with_stdin_open(cmd);
        assert_eq!(code, Some(2), "{err}");
        assert!(out.is_empty(), "{out}");
        assert!(err.starts_with("sessions-mcp: config file ") && err.contains("tools.sesions"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

/// stdin a terminal (a person at a prompt): strict, whatever the switches say.
#[test]
fn serve_at_a_terminal_is_strict() {
    if Command::new("script").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "script(1) (util-linux) is required under CI");
        eprintln!("skipped: script(1) is not installed");
        return;
    }
    let env = TestEnv::with_config("{ tools: { sesions: {} } }");
    let serve = env.command(&["serve"]);
    let line = std::iter::once(serve.get_program())
        .chain(serve.get_args())
        .map(|a| format!("'{}'", a.to_str().unwrap()))
        .collect::<Vec<_>>()
        .join(" ");
    let mut script = Command::new("script");
    script.args(["-qec", &line, "/dev/null"]).env("RUST_LOG", "warn").env_remove("SESSIONS_MCP_STRICT");
    let mut child = script.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let status = common::wait_child(&mut child, Duration::from_secs(10));
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(out.starts_with("sessions-mcp: config file ") && !out.contains("could not start"), "{out}");
}

/// Identity is never degraded: a refused token or `--as` exits 2 at once, even with a client
/// waiting on stdin.
#[test]
fn a_refused_identity_exits_2_at_once_even_for_a_host() {
    let env = TestEnv::new();
    let mut bad_token = env.command(&["serve"]);
    bad_token.env("SESSIONS_MCP_TOKEN", "smcp_run_nope");
    let (code, out, err) = run_with_stdin_open(bad_token);
    assert_eq!(code, Some(2), "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("SESSIONS_MCP_TOKEN is not a valid token"), "{err}");
    let (code, out, err) = run_with_stdin_open(env.command(&["serve", "--as", "agent:Bad!:x"]));
    assert_eq!(code, Some(2), "{err}");
    assert!(out.is_empty() && err.contains("--as"), "{out} {err}");
}

/// `--http` has no client on stdin: a config problem exits 2 at once there.
#[test]
fn serve_http_that_cannot_start_exits_2_at_once() {
    let env = TestEnv::with_config("{ tools: { sesions: {} } }");
    let (code, _, err) = run_with_stdin_open(env.command(&["serve", "--http", "127.0.0.1:0"]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.starts_with("sessions-mcp: config file "), "{err}");
}
