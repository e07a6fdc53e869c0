//! The whole-process side of the harness: start this very binary (`serve`, `serve --http`, the
//! agent) on a world, speak MCP to it as newline-delimited JSON-RPC lines over stdio, and read its
//! memory and threads from `/proc/<pid>/status`.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{Mutex, broadcast, oneshot};

/// The largest VmHWM of any server the run started (kB): the "peak during the runs" row.
static PEAK_HWM_KB: AtomicU64 = AtomicU64::new(0);

pub fn peak_hwm_kb() -> u64 {
    PEAK_HWM_KB.load(Ordering::Relaxed)
}

/// This binary with a clean environment and quiet logs; its stderr goes to the file `log` so that
/// a failure can be read afterwards.
pub fn command(log: &Path) -> anyhow::Result<Command> {
    let exe = std::env::current_exe().context("cannot find this binary to start servers from")?;
    let mut cmd = Command::new(exe);
    for var in ["SESSIONS_MCP_TOKEN", "SESSIONS_MCP_SESSION", "SESSIONS_MCP_RUN_ID", "SESSIONS_MCP_CONFIG"] {
        cmd.env_remove(var);
    }
    let stderr = std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    cmd.env("RUST_LOG", "warn").stderr(stderr).kill_on_drop(true);
    Ok(cmd)
}

/// `sessions-mcp serve ARGS --state-dir DIR`, logging to `<dir>/serve.log`.
pub fn serve_command(state_dir: &Path, args: &[&str]) -> anyhow::Result<Command> {
    let mut cmd = command(&state_dir.join("serve.log"))?;
    cmd.arg("serve").args(args).arg("--state-dir").arg(state_dir);
    Ok(cmd)
}

/// Sets the CPU affinity of the command's process in the child, between fork and exec: its
/// threads and children inherit it, so none starts outside the set.
#[cfg(target_os = "linux")]
fn pin(cmd: &mut Command, cores: Vec<usize>) -> anyhow::Result<()> {
    // SAFETY: the closure only builds a cpu_set_t on the stack and calls sched_setaffinity(2),
    // both async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &core in &cores {
                libc::CPU_SET(core, &mut set);
            }
            match libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn pin(_: &mut Command, _: Vec<usize>) -> anyhow::Result<()> {
    anyhow::bail!("pinning a server to CPUs needs Linux's sched_setaffinity")
}

/// Notifications a slow listener may fall behind by before it misses some.
const NOTIFICATIONS_KEPT: usize = 64;

/// Waiters by request id; each gets its response line unparsed.
type Pending = Arc<std::sync::Mutex<HashMap<u64, oneshot::Sender<String>>>>;

/// What routing needs of a line: a response has an id and no method. The rest is skipped
/// unparsed, so that the reader costs little next to the server it measures.
#[derive(serde::Deserialize)]
struct Head {
    id: Option<u64>,
    method: Option<serde::de::IgnoredAny>,
}

/// What a latency row checks of a tool result: that it is one, and not an error.
#[derive(serde::Deserialize)]
struct Outcome {
    result: Option<OutcomeResult>,
}

#[derive(serde::Deserialize)]
struct OutcomeResult {
    #[serde(rename = "isError", default)]
    is_error: bool,
}

/// A `serve` process over stdio. Requests may be outstanding together: a reader task hands each
/// response to the request with its id, and each notification to whoever listens.
pub struct StdioServer {
    child: Child,
    stdin: Mutex<Option<ChildStdin>>,
    pending: Pending,
    notifications: broadcast::Sender<String>,
    next_id: AtomicU64,
    log: std::path::PathBuf,
}

impl StdioServer {
    /// Starts `serve` on `state_dir` without initializing it (see [`StdioServer::initialize`]).
    pub fn spawn(state_dir: &Path) -> anyhow::Result<Self> {
        Self::spawn_on(state_dir, &[])
    }

