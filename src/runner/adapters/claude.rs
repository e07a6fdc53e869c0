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
//!
//! Usage is also reported as it happens, so a budget can stop a run mid-turn: after each new API
//! message of a turn (an `assistant` line with a `message.id` not seen before; Claude Code writes
//! one such line per content block, all with the message's id and usage) a `usage` gives the
//! results' tokens plus those of the turn's messages so far, and the results' cost (none before
//! the first: a turn's cost is known only at its `result`). An `assistant` line carries
//! the usage of the stream's `message_start`, whose output count is a placeholder (1); with
//! `--include-partial-messages` the message's `message_delta` stream event brings its real output
//! count, and another `usage` follows. The turn's `result` replaces the estimate.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::event::{self, Usage};
use super::{Decoder, NotJson, parse, text_of};

/// Remembers tool names by id (Claude's `tool_result` blocks carry only the id), the tokens and
/// cost of the results so far and the tokens of the running turn's API messages by message id.
#[derive(Default)]
pub struct Claude {
    tools: HashMap<String, String>,
    tokens: Tokens,
    cost_usd: Option<f64>,
    turn: HashMap<String, Tokens>,
}

/// The token counts of an Anthropic `usage` object (a `result`'s, a message's).
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
struct Tokens {
    input: i64,
    output: i64,
    cache_read: i64,
    cache_write: i64,
}

impl Tokens {
    fn of(usage: Option<&Value>) -> Self {
        Tokens::default().overlaid(usage)
    }

    /// These counts with those `usage` gives replacing them (a `message_delta` gives the
    /// message's counts so far, often only the output).
    fn overlaid(self, usage: Option<&Value>) -> Self {
        let n = |k: &str, was: i64| usage.and_then(|u| u.get(k)).and_then(Value::as_i64).unwrap_or(was);
        Tokens {
            input: n("input_tokens", self.input),
            output: n("output_tokens", self.output),
            cache_read: n("cache_read_input_tokens", self.cache_read),
            cache_write: n("cache_creation_input_tokens", self.cache_write),
        }
    }

