//! `gemini-stream-json`: Gemini CLI's `--output-format stream-json` NDJSON (headless: stdin not a
//! terminal). `init` → `start` (its `session_id` is the id `--resume` takes); assistant `message`
//! chunks (always `delta: true`) → `text_delta`, and the text since the last tool call → `message`
//! when a tool is called or the turn ends; `tool_use` → `tool_call`; `tool_result` → `tool_result`
//! (it carries only the id: the name is remembered from the call); `result` → `usage` plus `final`
//! with the text after the last tool call (what `--output-format json` calls `response`), or
//! `error` when its status is `error`. The CLI's own `error` events of severity `error` → `error`
//! (a run fails on one only when no `final` follows); warnings change nothing.
//!
//! `result.stats` counts the process's API calls only, also after `--resume` (the CLI does not
//! restore a resumed session's counters in headless mode), so the usage is the turn's. Its
//! `input_tokens` include the cached ones; `input` is the uncached rest. Gemini reports no cost.
//! Checked against the real CLI: `fixtures/README.md`.

use std::collections::HashMap;

use serde_json::Value;

use super::event::{self, Usage};
use super::{Decoder, NotJson, parse, text_of};

#[derive(Default)]
pub struct Gemini {
    session_id: Option<String>,
    /// The assistant's text since the last tool call (the reply so far).
    text: String,
    /// Tool names by id (a `tool_result` carries only the id).
    tools: HashMap<String, String>,
    /// The last error event's message: a `result` of status `error` after an invalid stream
    /// carries none of its own.
    last_error: Option<String>,
}

impl Decoder for Gemini {
    fn line(&mut self, line: &str) -> Result<Vec<Value>, NotJson> {
        let Some(v) = parse(line)? else { return Ok(Vec::new()) };
        Ok(match text_of(&v, "type") {
            "init" => {
                self.session_id = v.get("session_id").and_then(Value::as_str).map(String::from);
                let model = v.get("model").and_then(Value::as_str);
                vec![event::start(model, self.session_id.as_deref())]
            }
            "message" if text_of(&v, "role") == "assistant" => {
                let chunk = text_of(&v, "content");
                self.text.push_str(chunk);
                vec![event::text_delta(chunk)]
            }
            "tool_use" => self.tool_use(&v),
            "tool_result" => vec![self.tool_result(&v)],
            "error" if text_of(&v, "severity") == "error" => {
                let message = text_of(&v, "message").to_string();
                self.last_error = Some(message.clone());
                vec![event::error("error", &message)]
            }
            "result" => self.result(&v),
            _ => Vec::new(),
        })
    }
}

impl Gemini {
    /// The text so far as one `message`, if there is any; the next text starts a new one.
    fn flush(&mut self) -> Option<Value> {
        let text = std::mem::take(&mut self.text);
        (!text.is_empty()).then(|| event::message(&text))
    }

    fn tool_use(&mut self, v: &Value) -> Vec<Value> {
        let (id, name) = (text_of(v, "tool_id"), text_of(v, "tool_name"));
        self.tools.insert(id.to_string(), name.to_string());
        let arguments = v.get("parameters").cloned().unwrap_or_default();
        self.flush().into_iter().chain([event::tool_call(id, name, arguments)]).collect()
    }

    fn tool_result(&self, v: &Value) -> Value {
        let id = text_of(v, "tool_id");
        let name = self.tools.get(id).map_or("", String::as_str);
        let failed = text_of(v, "status") == "error";
        let output = match v.pointer("/error/message").and_then(Value::as_str) {
            Some(message) if failed => message,
            _ => text_of(v, "output"),
        };
        event::tool_result(id, name, output.into(), failed)
    }

    fn result(&mut self, v: &Value) -> Vec<Value> {
        let reply = self.text.clone();
        let mut out: Vec<Value> = self.flush().into_iter().collect();
        out.push(usage(v.get("stats").unwrap_or(&Value::Null)));
        if text_of(v, "status") == "error" {
            let code = v.pointer("/error/type").and_then(Value::as_str).unwrap_or("error");
            let message = match v.pointer("/error/message").and_then(Value::as_str) {
                Some(m) => api_message(m),
                None => self.last_error.clone().unwrap_or_else(|| "Gemini CLI reported an error".into()),
            };
            out.push(event::error(code, &message));
        } else {
            out.push(event::final_(&reply, "end_turn", self.session_id.as_deref()));
        }
        out
    }
}

/// `result.stats` as usage: uncached input (older CLIs lack `input`: the input less the cached),
/// output, cached.
fn usage(stats: &Value) -> Value {
    let n = |k: &str| stats.get(k).and_then(Value::as_i64);
    let cached = n("cached").unwrap_or(0);
    let input = n("input").unwrap_or_else(|| n("input_tokens").unwrap_or(0).saturating_sub(cached));
    event::usage(Usage {
        input,
        output: n("output_tokens").unwrap_or(0),
        cache_read: cached,
        cache_write: 0,
        cost_usd: None,
    })
}

/// The CLI wraps a refused request as `[API Error: <the API's JSON body>]`: the API's own message
/// is what a reader of the run's error needs.
fn api_message(message: &str) -> String {
    let body = message.strip_prefix("[API Error: ").and_then(|m| m.strip_suffix(']')).unwrap_or(message);
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|b| b.pointer("/error/message").and_then(Value::as_str).map(String::from))
        .unwrap_or_else(|| message.to_string())
}

