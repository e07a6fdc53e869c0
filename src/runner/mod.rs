//! The runner: one agent turn as a supervised subprocess (docs/RUNNER-PROTOCOL.md).
//! [`Runner::execute`] starts `sessions-mcp-supervise -- <agent>`, writes its [`Input`] (a `jsonl/1`
//! request line, or a CLI's prompt), reads stdout through the agent kind's [`adapters`] decoder as
//! `jsonl/1` events under the line, byte, idle and run-time limits, forwards `text_delta`s, writes
//! [`Steer`]s into a turn whose agent takes them (`stdin`), hands the turn's [`InputRequest`]s to
//! the engine and writes its answers back (`asking`), handles cancellation (cancel line or
//! signal, grace, then the supervisor's group kill) and returns an [`Outcome`]: the status, the
//! reply, the messages to persist, usage and errors.
//! It never touches the store: the runtime persists the outcome. A remote agent's turn
//! (`kind: "a2a"`) is no process but an A2A task, with the same hooks and [`Outcome`] ([`a2a`]).

pub mod a2a;
pub mod adapters;
mod asking;
pub mod discover;
pub mod login;
pub mod mcp_config;
pub mod orphans;
pub mod protocol;
pub mod sandbox;
mod spec;
mod stdin;
pub mod supervise;
mod sweep;
pub mod template;
pub mod worktree;

use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Map, Value, json};
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;

use crate::store::NewMessage;
pub use crate::store::RunStatus;

pub use spec::{
    AgentRunner, ECHO_WARNING, LoginCheck, RunnerSpec, agent_runner, effective_runner, host_agent, is_echo,
    missing_adapter_flags, resolve_runner,
};

use adapters::Decoder;
use asking::Asking;
use stdin::AgentStdin;

/// A message for the running turn; `taken` answers whether it was written into the turn (true)
/// or the agent cannot take one now (false: not declared, stdin closed, after final, run ending).
pub struct Steer {
    pub text: String,
    pub taken: tokio::sync::oneshot::Sender<bool>,
}

/// What a running turn asks for: leave to go on (an approval) or an answer (a question).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    Approval,
    Question,
}

/// The answer's verdict; a question answered with text is `Allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny,
}

/// The answer to an [`InputRequest`], written into the turn as its `input_response`.
#[derive(Debug, Clone)]
pub struct InputAnswer {
    pub decision: Decision,
    pub text: Option<String>,
}

/// A question or approval the running turn asks; answer it on `answer`. Dropping `answer`
/// unanswered answers the turn deny ("the request was dropped unanswered"), so it does not wait
/// on it. The runner drops its side when the run ends with the request open, so a failed send on
/// `answer` (or `answer.is_closed()`) means the turn no longer waits for it: it was withdrawn.
pub struct InputRequest {
    /// The agent's id for the request, unique among the run's open requests.
    pub id: String,
    pub kind: InputKind,
    pub text: String,
    pub options: Option<serde_json::Value>,
    pub details: Option<serde_json::Value>,
    pub answer: tokio::sync::oneshot::Sender<InputAnswer>,
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
/// The supervisor's SIGINT → SIGTERM → SIGKILL takes three of its 1 s steps; past this it is
/// stopped or stuck and the server kills it and its group itself.
const SUPERVISOR_ESCALATION: Duration = Duration::from_secs(5);
/// How long stderr may stay open after the run's processes ended (only an escaper holds it).
const STDERR_DRAIN: Duration = Duration::from_secs(2);

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
                if is_spawn_tool(&s("name")) {
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
                self.last_assistant_text = Some(protocol::content_text(&content));
                self.saw_message = true;
                self.push("assistant", content, Map::new());
            }
            _ => {}
        }
    }
}

