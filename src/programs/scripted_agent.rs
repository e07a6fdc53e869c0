//! The built-in scripted agent: `sessions-mcp agent --script FILE` speaks `jsonl/1` and answers
//! from rules in a JSON script. Tests and demos use it; it needs no model and no network. With no
//! script it echoes (`ECHO: <input>`), except in a spawn's Notes step, where it has nothing to add
//! (`ANNOUNCE_SKIP`): the zero-config agent `main` runs it so that `serve` works out of the box.
//!
//! Script: `{"rules": [{"match": {...}, ...actions}], "default": {...actions}}`. The first rule
//! whose `match` fits the request wins. Match keys (all optional): `mode`, `input` (substring),
//! `inputRegex`, `session` (exact key), `sessionPrefix`, `turn` (1-based count of user messages
//! including this one). Actions: `reply` (text; `{input}` is replaced, and `{1}`…`{9}` by the
//! capture groups of the rule's `inputRegex`), `messages` (assistant
//! texts emitted as `message` events before the final), `toolCalls` (`[{name, arguments, result}]`
//! emitted as `tool_call` + `tool_result`), `usage` (one usage object, or a list of them emitted in
//! order, `usageIntervalMs` apart — default 0 — with a cancel line during a wait ending the turn:
//! each is the run's usage so far), `sleepMs`, `deltas` (emit the reply as
//! `text_delta`s), `error` (`{code, message}`), `exitCode`, `ignoreCancel`, `noFinal`,
//! `invalidJson`, `floodBytes`, `call` (a session tool called back through the run socket; or a list, in order),
//! `steer` (declare `"steer": true` in `start`, so the runner writes steer lines), `awaitSteerMs`
//! (wait up to N ms for a steer line; a cancel line still ends the turn), `{steer}` in `reply`
//! (the texts of the steer lines read so far, one per line; empty if none), `ask` (one
//! `{kind, text, options?, details?, id?}` or a list: after `sleepMs`, emit each as an
//! `input_request` — `id` defaults to `ask<N>`, `{input}` in `text` is replaced — then wait for
//! every matching `input_response`, steer lines still read and a cancel line still ending the
//! turn; before `awaitSteerMs`), and `{answer}` / `{decision}` in `reply` (the responses' texts /
//! decisions, in the order asked, one per line).

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value, json};

