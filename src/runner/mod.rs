//! The runner: one agent turn as a supervised subprocess speaking `jsonl/1`
//! (RUNNER-PROTOCOL.md). [`Runner::execute`] starts `sessions-mcp supervise -- <agent>`, writes the
//! request line, reads events under the line, byte, idle and run-time limits, forwards
//! `text_delta`s, handles cancellation (cancel line, grace, then the supervisor's group kill) and
//! returns an [`Outcome`]: the status, the reply, the messages to persist, usage and errors.
//! It never touches the store: the runtime persists the outcome.

pub mod sandbox;
mod spec;

use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Map, Value, json};
use tokio::io::AsyncWriteExt;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;

use crate::store::NewMessage;

pub use spec::{RunnerSpec, resolve_runner};

/// How a run ended (the run row's status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Ok,
    Error,
    Timeout,
    Cancelled,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error => "error",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
        }
    }
}

/// What one run produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub status: RunStatus,
    /// `final.text` if non-empty, else the last assistant message text.
    pub reply: Option<String>,
    pub messages: Vec<NewMessage>,
    pub usage: Option<Value>,
    pub model: Option<String>,
    pub stop_reason: Option<String>,
    pub external_session_id: Option<String>,
    pub error: Option<String>,
    pub exit_status: Option<i32>,
    pub stderr_tail: String,
}

impl Outcome {
    fn failed(error: impl Into<String>) -> Self {
        Outcome {
            status: RunStatus::Error,
            reply: None,
            messages: Vec::new(),
            usage: None,
            model: None,
            stop_reason: None,
            external_session_id: None,
            error: Some(error.into()),
            exit_status: None,
            stderr_tail: String::new(),
        }
    }
}

/// Why the runner stopped reading early.
enum Stop {
    Cancelled,
    Timeout,
    Idle,
    Protocol(String),
}

const STDERR_TAIL: usize = 64 * 1024;
/// After `final` the agent has this long to exit before it is killed.
const EXIT_AFTER_FINAL: Duration = Duration::from_secs(5);

/// Builds the persisted messages from events, in event order.
#[derive(Default)]
struct Transcript {
    messages: Vec<NewMessage>,
    open: Option<Vec<Value>>,
    run_id: String,
    saw_message: bool,
    last_assistant_text: Option<String>,
}

impl Transcript {
    fn close(&mut self) {
        if let Some(blocks) = self.open.take() {
            self.push("assistant", Value::Array(blocks), Map::new());
        }
    }

    fn push(&mut self, role: &str, content: Value, extra: Map<String, Value>) {
        self.messages.push(NewMessage {
            role: role.into(),
            content,
            run_id: Some(self.run_id.clone()),
            extra: (!extra.is_empty()).then_some(extra),
            ..Default::default()
        });
    }

    fn event(&mut self, e: &Value) {
        let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        match e.get("type").and_then(Value::as_str) {
            Some("tool_call") => {
                let mut args = e.get("arguments").cloned().unwrap_or(json!({}));
                if s("name") == "sessions_spawn" {
                    omit_attachment_content(&mut args);
                }
                let block = json!({"type": "toolCall", "id": s("id"), "name": s("name"), "arguments": args});
                self.open.get_or_insert_with(Vec::new).push(block);
            }
            Some("tool_result") => {
                self.close();
                let content = match e.get("content") {
                    Some(Value::String(t)) => json!([{"type": "text", "text": t}]),
                    Some(v @ Value::Array(_)) => v.clone(),
                    Some(other) => json!([{"type": "text", "text": other.to_string()}]),
                    None => json!([]),
                };
                let mut extra = Map::new();
                extra.insert("toolCallId".into(), s("id").into());
                extra.insert("toolName".into(), s("name").into());
                extra.insert("isError".into(), e.get("isError").and_then(Value::as_bool).unwrap_or(false).into());
                self.push("toolResult", content, extra);
            }
            Some("message") => {
                self.close();
                let content = e.get("content").cloned().unwrap_or(Value::String(String::new()));
                self.last_assistant_text = Some(crate::agent::content_text(&content));
                self.saw_message = true;
                self.push("assistant", content, Map::new());
            }
            _ => {}
        }
    }
}

