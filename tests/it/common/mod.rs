//! Black-box harness: start the real binary, speak newline-delimited JSON-RPC over stdio, build
//! worlds with `dev seed`, fingerprint the store, validate results against the checked-in schemas.
#![allow(dead_code)]

pub mod http_client;
pub mod inproc;
pub mod runner;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use serde_json::{Value, json};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_sessions-mcp")
}

/// A state directory (and optional config) for one test, and its store: the SQLite file in the
/// directory, or with `SESSIONS_MCP_TEST_STORE=postgres` a database of its own on the server of
/// `SESSIONS_MCP_TEST_PG` (every process the test starts is given its URL).
pub struct TestEnv {
    pub dir: tempfile::TempDir,
    pub config: Option<PathBuf>,
    pub pg: Option<TestDatabase>,
    /// A database this env shares with others (a node of several; see [`TestEnv::node_of`]).
    pub shared_store: Option<String>,
}

impl TestEnv {
    pub fn new() -> Self {
        let pg = postgres_selected().then(TestDatabase::create);
        TestEnv { dir: tempfile::tempdir().expect("tempdir"), config: None, pg, shared_store: None }
    }

    /// A node on the database `url`: a state dir of its own, the store shared.
    pub fn node_of(url: &str) -> Self {
        TestEnv { shared_store: Some(url.to_string()), ..TestEnv::sqlite() }
    }

    /// The PostgreSQL URL every process of this env is given, if it is on PostgreSQL.
    pub fn store_url(&self) -> Option<&str> {
        self.pg.as_ref().map(|db| db.url.as_str()).or(self.shared_store.as_deref())
    }

    /// A test of the SQLite file itself (its copy into PostgreSQL, its fault handling): SQLite
    /// whichever backend the suite runs on.
    pub fn sqlite() -> Self {
        TestEnv { dir: tempfile::tempdir().expect("tempdir"), config: None, pg: None, shared_store: None }
    }

    /// This env on SQLite whichever backend the suite runs on (see [`TestEnv::sqlite`]).
    pub fn on_sqlite(mut self) -> Self {
        self.pg = None;
        self
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
            "SESSIONS_MCP_STRICT",
            "SESSIONS_MCP_STORE_URL",
        ] {
            c.env_remove(var);
        }
        if let Some(url) = self.store_url() {
            c.env("SESSIONS_MCP_STORE_URL", url);
        }
        c.env("RUST_LOG", "warn");
        // The agent CLIs installed where the tests run must not change what a zero-config server
        // runs; tests/it/first_use.rs turns discovery on with a PATH of fakes.
        c.env("SESSIONS_MCP_DISCOVERY", "off");
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
        Client::start(self.serve_command(as_key, envs))
    }

    /// A `serve` started again until one answers initialize (for tests that kill servers).
    pub fn serve_until_up(&self) -> Client {
        for _ in 0..10 {
            match Client::try_start(self.serve_command(None, &[])) {
                Ok(client) => return client,
                Err(mut dead) => eprintln!("serve died before initialize: {}", dead.what_the_server_left()),
            }
        }
        panic!("serve died before initialize ten times");
    }

    pub fn serve_command(&self, as_key: Option<&str>, envs: &[(&str, &str)]) -> Command {
        let mut cmd = self.command(&["serve"]);
        if let Some(k) = as_key {
            cmd.arg("--as").arg(k);
        }
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd
    }
}

/// The pid holding `runtime.lock` of a state dir (its runtime owner), from /proc/locks.
pub fn runtime_lock_holder(state_dir: &Path) -> Option<i32> {
    use std::os::unix::fs::MetadataExt;
    let inode = std::fs::metadata(state_dir.join("runtime.lock")).ok()?.ino();
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (pid, dev_inode) = (f.get(4)?, f.get(5)?);
        (dev_inode.rsplit(':').next()? == inode.to_string()).then(|| pid.parse().ok()).flatten()
    })
}