/// Our spawn tool by its bare name or under any prefix a CLI gives MCP tools (Claude Code's
/// `mcp__<server>__`, others use `<server>.` or `<server>-`). Matching a suffix errs towards
/// omitting content: the transcript loses only a copy of what the child received.
fn is_spawn_tool(name: &str) -> bool {
    name.ends_with("sessions_spawn")
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

/// What to start for a run: the agent itself, or bwrap around it.
#[derive(Debug, Clone)]
pub struct Launch {
    pub run_id: String,
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: std::path::PathBuf,
    /// Run the agent as this uid/gid (sandboxed runs of a root server).
    pub uid_gid: Option<(u32, u32)>,
}

/// What the agent reads on stdin.
#[derive(Debug, Clone)]
pub enum Input {
    /// `jsonl/1`: one request line; stdin stays open for control lines (`cancel`).
    Request(Value),
    /// CLI adapters: the rendered prompt, then EOF; cancellation is by signal only. Claude Code
    /// started with `--input-format stream-json` gets it as a user message instead, and stdin
    /// stays open for steers until its first result.
    Prompt(String),
}

/// Callbacks during a run: the supervisor's pid once started, streamed text, where the turn's
/// input requests go (None: every request is answered deny, "this run cannot ask"), and each
/// `usage` event as it arrives, so budgets can stop a run mid-way.
pub struct Hooks<'a> {
    pub on_spawn: &'a (dyn Fn(i32) + Send + Sync),
    pub on_delta: &'a (dyn Fn(&str) + Send + Sync),
    pub on_input: Option<&'a tokio::sync::mpsc::UnboundedSender<InputRequest>>,
    /// Every `usage` event of the run, in arrival order, as soon as it is decoded and exactly as
    /// [`Outcome::usage`] would keep it: the run's usage so far (with `"cumulative": true`, the
    /// CLI's own session totals), each one replacing the one before.
    pub on_usage: Option<&'a (dyn Fn(&Value) + Send + Sync)>,
    /// True when the run starts waiting for an answer to its input requests, false when the
    /// last open one is answered: the run's deadline stands still meanwhile (a person reading
    /// is not the run's time), and so may whatever else counts the run's time (a runtime budget).
    pub on_waiting: Option<&'a (dyn Fn(bool) + Send + Sync)>,
}

impl Hooks<'static> {
    /// Hooks that listen to nothing, for reading a stdout without a run.
    fn silent() -> Self {
        Hooks { on_spawn: &|_| {}, on_delta: &|_| {}, on_input: None, on_usage: None, on_waiting: None }
    }
}

/// Runs agent turns. Cheap to clone.
#[derive(Clone)]
pub struct Runner {
    /// This binary (the scripted agent, `connect`, bound into a sandbox).
    pub exe: std::path::PathBuf,
    /// `sessions-mcp-supervise`, beside it: every run starts through it.
    pub supervisor: std::path::PathBuf,
    /// The run-id sweep every run's end waits for, one `/proc` scan for many runs.
    sweeper: sweep::Sweeper,
}

/// The limits a run's outcome names when it hit one.
#[derive(Default, Clone, Copy)]
struct Limits {
    timeout: Duration,
    idle: Option<Duration>,
}

impl Limits {
    fn of(spec: &RunnerSpec) -> Self {
        Limits { timeout: spec.timeout, idle: spec.idle_timeout }
    }
}

/// What the events of a run add up to while it is read.
struct Collected {
    transcript: Transcript,
    usage: Option<Value>,
    /// Every report so far, checked (`policy::usage`): what `usage` is built from.
    reported: crate::policy::usage::UsageSoFar,
    model: Option<String>,
    external_session_id: Option<String>,
    final_event: Option<Value>,
    error_event: Option<Value>,
    /// Whether the agent wrote any event at all (a CLI that exits before its first line failed to
    /// start, which its failure says).
    saw_event: bool,
}

impl Collected {
    fn new(run_id: &str) -> Self {
        Collected {
            transcript: Transcript { run_id: run_id.to_string(), ..Default::default() },
            usage: None,
            reported: Default::default(),
            model: None,
            external_session_id: None,
            final_event: None,
            error_event: None,
            saw_event: false,
        }
    }

