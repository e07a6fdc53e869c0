//! `codex-exec-json`: `codex exec --json` NDJSON. `thread.started` → `start` (its `thread_id` is
//! the id `codex exec resume` takes); tool-like items (`command_execution`, `mcp_tool_call`,
//! `file_change`, `web_search`) → `tool_call` when they start and `tool_result` when they complete;
//! `agent_message` items → `message`; `turn.completed` → `usage` plus `final` with the last agent
//! message; `turn.failed` and `error` → `error`. Codex reports neither cost nor model: the run
//! keeps the model it was asked for. Items of type `error` are warnings (unknown model metadata,
//! ignored settings) and change nothing. Checked against the real CLI: `fixtures/README.md`.

use std::collections::HashSet;

use serde_json::{Value, json};

use super::event::{self, Usage};
use super::{Decoder, NotJson, parse, text_of};

#[derive(Default)]
pub struct Codex {
    thread_id: Option<String>,
    last_message: String,
    /// Tool items whose `tool_call` was emitted (some item types only ever complete).
    called: HashSet<String>,
}

impl Decoder for Codex {
    fn line(&mut self, line: &str) -> Result<Vec<Value>, NotJson> {
        let Some(v) = parse(line)? else { return Ok(Vec::new()) };
        let item = v.get("item").unwrap_or(&Value::Null);
        Ok(match text_of(&v, "type") {
            "thread.started" => {
                self.thread_id = v.get("thread_id").and_then(Value::as_str).map(String::from);
                vec![event::start(None, self.thread_id.as_deref())]
            }
            "item.started" => self.call(item).into_iter().collect(),
            "item.completed" => self.completed(item),
            "turn.completed" => self.turn_completed(&v),
            "turn.failed" => vec![event::error("turn_failed", &api_message(text_of(&v["error"], "message")))],
            // Also sent for retries ("Reconnecting... 1/5"): it fails a run only if no final follows.
            "error" => vec![event::error("error", &api_message(text_of(&v, "message")))],
            _ => Vec::new(),
        })
    }
}

/// Codex passes a refused request's body on as the message (`{"error":{"message":…}}`): the
/// API's own message is what a reader of the run's error needs.
fn api_message(message: &str) -> String {
    serde_json::from_str::<Value>(message)
        .ok()
        .and_then(|body| body.pointer("/error/message").and_then(Value::as_str).map(String::from))
        .unwrap_or_else(|| message.to_string())
}

/// A tool-like item as (name, arguments); None for messages, reasoning, plans and notes.
fn tool(item: &Value) -> Option<(&str, Value)> {
    Some(match text_of(item, "type") {
        "command_execution" => ("command_execution", json!({"command": text_of(item, "command")})),
        // The bare tool name, as the server's own tools are named (transcript rules match on it).
        "mcp_tool_call" => (text_of(item, "tool"), item.get("arguments").cloned().unwrap_or_default()),
        "file_change" => ("file_change", json!({"changes": item.get("changes").cloned().unwrap_or_default()})),
        "web_search" => ("web_search", json!({"query": text_of(item, "query")})),
        _ => return None,
    })
}

/// What a completed tool item returned, and whether it failed.
fn outcome(item: &Value) -> (Value, bool) {
    let failed = matches!(text_of(item, "status"), "failed" | "declined");
    let content = match text_of(item, "type") {
        "command_execution" => text_of(item, "aggregated_output").into(),
        "mcp_tool_call" => match item.pointer("/error/message").and_then(Value::as_str) {
            Some(message) => message.into(),
            None => item.pointer("/result/content").cloned().unwrap_or_default(),
        },
        "file_change" => {
            let changes = item.get("changes").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
            let lines: Vec<String> =
                changes.iter().map(|c| format!("{} {}", text_of(c, "kind"), text_of(c, "path"))).collect();
            lines.join("\n").into()
        }
        _ => "".into(),
    };
    (content, failed || item.get("error").is_some_and(|e| !e.is_null()))
}