/// `sessions_spawn` call arguments never keep attachment content in a transcript.
fn omit_attachment_content(args: &mut Value) {
    if let Some(list) = args.get_mut("attachments").and_then(Value::as_array_mut) {
        for a in list {
            if let Some(obj) = a.as_object_mut().filter(|o| o.contains_key("content")) {
                obj.insert("content".into(), "[attachment content omitted]".into());
            }
        }
    }
}

/// Reads an agent's `jsonl/1` stdout, one line at a time, into the transcript and the parts of the
/// result. No I/O: [`Runner::execute`] feeds it the lines it reads, and the fuzz target feeds it
/// arbitrary ones.
pub struct EventReader {
    transcript: Transcript,
    usage: Option<Value>,
    model: Option<String>,
    final_event: Option<Value>,
    error_event: Option<Value>,
    external_session_id: Option<String>,
}

/// What the events of one run amount to once reading stopped.
#[derive(Debug)]
pub struct Read {
    /// `final.text` if non-empty, else the last assistant message text.
    pub reply: Option<String>,
    pub messages: Vec<NewMessage>,
    pub usage: Option<Value>,
    pub model: Option<String>,
    pub stop_reason: Option<String>,
    pub external_session_id: Option<String>,
    pub final_event: Option<Value>,
    pub error_event: Option<Value>,
}

impl EventReader {
    pub fn new(run_id: &str) -> Self {
        EventReader {
            transcript: Transcript { run_id: run_id.to_string(), ..Default::default() },
            usage: None,
            model: None,
            final_event: None,
            error_event: None,
            external_session_id: None,
        }
    }

    /// Line `line_no` (1-based) of stdout. `Ok(true)` once `final` arrived (stop reading);
    /// `Err` is the protocol failure that fails the run.
    pub fn line(&mut self, line_no: usize, text: &str, on_delta: &dyn Fn(&str)) -> Result<bool, String> {
        if text.trim().is_empty() {
            return Ok(false);
        }
        let Ok(event) = serde_json::from_str::<Value>(text) else {
            return Err(format!("protocol: line {line_no} is not JSON"));
        };
        match event.get("type").and_then(Value::as_str) {
            Some("start") => {
                self.model = event.get("model").and_then(Value::as_str).map(String::from).or(self.model.take());
                self.external_session_id = event.get("externalSessionId").and_then(Value::as_str).map(String::from);
            }
            Some("text_delta") => on_delta(event.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("usage") => self.usage = Some(event),
            Some("error") => self.error_event = Some(event),
            Some("final") => {
                self.final_event = Some(event);
                return Ok(true);
            }
            _ => self.transcript.event(&event),
        }
        Ok(false)
    }

    /// A line read during the cancel grace: only a `final` (true: stop) or transcript events count.
    fn late_line(&mut self, text: &str) -> bool {
        let Ok(e) = serde_json::from_str::<Value>(text) else { return false };
        if e.get("type").and_then(Value::as_str) == Some("final") {
            self.final_event = Some(e);
            return true;
        }
        self.transcript.event(&e);
        false
    }

    /// Closes the transcript and picks the reply.
    pub fn finish(mut self) -> Read {
        let t = &mut self.transcript;
        t.close();
        let final_text =
            self.final_event.as_ref().and_then(|f| f.get("text")).and_then(Value::as_str).map(String::from);
        if !t.saw_message && final_text.as_deref().is_some_and(|t| !t.is_empty()) {
            t.push("assistant", Value::String(final_text.clone().unwrap_or_default()), Map::new());
        }
        let reply = final_text.filter(|t| !t.is_empty()).or(t.last_assistant_text.clone());
        let stop_reason =
            self.final_event.as_ref().and_then(|f| f.get("stopReason")).and_then(Value::as_str).map(String::from);
        let final_session = self.final_event.as_ref().and_then(|f| f.get("externalSessionId")).and_then(Value::as_str);
        Read {
            reply,
            messages: std::mem::take(&mut t.messages),
            usage: self.usage,
            model: self.model,
            stop_reason,
            external_session_id: final_session.map(String::from).or(self.external_session_id),
            final_event: self.final_event,
            error_event: self.error_event,
        }
    }
}

/// What to start for a run: the agent itself, or bwrap around it.
#[derive(Debug, Clone)]
pub struct Launch {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: std::path::PathBuf,
    /// Run the agent as this uid/gid (sandboxed runs of a root server).
    pub uid_gid: Option<(u32, u32)>,
}

/// Callbacks during a run: the supervisor's pid once started, and streamed text.
pub struct Hooks<'a> {
    pub on_spawn: &'a (dyn Fn(i32) + Send + Sync),
    pub on_delta: &'a (dyn Fn(&str) + Send + Sync),
}