use crate::runner::protocol::{ANNOUNCE_SKIP, content_text};

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Script {
    #[serde(default)]
    pub rules: Vec<Rule>,
    #[serde(default)]
    pub default: Option<Actions>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    #[serde(default, rename = "match")]
    pub when: Match,
    #[serde(flatten)]
    pub actions: Actions,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Match {
    pub mode: Option<String>,
    pub input: Option<String>,
    pub input_regex: Option<String>,
    pub session: Option<String>,
    pub session_prefix: Option<String>,
    pub turn: Option<u64>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Actions {
    pub reply: Option<String>,
    #[serde(default)]
    pub messages: Vec<String>,
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// Usage reports, emitted in order before the final: one object or a list.
    #[serde(default, deserialize_with = "one_or_many")]
    pub usage: Vec<Map<String, Value>>,
    /// The wait between two usage reports (a cancel line still ends the turn).
    #[serde(default)]
    pub usage_interval_ms: u64,
    pub sleep_ms: Option<u64>,
    #[serde(default)]
    pub deltas: bool,
    pub error: Option<Value>,
    pub exit_code: Option<u8>,
    #[serde(default)]
    pub ignore_cancel: bool,
    #[serde(default)]
    pub no_final: bool,
    #[serde(default)]
    pub invalid_json: bool,
    pub flood_bytes: Option<u64>,
    /// Calls a session tool back through the server as this run's session (the result is
    /// emitted as tool_call + tool_result; `{result}` in `reply` is its structured content);
    /// a list calls each in order (`{result}`: the last one's).
    #[serde(default, deserialize_with = "one_or_many")]
    pub call: Vec<Call>,
    /// Declares in `start` that the agent takes steer lines.
    #[serde(default)]
    pub steer: bool,
    /// Waits up to this long for a steer line before going on (cancel lines still end the turn).
    pub await_steer_ms: Option<u64>,
    /// Input requests emitted after `sleepMs`; the turn waits for all their answers.
    #[serde(default, deserialize_with = "one_or_many")]
    pub ask: Vec<Ask>,
}

/// One input request the turn makes (docs/RUNNER-PROTOCOL.md, Asking). `kind` is any string, so
/// that a script can make a malformed request.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ask {
    /// `ask<N>` (its 1-based place in `ask`) when absent.
    pub id: Option<String>,
    pub kind: String,
    #[serde(default)]
    pub text: String,
    pub options: Option<Value>,
    pub details: Option<Value>,
}

/// `ask` or `usage` as one item or a list of them.
fn one_or_many<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany<T> {
        Many(Vec<T>),
        One(Box<T>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(item) => vec![*item],
        OneOrMany::Many(items) => items,
    })
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Call {
    pub tool: String,
    #[serde(default)]
    pub arguments: Value,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
    #[serde(default)]
    pub result: Value,
}

/// The input without the server's inter-session marker line (rules match what the peer wrote).
fn strip_marker(text: &str) -> String {
    match text.strip_prefix("[Inter-session message]") {
        Some(rest) => rest.split_once('\n').map_or("", |(_, body)| body).to_string(),
        None => text.to_string(),
    }
}

impl Match {
    fn fits(&self, req: &Value, input: &str) -> bool {
        let s = |k: &str| req.get(k).and_then(Value::as_str).unwrap_or("");
        let turn = req
            .get("messages")
            .and_then(Value::as_array)
            .map_or(0, |m| m.iter().filter(|x| x.get("role").and_then(Value::as_str) == Some("user")).count())
            as u64
            + 1;
        self.mode.as_deref().is_none_or(|m| m == s("mode"))
            && self.input.as_deref().is_none_or(|i| input.contains(i))
            && self.input_regex.as_deref().is_none_or(|r| regex::Regex::new(r).is_ok_and(|re| re.is_match(input)))
            && self.session.as_deref().is_none_or(|k| k == s("sessionKey"))
            && self.session_prefix.as_deref().is_none_or(|p| s("sessionKey").starts_with(p))
            && self.turn.is_none_or(|t| t == turn)
    }
}

impl Script {
    pub fn load(path: &Path) -> Result<Script, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn actions_for(&self, req: &Value, input: &str) -> Actions {
        self.rule_for(req, input)
            .map(|r| r.actions.clone())
            .or_else(|| self.default.clone())
            .unwrap_or_else(|| built_in(req))
    }

    fn rule_for(&self, req: &Value, input: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.when.fits(req, input))
    }

    /// What `{input}` and `{1}`…`{9}` stand for in this turn's reply and call arguments.
    fn fill_for(&self, req: &Value, input: &str) -> Fill {
        let groups =
            self.rule_for(req, input)
                .and_then(|r| r.when.input_regex.as_deref())
                .and_then(|re| {
                    regex::Regex::new(re).ok()?.captures(input).map(|c| {
                        c.iter().skip(1).map(|g| g.map_or(String::new(), |g| g.as_str().to_string())).collect()
                    })
                })
                .unwrap_or_default();
        Fill { input: input.to_string(), groups }
    }
}

/// What the agent does when no rule fits and the script has no default: echo the input. Not in
/// a spawn's Notes step: its input is the server's Notes prompt, and an echo would repeat that
/// prompt into every announce of a zero-config spawn; the echo agent has no notes to add.
fn built_in(req: &Value) -> Actions {
    let notes_step = req.get("mode").and_then(Value::as_str) == Some("announce")
        && req.get("announceKind").and_then(Value::as_str) == Some("subagent");
    let reply = if notes_step { ANNOUNCE_SKIP } else { "ECHO: {input}" };
    Actions { reply: Some(reply.into()), ..Default::default() }
}

/// The placeholders of a turn: `{input}` and the capture groups `{1}`…`{9}`.
struct Fill {
    input: String,
    groups: Vec<String>,
}

impl Fill {
    fn apply(&self, text: &str) -> String {
        let mut out = text.replace("{input}", &self.input);
        for (i, g) in self.groups.iter().enumerate().take(9) {
            out = out.replace(&format!("{{{}}}", i + 1), g);
        }
        out
    }

    /// The placeholders inside the string values of call arguments.
    fn apply_value(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.apply(s)),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.apply_value(x)).collect()),
            Value::Object(o) => Value::Object(o.iter().map(|(k, x)| (k.clone(), self.apply_value(x))).collect()),
            other => other.clone(),
        }
    }
}

fn emit(out: &mut impl Write, event: Value) {
    let _ = writeln!(out, "{event}");
    let _ = out.flush();
}