    /// [`StdioServer::spawn`] with the server and every process it starts (its agents) kept to
    /// the CPUs `cores` (all of them when empty), set before the server's first instruction.
    pub fn spawn_on(state_dir: &Path, cores: &[usize]) -> anyhow::Result<Self> {
        std::fs::create_dir_all(state_dir)?;
        let mut cmd = serve_command(state_dir, &[])?;
        if !cores.is_empty() {
            pin(&mut cmd, cores.to_vec())?;
        }
        let mut child =
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().context("cannot start `sessions-mcp serve`")?;
        let stdout = child.stdout.take().context("serve has no stdout")?;
        let pending: Pending = Arc::default();
        let (routes, notifications) = (pending.clone(), broadcast::channel(NOTIFICATIONS_KEPT).0);
        let notify = notifications.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Head>(&line) {
                    Ok(Head { id: Some(id), method: None }) => {
                        if let Some(tx) = routes.lock().unwrap().remove(&id) {
                            let _ = tx.send(line);
                        }
                    }
                    Ok(Head { id: None, method: Some(_) }) => {
                        let _ = notify.send(line);
                    }
                    // A request from the server is not ours to answer.
                    _ => {}
                }
            }
        });
        let stdin = Mutex::new(child.stdin.take());
        let log = state_dir.join("serve.log");
        Ok(StdioServer { child, stdin, pending, notifications, next_id: AtomicU64::new(1), log })
    }

    /// Starts `serve` and completes the `initialize` handshake.
    pub async fn start(state_dir: &Path) -> anyhow::Result<Self> {
        let server = Self::spawn(state_dir)?;
        server.initialize().await?;
        Ok(server)
    }

    /// `initialize`, answered, then `notifications/initialized`.
    pub async fn initialize(&self) -> anyhow::Result<()> {
        let params = json!({"protocolVersion": "2025-11-25", "capabilities": {},
                            "clientInfo": {"name": "sessions-mcp-bench", "version": "1"}});
        self.request("initialize", params).await?;
        self.line(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await
    }

    /// The server's notifications from now on, each line unparsed.
    pub fn notifications(&self) -> broadcast::Receiver<String> {
        self.notifications.subscribe()
    }

    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    async fn line(&self, msg: &Value) -> anyhow::Result<()> {
        let mut stdin = self.stdin.lock().await;
        let stdin = stdin.as_mut().context("stdin of serve is closed")?;
        stdin.write_all(format!("{msg}\n").as_bytes()).await?;
        stdin.flush().await.map_err(Into::into)
    }

    /// Sends a request and waits for its response line.
    async fn exchange(&self, method: &str, params: Value) -> anyhow::Result<String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        self.line(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await?;
        rx.await.with_context(|| format!("serve exited before answering {method}; see {}", self.log.display()))
    }

    /// Sends a request and waits for its result (an error if the server answered with one).
    pub async fn request(&self, method: &str, params: Value) -> anyhow::Result<Value> {
        let mut msg: Value = serde_json::from_str(&self.exchange(method, params).await?)?;
        match msg.get_mut("result") {
            Some(r) => Ok(r.take()),
            None => anyhow::bail!("{method}: {}", msg.get("error").unwrap_or(&msg)),
        }
    }

    /// Calls a tool and checks only that it succeeded, leaving the result unparsed: the latency
    /// rows time the server and the transport, as `curl` timed the reference, not a client's
    /// JSON parser.
    pub async fn call_ok(&self, tool: &str, args: Value) -> anyhow::Result<()> {
        let line = self.exchange("tools/call", json!({"name": tool, "arguments": args})).await?;
        let outcome: Outcome = serde_json::from_str(&line)?;
        anyhow::ensure!(outcome.result.is_some_and(|r| !r.is_error), "{tool} failed: {line}");
        Ok(())
    }

    /// Calls a tool; its structuredContent, an error unless the tool answered ok or accepted.
    pub async fn call(&self, tool: &str, args: Value) -> anyhow::Result<Value> {
        let result = self.request("tools/call", json!({"name": tool, "arguments": args})).await?;
        let structured = result.get("structuredContent").cloned().unwrap_or(Value::Null);
        anyhow::ensure!(result.get("isError") != Some(&json!(true)), "{tool} failed: {structured}");
        Ok(structured)
    }

    /// The server's memory and threads now.
    pub fn memory(&self) -> Memory {
        Memory::of(self.pid())
    }

    /// SIGTERM (which cancels running runs and leaves queued ones), then waits for the exit.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        stop_child(&mut self.child).await
    }
}

/// Notes the child's peak memory, asks it to stop (SIGTERM) and waits up to 10 s before killing it.
pub async fn stop_child(child: &mut Child) -> anyhow::Result<()> {
    let Some(pid) = child.id() else { return Ok(()) };
    Memory::of(pid); // folds its peak into the run's
    // SAFETY: kill(2) on our own child's pid, which has not been reaped yet (id() is Some).
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err() {
        child.kill().await?;
        anyhow::bail!("process {pid} did not exit within 10 s of SIGTERM; killed it");
    }
    Ok(())
}

/// A process's memory and threads from `/proc/<pid>/status` (kB; zero when unreadable).
#[derive(Debug, Default, Clone, Copy)]
pub struct Memory {
    pub rss_kb: u64,
    pub hwm_kb: u64,
    pub threads: u64,
}

impl Memory {
    /// Reads the figures and folds the peak into [`peak_hwm_kb`].
    pub fn of(pid: u32) -> Memory {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| {
            let line = status.lines().find(|l| l.starts_with(name));
            line.and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0)
        };
        let m = Memory { rss_kb: field("VmRSS:"), hwm_kb: field("VmHWM:"), threads: field("Threads:") };
        PEAK_HWM_KB.fetch_max(m.hwm_kb, Ordering::Relaxed);
        m
    }
}
