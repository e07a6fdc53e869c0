//! The official Python MCP SDK (PyPI `mcp`, pinned in `tests/clients/requirements.txt`) as a
//! black-box client over stdio, streamable HTTP and the legacy SSE transport: tools, list, history,
//! a resource subscription and its update notification, spawn, send (`tests/clients/python_sdk.py`).
//!
//! The interpreter is `$SESSIONS_MCP_PYTHON` (`.ci/run` sets it to a venv it installs), else
//! `python3` if it can import `mcp`. Without one the test says so and passes locally; under CI
//! (`CI` set) a missing SDK is a failure, so CI can never skip it silently.

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::TestEnv;
use sha2::{Digest, Sha256};

pub(crate) fn python() -> Option<String> {
    python_with("mcp")
}

/// The interpreter that can import `module` (an SDK of `tests/clients/requirements.txt`); None,
/// with a note, outside CI when there is none; under CI a missing SDK fails the test.
pub(crate) fn python_with(module: &str) -> Option<String> {
    let candidate = std::env::var("SESSIONS_MCP_PYTHON").unwrap_or_else(|_| "python3".into());
    let import = format!("import {module}");
    let ok = Command::new(&candidate).args(["-c", &import]).output().is_ok_and(|o| o.status.success());
    if ok {
        return Some(candidate);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI needs the Python SDK `{module}`: set SESSIONS_MCP_PYTHON ({candidate} has no `{module}`)"
    );
    eprintln!("skipped: no Python with `{module}` (pip install -r tests/clients/requirements.txt)");
    None
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/python_sdk.py")
}

fn run_client(python: &str, args: &[&str]) {
    run_client_in(python, args, None);
}

/// [`run_client`] declaring `root` as the client's one root.
fn run_client_in(python: &str, args: &[&str], root: Option<&std::path::Path>) {
    let mut cmd = Command::new(python);
    if let Some(root) = root {
        cmd.env("SESSIONS_MCP_ROOT", root);
    }
    let out = cmd.arg(script()).args(args).stdin(Stdio::null()).output().unwrap();
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

#[test]
fn the_python_sdk_drives_streamable_http_and_legacy_sse() {
    let Some(python) = python() else { return };
    let token = "py-desk-token-0123456789";
    let sha = hex::encode(Sha256::digest(token.as_bytes()));
    let env =
        TestEnv::with_config(&format!("{{server: {{tokens: [{{sha256: '{sha}', sessionKey: 'agent:main:desk'}}]}}}}"));
    let server = env.serve_http(&[]);
    let base = format!("http://127.0.0.1:{}", server.port);
    // Over HTTP the server's own directory says nothing of the caller's project: its roots do.
    let project = tempfile::tempdir().unwrap();
    let project = std::fs::canonicalize(project.path()).unwrap();
    run_client_in(&python, &["agent:main:desk", "http", &format!("{base}/mcp"), token], Some(&project));
    run_client(&python, &["agent:main:desk", "sse", &format!("{base}/sse"), token]);
    drop(server);
}