/// Runs one turn: reads the request line from stdin, answers on stdout.
pub fn run(script: Option<&Path>) -> ExitCode {
    let script = match script.map(Script::load).transpose() {
        Ok(s) => s.unwrap_or_default(),
        Err(e) => {
            eprintln!("sessions-mcp agent: {e}");
            return ExitCode::from(2);
        }
    };
    let stdin = std::io::stdin();
    let mut line = String::new();
    if stdin.lock().read_line(&mut line).is_err() || line.trim().is_empty() {
        eprintln!("sessions-mcp agent: no request line on stdin");
        return ExitCode::from(2);
    }
    let req: Value = match serde_json::from_str(&line) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("sessions-mcp agent: request is not JSON: {e}");
            return ExitCode::from(2);
        }
    };
    let input = strip_marker(&content_text(req.get("input").and_then(|i| i.get("content")).unwrap_or(&Value::Null)));
    let a = script.actions_for(&req, &input);
    let fill = script.fill_for(&req, &input);
    let mut control = Control::watch(a.ignore_cancel);
    let mut out = std::io::stdout().lock();
    let mut start = json!({"type": "start", "model": req.get("model")});
    if a.steer {
        start["steer"] = true.into();
    }
    emit(&mut out, start);
    if a.invalid_json {
        let _ = writeln!(out, "this is not json");
        let _ = out.flush();
    }
    if let Some(n) = a.flood_bytes {
        let chunk = json!({"type": "text_delta", "text": "x".repeat(1000)}).to_string();
        let mut sent = 0;
        while sent < n {
            if writeln!(out, "{chunk}").is_err() {
                break;
            }
            sent += chunk.len() as u64 + 1;
        }
    }
    if !pause(&a, &fill, &mut control, &mut out) {
        return cancelled(&mut out);
    }
    for (i, call) in a.tool_calls.iter().enumerate() {
        let id = format!("call{}", i + 1);
        emit(&mut out, json!({"type": "tool_call", "id": id, "name": call.name, "arguments": call.arguments}));
        emit(
            &mut out,
            json!({"type": "tool_result", "id": id, "name": call.name, "content": call.result, "isError": false}),
        );
    }
    let mut call_result = Value::Null;
    for call in &a.call {
        let arguments = fill.apply_value(&call.arguments);
        emit(&mut out, json!({"type": "tool_call", "id": "callback", "name": call.tool, "arguments": arguments}));
        let (result, is_error) = match call_back(&call.tool, &arguments) {
            Ok(r) => {
                let e = r.get("isError").and_then(Value::as_bool).unwrap_or(false);
                (r, e)
            }
            Err(e) => (json!({"error": e}), true),
        };
        call_result = result.get("structuredContent").cloned().unwrap_or(result.clone());
        emit(
            &mut out,
            json!({"type": "tool_result", "id": "callback", "name": call.tool, "content": call_result.to_string(), "isError": is_error}),
        );
    }
    for m in &a.messages {
        emit(&mut out, json!({"type": "message", "role": "assistant", "content": m}));
    }
    let reply = fill
        .apply(a.reply.as_deref().unwrap_or(""))
        .replace("{result}", &call_result.to_string())
        .replace("{steer}", &control.steer_text())
        .replace("{answer}", &control.answered(|a| &a.text))
        .replace("{decision}", &control.answered(|a| &a.decision));
    if a.deltas {
        for chunk in reply.as_bytes().chunks(8) {
            emit(&mut out, json!({"type": "text_delta", "text": String::from_utf8_lossy(chunk)}));
        }
    }
    if !report_usage(&a, &mut control, &mut out) {
        return cancelled(&mut out);
    }
    if let Some(e) = &a.error {
        let mut e = e.clone();
        e["type"] = json!("error");
        emit(&mut out, e);
    }
    if !a.no_final && a.error.is_none() {
        emit(&mut out, json!({"type": "final", "text": reply, "stopReason": "end_turn"}));
    }
    ExitCode::from(a.exit_code.unwrap_or(if a.error.is_some() { 1 } else { 0 }))
}

/// Ends a turn a cancel line ended: a final with what it has (nothing).
fn cancelled(out: &mut impl Write) -> ExitCode {
    emit(out, json!({"type": "final", "text": "", "stopReason": "cancelled"}));
    ExitCode::SUCCESS
}

