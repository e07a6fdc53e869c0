//! The A2A v0.3 spellings of the JSON-RPC binding, for peers whose client predates v1.0 — Gemini
//! CLI's remote agents (`@a2a-js/sdk` 0.3) among them. A v0.3 method name is served by its v1.0
//! method, with the same caller, checks and handlers; only the answer's shape is rewritten:
//! objects tagged by `kind` instead of wrapped by a field, lowercase states and roles, parts
//! `{kind, text}`. The request needs no rewriting: the v1.0 types already read v0.3 messages
//! (`role: "user"`, `kind` tags). Errors keep their codes, which v0.3 shares.

use a2a_protocol_types::error::A2aError;
use serde_json::{Map, Value, json};

/// The v1.0 method a v0.3 method name means; None for any other name.
pub(super) fn v1_method(name: &str) -> Option<&'static str> {
    Some(match name {
        "message/send" => "SendMessage",
        "message/stream" => "SendStreamingMessage",
        "tasks/get" => "GetTask",
        "tasks/cancel" => "CancelTask",
        "tasks/resubscribe" => "SubscribeToTask",
        _ => return None,
    })
}

/// v0.3's `configuration.blocking` as v1.0's `returnImmediately` (its negation; a
/// `returnImmediately` also given wins): `blocking: false` answers at once, as v0.3 says.
pub(super) fn blocking_as_v1(params: &mut Option<Value>) -> Result<(), A2aError> {
    let config = params.as_mut().and_then(|p| p.get_mut("configuration")).and_then(Value::as_object_mut);
    let Some(blocking) = config.as_ref().and_then(|c| c.get("blocking")).cloned() else { return Ok(()) };
    let Value::Bool(blocking) = blocking else {
        return Err(A2aError::invalid_params(format!(
            "params.configuration.blocking: must be true or false, not {blocking}"
        )));
    };
    if let Some(config) = config {
        config.remove("blocking");
        config.entry("returnImmediately").or_insert(json!(!blocking));
    }
    Ok(())
}

/// The fields a v0.3 client reads off the card beside v1.0's `supportedInterfaces`: the JSON-RPC
/// URL as `url` and its binding as `preferredTransport`. v1.0 clients ignore them.
pub(super) fn with_v03_card_fields(mut card: Value, jsonrpc_url: &str) -> Value {
    if let Some(fields) = card.as_object_mut() {
        fields.insert("url".into(), json!(jsonrpc_url));
        fields.insert("preferredTransport".into(), json!("JSONRPC"));
    }
    card
}

/// A v1.0 result (a `SendMessageResponse` or `StreamResponse`, wrapped by `task`, `message`,
/// `statusUpdate` or `artifactUpdate`; or a bare task) in v0.3's shape.
pub(super) fn result(v1: Value) -> Value {
    let Value::Object(mut fields) = v1 else { return v1 };
    let wrapped = ["task", "message", "statusUpdate", "artifactUpdate"].into_iter().find(|k| fields.contains_key(*k));
    match wrapped {
        Some(kind) if fields.len() == 1 => {
            let inner = fields.remove(kind).unwrap_or_default();
            match kind {
                "message" => message(inner),
                "statusUpdate" => status_update(inner),
                "artifactUpdate" => artifact_update(inner),
                _ => task(inner),
            }
        }
        _ => task(Value::Object(fields)),
    }
}

/// Whether a v0.3 stream ends after this (already rewritten) event: at a final state, and where
/// the task waits on its caller — a v0.3 client answers with a new message, not on the stream.
pub(super) fn ends_stream(event: &Value) -> bool {
    event["status"]["state"].as_str().is_some_and(is_last)
}

fn is_last(state: &str) -> bool {
    matches!(state, "completed" | "canceled" | "failed" | "rejected" | "input-required" | "auth-required")
}

fn task(v1: Value) -> Value {
    tagged("task", v1, |fields| {
        rewrite(fields, "status", status);
        rewrite(fields, "history", |h| each(h, message));
        rewrite(fields, "artifacts", |a| each(a, artifact));
    })
}

fn status_update(v1: Value) -> Value {
    tagged("status-update", v1, |fields| {
        rewrite(fields, "status", status);
        let last = fields.get("status").and_then(|s| s["state"].as_str()).is_some_and(is_last);
        fields.insert("final".into(), json!(last));
    })
}

fn artifact_update(v1: Value) -> Value {
    tagged("artifact-update", v1, |fields| rewrite(fields, "artifact", artifact))
}

fn message(v1: Value) -> Value {
    tagged("message", v1, |fields| {
        rewrite(fields, "role", |r| json!(r.as_str().map_or_else(|| "agent".into(), |r| lower(r, "ROLE_"))));
        rewrite(fields, "parts", |p| each(p, part));
    })
}

fn status(mut v1: Value) -> Value {
    if let Some(state) = v1["state"].as_str() {
        let state = if state == "TASK_STATE_UNSPECIFIED" { "unknown".into() } else { lower(state, "TASK_STATE_") };
        v1["state"] = json!(state);
    }
    if let Some(m) = v1.get_mut("message") {
        *m = message(m.take());
    }
    v1
}

fn artifact(mut v1: Value) -> Value {
    if let Some(parts) = v1.get_mut("parts") {
        *parts = each(parts.take(), part);
    }
    v1
}