/// Whether the suite runs on PostgreSQL (`SESSIONS_MCP_TEST_STORE=postgres`; else SQLite).
pub fn postgres_selected() -> bool {
    match std::env::var("SESSIONS_MCP_TEST_STORE").as_deref() {
        Ok("postgres") => true,
        Ok("sqlite") | Ok("") | Err(_) => false,
        Ok(other) => panic!("SESSIONS_MCP_TEST_STORE={other}: say sqlite or postgres"),
    }
}

/// A database of one test on the server of `SESSIONS_MCP_TEST_PG`, dropped with it.
pub struct TestDatabase {
    /// The URL sessions-mcp is given: over TLS with the server's certificate and name checked
    /// when the server's CA is known (`SESSIONS_MCP_TEST_PG_TLS`, as .ci/postgres.sh sets it),
    /// as a production node would connect.
    pub url: String,
    /// The URL the test's own connections use (the driver alone knows no `verify-full`).
    plain_url: String,
    admin: String,
    name: String,
}

impl TestDatabase {
    pub fn create() -> TestDatabase {
        let admin = std::env::var("SESSIONS_MCP_TEST_PG")
            .expect("SESSIONS_MCP_TEST_STORE=postgres needs SESSIONS_MCP_TEST_PG (.ci/postgres.sh starts a server)");
        let name = format!("smcp_it_{}", uuid::Uuid::new_v4().simple());
        pg_admin(&admin, &format!("CREATE DATABASE \"{name}\" ENCODING 'UTF8' TEMPLATE template0"));
        let plain_url = url_of(&admin, &name);
        let url = match std::env::var("SESSIONS_MCP_TEST_PG_TLS").ok().filter(|d| !d.is_empty()) {
            Some(dir) => verified(&plain_url, &dir),
            None => plain_url.clone(),
        };
        TestDatabase { url, plain_url, admin, name }
    }
}

/// `url` (on 127.0.0.1) by the name its server's certificate carries, `localhost`, checked
/// against the CA in `tls_dir`.
fn verified(url: &str, tls_dir: &str) -> String {
    assert!(url.contains("@127.0.0.1:"), "the test server is on 127.0.0.1: {url}");
    format!(
        "{}?hostaddr=127.0.0.1&sslmode=verify-full&sslrootcert={tls_dir}/ca.crt",
        url.replacen("@127.0.0.1:", "@localhost:", 1)
    )
}

/// `admin` (a URL) with its database replaced by `db`.
fn url_of(admin: &str, db: &str) -> String {
    let (base, _) = admin.rsplit_once('/').expect("a URL with a database");
    format!("{base}/{db}")
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if std::env::var_os("SESSIONS_MCP_TEST_KEEP_DB").is_some() {
            eprintln!("kept the test database {}", self.name);
            return;
        }
        pg_admin(&self.admin, &format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name));
    }
}

/// Rows of `sql` on this database.
impl TestDatabase {
    pub fn query(&self, sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]) -> Vec<tokio_postgres::Row> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (client, conn) =
                tokio_postgres::connect(&self.plain_url, tokio_postgres::NoTls).await.expect("connect");
            let conn = tokio::spawn(conn);
            let rows = client.query(sql, params).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
            drop(client);
            let _ = conn.await;
            rows
        })
    }
}

/// Runs `sql` on the server as its admin.
fn pg_admin(admin: &str, sql: &str) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (client, conn) =
            tokio_postgres::connect(admin, tokio_postgres::NoTls).await.expect("connect to the test server");
        let conn = tokio::spawn(conn);
        client.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        drop(client);
        let _ = conn.await;
    });
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// A running `serve` process and its JSON-RPC stream.
/// A `serve --http 127.0.0.1:0 [EXTRA…]` process (HTTP or HTTPS) and the port it printed; killed on drop.
pub struct HttpServer {
    child: Child,
    pub port: u16,
}

impl TestEnv {
    pub fn serve_http(&self, extra: &[&str]) -> HttpServer {
        self.listen_http("serve", extra)
    }

