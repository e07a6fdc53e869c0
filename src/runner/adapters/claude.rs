//! `claude-stream-json`: Claude Code's `-p --output-format stream-json --verbose` NDJSON.
//! `system/init` → `start` (its `session_id` is the id to resume); `stream_event` text deltas (with
//! `--include-partial-messages`) → `text_delta`; `assistant` text blocks → `message`, `tool_use`
//! blocks → `tool_call`; `user` `tool_result` blocks → `tool_result`; `result` → `usage` plus
//! `final`, or `error` when `is_error` (an API error or an interrupted turn: Claude Code exits 0
//! after SIGINT, so the error is what makes such a run fail). Started with
//! `--permission-prompt-tool stdio` (and `--input-format stream-json`), Claude Code asks its host
//! on stdout before a tool that needs permission: a `control_request` of subtype `can_use_tool`
//! → `input_request` of kind `approval`, its `request_id` the id (the runner writes the answer
//! back as a `control_response`, `runner/stdin.rs`). An MCP server's `elicitation/create` reaches
//! the host the same way (`--input-format stream-json` suffices), as a `control_request` of
//! subtype `elicitation` → `input_request` of kind `question`, with the server's name and the
//! schema its answer must fit in `details`; other control requests are not events.
//!
//! With `--input-format stream-json` one process can run more than one turn (a steer queued
//! behind the turn under way runs as a turn of its own), each ending in a `result`: its `usage`
//! counts that turn only, its `total_cost_usd` the whole process. So the tokens add up over the
//! results and the cost is the last one's.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::event::{self, Usage};
use super::{Decoder, NotJson, parse, text_of};

/// Remembers tool names by id (Claude's `tool_result` blocks carry only the id) and the tokens of
/// the results so far.
#[derive(Default)]
pub struct Claude {
    tools: HashMap<String, String>,
    tokens: Tokens,
}

/// The token counts of a `result`'s `usage`.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
struct Tokens {
    input: i64,
    output: i64,
    cache_read: i64,
    cache_write: i64,
}

impl Tokens {
    fn of(result: &Value) -> Self {
        let n = |k: &str| result.pointer(&format!("/usage/{k}")).and_then(Value::as_i64).unwrap_or(0);
        Tokens {
            input: n("input_tokens"),
            output: n("output_tokens"),
            cache_read: n("cache_read_input_tokens"),
            cache_write: n("cache_creation_input_tokens"),
        }
    }

    fn plus(self, other: Tokens) -> Self {
        Tokens {
            input: self.input + other.input,
            output: self.output + other.output,
            cache_read: self.cache_read + other.cache_read,
            cache_write: self.cache_write + other.cache_write,
        }
    }
}

impl Decoder for Claude {
    fn line(&mut self, line: &str) -> Result<Vec<Value>, NotJson> {
        let Some(v) = parse(line)? else { return Ok(Vec::new()) };
        // Lines of a sub-agent (the Task tool) carry its parent's tool id: they are that agent's
        // own turns; the parent sees its result as the Task tool's result.
        if v.get("parent_tool_use_id").is_some_and(Value::is_string) {
            return Ok(Vec::new());
        }
        Ok(match (text_of(&v, "type"), text_of(&v, "subtype")) {
            ("system", "init") => vec![event::start(Some(text_of(&v, "model")), Some(text_of(&v, "session_id")))],
            ("stream_event", _) => text_delta(&v).into_iter().collect(),
            ("assistant", _) => self.assistant(&v),
            ("user", _) => self.tool_results(&v),
            ("result", _) => self.result(&v),
            ("control_request", _) => control_request(&v).into_iter().collect(),
            _ => Vec::new(),
        })
    }
}

