//! The agent's stdin after the run started (docs/RUNNER-PROTOCOL.md, Steering and Asking): what
//! the input is written as, which [`Steer`]s go in and as what line, how the answers to input
//! requests go in, when stdin closes, and how a cancel reaches the agent (a control line, or a
//! signal once stdin is closed).
//!
//! - `jsonl/1`: the request line; stdin stays open for control lines. Steers go in as
//!   `{"type":"steer","text":…}` once the agent's first event, its `start`, said `"steer": true`;
//!   until that event they wait in their channel, and an agent that did not declare it gets none.
//!   Answers go in as `{"type":"input_response","id":…,"decision":…,"text":…}`.
//! - Claude Code started with `--input-format stream-json`: the prompt and each steer as a
//!   stream-json user message. Claude Code takes a message that arrives while it works into the
//!   running turn (beside the next tool result) or, when the model's answer was already on its
//!   way, runs it as one more turn of the same process, with its own `result`; it reads stdin to
//!   EOF and exits after the last queued message. So stdin closes at the first result, and a run
//!   that took a steer reads on to EOF: its last result is the run's. The answer to a permission
//!   prompt (`--permission-prompt-tool stdio`) goes in as the `control_response` to its
//!   `control_request`.
//! - Any other CLI: the prompt, then EOF; no steers.

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use super::{Decision, Input, InputAnswer, Steer, terminate};
use crate::config::RunnerKind;

/// What the agent reads on stdin, fixed when the run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Channel {
    /// `jsonl/1` control lines: `cancel`, and `steer` for an agent that declared it.
    Jsonl,
    /// Claude Code's `--input-format stream-json` user messages, until its first result.
    ClaudeStream,
    /// A CLI's prompt, then EOF.
    Prompt,
}

impl Channel {
    fn of(kind: RunnerKind, argv: &[String], input: &Input) -> Self {
        match input {
            Input::Request(_) => Channel::Jsonl,
            Input::Prompt(_) if kind == RunnerKind::ClaudeStreamJson && asks_for_stream_input(argv) => {
                Channel::ClaudeStream
            }
            Input::Prompt(_) => Channel::Prompt,
        }
    }
}

/// Whether Claude Code's argv says `--input-format stream-json` (or `--input-format=stream-json`).
fn asks_for_stream_input(argv: &[String]) -> bool {
    argv.iter().any(|a| a == "--input-format=stream-json")
        || argv.windows(2).any(|pair| pair[0] == "--input-format" && pair[1] == "stream-json")
}

/// Whether steers go in now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taking {
    /// A `jsonl/1` agent before its first event: steers wait in their channel.
    Undecided,
    Yes,
    No,
}

/// The agent's stdin and the steers for its turn.
pub(super) struct AgentStdin {
    channel: Channel,
    pipe: Option<ChildStdin>,
    steers: Option<UnboundedReceiver<Steer>>,
    taking: Taking,
    took_a_steer: bool,
}

impl AgentStdin {
    pub(super) fn new(
        kind: RunnerKind,
        argv: &[String],
        input: &Input,
        pipe: Option<ChildStdin>,
        steers: Option<UnboundedReceiver<Steer>>,
    ) -> Self {
        let channel = Channel::of(kind, argv, input);
        let taking = match channel {
            Channel::Jsonl => Taking::Undecided,
            Channel::ClaudeStream => Taking::Yes,
            Channel::Prompt => Taking::No,
        };
        let mut stdin = AgentStdin { channel, pipe, steers, taking, took_a_steer: false };
        if taking == Taking::No {
            stdin.refuse_steers();
        }
        stdin
    }