    /// `daemon --http 127.0.0.1:0 [EXTRA…]`: the runtime's owner, also listening.
    pub fn daemon_http(&self, extra: &[&str]) -> HttpServer {
        self.listen_http("daemon", extra)
    }

    fn listen_http(&self, command: &str, extra: &[&str]) -> HttpServer {
        let mut child = self
            .command(&[&[command, "--http", "127.0.0.1:0"], extra].concat())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let port = loop {
            let line = lines.next().expect("the server printed its address").unwrap();
            // http:// or, with server.tls, https://
            if let Some(rest) = line.split("://127.0.0.1:").nth(1) {
                break rest.split('/').next().unwrap().parse().unwrap();
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        HttpServer { child, port }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long a client waits for the server's next line before it gives up on a response. Above the
/// longest `timeoutSeconds` a test passes (120 s), so a call that waits its whole timeout on a
/// loaded machine is not taken for a hung server; a server that died is seen at once anyway.
const SILENCE_BOUND: Duration = Duration::from_secs(150);

pub struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next_id: u64,
    pending: Vec<Value>,
    /// Notifications seen while waiting for responses.
    notes: Vec<Value>,
    /// The roots this client answers `roots/list` with while it waits (None: it leaves the
    /// request unanswered among the notes, as for any other request from the server).
    roots: Option<Box<Value>>,
}

impl Client {
    pub fn start(cmd: Command) -> Client {
        Self::start_declaring(cmd, json!({}))
    }

    /// Starts a server and initializes it declaring these client `capabilities`.
    pub fn start_declaring(cmd: Command, capabilities: Value) -> Client {
        Self::start_as(cmd, capabilities, "tests")
    }

    /// Starts a server and initializes it as the MCP client `name` (`clientInfo.name`: a host).
    pub fn start_as(cmd: Command, capabilities: Value, name: &str) -> Client {
        Self::try_start_declaring(cmd, capabilities, name).unwrap_or_else(|mut c| {
            let left = c.what_the_server_left();
            panic!("no answer to initialize: {left}")
        })
    }

    /// Starts a server; Err (holding it, for its stderr) when it died before answering initialize.
    pub fn try_start(cmd: Command) -> Result<Client, Client> {
        Self::try_start_declaring(cmd, json!({}), "tests")
    }

    fn try_start_declaring(mut cmd: Command, capabilities: Value, name: &str) -> Result<Client, Client> {
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
        let mut c = Client { child, stdin, lines: rx, next_id: 1, pending: Vec::new(), notes: Vec::new(), roots: None };
        let init = c.try_request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": {"name": name, "version": "1"}}),
        );
        let Some(init) = init else { return Err(c) };
        assert!(init.get("result").is_some(), "initialize failed: {init}");
        c.notify("notifications/initialized", json!({}));
        Ok(c)
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
        match self.try_wait_for(id) {
            Some(msg) => msg,
            None => panic!("no response to request {id}: {}", self.what_the_server_left()),
        }
    }

    /// For a failure message: the server's exit status and stderr once it has exited, else that
    /// it is still running (its stderr is only read when it is gone, so this never blocks long).
    fn what_the_server_left(&mut self) -> String {
        // Its stdout closing comes just before its exit: give the exit a moment to be seen.
        let exited = (0..20).find_map(|_| match self.child.try_wait() {
            Ok(Some(status)) => Some(status),
            _ => {
                std::thread::sleep(Duration::from_millis(50));
                None
            }
        });
        let Some(status) = exited else { return "the server is still running".into() };
        let Some(mut stderr) = self.child.stderr.take() else { return format!("the server exited with {status}") };
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut err = String::new();
            let _ = stderr.read_to_string(&mut err);
            let _ = tx.send(err);
        });
        let err = rx.recv_timeout(Duration::from_secs(2)).unwrap_or_default();
        format!("the server exited with {status}; its stderr:\n{err}")
    }

