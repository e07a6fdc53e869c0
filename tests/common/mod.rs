//! Black-box harness: start the real binary, speak newline-delimited JSON-RPC over stdio, build
//! worlds with `dev seed`, fingerprint the store, validate results against the checked-in schemas.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use serde_json::{Value, json};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_sessions-mcp")
}

/// A state directory (and optional config) for one test.
pub struct TestEnv {
    pub dir: tempfile::TempDir,
    pub config: Option<PathBuf>,
}

impl TestEnv {
    pub fn new() -> Self {
        TestEnv { dir: tempfile::tempdir().expect("tempdir"), config: None }
    }

    pub fn with_config(json5: &str) -> Self {
        let mut env = Self::new();
        env.set_config(json5);
        env
    }

    pub fn set_config(&mut self, json5: &str) {
        let path = self.dir.path().join("config.json5");
        std::fs::write(&path, json5).expect("write config");
        self.config = Some(path);
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// A command for the binary with this env's state dir and config and a clean environment.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.args(args).arg("--state-dir").arg(self.state_dir());
        if let Some(cfg) = &self.config {
            c.arg("--config").arg(cfg);
        }
        for var in [
            "SESSIONS_MCP_TOKEN",
            "SESSIONS_MCP_SESSION",
            "SESSIONS_MCP_RUN_ID",
            "SESSIONS_MCP_CONFIG",
            "SESSIONS_MCP_STATE_DIR",
        ] {
            c.env_remove(var);
        }
        c.env("RUST_LOG", "warn");
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run sessions-mcp")
    }

    /// Writes a world spec through `dev seed`.
    pub fn seed(&self, world: Value) {
        let path = self.dir.path().join(format!("world-{}.json", uuid_like()));
        std::fs::write(&path, world.to_string()).unwrap();
        let out = self.run(&["dev", "seed", path.to_str().unwrap()]);
        assert!(out.status.success(), "seed failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn seed_generated(&self, args: &[&str]) {
        let mut all = vec!["dev", "seed"];
        all.extend_from_slice(args);
        let out = self.run(&all);
        assert!(out.status.success(), "seed failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn fingerprint(&self) -> String {
        let out = self.run(&["dev", "fingerprint"]);
        assert!(out.status.success(), "fingerprint failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// Starts `serve` acting as `as_key` (None = default `main`) and initializes it.
    pub fn serve(&self, as_key: Option<&str>) -> Client {
        self.serve_with(as_key, &[])
    }

    pub fn serve_with(&self, as_key: Option<&str>, envs: &[(&str, &str)]) -> Client {
        let mut cmd = self.command(&["serve"]);
        if let Some(k) = as_key {
            cmd.arg("--as").arg(k);
        }
        for (k, v) in envs {
            cmd.env(k, v);
        }
        Client::start(cmd)
    }
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// A running `serve` process and its JSON-RPC stream.
pub struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next_id: u64,
    pending: Vec<Value>,
}

impl Client {
    pub fn start(mut cmd: Command) -> Client {
        let mut child =
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn serve");
        let stdout: ChildStdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut c = Client { child, stdin, lines: rx, next_id: 1, pending: Vec::new() };
        let init = c.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "tests", "version": "1"}}),
        );
        assert!(init.get("result").is_some(), "initialize failed: {init}");
        c.notify("notifications/initialized", json!({}));
        c
    }

    pub fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        self.send_raw(&json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string());
    }

    /// Sends a request and returns the whole JSON-RPC response (result or error).
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send_raw(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string());
        self.wait_for(id)
    }

    pub fn wait_for(&mut self, id: u64) -> Value {
        if let Some(pos) = self.pending.iter().position(|m| m.get("id") == Some(&json!(id))) {
            return self.pending.remove(pos);
        }
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("no response to request {id}"));
            let msg: Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
            if msg.get("id") == Some(&json!(id)) {
                return msg;
            }
            if msg.get("id").is_some() {
                self.pending.push(msg);
            }
        }
    }

    /// Calls a tool; returns the `CallToolResult` JSON and checks the mirror and schema rules.
    pub fn call_result(&mut self, tool: &str, args: Value) -> Value {
        let resp = self.request("tools/call", json!({"name": tool, "arguments": args}));
        let result = resp.get("result").cloned().unwrap_or_else(|| panic!("{tool}: JSON-RPC error {resp}"));
        let structured = result["structuredContent"].clone();
        let text = result["content"][0]["text"].as_str().expect("text content");
        assert_eq!(serde_json::from_str::<Value>(text).unwrap(), structured, "text mirrors structuredContent");
        let status = structured["status"].as_str().expect("status");
        let is_error = matches!(status, "error" | "forbidden" | "not_found" | "invalid");
        assert_eq!(result["isError"].as_bool().unwrap_or(false), is_error, "isError follows status: {structured}");
        assert_conforms(tool, &structured);
        result
    }

    /// Calls a tool and returns its structuredContent.
    pub fn call(&mut self, tool: &str, args: Value) -> Value {
        self.call_result(tool, args)["structuredContent"].clone()
    }

    /// Closes stdin and waits for the process (it must exit 0).
    pub fn close(mut self) -> String {
        drop(self.stdin.take());
        let out = self.child.wait().expect("wait");
        let mut err = String::new();
        if let Some(mut s) = self.child.stderr.take() {
            use std::io::Read;
            let _ = s.read_to_string(&mut err);
        }
        assert!(out.success(), "serve exited with {out}: {err}");
        err
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn schema_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas")
}

/// Validates `value` against `schemas/<tool>.output.json`.
pub fn assert_conforms(tool: &str, value: &Value) {
    assert_valid(&schema_dir().join(format!("{tool}.output.json")), value);
}

pub fn assert_valid(schema_path: &Path, value: &Value) {
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(schema_path).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let errors: Vec<String> = validator.iter_errors(value).map(|e| format!("{e} at {}", e.instance_path())).collect();
    assert!(errors.is_empty(), "{} does not conform to {}: {errors:?}", value, schema_path.display());
}

/// The keys of a sessions_list answer, in order.
pub fn keys_of(list: &Value) -> Vec<String> {
    list["sessions"].as_array().expect("sessions").iter().map(|r| r["key"].as_str().unwrap().to_string()).collect()
}