    /// Takes the events of one line in order; true once `final` came (the rest is ignored).
    /// Reading goes on past a `final` only for a CLI that ran a steer as a further turn: a later
    /// `final` or `error` then replaces the earlier result, so the run ends as its last turn did.
    /// Text deltas and usage reach `hooks` as they are taken.
    fn take(&mut self, events: Vec<Value>, hooks: &Hooks) -> bool {
        self.saw_event |= !events.is_empty();
        for event in events {
            let s = |k: &str| event.get(k).and_then(Value::as_str).map(String::from);
            match event.get("type").and_then(Value::as_str) {
                Some("start") => {
                    self.model = s("model").filter(|m| !m.is_empty()).or(self.model.take());
                    self.external_session_id = s("externalSessionId").or(self.external_session_id.take());
                }
                Some("text_delta") => (hooks.on_delta)(event.get("text").and_then(Value::as_str).unwrap_or("")),
                Some("usage") => self.take_usage(&event, hooks),
                Some("error") => {
                    self.supersede_result();
                    self.error_event = Some(event);
                }
                Some("final") => {
                    self.supersede_result();
                    self.external_session_id = s("externalSessionId").or(self.external_session_id.take());
                    self.final_event = Some(event);
                    return true;
                }
                _ => self.transcript.event(&event),
            }
        }
        false
    }

    /// A usage report is untrusted: only its valid, non-decreasing amounts count (the first value
    /// ignored is logged once and named in the run's usage as `rejected`).
    fn take_usage(&mut self, report: &Value, hooks: &Hooks) {
        let had_rejected = self.reported.rejected().is_some();
        let usage = self.reported.take(report);
        if let (false, Some(why)) = (had_rejected, self.reported.rejected()) {
            tracing::warn!(run = %self.transcript.run_id, "a usage report of the agent was ignored: {why}");
        }
        let Some(usage) = usage else { return };
        if let Some(on_usage) = hooks.on_usage {
            on_usage(&usage);
        }
        self.usage = Some(usage);
    }

    /// Forgets an earlier turn's result (a `final`, and an `error` before it) when another comes.
    fn supersede_result(&mut self) {
        if self.final_event.take().is_some() {
            self.error_event = None;
        }
    }

    fn outcome(mut self, stop: Option<Stop>, limits: Limits, exit_status: Option<i32>, stderr_tail: String) -> Outcome {
        self.transcript.close();
        let field =
            |k: &str| self.final_event.as_ref().and_then(|f| f.get(k)).and_then(Value::as_str).map(String::from);
        let (final_text, stop_reason) = (field("text"), field("stopReason"));
        if !self.transcript.saw_message && final_text.as_deref().is_some_and(|t| !t.is_empty()) {
            self.transcript.push("assistant", Value::String(final_text.clone().unwrap_or_default()), Map::new());
        }
        let reply = final_text.filter(|t| !t.is_empty()).or(self.transcript.last_assistant_text.clone());
        let (status, error) = match stop {
            Some(Stop::Cancelled) => (RunStatus::Cancelled, Some("cancelled".to_string())),
            Some(Stop::Timeout) => (RunStatus::Timeout, Some(format!("timed out after {}s", limits.timeout.as_secs()))),
            Some(Stop::Idle) => (
                RunStatus::Error,
                Some(format!("idle timeout: no output for {}s", limits.idle.map_or(0, |d| d.as_secs()))),
            ),
            Some(Stop::Protocol(e)) => (RunStatus::Error, Some(e)),
            None if self.final_event.is_some() && exit_status == Some(0) => (RunStatus::Ok, None),
            None => (
                RunStatus::Error,
                Some(failure_text(self.error_event.as_ref(), self.final_event.is_some(), exit_status, &stderr_tail)),
            ),
        };
        Outcome {
            status,
            reply,
            messages: self.transcript.messages,
            usage: self.usage,
            model: self.model,
            stop_reason,
            external_session_id: self.external_session_id,
            error,
            exit_status,
            stderr_tail,
        }
    }
}