    /// Writes the run's input, bounded by the run's deadline (an agent that never reads stdin
    /// fills the pipe); false when the deadline came first. A plain CLI's stdin closes after it:
    /// it reads its prompt up to EOF.
    pub(super) async fn write_input(&mut self, input: &Input, deadline: Instant) -> bool {
        let bytes = match (input, self.channel) {
            (Input::Request(request), _) => format!("{request}\n"),
            (Input::Prompt(prompt), Channel::ClaudeStream) => user_message(prompt),
            (Input::Prompt(prompt), _) => prompt.clone(),
        };
        let written = match self.pipe.as_mut() {
            Some(pipe) => tokio::time::timeout_at(deadline, write(pipe, bytes.as_bytes())).await.is_ok(),
            None => true,
        };
        if self.channel == Channel::Prompt {
            self.pipe = None;
        }
        written
    }

    /// The next steer to write; never resolves while steers cannot go in (or none can come).
    pub(super) async fn next_steer(&mut self) -> Steer {
        let open = self.taking == Taking::Yes && self.pipe.is_some();
        match self.steers.as_mut().filter(|_| open) {
            Some(rx) => match rx.recv().await {
                Some(steer) => steer,
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }

    /// Writes one steer into the turn and answers it.
    pub(super) async fn write_steer(&mut self, steer: Steer, cancel: &CancellationToken, deadline: Instant) {
        let line = match self.channel {
            Channel::ClaudeStream => user_message(&steer.text),
            _ => format!("{}\n", json!({"type": "steer", "text": steer.text})),
        };
        let taken = self.write_control(&line, cancel, deadline).await;
        let _ = steer.taken.send(taken);
        self.took_a_steer |= taken;
    }

    /// Writes the answer to the agent's input request `id` into the turn; an agent whose stdin
    /// is already closed does not get it.
    pub(super) async fn write_answer(
        &mut self,
        id: &str,
        answer: &InputAnswer,
        cancel: &CancellationToken,
        deadline: Instant,
    ) {
        let line = match self.channel {
            Channel::ClaudeStream => permission_response(id, answer),
            _ => input_response(id, answer),
        };
        self.write_control(&line, cancel, deadline).await;
    }

    /// Writes one line after the input; whether it went in. A write the cancel or the deadline
    /// cut short (the agent stopped reading stdin), or one the agent refused (its stdin closed),
    /// leaves stdin unusable: it is closed and steers are refused from then on.
    async fn write_control(&mut self, line: &str, cancel: &CancellationToken, deadline: Instant) -> bool {
        let written = match self.pipe.as_mut() {
            Some(pipe) => tokio::select! {
                biased;
                written = write(pipe, line.as_bytes()) => written.is_ok(),
                _ = cancel.cancelled() => false,
                _ = tokio::time::sleep_until(deadline) => false,
            },
            None => false,
        };
        if !written {
            self.pipe = None;
            self.refuse_steers();
        }
        written
    }

    /// What the events of one stdout line say about stdin: a `jsonl/1` agent's first event
    /// decides whether it takes steers (its `start` with `"steer": true`); Claude Code's first
    /// result (a `final` or an `error`) closes stdin, so that it exits once it has run every
    /// message it read.
    pub(super) fn observe(&mut self, events: &[Value]) {
        let is = |ty: &str| events.iter().any(|e| e.get("type").and_then(Value::as_str) == Some(ty));
        match self.channel {
            Channel::Jsonl if self.taking == Taking::Undecided && !events.is_empty() => {
                let declared = events.iter().any(|e| e["type"] == "start" && e["steer"] == true);
                self.taking = if declared { Taking::Yes } else { Taking::No };
                if !declared {
                    self.refuse_steers();
                }
            }
            Channel::ClaudeStream if self.pipe.is_some() && (is("final") || is("error")) => {
                self.pipe = None;
                self.refuse_steers();
            }
            _ => {}
        }
    }

    /// Whether reading goes on past a `final`: Claude Code may run a steer it took as one more
    /// turn after the result it had under way, and exits (stdout EOF) after its last one.
    pub(super) fn reads_past_final(&self) -> bool {
        self.channel == Channel::ClaudeStream && self.took_a_steer
    }

    /// Takes no more steers: the channel closes (a later send fails) and those still in it are
    /// answered false.
    pub(super) fn refuse_steers(&mut self) {
        self.taking = Taking::No;
        if let Some(mut rx) = self.steers.take() {
            refuse(&mut rx);
        }
    }

    /// Asks the agent to stop: the cancel line to a `jsonl/1` agent whose stdin is open (bounded
    /// by the grace), else SIGTERM through its supervisor (stdin closed first).
    pub(super) async fn cancel(&mut self, pid: Option<i32>, grace: Duration) {
        match (self.channel, self.pipe.as_mut()) {
            (Channel::Jsonl, Some(pipe)) => {
                let line = b"{\"type\":\"cancel\",\"reason\":\"timeout\"}\n";
                let _ = tokio::time::timeout(grace, write(pipe, line)).await;
            }
            _ => {
                self.pipe = None;
                terminate(pid);
            }
        }
    }
}

/// Closes a steer channel (a later send fails) and answers the steers still in it false.
pub(super) fn refuse(steers: &mut UnboundedReceiver<Steer>) {
    steers.close();
    while let Ok(steer) = steers.try_recv() {
        let _ = steer.taken.send(false);
    }
}

/// One `jsonl/1` `input_response` line: the answer to the agent's request `id`.
fn input_response(id: &str, answer: &InputAnswer) -> String {
    let decision = match answer.decision {
        Decision::Allow => "allow",
        Decision::Deny => "deny",
    };
    let mut line = json!({"type": "input_response", "id": id, "decision": decision});
    if let Some(text) = &answer.text {
        line["text"] = text.as_str().into();
    }
    format!("{line}\n")
}

/// Claude Code's `control_response` to its `can_use_tool` request `id`: allow (it runs the tool
/// with the input it asked about), or deny with the answer's text as the message its model gets
/// as the tool's result.
fn permission_response(id: &str, answer: &InputAnswer) -> String {
    let verdict = match answer.decision {
        Decision::Allow => json!({"behavior": "allow"}),
        Decision::Deny => json!({"behavior": "deny", "message": answer.text.as_deref().unwrap_or(PERMISSION_DENIED)}),
    };
    let line = json!({"type": "control_response",
                      "response": {"subtype": "success", "request_id": id, "response": verdict}});
    format!("{line}\n")
}

/// What Claude Code's model reads for a permission denied without a text.
const PERMISSION_DENIED: &str = "Permission denied: the tool was not run.";

/// One Claude Code stream-json input line: a user message with `text` as its one text block.
fn user_message(text: &str) -> String {
    let message = json!({"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": text}]}});
    format!("{message}\n")
}