/// Emits the usage reports in order, `usageIntervalMs` apart; false when a cancel line came
/// during a wait between two.
fn report_usage(a: &Actions, control: &mut Control, out: &mut impl Write) -> bool {
    let interval = Duration::from_millis(a.usage_interval_ms);
    for (n, report) in a.usage.iter().enumerate() {
        if n > 0 && !interval.is_zero() && !control.wait(Some(interval), Until::Elapsed) {
            return false;
        }
        let mut usage = report.clone();
        usage.insert("type".into(), "usage".into());
        emit(out, Value::Object(usage));
    }
    true
}

/// Sleeps, asks and waits for a steer as the actions say, in that order; false when a cancel
/// line came first.
fn pause(a: &Actions, fill: &Fill, control: &mut Control, out: &mut impl Write) -> bool {
    let ms = |ms: u64| Some(Duration::from_millis(ms));
    if let Some(sleep) = a.sleep_ms
        && !control.wait(ms(sleep), Until::Elapsed)
    {
        return false;
    }
    for (n, ask) in a.ask.iter().enumerate() {
        let id = ask.id.clone().unwrap_or_else(|| format!("ask{}", n + 1));
        let mut request = json!({"type": "input_request", "id": id, "kind": ask.kind, "text": fill.apply(&ask.text)});
        for (key, value) in [("options", &ask.options), ("details", &ask.details)] {
            if let Some(value) = value {
                request[key] = value.clone();
            }
        }
        emit(out, request);
        control.asked.push(id);
    }
    if !control.asked.is_empty() && !control.wait(None, Until::Answered) {
        return false;
    }
    a.await_steer_ms.is_none_or(|wait| control.wait(ms(wait), Until::Steered))
}

/// Calls a session tool through the owner's socket with this run's token.
fn call_back(tool: &str, arguments: &Value) -> Result<Value, String> {
    let socket = std::env::var("SESSIONS_MCP_SOCKET").map_err(|_| "SESSIONS_MCP_SOCKET is not set".to_string())?;
    let token = std::env::var("SESSIONS_MCP_TOKEN").map_err(|_| "SESSIONS_MCP_TOKEN is not set".to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let client = crate::programs::connect::SocketClient::new(Path::new(&socket), &token);
    rt.block_on(client.call_tool(tool, arguments)).map_err(|e| e.to_string())
}

/// What a wait waits for, besides a cancel line.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Until {
    /// All of its time.
    Elapsed,
    /// A steer line (or its time).
    Steered,
    /// An answer to every request asked (no time limit: the run's own limits apply).
    Answered,
}

/// A control line the agent acts on.
#[derive(Debug, PartialEq)]
enum ControlLine {
    Cancel,
    Steer(String),
    Answer { id: String, answer: Answer },
}

/// An `input_response`'s decision and text (`""` when it has none).
#[derive(Debug, PartialEq)]
struct Answer {
    decision: String,
    text: String,
}

/// Reads one stdin line after the request; None for what the agent ignores.
fn control_line(line: &str) -> Option<ControlLine> {
    let control: Value = serde_json::from_str(line).ok()?;
    let s = |k: &str| control.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    match control.get("type").and_then(Value::as_str)? {
        "cancel" => Some(ControlLine::Cancel),
        "steer" => Some(ControlLine::Steer(s("text"))),
        "input_response" => {
            Some(ControlLine::Answer { id: s("id"), answer: Answer { decision: s("decision"), text: s("text") } })
        }
        _ => None,
    }
}

/// The control lines on stdin after the request, read by one thread: `cancel` sets a flag
/// (unless told to ignore it), each `steer` and `input_response` is queued for the turn.
struct Control {
    cancelled: std::sync::Arc<std::sync::atomic::AtomicBool>,
    lines: std::sync::mpsc::Receiver<ControlLine>,
    steered: Vec<String>,
    /// The ids of the turn's input requests, in the order asked.
    asked: Vec<String>,
    answers: std::collections::HashMap<String, Answer>,
}