    /// Sends a request; None when the server died (or stayed silent [`SILENCE_BOUND`]) before answering.
    pub fn try_request(&mut self, method: &str, params: Value) -> Option<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        let stdin = self.stdin.as_mut()?;
        stdin.write_all(format!("{line}\n").as_bytes()).ok()?;
        stdin.flush().ok()?;
        self.try_wait_for(id)
    }

    /// The response to request `id`; None when the stream ended (or stayed silent [`SILENCE_BOUND`]) first.
    pub fn try_wait_for(&mut self, id: u64) -> Option<Value> {
        if let Some(pos) = self.pending.iter().position(|m| m.get("id") == Some(&json!(id))) {
            return Some(self.pending.remove(pos));
        }
        loop {
            let line = self.lines.recv_timeout(SILENCE_BOUND).ok()?;
            let msg: Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
            // A request from the server (elicitation/create) has an id of its own counter: it is
            // never a response, whatever its id.
            let response = msg.get("id").is_some() && msg.get("method").is_none();
            if response && msg.get("id") == Some(&json!(id)) {
                return Some(msg);
            }
            if response {
                self.pending.push(msg);
            } else if !self.answered_roots(&msg) {
                self.notes.push(msg);
            }
        }
    }

    /// From now on, answers the server's `roots/list` with these file roots (as a host started
    /// in a project does), and tells it that the list changed.
    pub fn set_roots(&mut self, dirs: &[&Path]) {
        let roots: Vec<Value> = dirs
            .iter()
            .map(
                |d| json!({"uri": format!("file://{}", d.display()), "name": d.file_name().unwrap().to_string_lossy()}),
            )
            .collect();
        self.roots = Some(Box::new(json!(roots)));
        self.notify("notifications/roots/list_changed", json!({}));
    }

    /// Answers a `roots/list` request from the server when this client has roots.
    fn answered_roots(&mut self, msg: &Value) -> bool {
        let Some(roots) = self.roots.as_deref().cloned().filter(|_| msg["method"] == "roots/list") else {
            return false;
        };
        self.send_raw(&json!({"jsonrpc": "2.0", "id": msg["id"], "result": {"roots": roots}}).to_string());
        true
    }

    /// Reads whatever arrives for up to `timeout` (responses are kept, notifications collected).
    pub fn pump(&mut self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        while let Ok(line) = self.lines.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            let Ok(msg) = serde_json::from_str::<Value>(&line) else { continue };
            if msg.get("id").is_some() && msg.get("method").is_none() {
                self.pending.push(msg);
            } else {
                self.notes.push(msg);
            }
        }
    }

    /// Removes and returns the first collected notification with this method.
    pub fn take_notification(&mut self, method: &str) -> Option<Value> {
        let pos = self.notes.iter().position(|n| n["method"] == method)?;
        Some(self.notes.remove(pos))
    }

    /// Calls a tool; returns the `CallToolResult` JSON and checks the mirror and schema rules.
    pub fn call_result(&mut self, tool: &str, args: Value) -> Value {
        let resp = self.request("tools/call", json!({"name": tool, "arguments": args}));
        check_call_response(tool, &resp)
    }

    /// Calls a tool and returns its structuredContent.
    pub fn call(&mut self, tool: &str, args: Value) -> Value {
        self.call_result(tool, args)["structuredContent"].clone()
    }

    /// Closes stdin and waits for the process (it must exit 0).
    pub fn close(self) -> String {
        let (out, err) = self.finish();
        assert!(out.success(), "serve exited with {out}: {err}");
        err
    }

    /// Closes stdin, waits for the process, and returns its exit status and stderr.
    pub fn finish(mut self) -> (std::process::ExitStatus, String) {
        drop(self.stdin.take());
        let out = self.child.wait().expect("wait");
        let mut err = String::new();
        if let Some(mut s) = self.child.stderr.take() {
            use std::io::Read;
            let _ = s.read_to_string(&mut err);
        }
        (out, err)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A listener on a loopback port that answers each connection with `answer`, on a thread of its
/// own (the fake model APIs the real agent CLIs talk to); its port.
pub fn loopback_server(answer: impl Fn(std::net::TcpStream) + Send + Sync + 'static) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let answer = std::sync::Arc::new(answer);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let answer = answer.clone();
            std::thread::spawn(move || answer(stream));
        }
    });
    port
}