/// Reads a whole stdout the way a run reads it, without a process: the transcript messages and the
/// reply it adds up to. The fuzz targets drive the decoders and the event rules through this.
pub fn decode_stdout(kind: crate::config::RunnerKind, run_id: &str, stdout: &str) -> (Vec<NewMessage>, Option<String>) {
    let mut decoder = adapters::decoder(kind);
    let mut collected = Collected::new(run_id);
    let silent = Hooks::silent();
    let mut stop = None;
    for (n, line) in stdout.lines().enumerate() {
        let Ok(events) = decoder.line(line) else {
            stop = Some(Stop::Protocol(format!("protocol: line {} is not JSON", n + 1)));
            break;
        };
        if collected.take(events, &silent) {
            break;
        }
    }
    if stop.is_none() && collected.final_event.is_none() {
        collected.take(decoder.end(), &silent);
    }
    let outcome = collected.outcome(stop, Limits::default(), Some(0), String::new());
    (outcome.messages, outcome.reply)
}

impl Runner {
    /// The runner of this process, which becomes the last subreaper of its runs
    /// ([`orphans`]).
    pub fn new() -> std::io::Result<Self> {
        let runner = Runner::at(std::env::current_exe()?);
        orphans::adopt_orphans();
        Ok(runner)
    }

    /// The runner of the `sessions-mcp` binary at `exe`.
    pub fn at(exe: std::path::PathBuf) -> Self {
        let supervisor = supervisor_beside(&exe);
        if !supervisor.is_file() {
            tracing::warn!(path = %supervisor.display(), "the run supervisor is missing: every run will fail to start");
        }
        Runner { exe, supervisor, sweeper: sweep::Sweeper::default() }
    }

    /// Executes one turn: `launch` says what to start (the agent, or bwrap around it); `spec`
    /// gives the limits and the kind of agent; `cancel` ends the run early; `steers` brings
    /// messages for the running turn, each answered on its `taken` (false for any left when the
    /// turn can take no more); the turn's input requests go to `hooks.on_input`, and those still
    /// open when the turn ends are dropped.
    pub async fn execute(
        &self,
        spec: &RunnerSpec,
        launch: &Launch,
        input: &Input,
        cancel: CancellationToken,
        hooks: &Hooks<'_>,
        mut steers: Option<tokio::sync::mpsc::UnboundedReceiver<Steer>>,
    ) -> Outcome {
        let (mut child, _started) = match orphans::spawn(&mut self.supervised(spec, launch)) {
            Ok(c) => c,
            Err(e) => {
                if let Some(rx) = steers.as_mut() {
                    stdin::refuse(rx);
                }
                let what = if e.kind() == std::io::ErrorKind::NotFound && !self.supervisor.is_file() {
                    format!("{} is missing (it is installed beside sessions-mcp)", self.supervisor.display())
                } else {
                    e.to_string()
                };
                return Outcome::failed(format!("cannot start the supervisor: {what}"));
            }
        };
        let pid = child.id().map(|p| p as i32);
        if let Some(p) = pid {
            (hooks.on_spawn)(p);
        }
        let mut stdin = AgentStdin::new(spec.kind, &launch.args, input, child.stdin.take(), steers);
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr_cutoff = CancellationToken::new();
        let mut stderr_task =
            tokio::spawn(read_tail(child.stderr.take().expect("piped stderr"), stderr_cutoff.clone()));
        let deadline = tokio::time::Instant::now() + spec.timeout;
        let written = stdin.write_input(input, deadline).await;

        let mut lines = FramedRead::new(stdout, LinesCodec::new_with_max_length(spec.max_line_bytes));
        let mut decoder = adapters::decoder(spec.kind);
        let mut collected = Collected::new(&launch.run_id);
        let stop = if written {
            let asking = Asking::new(hooks.on_input, &launch.run_id);
            let mut reading = Reading {
                spec,
                deadline,
                waiting_since: None,
                supervisor: pid,
                cancel: &cancel,
                hooks,
                stdin: &mut stdin,
                asking,
            };
            reading.events(&mut lines, decoder.as_mut(), &mut collected).await
        } else {
            Some(Stop::Timeout)
        };
        stdin.refuse_steers();
        if matches!(stop, Some(Stop::Cancelled | Stop::Timeout)) {
            stdin.cancel(pid, spec.cancel_grace).await;
            // A final with stopReason "cancelled" within the grace is kept as the partial result.
            let grace = tokio::time::sleep(spec.cancel_grace);
            tokio::pin!(grace);
            loop {
                tokio::select! {
                    _ = &mut grace => break,
                    next = lines.next() => match next {
                        Some(Ok(t)) => {
                            let events = decoder.line(&t).unwrap_or_default();
                            if collected.take(events, hooks) {
                                break;
                            }
                        }
                        _ => break,
                    },
                }
            }
        }
        drop(stdin);
        let wait = if collected.final_event.is_some() { EXIT_AFTER_FINAL } else { spec.cancel_grace };
        let mut exit = None;
        if stop.is_none() {
            exit = tokio::time::timeout(wait, child.wait()).await.ok().and_then(Result::ok);
        }
        if exit.is_none() {
            exit = stop_supervisor(&mut child, pid).await;
        }
        end_orphaned_group(pid, exit.as_ref(), &launch.run_id);
        self.sweeper.sweep(&launch.run_id).await;
        // What still holds stderr open now escaped the tree: it must not hold the run open too.
        let stderr_tail = match tokio::time::timeout(STDERR_DRAIN, &mut stderr_task).await {
            Ok(tail) => tail.unwrap_or_default(),
            Err(_) => {
                stderr_cutoff.cancel();
                stderr_task.await.unwrap_or_default()
            }
        };
        let before_any_output = stop.is_none() && !collected.saw_event;
        let code = exit.and_then(|s| s.code());
        let mut outcome = collected.outcome(stop, Limits::of(spec), code, stderr_tail);
        // Only for CLIs: a jsonl agent is a program of the operator's, whose own words suffice.
        if let (true, true, Some(code)) = (before_any_output, spec.cli.is_some(), code.filter(|c| *c != 0)) {
            outcome.error = Some(exited_silently(spec, code, &outcome.stderr_tail));
        }
        outcome
    }