impl Control {
    fn watch(ignore_cancel: bool) -> Self {
        let cancelled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tx, lines) = std::sync::mpsc::channel();
        let flag = cancelled.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                match control_line(&line) {
                    Some(ControlLine::Cancel) if !ignore_cancel => {
                        flag.store(true, std::sync::atomic::Ordering::Relaxed)
                    }
                    Some(ControlLine::Cancel) | None => {}
                    Some(queued) => {
                        let _ = tx.send(queued);
                    }
                }
            }
        });
        Control { cancelled, lines, steered: Vec::new(), asked: Vec::new(), answers: Default::default() }
    }

    /// Waits up to `limit` (None: no limit), less once `until` is reached, keeping the steers
    /// and answers that arrive; false when a cancel line came first. Once stdin has closed no
    /// answer can come: a wait for answers ends then.
    fn wait(&mut self, limit: Option<Duration>, until: Until) -> bool {
        let deadline = limit.map(|l| std::time::Instant::now() + l);
        loop {
            if self.cancelled.load(std::sync::atomic::Ordering::Relaxed) {
                return false;
            }
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            if left.is_some_and(|l| l.is_zero()) || self.reached(until) {
                return true;
            }
            let step = left.map_or(Duration::from_millis(20), |l| l.min(Duration::from_millis(20)));
            match self.lines.recv_timeout(step) {
                Ok(line) => self.keep(line),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) if until == Until::Answered => return true,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(step),
            }
        }
    }

    fn reached(&self, until: Until) -> bool {
        match until {
            Until::Elapsed => false,
            Until::Steered => !self.steered.is_empty(),
            Until::Answered => self.asked.iter().all(|id| self.answers.contains_key(id)),
        }
    }

    fn keep(&mut self, line: ControlLine) {
        match line {
            ControlLine::Steer(text) => self.steered.push(text),
            ControlLine::Answer { id, answer } => {
                self.answers.insert(id, answer);
            }
            ControlLine::Cancel => {}
        }
    }

    /// The texts of every steer line read so far, one per line.
    fn steer_text(&mut self) -> String {
        while let Ok(line) = self.lines.try_recv() {
            self.keep(line);
        }
        self.steered.join("\n")
    }

    /// One field of each answer, in the order asked, one per line (empty for one not answered).
    fn answered(&self, field: impl Fn(&Answer) -> &String) -> String {
        let empty = String::new();
        self.asked.iter().map(|id| self.answers.get(id).map_or(&empty, &field).as_str()).collect::<Vec<_>>().join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(text: &str) -> Script {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn first_matching_rule_wins_and_default_echoes() {
        let s = script(
            r#"{"rules": [{"match": {"input": "ping"}, "reply": "pong"},
                          {"match": {"mode": "reply", "turn": 2}, "reply": "second"}]}"#,
        );
        let req = json!({"mode": "send", "messages": []});
        assert_eq!(s.actions_for(&req, "ping me").reply.as_deref(), Some("pong"));
        assert_eq!(s.actions_for(&req, "other").reply.as_deref(), Some("ECHO: {input}"));
        let req = json!({"mode": "reply", "messages": [{"role": "user", "content": "a"}]});
        assert_eq!(s.actions_for(&req, "x").reply.as_deref(), Some("second"));
    }

    #[test]
    fn the_echo_adds_no_notes_to_a_spawn_announce_but_echoes_every_other_turn() {
        let echo = Script::default();
        let notes = json!({"mode": "announce", "announceKind": "subagent", "messages": []});
        assert_eq!(echo.actions_for(&notes, "Write short notes").reply.as_deref(), Some("ANNOUNCE_SKIP"));
        let a2a = json!({"mode": "announce", "announceKind": "agent_to_agent", "messages": []});
        assert_eq!(echo.actions_for(&a2a, "x").reply.as_deref(), Some("ECHO: {input}"));
        let spawn = json!({"mode": "spawn", "messages": []});
        assert_eq!(echo.actions_for(&spawn, "task").reply.as_deref(), Some("ECHO: {input}"));
    }

    #[test]
    fn capture_groups_of_the_matching_rule_fill_reply_and_call_arguments() {
        let s = script(r#"{"rules": [{"match": {"inputRegex": "^relay (\\S+) (\\d+)$"}, "reply": "sent {2}"}]}"#);
        let req = json!({"mode": "send", "messages": []});
        let fill = s.fill_for(&req, "relay agent:b:main 42");
        assert_eq!(fill.apply("sent {2} to {1} ({input})"), "sent 42 to agent:b:main (relay agent:b:main 42)");
        let args = fill.apply_value(&json!({"sessionKey": "{1}", "message": ["n={2}"], "timeoutSeconds": 0}));
        assert_eq!(args, json!({"sessionKey": "agent:b:main", "message": ["n=42"], "timeoutSeconds": 0}));
        assert_eq!(s.fill_for(&req, "no match").apply("{1}|{input}"), "{1}|no match");
    }

    #[test]
    fn ask_takes_one_request_or_a_list() {
        let one = script(r#"{"default": {"ask": {"kind": "approval", "text": "May I?"}}}"#);
        let asks = one.default.unwrap().ask;
        assert_eq!((asks.len(), asks[0].kind.as_str(), asks[0].id.as_deref()), (1, "approval", None));
        let many = script(r#"{"default": {"ask": [{"id": "a", "kind": "question"}, {"kind": "approval"}]}}"#);
        assert_eq!(many.default.unwrap().ask.len(), 2);
        assert!(serde_json::from_str::<Script>(r#"{"default": {"ask": {"text": "no kind"}}}"#).is_err());
    }

    #[test]
    fn usage_takes_one_report_or_a_list_of_objects() {
        let one = script(r#"{"default": {"usage": {"inputTokens": 1}}}"#).default.unwrap();
        assert_eq!((one.usage.len(), one.usage_interval_ms), (1, 0));
        let many = script(r#"{"default": {"usage": [{"inputTokens": 1}, {"inputTokens": 2}], "usageIntervalMs": 5}}"#);
        let many = many.default.unwrap();
        assert_eq!((many.usage.len(), many.usage_interval_ms), (2, 5));
        assert!(script(r#"{"default": {}}"#).default.unwrap().usage.is_empty());
        assert!(serde_json::from_str::<Script>(r#"{"default": {"usage": 3}}"#).is_err());
    }

    /// A control whose stdin thread has read a cancel line (or not), with no line queued.
    fn control(cancel_read: bool) -> Control {
        let (_, lines) = std::sync::mpsc::channel();
        Control {
            cancelled: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(cancel_read)),
            lines,
            steered: Vec::new(),
            asked: Vec::new(),
            answers: Default::default(),
        }
    }

    fn usage_series(interval_ms: u64) -> Actions {
        let usage = (1..=3).map(|n| json!({"inputTokens": n * 10}).as_object().unwrap().clone()).collect();
        Actions { usage, usage_interval_ms: interval_ms, ..Default::default() }
    }

    fn reported(out: &[u8]) -> Vec<Value> {
        String::from_utf8_lossy(out).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    #[test]
    fn a_usage_list_is_reported_in_order_the_interval_apart() {
        let mut out = Vec::new();
        let started = std::time::Instant::now();
        assert!(report_usage(&usage_series(40), &mut control(false), &mut out));
        assert!(started.elapsed() >= Duration::from_millis(80), "two waits between three reports");
        let reports = reported(&out);
        assert_eq!(reports.iter().map(|u| u["inputTokens"].as_i64().unwrap()).collect::<Vec<_>>(), [10, 20, 30]);
        assert!(reports.iter().all(|u| u["type"] == "usage"), "{reports:?}");
    }

    #[test]
    fn a_cancel_line_during_the_wait_between_reports_ends_the_turn() {
        let mut out = Vec::new();
        assert!(!report_usage(&usage_series(10_000), &mut control(true), &mut out));
        assert_eq!(reported(&out), [json!({"inputTokens": 10, "type": "usage"})], "the first report, then the cancel");
        let mut out = Vec::new();
        assert!(report_usage(&usage_series(0), &mut control(true), &mut out), "no interval, no wait to cancel");
        assert_eq!(reported(&out).len(), 3);
    }

    #[test]
    fn control_lines_are_cancel_steer_and_input_response_and_the_rest_is_ignored() {
        assert_eq!(control_line(r#"{"type":"cancel","reason":"timeout"}"#), Some(ControlLine::Cancel));
        assert_eq!(control_line(r#"{"type":"steer","text":"go"}"#), Some(ControlLine::Steer("go".into())));
        assert_eq!(
            control_line(r#"{"type":"input_response","id":"a","decision":"allow","text":"yes"}"#),
            Some(ControlLine::Answer {
                id: "a".into(),
                answer: Answer { decision: "allow".into(), text: "yes".into() }
            })
        );
        assert_eq!(
            control_line(r#"{"type":"input_response","id":"b","decision":"deny"}"#),
            Some(ControlLine::Answer {
                id: "b".into(),
                answer: Answer { decision: "deny".into(), text: String::new() }
            })
        );
        assert_eq!(control_line(r#"{"type":"later"}"#), None);
        assert_eq!(control_line("not json"), None);
    }

    #[test]
    fn the_marker_line_is_not_part_of_the_input() {
        assert_eq!(strip_marker("[Inter-session message] sourceSession=x — data\nping"), "ping");
        assert_eq!(strip_marker("ping"), "ping");
    }

    #[test]
    fn content_text_joins_text_blocks() {
        assert_eq!(content_text(&json!("hi")), "hi");
        assert_eq!(
            content_text(&json!([{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}])),
            "a\nb"
        );
    }
}