fn blocks(v: &Value) -> &[Value] {
    v.pointer("/message/content").and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn text_delta(v: &Value) -> Option<Value> {
    let delta =
        v.pointer("/event/delta").filter(|_| v.pointer("/event/type") == Some(&"content_block_delta".into()))?;
    (text_of(delta, "type") == "text_delta").then(|| event::text_delta(text_of(delta, "text")))
}

impl Claude {
    /// One assistant message: its text as one `message`, then its tool calls in order.
    fn assistant(&mut self, v: &Value) -> Vec<Value> {
        let blocks = blocks(v);
        let text: Vec<&str> =
            blocks.iter().filter(|b| text_of(b, "type") == "text").map(|b| text_of(b, "text")).collect();
        let mut out: Vec<Value> = (!text.is_empty()).then(|| event::message(&text.join("\n"))).into_iter().collect();
        for b in blocks.iter().filter(|b| text_of(b, "type") == "tool_use") {
            let (id, name) = (text_of(b, "id"), text_of(b, "name"));
            self.tools.insert(id.to_string(), name.to_string());
            out.push(event::tool_call(id, name, b.get("input").cloned().unwrap_or_default()));
        }
        out
    }

    fn tool_results(&self, v: &Value) -> Vec<Value> {
        blocks(v)
            .iter()
            .filter(|b| text_of(b, "type") == "tool_result")
            .map(|b| {
                let id = text_of(b, "tool_use_id");
                let name = self.tools.get(id).map_or("", String::as_str);
                let is_error = b.get("is_error").and_then(Value::as_bool).unwrap_or(false);
                event::tool_result(id, name, b.get("content").cloned().unwrap_or_default(), is_error)
            })
            .collect()
    }

    /// A turn's summary: the usage and cost of the run so far, then the final reply or the error.
    fn result(&mut self, v: &Value) -> Vec<Value> {
        self.tokens = self.tokens.plus(Tokens::of(v));
        let usage = event::usage(Usage {
            input: self.tokens.input,
            output: self.tokens.output,
            cache_read: self.tokens.cache_read,
            cache_write: self.tokens.cache_write,
            cost_usd: v.get("total_cost_usd").and_then(Value::as_f64),
        });
        vec![usage, ending(v)]
    }
}

/// A control request as the input request it is: `can_use_tool` an approval, `elicitation` a
/// question. Others (hook callbacks, dialogs, token refreshes) are not answered here.
fn control_request(v: &Value) -> Option<Value> {
    let request = v.get("request")?;
    let id = text_of(v, "request_id");
    match text_of(request, "subtype") {
        "can_use_tool" => Some(permission_request(id, request)),
        "elicitation" => Some(elicitation_request(id, request)),
        _ => None,
    }
}

/// A `can_use_tool` request as the approval it asks for: which tool, with what input.
fn permission_request(id: &str, request: &Value) -> Value {
    let tool = match text_of(request, "display_name") {
        "" => text_of(request, "tool_name"),
        shown => shown,
    };
    let text = match text_of(request, "description") {
        "" => format!("Claude Code asks to use {tool}"),
        what => format!("Claude Code asks to use {tool}: {what}"),
    };
    let mut details = json!({"toolName": text_of(request, "tool_name"),
                             "input": request.get("input").cloned().unwrap_or_default()});
    if let Some(tool_use) = request.get("tool_use_id").and_then(Value::as_str) {
        details["toolUseId"] = tool_use.into();
    }
    event::input_request(id, "approval", &text, details)
}

/// An `elicitation` request (Claude Code's 2.1.328 bundle: `{subtype:"elicitation",
/// mcp_server_name, message, mode?: "form"|"url", url?, elicitation_id?, requested_schema?, …}`)
/// as the question its MCP server asks. `details.elicitation` says what the answer must fit —
/// `serverName`, `requestedSchema` (absent in URL mode), `mode` and `url` when given — and tells
/// the runner to write the answer as an elicitation result (`runner/stdin.rs`).
fn elicitation_request(id: &str, request: &Value) -> Value {
    let server = text_of(request, "mcp_server_name");
    let mut text = format!("MCP server {server} asks: {}", text_of(request, "message"));
    let mut asked = json!({"serverName": server});
    if let Some(schema) = request.get("requested_schema") {
        asked["requestedSchema"] = schema.clone();
    }
    if let Some(mode) = request.get("mode").and_then(Value::as_str) {
        asked["mode"] = mode.into();
    }
    if let Some(url) = request.get("url").and_then(Value::as_str) {
        text = format!("{text} ({url})");
        asked["url"] = url.into();
    }
    event::input_request(id, "question", &text, json!({"elicitation": asked}))
}

/// The reply a `result` ends its turn with, or the error it reports.
fn ending(v: &Value) -> Value {
    let session = v.get("session_id").and_then(Value::as_str);
    if v.get("is_error").and_then(Value::as_bool).unwrap_or(false) {
        let code = v.get("api_error_type").and_then(Value::as_str).unwrap_or(text_of(v, "subtype"));
        let message = match v.get("result").and_then(Value::as_str) {
            Some(r) => r.to_string(),
            None => {
                format!("Claude Code ended the turn with {} ({})", text_of(v, "subtype"), text_of(v, "terminal_reason"))
            }
        };
        event::error(code, &message)
    } else {
        let stop = v.get("stop_reason").and_then(Value::as_str).unwrap_or("end_turn");
        event::final_(text_of(v, "result"), stop, session)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::{decode_fixture, of_type};
    use crate::config::RunnerKind::ClaudeStreamJson;

    const SESSION: &str = "8a56f4b5-3d3c-4d3b-856e-abebb7877338";

    #[test]
    fn a_normal_turn_streams_deltas_and_ends_with_usage_cost_and_the_session_id() {
        let events = decode_fixture(ClaudeStreamJson, "claude-normal.jsonl");
        let start = of_type(&events, "start");
        assert_eq!(
            (start[0]["model"].as_str(), start[0]["externalSessionId"].as_str()),
            (Some("claude-sonnet-4-5"), Some(SESSION))
        );
        let deltas: String = of_type(&events, "text_delta").iter().map(|e| e["text"].as_str().unwrap()).collect();
        assert_eq!(deltas, "Hello from the fake API (1 messages)");
        assert_eq!(of_type(&events, "message")[0]["content"], "Hello from the fake API (1 messages)");
        let usage = of_type(&events, "usage")[0];
        assert_eq!((usage["inputTokens"].as_i64(), usage["outputTokens"].as_i64()), (Some(10), Some(6)));
        assert!(usage["costUsd"].as_f64().unwrap() > 0.0);
        let last = events.last().unwrap();
        assert_eq!((last["type"].as_str(), last["stopReason"].as_str()), (Some("final"), Some("end_turn")));
        assert_eq!(last["text"], "Hello from the fake API (1 messages)");
        assert_eq!(last["externalSessionId"], SESSION);
    }

    #[test]
    fn tool_use_and_tool_result_blocks_become_tool_events_with_the_tool_name() {
        let events = decode_fixture(ClaudeStreamJson, "claude-tools.jsonl");
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["start", "tool_call", "tool_result", "message", "usage", "final"]);
        assert_eq!(events[1]["name"], "Bash");
        assert_eq!(events[1]["arguments"]["command"], "echo tool-ran");
        assert_eq!((events[2]["id"].clone(), events[2]["name"].clone()), (events[1]["id"].clone(), "Bash".into()));
        assert_eq!((events[2]["content"].as_str(), events[2]["isError"].as_bool()), (Some("tool-ran"), Some(false)));
        assert_eq!(events[5]["text"], "done: tool-ran");
    }

    #[test]
    fn a_steer_run_as_a_second_turn_ends_in_a_second_result_with_the_tokens_of_both() {
        let events = decode_fixture(ClaudeStreamJson, "claude-steered.jsonl");
        let finals: Vec<&str> = of_type(&events, "final").iter().map(|e| e["text"].as_str().unwrap()).collect();
        assert_eq!(finals, ["Hello from the fake API (1 messages)", "Steered (3 messages)"]);
        let usage = of_type(&events, "usage");
        let last = usage.last().unwrap();
        assert_eq!((last["inputTokens"].as_i64(), last["outputTokens"].as_i64()), (Some(40), Some(12)));
        assert_eq!(last["costUsd"].as_f64(), Some(0.00030000000000000003), "total_cost_usd is the process's total");
        assert_eq!(usage[0]["inputTokens"], 10);
    }

    #[test]
    fn a_permission_prompt_on_stdio_is_an_approval_request_between_the_tool_call_and_its_result() {
        let events = decode_fixture(ClaudeStreamJson, "claude-permission.jsonl");
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["start", "tool_call", "input_request", "tool_result", "message", "usage", "final"]);
        let request = &events[2];
        assert_eq!(
            (request["id"].as_str(), request["kind"].as_str()),
            (Some("5f5b8511-0494-40fd-a15f-4189bac12c2e"), Some("approval"))
        );
        assert_eq!(request["text"], "Claude Code asks to use Write: written.txt");
        let details = &request["details"];
        assert_eq!(
            (details["toolName"].as_str(), details["toolUseId"].as_str()),
            (Some("Write"), Some("toolu_fake_write"))
        );
        assert!(details["input"]["file_path"].as_str().unwrap().ends_with("/written.txt"), "{details}");
        assert!(events[3]["content"].as_str().unwrap().starts_with("File created successfully"));
    }

    #[test]
    fn an_elicitation_is_a_question_naming_its_server_with_the_schema_in_the_details() {
        let mut d = crate::runner::adapters::decoder(ClaudeStreamJson);
        let line = r#"{"type":"control_request","request_id":"r1","request":{"subtype":"elicitation",
            "mcp_server_name":"sessions","message":"Which branch?","mode":"form","elicitation_id":"e1",
            "requested_schema":{"type":"object","properties":{"branch":{"type":"string"}}},
            "property_order":["branch"]}}"#;
        let events = d.line(line).unwrap();
        assert_eq!(
            events,
            [json!({"type": "input_request", "id": "r1", "kind": "question",
                    "text": "MCP server sessions asks: Which branch?",
                    "details": {"elicitation": {"serverName": "sessions", "mode": "form",
                        "requestedSchema": {"type": "object", "properties": {"branch": {"type": "string"}}}}}})]
        );
    }

    #[test]
    fn a_url_elicitation_shows_its_url_and_has_no_schema() {
        let mut d = crate::runner::adapters::decoder(ClaudeStreamJson);
        let line = r#"{"type":"control_request","request_id":"r2","request":{"subtype":"elicitation",
            "mcp_server_name":"auth","message":"Sign in","mode":"url","url":"https://example.com/a"}}"#;
        let events = d.line(line).unwrap();
        assert_eq!(events[0]["text"], "MCP server auth asks: Sign in (https://example.com/a)");
        assert_eq!(
            events[0]["details"],
            json!({"elicitation": {"serverName": "auth", "mode": "url", "url": "https://example.com/a"}})
        );
    }

    #[test]
    fn a_control_request_other_than_a_permission_prompt_or_an_elicitation_is_not_an_event() {
        let mut d = crate::runner::adapters::decoder(ClaudeStreamJson);
        for subtype in ["hook_callback", "request_user_dialog", ""] {
            let line = json!({"type": "control_request", "request_id": "r1", "request": {"subtype": subtype}});
            assert!(d.line(&line.to_string()).unwrap().is_empty(), "{subtype}");
        }
        assert!(d.line(r#"{"type":"control_request","request_id":"r1"}"#).unwrap().is_empty());
    }

    #[test]
    fn an_api_error_is_an_error_event_and_no_final() {
        let events = decode_fixture(ClaudeStreamJson, "claude-error.jsonl");
        assert!(of_type(&events, "final").is_empty());
        let error = events.last().unwrap();
        assert_eq!((error["type"].as_str(), error["code"].as_str()), (Some("error"), Some("invalid_request_error")));
        assert_eq!(error["message"], "API Error: 400 fake: this request is refused");
    }

    #[test]
    fn an_interrupted_turn_keeps_its_partial_text_and_reports_an_error() {
        let events = decode_fixture(ClaudeStreamJson, "claude-cancelled.jsonl");
        assert_eq!(of_type(&events, "message")[0]["content"], "Working");
        assert!(of_type(&events, "final").is_empty());
        let error = events.last().unwrap();
        assert_eq!(error["code"], "error_during_execution");
        assert!(error["message"].as_str().unwrap().contains("aborted_streaming"), "{error}");
    }
}