impl Codex {
    fn call(&mut self, item: &Value) -> Option<Value> {
        let (name, arguments) = tool(item)?;
        let id = text_of(item, "id");
        self.called.insert(id.to_string()).then(|| event::tool_call(id, name, arguments))
    }

    fn completed(&mut self, item: &Value) -> Vec<Value> {
        if text_of(item, "type") == "agent_message" {
            self.last_message = text_of(item, "text").to_string();
            return vec![event::message(&self.last_message)];
        }
        let Some((name, _)) = tool(item) else { return Vec::new() };
        let mut out: Vec<Value> = self.call(item).into_iter().collect();
        let (content, failed) = outcome(item);
        out.push(event::tool_result(text_of(item, "id"), name, content, failed));
        out
    }

    fn turn_completed(&self, v: &Value) -> Vec<Value> {
        let n = |k: &str| v.pointer(&format!("/usage/{k}")).and_then(Value::as_i64).unwrap_or(0);
        let usage = Usage {
            input: n("input_tokens"),
            output: n("output_tokens"),
            cache_read: n("cached_input_tokens"),
            cache_write: n("cache_write_input_tokens"),
            cost_usd: None,
        };
        // These are the thread's running totals: after `exec resume` they include every earlier
        // turn, so the run subtracts what the session's last turn reported.
        let mut usage = event::usage(usage);
        usage["cumulative"] = true.into();
        vec![usage, event::final_(&self.last_message, "end_turn", self.thread_id.as_deref())]
    }
}

#[cfg(test)]
mod tests {
    use super::super::{decode_fixture, of_type};
    use crate::config::RunnerKind::CodexExecJson;

    #[test]
    fn a_normal_turn_reports_the_thread_the_message_and_usage_without_cost() {
        let events = decode_fixture(CodexExecJson, "codex-normal.jsonl");
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["start", "message", "usage", "final"]);
        assert_eq!(events[0]["externalSessionId"], "01a22c31-9c78-74a2-8f25-d04ba65889e7");
        assert_eq!((events[2]["inputTokens"].as_i64(), events[2]["outputTokens"].as_i64()), (Some(42), Some(7)));
        assert_eq!(events[2]["cacheWriteTokens"], 0);
        assert!(events[2].get("costUsd").is_none());
        assert_eq!(events[3]["text"], "Hello from the fake Responses API (4 input items)");
        assert_eq!(events[3]["externalSessionId"], "01a22c31-9c78-74a2-8f25-d04ba65889e7");
    }

    #[test]
    fn tool_items_become_one_call_and_one_result_each() {
        let events = decode_fixture(CodexExecJson, "codex-tools.jsonl");
        let calls = of_type(&events, "tool_call");
        let names: Vec<&str> = calls.iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["command_execution", "sessions_list", "file_change", "command_execution"]);
        assert_eq!(calls[0]["arguments"]["command"], "/bin/bash -lc ls");
        assert_eq!(calls[1]["arguments"]["limit"], 5);
        let results = of_type(&events, "tool_result");
        assert_eq!(results.len(), 4);
        assert_eq!(
            (results[0]["content"].as_str(), results[0]["isError"].as_bool()),
            (Some("a.txt\nb.txt\n"), Some(false))
        );
        assert_eq!(results[1]["content"][0]["text"], "{\"status\": \"ok\", \"count\": 1}");
        assert_eq!(results[2]["content"], "add /tmp/cx/work/notes.md");
        assert_eq!(results[3]["isError"], true);
        assert_eq!(events.last().unwrap()["text"], "done after 4 tools");
    }

    #[test]
    fn a_failed_turn_is_an_error_and_no_final() {
        let events = decode_fixture(CodexExecJson, "codex-error.jsonl");
        assert!(of_type(&events, "final").is_empty());
        let last = events.last().unwrap();
        assert_eq!(last["code"], "turn_failed");
        assert_eq!(last["message"], "the fake API refuses: ERROR");
    }

    #[test]
    fn a_cancelled_turn_has_a_thread_and_no_final() {
        let events = decode_fixture(CodexExecJson, "codex-cancelled.jsonl");
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["start"]);
    }
}
