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
//!   `control_request`; so does the answer to an MCP server's elicitation, as the result its
//!   schema asks for (the decoder's `details.elicitation` says which requests are elicitations).
//! - Any other CLI: the prompt, then EOF; no steers.

use std::collections::HashMap;

use serde_json::{Map, Value, json};
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
    /// The `requestedSchema` (null when none) of each elicitation Claude Code asked, by request
    /// id, until it is answered: its answer is an elicitation result, not a permission verdict.
    elicitations: HashMap<String, Value>,
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
        let mut stdin = AgentStdin { channel, pipe, steers, taking, took_a_steer: false, elicitations: HashMap::new() };
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
            Channel::ClaudeStream => match self.elicitations.remove(id) {
                Some(schema) => control_response(id, elicitation_result(id, answer, &schema)),
                None => control_response(id, permission_verdict(answer)),
            },
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
    /// decides whether it takes steers (its `start` with `"steer": true`); Claude Code's
    /// elicitations are remembered for their answers; its first result (a `final` or an
    /// `error`) closes stdin, so that it exits once it has run every message it read.
    pub(super) fn observe(&mut self, events: &[Value]) {
        if self.channel == Channel::ClaudeStream {
            self.remember_elicitations(events);
        }
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

    /// Keeps the schema of each elicitation among the events: an `input_request` whose details
    /// carry the decoder's `elicitation`.
    fn remember_elicitations(&mut self, events: &[Value]) {
        for event in events.iter().filter(|e| e["type"] == "input_request") {
            if let (Some(id), Some(asked)) = (event["id"].as_str(), event.pointer("/details/elicitation")) {
                self.elicitations.insert(id.to_string(), asked["requestedSchema"].clone());
            }
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

/// Claude Code's `control_response` to its `control_request` `id`, carrying `response`.
fn control_response(id: &str, response: Value) -> String {
    let line = json!({"type": "control_response",
                      "response": {"subtype": "success", "request_id": id, "response": response}});
    format!("{line}\n")
}

/// The verdict on a `can_use_tool` request: allow (Claude Code runs the tool with the input it
/// asked about), or deny with the answer's text as the message its model gets as the tool's
/// result.
fn permission_verdict(answer: &InputAnswer) -> Value {
    match answer.decision {
        Decision::Allow => json!({"behavior": "allow"}),
        Decision::Deny => json!({"behavior": "deny", "message": answer.text.as_deref().unwrap_or(PERMISSION_DENIED)}),
    }
}

/// The result of the elicitation `id` (Claude Code's 2.1.328 bundle validates it as `{action:
/// "accept"|"decline"|"cancel", content?: record}`): deny declines; allow accepts with the
/// content the answer's text makes against the `requestedSchema`, or declines (with a warning)
/// when the text does not fit it, so the MCP server never gets content its schema refuses.
fn elicitation_result(id: &str, answer: &InputAnswer, schema: &Value) -> Value {
    if answer.decision == Decision::Deny {
        return json!({"action": "decline"});
    }
    match elicited_content(answer.text.as_deref(), schema) {
        Ok(content) => json!({"action": "accept", "content": content}),
        Err(why) => {
            tracing::warn!(request_id = id, %why, "the answer does not fit the elicitation's schema; declined");
            json!({"action": "decline"})
        }
    }
}

/// The content an answer's text makes: a JSON object as it is; otherwise the one property of a
/// one-property schema, filled from the text; nothing for a schema without properties.
fn elicited_content(text: Option<&str>, schema: &Value) -> Result<Map<String, Value>, String> {
    if let Some(Ok(Value::Object(content))) = text.map(serde_json::from_str::<Value>) {
        return Ok(content);
    }
    let properties = schema.get("properties").and_then(Value::as_object).filter(|p| !p.is_empty());
    let Some(properties) = properties else { return Ok(Map::new()) };
    let mut each = properties.iter();
    let (Some((name, property)), None) = (each.next(), each.next()) else {
        return Err(format!("the schema asks for {} properties and the text is no JSON object", properties.len()));
    };
    let text = text.ok_or_else(|| format!("the schema asks for {name:?} and the answer has no text"))?;
    let value =
        property_value(text, property).ok_or_else(|| format!("the answer's text does not fit {name:?}: {property}"))?;
    Ok(Map::from_iter([(name.clone(), value)]))
}

/// The text as the value of one schema property: one of its `enum` (or `oneOf` `const`) values
/// when it lists them, else a string, number, integer or boolean as its `type` says.
fn property_value(text: &str, property: &Value) -> Option<Value> {
    let listed: Vec<&Value> = match (property.get("enum"), property.get("oneOf")) {
        (Some(Value::Array(values)), _) => values.iter().collect(),
        (_, Some(Value::Array(options))) => options.iter().filter_map(|o| o.get("const")).collect(),
        _ => Vec::new(),
    };
    if !listed.is_empty() {
        return listed.into_iter().find(|v| v.as_str() == Some(text.trim())).cloned();
    }
    match property.get("type").and_then(Value::as_str)? {
        "string" => Some(text.into()),
        "number" => text.trim().parse::<f64>().ok().and_then(serde_json::Number::from_f64).map(Value::Number),
        "integer" => text.trim().parse::<i64>().ok().map(Value::from),
        "boolean" => text.trim().parse::<bool>().ok().map(Value::Bool),
        _ => None,
    }
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

    fn answer(decision: Decision, text: Option<&str>) -> InputAnswer {
        InputAnswer { decision, text: text.map(str::to_string) }
    }

    #[test]
    fn a_permission_answer_is_claude_codes_control_response_with_the_denial_as_its_message() {
        let v: Value =
            serde_json::from_str(&control_response("r1", permission_verdict(&answer(Decision::Allow, Some("fine")))))
                .unwrap();
        assert_eq!(
            v,
            json!({"type": "control_response",
                   "response": {"subtype": "success", "request_id": "r1", "response": {"behavior": "allow"}}})
        );
        let deny = permission_verdict(&answer(Decision::Deny, Some("not now")));
        assert_eq!(deny, json!({"behavior": "deny", "message": "not now"}));
        assert_eq!(permission_verdict(&answer(Decision::Deny, None))["message"], PERMISSION_DENIED);
    }

    /// A form's `requestedSchema` with these properties.
    fn form(properties: Value) -> Value {
        json!({"type": "object", "properties": properties})
    }

    fn elicited(decision: Decision, text: Option<&str>, schema: &Value) -> Value {
        elicitation_result("r1", &answer(decision, text), schema)
    }

    #[test]
    fn a_denied_elicitation_is_declined_whatever_its_text() {
        let schema = form(json!({"name": {"type": "string"}}));
        assert_eq!(elicited(Decision::Deny, Some("Ada"), &schema), json!({"action": "decline"}));
    }

    #[test]
    fn an_answer_that_is_a_json_object_is_the_content_as_it_is() {
        let schema = form(json!({"name": {"type": "string"}, "age": {"type": "integer"}}));
        assert_eq!(
            elicited(Decision::Allow, Some(r#"{"name": "Ada", "age": 36}"#), &schema),
            json!({"action": "accept", "content": {"name": "Ada", "age": 36}})
        );
    }

    #[test]
    fn the_text_fills_the_one_property_of_a_schema_as_its_type_says() {
        let one = |property: Value, text: &str| elicited(Decision::Allow, Some(text), &form(json!({"p": property})));
        let accepted = |value: Value| json!({"action": "accept", "content": {"p": value}});
        assert_eq!(one(json!({"type": "string"}), " main \n"), accepted(" main \n".into()));
        assert_eq!(one(json!({"type": "string", "enum": ["red", "blue"]}), "blue\n"), accepted("blue".into()));
        let titled = json!({"type": "string", "oneOf": [{"const": "a", "title": "A"}, {"const": "b", "title": "B"}]});
        assert_eq!(one(titled, "b"), accepted("b".into()));
        assert_eq!(one(json!({"type": "number"}), "2.5"), accepted(2.5.into()));
        assert_eq!(one(json!({"type": "integer"}), " 7"), accepted(7.into()));
        assert_eq!(one(json!({"type": "boolean"}), "true"), accepted(true.into()));
    }

    #[test]
    fn a_text_that_does_not_fit_the_one_property_is_declined() {
        let one = |property: Value, text: Option<&str>| elicited(Decision::Allow, text, &form(json!({"p": property})));
        let declined = json!({"action": "decline"});
        assert_eq!(one(json!({"type": "string", "enum": ["red", "blue"]}), Some("green")), declined);
        assert_eq!(one(json!({"type": "number"}), Some("many")), declined);
        assert_eq!(one(json!({"type": "integer"}), Some("2.5")), declined);
        assert_eq!(one(json!({"type": "boolean"}), Some("yes")), declined);
        assert_eq!(one(json!({"type": "array", "items": {"type": "string"}}), Some("a")), declined);
        assert_eq!(one(json!({"type": "string"}), None), declined, "no text fills no property");
    }

    #[test]
    fn a_schema_without_properties_is_accepted_with_empty_content() {
        let accepted = json!({"action": "accept", "content": {}});
        assert_eq!(elicited(Decision::Allow, Some("ok"), &form(json!({}))), accepted);
        assert_eq!(elicited(Decision::Allow, None, &Value::Null), accepted, "a URL elicitation has no schema");
    }

    #[test]
    fn a_text_for_a_schema_of_several_properties_is_declined() {
        let schema = form(json!({"name": {"type": "string"}, "age": {"type": "integer"}}));
        assert_eq!(elicited(Decision::Allow, Some("Ada"), &schema), json!({"action": "decline"}));
        assert_eq!(elicited(Decision::Allow, Some("[1]"), &schema), json!({"action": "decline"}), "not an object");
    }

    #[tokio::test]
    async fn claude_codes_elicitations_are_remembered_until_answered_and_its_permission_prompts_are_not() {
        let stream = args(&["--input-format", "stream-json"]);
        let mut stdin = AgentStdin::new(RunnerKind::ClaudeStreamJson, &stream, &Input::Prompt("x".into()), None, None);
        let schema = form(json!({"branch": {"type": "string"}}));
        stdin.observe(&[
            json!({"type": "input_request", "id": "e1", "kind": "question",
                   "details": {"elicitation": {"serverName": "s", "requestedSchema": schema}}}),
            json!({"type": "input_request", "id": "p1", "kind": "approval", "details": {"toolName": "Write"}}),
        ]);
        assert_eq!(stdin.elicitations, HashMap::from([("e1".to_string(), schema)]));
        let deadline = Instant::now() + Duration::from_secs(5);
        stdin.write_answer("e1", &answer(Decision::Allow, Some("main")), &CancellationToken::new(), deadline).await;
        assert!(stdin.elicitations.is_empty(), "an answered elicitation is forgotten");
    }

    #[test]
    fn an_elicitation_result_is_claude_codes_control_response() {
        let result = elicitation_result(
            "r9",
            &answer(Decision::Allow, Some("main")),
            &form(json!({"branch": {"type": "string"}})),
        );
        let v: Value = serde_json::from_str(&control_response("r9", result)).unwrap();
        assert_eq!(
            v,
            json!({"type": "control_response",
                   "response": {"subtype": "success", "request_id": "r9",
                                "response": {"action": "accept", "content": {"branch": "main"}}}})
        );
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