/// Runs agent turns. Cheap to clone.
#[derive(Clone)]
pub struct Runner {
    /// This binary, which provides `supervise`.
    pub exe: std::path::PathBuf,
}

impl Runner {
    pub fn new() -> std::io::Result<Self> {
        Ok(Runner { exe: std::env::current_exe()? })
    }

    /// Executes one turn: `launch` says what to start (the agent, or bwrap around it); `spec`
    /// gives the limits; `cancel` ends the run early.
    pub async fn execute(
        &self,
        spec: &RunnerSpec,
        launch: &Launch,
        request: &Value,
        cancel: CancellationToken,
        hooks: &Hooks<'_>,
    ) -> Outcome {
        let run_id = request.get("runId").and_then(Value::as_str).unwrap_or("").to_string();
        let mut cmd = tokio::process::Command::new(&self.exe);
        cmd.arg("supervise")
            .arg("--deadline-ms")
            .arg((spec.timeout.as_millis() as u64 + spec.cancel_grace.as_millis() as u64 + 10_000).to_string());
        if let Some((uid, gid)) = launch.uid_gid {
            cmd.arg("--uid").arg(uid.to_string()).arg("--gid").arg(gid.to_string());
        }
        cmd.arg("--")
            .arg(&launch.program)
            .args(&launch.args)
            .current_dir(&launch.workdir)
            .env_clear()
            .envs(launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return Outcome::failed(format!("cannot start the supervisor: {e}")),
        };
        let pid = child.id().map(|p| p as i32);
        if let Some(p) = pid {
            (hooks.on_spawn)(p);
        }
        let mut stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let stderr_task = tokio::spawn(read_tail(stderr));
        let line = request.to_string() + "\n";
        let _ = stdin.write_all(line.as_bytes()).await;
        let _ = stdin.flush().await;

        let mut lines = FramedRead::new(stdout, LinesCodec::new_with_max_length(spec.max_line_bytes));
        let mut events = EventReader::new(&run_id);
        let mut total_bytes = 0usize;
        let deadline = tokio::time::Instant::now() + spec.timeout;
        let mut line_no = 0usize;
        let stop: Option<Stop> = loop {
            let idle = async {
                match spec.idle_timeout {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                biased;
                _ = cancel.cancelled() => break Some(Stop::Cancelled),
                _ = tokio::time::sleep_until(deadline) => break Some(Stop::Timeout),
                _ = idle => break Some(Stop::Idle),
                next = lines.next() => next,
            };
            let text = match next {
                None => break None,
                Some(Err(LinesCodecError::MaxLineLengthExceeded)) => {
                    break Some(Stop::Protocol(format!(
                        "protocol: line {} is longer than maxLineBytes ({})",
                        line_no + 1,
                        spec.max_line_bytes
                    )));
                }
                Some(Err(e)) => break Some(Stop::Protocol(format!("protocol: reading stdout: {e}"))),
                Some(Ok(t)) => t,
            };
            line_no += 1;
            total_bytes += text.len() + 1;
            if total_bytes > spec.max_stdout_bytes {
                break Some(Stop::Protocol(format!(
                    "protocol: stdout exceeded maxStdoutBytes ({})",
                    spec.max_stdout_bytes
                )));
            }
            match events.line(line_no, &text, hooks.on_delta) {
                Ok(false) => {}
                Ok(true) => break None,
                Err(e) => break Some(Stop::Protocol(e)),
            }
        };
        // Stop reading: after `final`, at EOF, or on a stop condition.
        let cancelled = matches!(stop, Some(Stop::Cancelled | Stop::Timeout));
        if cancelled {
            let _ = stdin.write_all(b"{\"type\":\"cancel\",\"reason\":\"timeout\"}\n").await;
            let _ = stdin.flush().await;
            // A final with stopReason "cancelled" within the grace is kept as the partial result.
            let grace = tokio::time::sleep(spec.cancel_grace);
            tokio::pin!(grace);
            loop {
                tokio::select! {
                    _ = &mut grace => break,
                    next = lines.next() => match next {
                        Some(Ok(t)) => {
                            if events.late_line(&t) {
                                break;
                            }
                        }
                        _ => break,
                    },
                }
            }
        }
        drop(stdin);
        let exit = match &stop {
            None => {
                match tokio::time::timeout(
                    if events.final_event.is_some() { EXIT_AFTER_FINAL } else { spec.cancel_grace },
                    child.wait(),
                )
                .await
                {
                    Ok(Ok(status)) => Some(status),
                    _ => {
                        terminate(pid);
                        child.wait().await.ok()
                    }
                }
            }
            Some(_) => {
                terminate(pid);
                child.wait().await.ok()
            }
        };
        let stderr_tail = stderr_task.await.unwrap_or_default();
        let exit_status = exit.and_then(|s| s.code());
        let read = events.finish();
        let (status, error) = match stop {
            Some(Stop::Cancelled) => (RunStatus::Cancelled, Some("cancelled".to_string())),
            Some(Stop::Timeout) => (RunStatus::Timeout, Some(format!("timed out after {}s", spec.timeout.as_secs()))),
            Some(Stop::Idle) => (
                RunStatus::Error,
                Some(format!("idle timeout: no output for {}s", spec.idle_timeout.map_or(0, |d| d.as_secs()))),
            ),
            Some(Stop::Protocol(e)) => (RunStatus::Error, Some(e)),
            None if read.final_event.is_some() && exit_status == Some(0) => (RunStatus::Ok, None),
            None => (
                RunStatus::Error,
                Some(failure_text(read.error_event.as_ref(), read.final_event.is_some(), exit_status, &stderr_tail)),
            ),
        };
        Outcome {
            status,
            reply: read.reply,
            messages: read.messages,
            usage: read.usage,
            model: read.model,
            stop_reason: read.stop_reason,
            external_session_id: read.external_session_id,
            error,
            exit_status,
            stderr_tail,
        }
    }
}

fn failure_text(error_event: Option<&Value>, had_final: bool, exit: Option<i32>, stderr: &str) -> String {
    if let Some(e) = error_event {
        let code = e.get("code").and_then(Value::as_str).unwrap_or("error");
        let msg = e.get("message").and_then(Value::as_str).unwrap_or("");
        return format!("{code}: {msg}");
    }
    let why = match (had_final, exit) {
        (false, Some(0)) => "the agent exited 0 without a final event".to_string(),
        (_, Some(code)) => format!("the agent exited with status {code}"),
        (_, None) => "the agent was killed by a signal".to_string(),
    };
    let tail: String =
        stderr.lines().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join(" | ");
    if tail.is_empty() { why } else { format!("{why}; stderr: {tail}") }
}

/// Asks the supervisor to end the run (it escalates through the group).
fn terminate(pid: Option<i32>) {
    if let Some(pid) = pid {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

/// Drains stderr, keeping its last 64 KiB.
async fn read_tail(mut stderr: tokio::process::ChildStderr) -> String {
    use tokio::io::AsyncReadExt;
    let mut tail: Vec<u8> = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > STDERR_TAIL {
            tail.drain(..tail.len() - STDERR_TAIL);
        }
    }
    String::from_utf8_lossy(&tail).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_calls_join_the_open_assistant_message_and_results_close_it() {
        let mut t = Transcript { run_id: "r".into(), ..Default::default() };
        t.event(&json!({"type": "tool_call", "id": "1", "name": "bash", "arguments": {"cmd": "ls"}}));
        t.event(&json!({"type": "tool_call", "id": "2", "name": "sessions_spawn",
                        "arguments": {"task": "x", "attachments": [{"name": "a", "content": "secret"}]}}));
        t.event(&json!({"type": "tool_result", "id": "1", "name": "bash", "content": "a.txt"}));
        t.event(&json!({"type": "message", "role": "assistant", "content": "done"}));
        t.close();
        assert_eq!(t.messages.len(), 3);
        assert_eq!(t.messages[0].content.as_array().unwrap().len(), 2);
        assert_eq!(t.messages[0].content[1]["arguments"]["attachments"][0]["content"], "[attachment content omitted]");
        assert_eq!(t.messages[1].role, "toolResult");
        assert_eq!(t.messages[1].extra.as_ref().unwrap()["toolName"], "bash");
        assert_eq!(t.last_assistant_text.as_deref(), Some("done"));
    }
}