pub fn schema_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas")
}

/// Whether bubblewrap can start a jail here; panics in CI when it cannot.
pub fn bwrap_works() -> bool {
    let ok = Command::new("bwrap")
        .args(["--ro-bind", "/", "/", "--unshare-all", "--unshare-user", "--uid", "65534", "--", "/bin/true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "bubblewrap cannot start a jail in CI (install the bubblewrap package)"
        );
        eprintln!("SKIPPED: bubblewrap cannot start a jail on this machine (no bwrap or no user namespaces)");
    }
    ok
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

// ---------------------------------------------------------------------------------------------
// Helpers for the send and runs tests (tests/it/send_stdio.rs, tests/it/runs.rs).

/// Polls `f` every 50–200 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub fn wait_until<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(50);
    loop {
        if let Some(v) = f() {
            return v;
        }
        if std::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// The plain text of a message content (string or text blocks).
/// The structured tool results in a transcript (`show`'s messages), in order.
pub fn tool_results(show: &Value) -> Vec<Value> {
    show["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "toolResult")
        .map(|m| serde_json::from_str(&text_of(&m["content"])).unwrap_or(Value::Null))
        .collect()
}

pub fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Pids of live processes whose environment carries `SESSIONS_MCP_RUN_ID=<run_id>`.
pub fn pids_with_run_id(run_id: &str) -> Vec<i32> {
    pids_with_env(&format!("SESSIONS_MCP_RUN_ID={run_id}"))
}

/// The processes whose environment holds `needle` (a `NAME=value` assignment).
pub fn pids_with_env(needle: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == needle.as_bytes()))
        })
        .collect()
}