#[cfg(test)]
mod tests {
    use super::super::{decode_fixture, decoder, of_type};
    use crate::config::RunnerKind::GeminiStreamJson;

    fn types(events: &[serde_json::Value]) -> Vec<&str> {
        events.iter().map(|e| e["type"].as_str().unwrap()).collect()
    }

    #[test]
    fn a_normal_turn_streams_deltas_and_reports_the_session_model_reply_and_usage_without_cost() {
        let events = decode_fixture(GeminiStreamJson, "gemini-normal.jsonl");
        assert_eq!(types(&events), ["start", "text_delta", "text_delta", "message", "usage", "final"]);
        assert_eq!(events[0]["externalSessionId"], "7d03d3f4-bf8f-48f1-806b-5f50472f3205");
        assert_eq!(events[0]["model"], "gemini-2.5-flash");
        assert_eq!(events[3]["content"], "Hello from the fake Gemini API (1 contents)");
        assert_eq!((events[4]["inputTokens"].as_i64(), events[4]["outputTokens"].as_i64()), (Some(100), Some(8)));
        assert!(events[4].get("costUsd").is_none());
        assert!(events[4].get("cumulative").is_none(), "a turn's own usage");
        assert_eq!(events[5]["text"], "Hello from the fake Gemini API (1 contents)");
        assert_eq!(events[5]["externalSessionId"], "7d03d3f4-bf8f-48f1-806b-5f50472f3205");
    }

    #[test]
    fn a_resumed_turn_keeps_the_session_and_reports_only_its_own_tokens() {
        let events = decode_fixture(GeminiStreamJson, "gemini-resumed.jsonl");
        assert_eq!(events[0]["externalSessionId"], "7d03d3f4-bf8f-48f1-806b-5f50472f3205");
        let usage = of_type(&events, "usage");
        assert_eq!((usage[0]["inputTokens"].as_i64(), usage[0]["outputTokens"].as_i64()), (Some(100), Some(8)));
        assert_eq!(events.last().unwrap()["text"], "Hello from the fake Gemini API (3 contents)");
    }

    #[test]
    fn a_tool_call_and_its_result_carry_the_name_and_the_reply_is_the_text_after_them() {
        let events = decode_fixture(GeminiStreamJson, "gemini-tools.jsonl");
        assert_eq!(types(&events), ["start", "tool_call", "tool_result", "text_delta", "message", "usage", "final"]);
        assert_eq!(events[1]["name"], "list_directory");
        assert_eq!(events[1]["arguments"]["dir_path"], "/tmp/gm/home/.gemini/tmp/work");
        assert_eq!(
            (events[2]["id"].clone(), events[2]["name"].as_str()),
            (events[1]["id"].clone(), Some("list_directory"))
        );
        assert_eq!(events[2]["isError"], false);
        assert_eq!((events[5]["inputTokens"].as_i64(), events[5]["outputTokens"].as_i64()), (Some(200), Some(16)));
        assert!(events[6]["text"].as_str().unwrap().starts_with("done: "));
    }

    #[test]
    fn a_tool_the_headless_cli_does_not_offer_is_a_failed_result_with_the_reason() {
        let events = decode_fixture(GeminiStreamJson, "gemini-refused.jsonl");
        let result = of_type(&events, "tool_result")[0];
        assert_eq!((result["name"].as_str(), result["isError"].as_bool()), (Some("write_file"), Some(true)));
        assert!(result["content"].as_str().unwrap().starts_with("Tool \"write_file\" not found"), "{result}");
        assert_eq!(of_type(&events, "final").len(), 1, "the turn itself succeeded");
    }

    #[test]
    fn a_refused_request_is_an_error_with_the_apis_message_and_no_final() {
        let events = decode_fixture(GeminiStreamJson, "gemini-error.jsonl");
        assert!(of_type(&events, "final").is_empty());
        let last = events.last().unwrap();
        assert_eq!(last["type"], "error");
        assert_eq!(last["message"], "fake: this request is refused");
    }

    #[test]
    fn a_cancelled_turn_has_its_partial_text_and_no_final() {
        let events = decode_fixture(GeminiStreamJson, "gemini-cancelled.jsonl");
        assert_eq!(types(&events), ["start", "text_delta"]);
    }

    #[test]
    fn an_invalid_stream_fails_with_the_error_event_before_its_bare_result_and_warnings_pass() {
        let mut d = decoder(GeminiStreamJson);
        assert!(d.line(r#"{"type":"error","severity":"warning","message":"retrying"}"#).unwrap().is_empty());
        let error = d.line(r#"{"type":"error","severity":"error","message":"empty response"}"#).unwrap();
        assert_eq!(error[0]["message"], "empty response");
        let end = d.line(r#"{"type":"result","status":"error","stats":{"input_tokens":5,"cached":2}}"#).unwrap();
        assert_eq!(types(&end), ["usage", "error"]);
        assert_eq!((end[0]["inputTokens"].as_i64(), end[0]["cacheReadTokens"].as_i64()), (Some(3), Some(2)));
        assert_eq!(end[1]["message"], "empty response");
    }
}