/// `{text}`, `{data}`, `{url|raw, mediaType, filename}` as `{kind: "text"|"data"|"file", …}`.
fn part(v1: Value) -> Value {
    let Value::Object(mut fields) = v1 else { return v1 };
    let kind = if fields.contains_key("text") {
        "text"
    } else if fields.contains_key("data") {
        "data"
    } else {
        let mut file = Map::new();
        for (from, to) in [("url", "uri"), ("raw", "bytes"), ("mediaType", "mimeType"), ("filename", "name")] {
            if let Some(value) = fields.remove(from) {
                file.insert(to.into(), value);
            }
        }
        fields.insert("file".into(), Value::Object(file));
        "file"
    };
    fields.insert("kind".into(), json!(kind));
    Value::Object(fields)
}

/// `TASK_STATE_INPUT_REQUIRED` → `input-required`, `ROLE_AGENT` → `agent`.
fn lower(value: &str, prefix: &str) -> String {
    value.trim_start_matches(prefix).to_ascii_lowercase().replace('_', "-")
}

fn tagged(kind: &str, v1: Value, edit: impl FnOnce(&mut Map<String, Value>)) -> Value {
    let Value::Object(mut fields) = v1 else { return v1 };
    edit(&mut fields);
    fields.insert("kind".into(), json!(kind));
    Value::Object(fields)
}

fn rewrite(fields: &mut Map<String, Value>, key: &str, f: impl FnOnce(Value) -> Value) {
    if let Some(value) = fields.get_mut(key) {
        *value = f(value.take());
    }
}

fn each(list: Value, f: fn(Value) -> Value) -> Value {
    match list {
        Value::Array(items) => Value::Array(items.into_iter().map(f).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_results_take_v03_shapes() {
        let reply = json!({"role": "ROLE_AGENT", "parts": [{"text": "hi"}, {"data": {"kind": "approval"}}]});
        let send = json!({"task": {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_INPUT_REQUIRED",
            "message": reply}, "artifacts": [{"artifactId": "reply", "parts": [{"url": "https://x/y", "mediaType": "text/plain"}]}]}});
        let task = result(send);
        assert_eq!((&task["kind"], &task["status"]["state"]), (&json!("task"), &json!("input-required")), "{task}");
        assert_eq!(task["status"]["message"]["kind"], "message", "{task}");
        assert_eq!(task["status"]["message"]["role"], "agent", "{task}");
        assert_eq!(
            task["status"]["message"]["parts"],
            json!([{"kind": "text", "text": "hi"},
            {"kind": "data", "data": {"kind": "approval"}}]),
            "{task}"
        );
        assert_eq!(
            task["artifacts"][0]["parts"][0],
            json!({"kind": "file", "file": {"uri": "https://x/y", "mimeType": "text/plain"}})
        );
        assert!(ends_stream(&task), "a v0.3 stream ends where the task waits on its caller");
        // GetTask's bare task.
        let bare = result(json!({"id": "t", "status": {"state": "TASK_STATE_UNSPECIFIED"}}));
        assert_eq!((&bare["kind"], &bare["status"]["state"]), (&json!("task"), &json!("unknown")), "{bare}");
    }

    #[test]
    fn blocking_false_is_return_immediately_and_an_explicit_return_immediately_wins() {
        let read = |p: Value| {
            let mut p = Some(p);
            blocking_as_v1(&mut p).map(|()| p.unwrap()["configuration"].clone())
        };
        assert_eq!(read(json!({"configuration": {"blocking": false}})).unwrap(), json!({"returnImmediately": true}));
        assert_eq!(read(json!({"configuration": {"blocking": true}})).unwrap(), json!({"returnImmediately": false}));
        let both = json!({"configuration": {"blocking": false, "returnImmediately": false}});
        assert_eq!(read(both).unwrap(), json!({"returnImmediately": false}));
        assert_eq!(read(json!({"message": {}})).unwrap(), Value::Null);
        let e = read(json!({"configuration": {"blocking": "no"}})).unwrap_err();
        assert!(e.message.contains("params.configuration.blocking: must be true or false"), "{}", e.message);
    }

    #[test]
    fn stream_updates_are_tagged_and_final_at_a_final_state() {
        let working = result(json!({"statusUpdate": {"taskId": "t", "status": {"state": "TASK_STATE_WORKING"}}}));
        assert_eq!((&working["kind"], &working["final"]), (&json!("status-update"), &json!(false)), "{working}");
        assert!(!ends_stream(&working));
        let done = result(json!({"statusUpdate": {"taskId": "t", "status": {"state": "TASK_STATE_COMPLETED"}}}));
        assert_eq!((&done["status"]["state"], &done["final"]), (&json!("completed"), &json!(true)), "{done}");
        assert!(ends_stream(&done));
        let piece = result(
            json!({"artifactUpdate": {"artifact": {"artifactId": "reply", "parts": [{"text": "a"}]}, "append": true}}),
        );
        assert_eq!(piece["kind"], "artifact-update", "{piece}");
        assert_eq!(piece["artifact"]["parts"][0], json!({"kind": "text", "text": "a"}), "{piece}");
        assert_eq!(v1_method("message/stream"), Some("SendStreamingMessage"));
        assert_eq!(v1_method("SendMessage"), None);
    }
}