    /// `sessions-mcp-supervise [--uid U --gid G] -- <program> <args>` with the run's environment.
    fn supervised(&self, spec: &RunnerSpec, launch: &Launch) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.supervisor);
        cmd.arg("--deadline-ms")
            .arg((spec.timeout.as_millis() as u64 + spec.cancel_grace.as_millis() as u64 + 10_000).to_string());
        if let Some(mask) = crate::privacy::user_umask() {
            cmd.arg("--umask").arg(mask.to_string());
        }
        if let Some((uid, gid)) = launch.uid_gid {
            cmd.arg("--uid").arg(uid.to_string()).arg("--gid").arg(gid.to_string());
        }
        cmd.arg("--server-sweeps")
            .arg("--")
            .arg(&launch.program)
            .args(&launch.args)
            .current_dir(&launch.workdir)
            .env_clear()
            .envs(launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }
}

/// What reading a run's stdout needs besides the stream: its limits, its stop signals, the
/// callbacks, its stdin (for steers and answers, and for what the events say about stdin) and
/// the turn's open input requests.
struct Reading<'r, 'h> {
    spec: &'r RunnerSpec,
    /// When the run times out; moved later by the time it waited for answers.
    deadline: tokio::time::Instant,
    /// Since when the run has been waiting for an answer (its deadline stands still).
    waiting_since: Option<tokio::time::Instant>,
    /// The supervisor, whose own deadline (the backstop) stands still with ours.
    supervisor: Option<i32>,
    cancel: &'r CancellationToken,
    hooks: &'r Hooks<'h>,
    stdin: &'r mut AgentStdin,
    asking: Asking<'r>,
}

