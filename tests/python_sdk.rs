//! The official Python MCP SDK (PyPI `mcp`, pinned in `tests/clients/requirements.txt`) as a
//! black-box client over stdio, streamable HTTP and the legacy SSE transport: tools, list, history,
//! a resource subscription and its update notification, spawn, send (`tests/clients/python_sdk.py`).
//!
//! The interpreter is `$SESSIONS_MCP_PYTHON` (`.ci/run` sets it to a venv it installs), else
//! `python3` if it can import `mcp`. Without one the test says so and passes locally; under CI
//! (`CI` set) a missing SDK is a failure, so CI can never skip it silently.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use common::TestEnv;
use sha2::{Digest, Sha256};

fn python() -> Option<String> {
    let candidate = std::env::var("SESSIONS_MCP_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&candidate).args(["-c", "import mcp"]).output().is_ok_and(|o| o.status.success());
    if ok {
        return Some(candidate);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI needs the Python MCP SDK: set SESSIONS_MCP_PYTHON ({candidate} has no `mcp`)"
    );
    eprintln!("skipped: no Python with the `mcp` SDK (pip install -r tests/clients/requirements.txt)");
    None
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/python_sdk.py")
}

fn run_client(python: &str, args: &[&str]) {
    let out = Command::new(python).arg(script()).args(args).stdin(Stdio::null()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("ok {}", args[1])),
        "python client over {} failed:\n{stdout}\n{}",
        args[1],
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_python_sdk_drives_stdio() {
    let Some(python) = python() else { return };
    let env = TestEnv::new();
    let state = env.state_dir();
    run_client(&python, &["main", "stdio", common::bin(), "serve", "--state-dir", state.to_str().unwrap()]);
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_python_sdk_drives_streamable_http_and_legacy_sse() {
    let Some(python) = python() else { return };
    let token = "py-desk-token-0123456789";
    let sha = hex::encode(Sha256::digest(token.as_bytes()));
    let env =
        TestEnv::with_config(&format!("{{server: {{tokens: [{{sha256: '{sha}', sessionKey: 'agent:main:desk'}}]}}}}"));
    let mut child = env
        .command(&["serve", "--http", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let server = Server(child);
    let base = loop {
        let line = lines.next().expect("the server printed its address").unwrap();
        if let Some(at) = line.find("http://127.0.0.1:") {
            break line[at..].trim_end_matches("/mcp").to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    run_client(&python, &["agent:main:desk", "http", &format!("{base}/mcp"), token]);
    run_client(&python, &["agent:main:desk", "sse", &format!("{base}/sse"), token]);
    drop(server);
}