/// Asserts that within `grace` no process carries any of `run_ids` in its environment.
pub fn assert_no_process_carries(run_ids: &[String], grace: Duration) {
    let deadline = std::time::Instant::now() + grace;
    loop {
        let left: Vec<(String, Vec<i32>)> =
            run_ids.iter().map(|r| (r.clone(), pids_with_run_id(r))).filter(|(_, pids)| !pids.is_empty()).collect();
        if left.is_empty() {
            return;
        }
        if std::time::Instant::now() >= deadline {
            let detail: Vec<String> = left
                .iter()
                .map(|(r, pids)| {
                    let cmds: Vec<String> = pids
                        .iter()
                        .map(|p| {
                            let c = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                            format!("{p}:{}", String::from_utf8_lossy(&c).replace('\0', " ").trim())
                        })
                        .collect();
                    format!("run {r}: {cmds:?}")
                })
                .collect();
            panic!("processes carrying run ids are left after {grace:?}: {detail:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A scripted agent entry for `agents.list[]`: the built-in `sessions-mcp agent --script FILE`
/// with `script` written into the env's temp dir; `runner_extra` is merged into `runner`.
pub fn scripted_agent(env: &TestEnv, id: &str, script: &Value, runner_extra: Value) -> Value {
    let path = env.write_file(&format!("script-{id}.json"), &script.to_string());
    let mut runner = json!({"command": bin(), "args": ["agent", "--script", path.to_str().unwrap()]});
    if let Value::Object(m) = runner_extra {
        for (k, v) in m {
            runner[k] = v;
        }
    }
    json!({"id": id, "runner": runner})
}

/// A `/bin/sh` agent entry: `body` written as a script file; `args` follow the script path.
pub fn shell_agent(env: &TestEnv, id: &str, body: &str, args: &[&str], runner_extra: Value) -> Value {
    let path = env.write_file(&format!("agent-{id}.sh"), body);
    let mut argv = vec![path.to_str().unwrap().to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    let mut runner = json!({"command": "/bin/sh", "args": argv});
    if let Value::Object(m) = runner_extra {
        for (k, v) in m {
            runner[k] = v;
        }
    }
    json!({"id": id, "runner": runner})
}

/// An env with agent `main` (echo) and `worker`, a shell agent running `body` (no runner options).
pub fn env_with_shell_worker(body: &str) -> TestEnv {
    let mut env = TestEnv::new();
    let worker = shell_agent(&env, "worker", body, &[], json!({}));
    env.set_config(&agents_config(vec![json!({"id": "main"}), worker], json!({})));
    env
}

/// A config (JSON, which is JSON5) with these agents, visibility `all`, agent-to-agent on, and
/// `extra`'s top-level keys (session, channels, runtime, …) added.
pub fn agents_config(agents: Vec<Value>, extra: Value) -> String {
    let mut cfg = json!({
        "agents": {"list": agents},
        "tools": {"sessions": {"visibility": "all"}, "agentToAgent": {"enabled": true}},
    });
    if let Value::Object(m) = extra {
        for (k, v) in m {
            cfg[k] = v;
        }
    }
    cfg.to_string()
}

/// The runs of a `show --json` answer, oldest first, optionally only those of `mode`.
pub fn runs_of(show: &Value, mode: Option<&str>) -> Vec<Value> {
    let mut runs: Vec<Value> = show["runs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| mode.is_none_or(|m| r["mode"] == m))
        .collect();
    runs.reverse();
    runs
}

/// The largest number of runs whose [startedAt, endedAt) intervals overlap at one instant.
pub fn max_overlap(runs: &[Value]) -> usize {
    let mut events: Vec<(i64, i32)> = Vec::new();
    for r in runs {
        let (Some(s), Some(e)) = (r["startedAt"].as_i64(), r["endedAt"].as_i64()) else { continue };
        events.push((s, 1));
        events.push((e, -1));
    }
    // At equal times an end comes before a start (a run that ends frees its slot first).
    events.sort();
    let (mut cur, mut max) = (0i32, 0i32);
    for (_, d) in events {
        cur += d;
        max = max.max(cur);
    }
    max as usize
}

impl TestEnv {
    /// Writes `contents` to `<tempdir>/<name>` and returns the absolute path.
    pub fn write_file(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents).expect("write file");
        path
    }

    /// `sessions-mcp show KEY --json`, parsed.
    pub fn show(&self, key: &str) -> Value {
        self.try_show(key).unwrap_or_else(|stderr| panic!("show {key} failed: {stderr}"))
    }

    /// `show`, or its stderr when the session is not (yet) there: for polls that start before the
    /// server made the session.
    pub fn try_show(&self, key: &str) -> Result<Value, String> {
        let out = self.run(&["show", key, "--json"]);
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("show {key}: not JSON ({e})")))
    }

    /// `sessions-mcp ls --json` → its `runs` object (one count per run status).
    pub fn run_counts(&self) -> Value {
        let out = self.run(&["ls", "--json"]);
        assert!(out.status.success(), "ls failed: {}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).expect("ls --json is JSON");
        v["runs"].clone()
    }

    /// Runs that are queued or running, over the whole store.
    pub fn unfinished_runs(&self) -> i64 {
        let c = self.run_counts();
        c["queued"].as_i64().unwrap_or(0) + c["running"].as_i64().unwrap_or(0)
    }

    /// Waits until no run is queued or running.
    pub fn wait_idle(&self, timeout: Duration) {
        wait_until(timeout, "all runs to finish", || (self.unfinished_runs() == 0).then_some(()));
    }
}

impl Client {
    /// The `serve` process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILLs the `serve` process and reaps it.
    pub fn kill_now(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends a request without waiting; returns its id (answer it with `wait_for` / `finish_call`).
    pub fn start_request(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send_raw(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string());
        id
    }

    /// Starts a tool call without waiting for it.
    pub fn start_call(&mut self, tool: &str, args: Value) -> u64 {
        self.start_request("tools/call", json!({"name": tool, "arguments": args}))
    }

    /// Waits for a call started with `start_call`; checks it like `call` and returns structuredContent.
    pub fn finish_call(&mut self, tool: &str, id: u64) -> Value {
        let resp = self.wait_for(id);
        check_call_response(tool, &resp)["structuredContent"].clone()
    }

    /// Sends a request and returns its response together with every notification that arrived
    /// before it (in order).
    pub fn request_collect(&mut self, method: &str, params: Value, timeout: Duration) -> (Value, Vec<Value>) {
        let id = self.start_request(method, params);
        let mut notes = Vec::new();
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|_| panic!("no response to request {id}"));
            let msg: Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
            if msg.get("id") == Some(&json!(id)) && msg.get("method").is_none() {
                return (msg, notes);
            }
            if msg.get("id").is_some() && msg.get("method").is_none() {
                self.pending.push(msg);
            } else {
                notes.push(msg);
            }
        }
    }
}

/// The checks of `Client::call_result` on a raw JSON-RPC response; returns the CallToolResult.
pub fn check_call_response(tool: &str, resp: &Value) -> Value {
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

impl Client {
    /// Sends SIGTERM to the `serve` process and waits up to `timeout` for it to exit.
    pub fn terminate_and_wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        terminate_pid(self.child.id());
        wait_child(&mut self.child, timeout)
    }
}

/// Sends SIGTERM to `pid` (through kill(1): the tests have no libc).
pub fn terminate_pid(pid: u32) {
    let ok = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().expect("run kill").success();
    assert!(ok, "kill -TERM {pid} failed");
}

/// Waits up to `timeout` for `child` to exit (panics if it does not).
pub fn wait_child(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            panic!("process {} did not exit within {timeout:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Client {
    /// Closes the client's end of stdin (EOF for `serve`) without waiting for the process.
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Waits up to `timeout` for the `serve` process to exit; None if it is still alive.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Starts `daemon` on the env's state dir and waits until it says it runs.
pub fn start_daemon(env: &TestEnv) -> Child {
    let mut daemon = env
        .command(&["daemon"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start daemon");
    let stderr = daemon.stderr.take().unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let ready = rx.recv_timeout(Duration::from_secs(10)).expect("the daemon says it runs");
    assert!(ready.contains("daemon"), "{ready}");
    daemon
}

/// One HTTP/1.1 request read off `stream` by the fake model APIs: its request line and body.
pub fn read_http_request(stream: &std::net::TcpStream) -> Option<(String, Vec<u8>)> {
    use std::io::Read;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let (mut request_line, mut length) = (String::new(), 0);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if request_line.is_empty() {
            request_line = line.clone();
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((request_line, body))
}

/// The first `toolCall` content block of a transcript (`show`'s `messages`).
pub fn first_tool_call(messages: &[Value]) -> Value {
    messages
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .find(|b| b["type"] == "toolCall")
        .expect("a toolCall block")
}

/// A real agent CLI for the end-to-end tests: `$var`, else `program` on PATH. Without it the test
/// prints why and passes, except in CI's extended tier (`CI` and `SESSIONS_MCP_EXTENDED` set),
/// which must run it.
pub fn real_cli_or_skip(var: &str, program: &str, name: &str) -> Option<PathBuf> {
    let cli = std::env::var_os(var).map(PathBuf::from).or_else(|| {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path).map(|d| d.join(program)).find(|p| p.is_file())
    });
    if cli.is_none() {
        let reason = format!("the {name} CLI is not installed (set {var} or put {program} on PATH)");
        assert!(std::env::var_os("CI").is_none() || std::env::var_os("SESSIONS_MCP_EXTENDED").is_none(), "{reason}");
        eprintln!("skipped: {reason}");
    }
    cli
}