/// What woke the reading loop.
enum Wake {
    Line(Option<Result<String, LinesCodecError>>),
    Steer(Steer),
    Answer(String, InputAnswer),
    Stopped(Stop),
}

impl Reading<'_, '_> {
    /// Reads stdout until `final` (past it, to EOF, for a CLI that ran a steer as a further
    /// turn), EOF (then the decoder's end events) or a stop condition, writing steers and the
    /// answers to input requests meanwhile. Neither the idle timer nor the deadline runs while a
    /// request is open: the idle timer starts afresh when the last one is answered, and the
    /// deadline moves later by the time waited (the request's own timeout bounds the wait).
    async fn events(
        &mut self,
        lines: &mut FramedRead<tokio::process::ChildStdout, LinesCodec>,
        decoder: &mut dyn Decoder,
        collected: &mut Collected,
    ) -> Option<Stop> {
        let (mut line_no, mut total_bytes) = (0usize, 0usize);
        let idle = self.spec.idle_timeout;
        let idle_from_now = || idle.map(|d| tokio::time::Instant::now() + d);
        let mut idle_at = idle_from_now();
        loop {
            let text = match self.wake(lines, idle_at.filter(|_| !self.asking.waiting())).await {
                Wake::Stopped(stop) => return Some(stop),
                Wake::Steer(steer) => {
                    self.stdin.write_steer(steer, self.cancel, self.deadline).await;
                    continue;
                }
                Wake::Answer(id, answer) => {
                    self.follow_waiting();
                    self.stdin.write_answer(&id, &answer, self.cancel, self.deadline).await;
                    if !self.asking.waiting() {
                        idle_at = idle_from_now();
                    }
                    continue;
                }
                Wake::Line(None) => {
                    collected.take(decoder.end(), self.hooks);
                    return None;
                }
                Wake::Line(Some(Err(LinesCodecError::MaxLineLengthExceeded))) => {
                    return Some(Stop::Protocol(format!(
                        "protocol: line {} is longer than maxLineBytes ({})",
                        line_no + 1,
                        self.spec.max_line_bytes
                    )));
                }
                Wake::Line(Some(Err(e))) => return Some(Stop::Protocol(format!("protocol: reading stdout: {e}"))),
                Wake::Line(Some(Ok(t))) => t,
            };
            idle_at = idle_from_now();
            line_no += 1;
            total_bytes += text.len() + 1;
            if total_bytes > self.spec.max_stdout_bytes {
                return Some(Stop::Protocol(format!(
                    "protocol: stdout exceeded maxStdoutBytes ({})",
                    self.spec.max_stdout_bytes
                )));
            }
            let Ok(events) = decoder.line(&text) else {
                let hint = missing_adapter_flags(self.spec).map(|fix| format!(" ({fix})")).unwrap_or_default();
                return Some(Stop::Protocol(format!("protocol: line {line_no} is not JSON{hint}")));
            };
            self.stdin.observe(&events);
            for request in events.iter().filter(|e| e.get("type").and_then(Value::as_str) == Some("input_request")) {
                if let Some((id, refusal)) = self.asking.ask(request) {
                    self.stdin.write_answer(&id, &refusal, self.cancel, self.deadline).await;
                }
            }
            self.follow_waiting();
            if collected.take(events, self.hooks) && !self.stdin.reads_past_final() {
                return None;
            }
        }
    }

    /// Holds the deadline (ours, the supervisor's, the hook's listeners') when the run starts
    /// waiting for an answer, and moves it later by the time waited when the last one came.
    fn follow_waiting(&mut self) {
        let now = tokio::time::Instant::now();
        let waiting = match (self.asking.waiting(), self.waiting_since) {
            (true, None) => {
                self.waiting_since = Some(now);
                true
            }
            (false, Some(since)) => {
                self.deadline += now - since;
                self.waiting_since = None;
                false
            }
            _ => return,
        };
        if let Some(pid) = self.supervisor {
            let signal = if waiting { supervise::HOLD_SIGNAL } else { supervise::RELEASE_SIGNAL };
            // SAFETY: kill has no memory-safety preconditions; the supervisor is our unreaped child.
            unsafe {
                libc::kill(pid, signal);
            }
        }
        if let Some(on_waiting) = self.hooks.on_waiting {
            on_waiting(waiting);
        }
    }

