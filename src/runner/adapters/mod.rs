//! Output adapters (docs/RUNNER-PROTOCOL.md, Adapters): each turns one agent program's stdout into
//! `jsonl/1` events, so the runner reads every kind of agent through one code path — the same
//! transcript, usage, reply and error rules. `jsonl` agents speak the protocol themselves;
//! `claude-stream-json`, `codex-exec-json` and `gemini-stream-json` translate those CLIs' NDJSON; `text` takes the whole
//! stdout as the reply. Each adapter is tested against recorded output in `fixtures/adapters/`.

mod claude;
mod codex;
mod gemini;
mod text;

use serde_json::Value;

use crate::config::RunnerKind;

/// A stdout line that should have been JSON and was not (the run fails with its line number).
#[derive(Debug, PartialEq, Eq)]
pub struct NotJson;

/// Reads an agent's stdout line by line and says which `jsonl/1` events it meant.
pub trait Decoder: Send {
    /// The events of one stdout line, in order.
    fn line(&mut self, line: &str) -> Result<Vec<Value>, NotJson>;
    /// The events stdout's end implies (only `text` has any: its reply is complete at EOF).
    fn end(&mut self) -> Vec<Value> {
        Vec::new()
    }
}

/// The decoder for a runner kind.
pub fn decoder(kind: RunnerKind) -> Box<dyn Decoder> {
    match kind {
        // A remote (`a2a`) agent has no stdout; its transcript is built by `runner::a2a`.
        RunnerKind::Jsonl | RunnerKind::A2a => Box::new(Jsonl),
        RunnerKind::ClaudeStreamJson => Box::<claude::Claude>::default(),
        RunnerKind::CodexExecJson => Box::<codex::Codex>::default(),
        RunnerKind::GeminiStreamJson => Box::<gemini::Gemini>::default(),
        RunnerKind::Text => Box::<text::Text>::default(),
    }
}

/// `jsonl/1` itself: every line is one event.
struct Jsonl;

impl Decoder for Jsonl {
    fn line(&mut self, line: &str) -> Result<Vec<Value>, NotJson> {
        Ok(parse(line)?.into_iter().collect())
    }
}

/// One JSON line; blank lines carry nothing (agents may pad their output).
fn parse(line: &str) -> Result<Option<Value>, NotJson> {
    if line.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str(line).map(Some).map_err(|_| NotJson)
}

/// A string field of a CLI event ("" when absent), for the many optional fields adapters read.
fn text_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// Builders of the `jsonl/1` events adapters emit, one per event type of the protocol.
mod event {
    use serde_json::{Value, json};

    pub fn start(model: Option<&str>, external_session_id: Option<&str>) -> Value {
        json!({"type": "start", "model": model, "externalSessionId": external_session_id})
    }

    pub fn text_delta(text: &str) -> Value {
        json!({"type": "text_delta", "text": text})
    }

    pub fn tool_call(id: &str, name: &str, arguments: Value) -> Value {
        json!({"type": "tool_call", "id": id, "name": name, "arguments": arguments})
    }

    pub fn tool_result(id: &str, name: &str, content: Value, is_error: bool) -> Value {
        json!({"type": "tool_result", "id": id, "name": name, "content": content, "isError": is_error})
    }

    pub fn message(text: &str) -> Value {
        json!({"type": "message", "role": "assistant", "content": text})
    }

    /// Token counts as the CLI reported them; `cost_usd` only where the CLI computes one.
    pub struct Usage {
        pub input: i64,
        pub output: i64,
        pub cache_read: i64,
        pub cache_write: i64,
        pub cost_usd: Option<f64>,
    }

    pub fn usage(u: Usage) -> Value {
        let mut v = json!({"type": "usage", "inputTokens": u.input, "outputTokens": u.output,
            "cacheReadTokens": u.cache_read, "cacheWriteTokens": u.cache_write});
        if let Some(cost) = u.cost_usd {
            v["costUsd"] = cost.into();
        }
        v
    }

    pub fn final_(text: &str, stop_reason: &str, external_session_id: Option<&str>) -> Value {
        json!({"type": "final", "text": text, "stopReason": stop_reason, "externalSessionId": external_session_id})
    }

    pub fn error(code: &str, message: &str) -> Value {
        json!({"type": "error", "code": code, "message": message})
    }

    pub fn input_request(id: &str, kind: &str, text: &str, details: Value) -> Value {
        json!({"type": "input_request", "id": id, "kind": kind, "text": text, "details": details})
    }
}

/// Test support: decodes a fixture file as the runner would (every line, then the end).
#[cfg(test)]
pub(crate) fn decode_fixture(kind: RunnerKind, name: &str) -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/adapters").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut d = decoder(kind);
    let mut events = Vec::new();
    for line in text.lines() {
        events.extend(d.line(line).unwrap_or_else(|_| panic!("{name}: a line is not JSON: {line}")));
    }
    events.extend(d.end());
    events
}

/// Test support: the events of one type.
#[cfg(test)]
pub(crate) fn of_type<'a>(events: &'a [Value], ty: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == ty).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_passes_events_through_and_refuses_non_json() {
        let mut d = decoder(RunnerKind::Jsonl);
        assert_eq!(d.line(r#"{"type":"final","text":"x"}"#).unwrap()[0]["text"], "x");
        assert_eq!(d.line("hello"), Err(NotJson));
        assert!(d.line("  ").unwrap().is_empty());
        assert!(d.end().is_empty());
    }
}