    fn plus(self, other: Tokens) -> Self {
        Tokens {
            // Saturating: the counts are the CLI's output, untrusted; past the ceiling the
            // usage check ignores them (policy::usage).
            input: self.input.saturating_add(other.input),
            output: self.output.saturating_add(other.output),
            cache_read: self.cache_read.saturating_add(other.cache_read),
            cache_write: self.cache_write.saturating_add(other.cache_write),
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
            ("stream_event", _) => text_delta(&v).into_iter().chain(self.message_delta(&v)).collect(),
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
    /// One assistant line: its text as one `message`, then its tool calls in order, then the
    /// usage so far when it is the first line of its API message.
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
        let id = v.pointer("/message/id").and_then(Value::as_str).filter(|id| !id.is_empty());
        if let Some(id) = id.filter(|id| !self.turn.contains_key(*id)) {
            self.turn.insert(id.to_string(), Tokens::of(v.pointer("/message/usage")));
            out.push(self.live_usage());
        }
        out
    }

    /// A `message_delta` stream event of a message already counted: its final counts (the real
    /// output count), and the usage so far with them.
    fn message_delta(&mut self, v: &Value) -> Option<Value> {
        let usage = v.pointer("/event/usage").filter(|_| v.pointer("/event/type") == Some(&"message_delta".into()));
        let message = self.turn.get_mut(text_of(v, "api_message_id"))?;
        *message = message.overlaid(Some(usage?));
        Some(self.live_usage())
    }

    /// The results' tokens plus the running turn's messages', and the results' cost (the turn's
    /// own is known at its `result`).
    fn live_usage(&self) -> Value {
        let tokens = self.turn.values().fold(self.tokens, |sum, message| sum.plus(*message));
        usage_event(tokens, self.cost_usd)
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
    /// Its tokens replace the turn's running estimate.
    fn result(&mut self, v: &Value) -> Vec<Value> {
        self.tokens = self.tokens.plus(Tokens::of(v.get("usage")));
        self.cost_usd = v.get("total_cost_usd").and_then(Value::as_f64);
        self.turn.clear();
        vec![usage_event(self.tokens, self.cost_usd), ending(v)]
    }
}

/// A `usage` event with these tokens, and the cost when one is known.
fn usage_event(tokens: Tokens, cost_usd: Option<f64>) -> Value {
    event::usage(Usage {
        input: tokens.input,
        output: tokens.output,
        cache_read: tokens.cache_read,
        cache_write: tokens.cache_write,
        cost_usd,
    })
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

/// What a run of a Claude Code that is not logged in fails with: what to do, in one line.
const NOT_LOGGED_IN: &str = "Claude Code is not logged in for this agent: run `claude` and /login (a subscription login needs runner.home \"inherit\", which preset \"claude\" sets), or pass ANTHROPIC_API_KEY (runner.env.passthrough; preset \"claude\" passes it)";

/// The reply a `result` ends its turn with, or the error it reports.
fn ending(v: &Value) -> Value {
    let session = v.get("session_id").and_then(Value::as_str);
    if v.get("is_error").and_then(Value::as_bool).unwrap_or(false) {
        // An error `result` keeps the subtype "success" when the turn itself ran (a login
        // failure, say): that is no code to show anyone.
        let subtype = Some(text_of(v, "subtype")).filter(|s| !s.is_empty() && *s != "success");
        let code = v.get("api_error_type").and_then(Value::as_str).or(subtype).unwrap_or("error");
        let message = match v.get("result").and_then(Value::as_str) {
            Some(r) if r.contains("Not logged in") => NOT_LOGGED_IN.to_string(),
            Some(r) => r.to_string(),
            None => {
                format!("Claude Code ended the turn with {} ({})", text_of(v, "subtype"), text_of(v, "terminal_reason"))
            }
        };
        event::error(if message == NOT_LOGGED_IN { "not_logged_in" } else { code }, &message)
    } else {
        let stop = v.get("stop_reason").and_then(Value::as_str).unwrap_or("end_turn");
        event::final_(text_of(v, "result"), stop, session)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

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
        let usage = of_type(&events, "usage");
        assert_eq!(tokens(&usage), [(10, 1), (10, 6), (10, 6)], "the message, its message_delta, the result");
        assert!(usage[..2].iter().all(|u| u.get("costUsd").is_none()), "{usage:?}");
        assert!(usage[2]["costUsd"].as_f64().unwrap() > 0.0);
        let last = events.last().unwrap();
        assert_eq!((last["type"].as_str(), last["stopReason"].as_str()), (Some("final"), Some("end_turn")));
        assert_eq!(last["text"], "Hello from the fake API (1 messages)");
        assert_eq!(last["externalSessionId"], SESSION);
    }

    #[test]
    fn tool_use_and_tool_result_blocks_become_tool_events_with_the_tool_name() {
        let events = decode_fixture(ClaudeStreamJson, "claude-tools.jsonl");
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["start", "tool_call", "usage", "tool_result", "message", "usage", "usage", "final"]);
        assert_eq!(events[1]["name"], "Bash");
        assert_eq!(events[1]["arguments"]["command"], "echo tool-ran");
        assert_eq!((events[3]["id"].clone(), events[3]["name"].clone()), (events[1]["id"].clone(), "Bash".into()));
        assert_eq!((events[3]["content"].as_str(), events[3]["isError"].as_bool()), (Some("tool-ran"), Some(false)));
        assert_eq!(tokens(&of_type(&events, "usage")), [(10, 1), (40, 2), (40, 12)]);
        assert_eq!(events[7]["text"], "done: tool-ran");
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
        assert_eq!(tokens(&usage), [(10, 1), (10, 6), (40, 7), (40, 12)], "the second turn adds to the first");
    }

    /// The input and output tokens of usage events.
    fn tokens(usage: &[&Value]) -> Vec<(i64, i64)> {
        usage.iter().map(|u| (u["inputTokens"].as_i64().unwrap(), u["outputTokens"].as_i64().unwrap())).collect()
    }

    /// The usage events of `lines` decoded in order, with their token counts and costs.
    fn usage_series(lines: &[Value]) -> Vec<(Value, Option<f64>)> {
        let mut d = crate::runner::adapters::decoder(ClaudeStreamJson);
        let events: Vec<Value> = lines.iter().flat_map(|l| d.line(&l.to_string()).unwrap()).collect();
        of_type(&events, "usage")
            .into_iter()
            .map(|u| {
                let counts = json!([u["inputTokens"], u["outputTokens"], u["cacheReadTokens"], u["cacheWriteTokens"]]);
                (counts, u["costUsd"].as_f64())
            })
            .collect()
    }

    /// An `assistant` line as Claude Code writes one per content block of API message `id`.
    fn assistant(id: &str, block: Value, usage: Value) -> Value {
        json!({"type": "assistant", "parent_tool_use_id": null,
               "message": {"id": id, "role": "assistant", "content": [block], "usage": usage}})
    }

    fn tool_use(id: &str) -> Value {
        json!({"type": "tool_use", "id": id, "name": "Bash", "input": {"command": "true"}})
    }

    fn tool_result(id: &str) -> Value {
        json!({"type": "user", "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "ok"}]}})
    }

    fn result(input: i64, output: i64, cost: f64) -> Value {
        json!({"type": "result", "subtype": "success", "is_error": false, "result": "done", "total_cost_usd": cost,
               "usage": {"input_tokens": input, "output_tokens": output,
                         "cache_read_input_tokens": 200, "cache_creation_input_tokens": 14}})
    }

    #[test]
    fn each_new_api_message_reports_the_usage_so_far_and_the_result_replaces_the_estimate() {
        let usage = |input: i64| {
            json!({"input_tokens": input, "output_tokens": 1,
                   "cache_read_input_tokens": 100, "cache_creation_input_tokens": 7})
        };
        let lines = [
            assistant("msg_1", json!({"type": "text", "text": "Running two"}), usage(10)),
            assistant("msg_1", tool_use("t1"), usage(10)),
            assistant("msg_1", tool_use("t2"), usage(10)),
            tool_result("t1"),
            tool_result("t2"),
            assistant("msg_2", json!({"type": "text", "text": "done"}), usage(30)),
            result(40, 16, 0.5),
        ];
        assert_eq!(
            usage_series(&lines),
            [(json!([10, 1, 100, 7]), None), (json!([40, 2, 200, 14]), None), (json!([40, 16, 200, 14]), Some(0.5)),],
            "one report per API message however many lines it has, then the result's"
        );

        let steer = [assistant("msg_3", json!({"type": "text", "text": "Steered"}), usage(50)), result(50, 6, 0.75)];
        let both: Vec<Value> = lines.into_iter().chain(steer).collect();
        let series = usage_series(&both);
        assert_eq!(
            series[3..],
            [(json!([90, 17, 300, 21]), Some(0.5)), (json!([90, 22, 400, 28]), Some(0.75))],
            "a further turn adds to the results before it, their cost the cost so far"
        );
    }

    #[test]
    fn a_message_delta_brings_the_message_s_real_output_count() {
        let delta = |id: &str| {
            json!({"type": "stream_event", "api_message_id": id, "parent_tool_use_id": null,
                   "event": {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}}})
        };
        let lines = [
            assistant("msg_1", json!({"type": "text", "text": "hi"}), json!({"input_tokens": 10, "output_tokens": 1})),
            delta("msg_1"),
            delta("msg_unknown"),
        ];
        assert_eq!(usage_series(&lines), [(json!([10, 1, 0, 0]), None), (json!([10, 9, 0, 0]), None)]);
    }

    #[test]
    fn a_permission_prompt_on_stdio_is_an_approval_request_between_the_tool_call_and_its_result() {
        let events = decode_fixture(ClaudeStreamJson, "claude-permission.jsonl");
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        let expected =
            ["start", "tool_call", "usage", "input_request", "tool_result", "message", "usage", "usage", "final"];
        assert_eq!(types, expected);
        let request = &events[3];
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
        assert!(events[4]["content"].as_str().unwrap().starts_with("File created successfully"));
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