    /// Waits for the next stdout line, a steer, an answer, or a reason to stop (cancel first).
    async fn wake(
        &mut self,
        lines: &mut FramedRead<tokio::process::ChildStdout, LinesCodec>,
        idle_at: Option<tokio::time::Instant>,
    ) -> Wake {
        let idle = async {
            match idle_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let deadline = async {
            match self.waiting_since {
                None => tokio::time::sleep_until(self.deadline).await,
                Some(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Wake::Stopped(Stop::Cancelled),
            _ = deadline => Wake::Stopped(Stop::Timeout),
            _ = idle => Wake::Stopped(Stop::Idle),
            next = lines.next() => Wake::Line(next),
            steer = self.stdin.next_steer() => Wake::Steer(steer),
            (id, answer) = self.asking.next_answer() => Wake::Answer(id, answer),
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

/// The failure of an agent that exited non-zero before writing a single event: it did not get to
/// work at all, so say what to check — for a CLI that tells a missing sign-in by its exit code
/// (Gemini CLI's 41), what to do about that.
fn exited_silently(spec: &RunnerSpec, code: i32, stderr: &str) -> String {
    let tail: String =
        stderr.lines().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join(" | ");
    let tail = if tail.is_empty() { String::new() } else { format!("; stderr: {tail}") };
    if spec.kind == crate::config::RunnerKind::GeminiStreamJson && code == 41 {
        return format!(
            "not_logged_in: Gemini CLI is not signed in for this agent: run `gemini` once and choose how to sign in (a Google login needs runner.home \"inherit\", which preset \"gemini\" sets), or pass GEMINI_API_KEY (runner.env.passthrough; preset \"gemini\" passes it){tail}"
        );
    }
    format!(
        "\"{}\" exited with status {code} before writing any output: it did not start its work; run it by hand as the run would (`sessions-mcp doctor` shows the command line) and check its login and flags{tail}",
        spec.command
    )
}

/// `sessions-mcp-supervise` beside the `sessions-mcp` at `exe`. A test binary of the library runs
/// from `target/<profile>/deps/`, one below the binaries cargo built.
fn supervisor_beside(exe: &std::path::Path) -> std::path::PathBuf {
    let dir = exe.parent().unwrap_or(std::path::Path::new("."));
    let here = dir.join(supervise::BINARY);
    if !here.is_file()
        && dir.file_name().is_some_and(|n| n == "deps")
        && let Some(up) = dir.parent().map(|d| d.join(supervise::BINARY)).filter(|p| p.is_file())
    {
        return up;
    }
    here
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

/// Ends the supervisor: asked first, killed when it has not exited by the end of its escalation
/// (the agent may have stopped it with SIGSTOP, or it is stuck).
async fn stop_supervisor(child: &mut tokio::process::Child, pid: Option<i32>) -> Option<std::process::ExitStatus> {
    terminate(pid);
    if let Ok(status) = tokio::time::timeout(SUPERVISOR_ESCALATION, child.wait()).await {
        return status.ok();
    }
    let _ = child.start_kill();
    child.wait().await.ok()
}

/// A supervisor that exited by itself has ended its group; one that died by a signal (SIGKILLed
/// by its own agent, by the OOM killer, or by [`stop_supervisor`]) left the group to the server;
/// what left the group as well is found by the run-id sweep that follows every run.
/// The group's id stays reserved while any member lives, so the kill cannot reach a stranger.
fn end_orphaned_group(pgid: Option<i32>, supervisor: Option<&std::process::ExitStatus>, run_id: &str) {
    use std::os::unix::process::ExitStatusExt;
    let Some(pgid) = pgid else { return };
    if supervisor.is_some_and(|s| s.signal().is_none()) {
        return;
    }
    tracing::warn!(run_id, pgid, "the run's supervisor died; the server ends its process group");
    // SAFETY: killpg has no memory-safety preconditions.
    unsafe {
        libc::killpg(pgid, libc::SIGKILL);
    }
}

/// Drains stderr, keeping its last 64 KiB.
/// Stops early, with what it has, when `cutoff` is cancelled.
async fn read_tail(mut stderr: tokio::process::ChildStderr, cutoff: CancellationToken) -> String {
    use tokio::io::AsyncReadExt;
    let mut tail: Vec<u8> = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = tokio::select! {
            read = stderr.read(&mut buf) => match read {
                Ok(n) if n > 0 => n,
                _ => break,
            },
            _ = cutoff.cancelled() => break,
        };
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
    fn decode_stdout_reads_a_whole_stdout_like_a_run_and_never_keeps_attachment_content() {
        let out = concat!(
            r#"{"type":"start","model":"m"}"#,
            "\n",
            r#"{"type":"tool_call","id":"1","name":"sessions_spawn","arguments":{"task":"t","attachments":[{"name":"a","content":"secret"}]}}"#,
            "\n",
            r#"{"type":"final","text":"done"}"#,
            "\n",
        );
        let (messages, reply) = decode_stdout(crate::config::RunnerKind::Jsonl, "r", out);
        assert_eq!(reply.as_deref(), Some("done"));
        assert!(!messages.is_empty());
        assert!(messages.iter().all(|m| !m.content.to_string().contains("secret")), "{messages:?}");
        let (_, reply) = decode_stdout(crate::config::RunnerKind::Text, "r", "plain\ntext\n");
        assert_eq!(reply.as_deref(), Some("plain\ntext"));
    }

    #[test]
    fn a_later_result_replaces_the_earlier_one_and_an_error_before_a_final_is_kept() {
        let ignore = Hooks::silent();
        let mut c = Collected::new("r");
        assert!(c.take(vec![json!({"type": "final", "text": "first"})], &ignore));
        assert!(c.take(vec![json!({"type": "final", "text": "second"})], &ignore));
        let outcome = c.outcome(None, Limits::default(), Some(0), String::new());
        assert_eq!((outcome.status, outcome.reply.as_deref()), (RunStatus::Ok, Some("second")));

        let mut c = Collected::new("r");
        c.take(vec![json!({"type": "final", "text": "first"})], &ignore);
        c.take(vec![json!({"type": "error", "code": "overloaded", "message": "later turn"})], &ignore);
        let outcome = c.outcome(None, Limits::default(), Some(0), String::new());
        assert_eq!(outcome.status, RunStatus::Error, "the last turn failed: {outcome:?}");
        assert_eq!(outcome.error.as_deref(), Some("overloaded: later turn"));

        let mut c = Collected::new("r");
        c.take(vec![json!({"type": "error", "code": "warn", "message": "m"}), json!({"type": "final"})], &ignore);
        let outcome = c.outcome(None, Limits::default(), Some(1), String::new());
        assert_eq!(
            outcome.error.as_deref(),
            Some("warn: m"),
            "a jsonl agent's error before its final names the failure"
        );
    }

    #[test]
    fn every_usage_reaches_on_usage_in_order_and_the_last_one_is_the_outcome_s() {
        let seen = std::sync::Mutex::new(Vec::new());
        let record = |u: &Value| seen.lock().unwrap().push(u.clone());
        let hooks = Hooks { on_usage: Some(&record), ..Hooks::silent() };
        let usage = |n: i64| json!({"type": "usage", "inputTokens": n, "outputTokens": n});
        let mut c = Collected::new("r");
        c.take(vec![usage(1), json!({"type": "text_delta", "text": "x"})], &hooks);
        c.take(vec![usage(5), json!({"type": "final", "text": "done"})], &hooks);
        assert_eq!(*seen.lock().unwrap(), [usage(1), usage(5)]);
        assert_eq!(c.outcome(None, Limits::default(), Some(0), String::new()).usage, Some(usage(5)));
    }

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
