//! The shapes both sides of the runner protocol share: the text of a `jsonl/1` message's content,
//! and the skip tokens an agent replies with to stay silent.

use serde_json::Value;

pub const REPLY_SKIP: &str = "REPLY_SKIP";
pub const ANNOUNCE_SKIP: &str = "ANNOUNCE_SKIP";
pub const NO_REPLY: &str = "NO_REPLY";

/// The text of a message's content (string or text blocks).
pub fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}