async fn write(pipe: &mut ChildStdin, bytes: &[u8]) -> std::io::Result<()> {
    pipe.write_all(bytes).await?;
    pipe.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_claude_code_asked_for_stream_json_input_gets_the_stream_channel() {
        let prompt = Input::Prompt("hi".into());
        let claude = RunnerKind::ClaudeStreamJson;
        let stream = args(&["-p", "--input-format", "stream-json", "--output-format", "stream-json"]);
        assert_eq!(Channel::of(claude, &stream, &prompt), Channel::ClaudeStream);
        assert_eq!(Channel::of(claude, &args(&["-p", "--input-format=stream-json"]), &prompt), Channel::ClaudeStream);
        assert_eq!(Channel::of(claude, &args(&["-p", "--input-format", "text"]), &prompt), Channel::Prompt);
        assert_eq!(Channel::of(claude, &args(&["-p", "--output-format", "stream-json"]), &prompt), Channel::Prompt);
        assert_eq!(Channel::of(RunnerKind::Text, &stream, &prompt), Channel::Prompt);
        assert_eq!(Channel::of(RunnerKind::Jsonl, &[], &Input::Request(json!({}))), Channel::Jsonl);
    }

    #[test]
    fn a_user_message_is_one_stream_json_line_with_one_text_block() {
        let line = user_message("say \"hi\"\nthen stop");
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            v,
            json!({"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": "say \"hi\"\nthen stop"}]}})
        );
    }

    #[test]
    fn an_input_response_is_one_line_with_the_request_id_and_its_text_only_when_there_is_one() {
        let allow = InputAnswer { decision: Decision::Allow, text: Some("yes\nreally".into()) };
        let line = input_response("q1", &allow);
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v, json!({"type": "input_response", "id": "q1", "decision": "allow", "text": "yes\nreally"}));
        let v: Value =
            serde_json::from_str(&input_response("q2", &InputAnswer { decision: Decision::Deny, text: None })).unwrap();
        assert_eq!(v, json!({"type": "input_response", "id": "q2", "decision": "deny"}));
    }

    #[test]
    fn a_permission_answer_is_claude_codes_control_response_with_the_denial_as_its_message() {
        let allow = InputAnswer { decision: Decision::Allow, text: Some("fine".into()) };
        let v: Value = serde_json::from_str(&permission_response("r1", &allow)).unwrap();
        assert_eq!(
            v,
            json!({"type": "control_response",
                   "response": {"subtype": "success", "request_id": "r1", "response": {"behavior": "allow"}}})
        );
        let deny = InputAnswer { decision: Decision::Deny, text: Some("not now".into()) };
        let v: Value = serde_json::from_str(&permission_response("r2", &deny)).unwrap();
        assert_eq!(v["response"]["response"], json!({"behavior": "deny", "message": "not now"}));
        let bare = InputAnswer { decision: Decision::Deny, text: None };
        let v: Value = serde_json::from_str(&permission_response("r3", &bare)).unwrap();
        assert_eq!(v["response"]["response"]["message"], PERMISSION_DENIED);
    }

    fn steer(text: &str) -> (Steer, tokio::sync::oneshot::Receiver<bool>) {
        let (taken, answer) = tokio::sync::oneshot::channel();
        (Steer { text: text.into(), taken }, answer)
    }

    #[test]
    fn steers_waiting_when_a_jsonl_agent_declares_none_are_refused_and_later_sends_fail() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (early, mut answer) = steer("early");
        tx.send(early).ok().unwrap();
        let mut stdin = AgentStdin::new(RunnerKind::Jsonl, &[], &Input::Request(json!({})), None, Some(rx));
        stdin.observe(&[]);
        assert_eq!(stdin.taking, Taking::Undecided, "a blank line decides nothing");
        stdin.observe(&[json!({"type": "start", "model": "m"})]);
        assert_eq!(answer.try_recv(), Ok(false));
        assert!(tx.send(steer("late").0).is_err(), "the channel is closed");
    }

    #[test]
    fn a_jsonl_start_with_steer_true_opens_steering() {
        let mut stdin = AgentStdin::new(RunnerKind::Jsonl, &[], &Input::Request(json!({})), None, None);
        stdin.observe(&[json!({"type": "start", "steer": true})]);
        assert_eq!(stdin.taking, Taking::Yes);
        assert!(!stdin.reads_past_final(), "a jsonl agent's final ends the run");
    }

    #[test]
    fn a_plain_cli_refuses_steers_from_the_start() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let stdin =
            AgentStdin::new(RunnerKind::ClaudeStreamJson, &args(&["-p"]), &Input::Prompt("x".into()), None, Some(rx));
        assert_eq!(stdin.taking, Taking::No);
        assert!(tx.send(steer("x").0).is_err());
    }

    #[tokio::test]
    async fn a_steer_with_no_stdin_to_write_to_is_answered_false() {
        let stream = args(&["--input-format", "stream-json"]);
        let mut stdin = AgentStdin::new(RunnerKind::ClaudeStreamJson, &stream, &Input::Prompt("x".into()), None, None);
        let (s, mut answer) = steer("x");
        stdin.write_steer(s, &CancellationToken::new(), Instant::now() + Duration::from_secs(5)).await;
        assert_eq!(answer.try_recv(), Ok(false));
        assert!(!stdin.reads_past_final());
    }
}
