//! What transcripts look like when a tool returns them: secrets masked, long text cut, image data
//! replaced by its size, and the whole answer kept under a byte budget. Each flag reports only
//! what actually happened (**Fix**: the reference reported truncation whenever it deleted a field).

use std::sync::OnceLock;

use regex::{Captures, Regex};
use serde_json::{Map, Value};

/// Longest text block returned, in characters.
pub const MAX_TEXT_CHARS: usize = 4000;
/// Budget of one answer's messages, in bytes of JSON.
pub const BUDGET_BYTES: usize = 80 * 1024;
const CUT_MARKER: &str = "\n…(truncated)…";
const TOO_LARGE: &str = "[sessions_history omitted: message too large]";

/// What sanitising did to a batch of messages.
#[derive(Debug, Default, Clone, Copy)]
pub struct Flags {
    pub content_truncated: bool,
    pub content_redacted: bool,
}

struct Pattern {
    re: Regex,
    /// The capture group holding the secret (0 = whole match).
    group: usize,
}

fn patterns() -> &'static [Pattern] {
    static P: OnceLock<Vec<Pattern>> = OnceLock::new();
    P.get_or_init(|| {
        let p = |re: &str, group: usize| Pattern { re: Regex::new(re).expect("redaction pattern"), group };
        vec![
            p(r"(?s)-----BEGIN [A-Z ]*PRIVATE KEY-----.+?-----END [A-Z ]*PRIVATE KEY-----", 0),
            p(r#"(?i)"(?:api_?key|token|secret|password|passwd|access_?token|refresh_?token|client_?secret)"\s*:\s*"([^"]+)""#, 1),
            p(r#"(?i)--(?:api[-_]?key|token|secret|password|passwd)[ =]+["']?([^\s"']+)"#, 1),
            p(r"(?i)\bBearer\s+([A-Za-z0-9._~+/=-]{8,})", 1),
            p(r#"(?i)\b[A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD)\b\s*[=:]\s*["']?([^\s"',;]+)"#, 1),
            p(r"\b(sk-[A-Za-z0-9_-]{8,})", 1),
            p(r"\b(gh[pousr]_[A-Za-z0-9]{20,})", 1),
            p(r"\b(github_pat_[A-Za-z0-9_]{20,})", 1),
            p(r"\b(xox[abprs]-[A-Za-z0-9-]{10,})", 1),
            p(r"\b(xapp-[A-Za-z0-9-]{10,})", 1),
            p(r"\b(gsk_[A-Za-z0-9_-]{10,})", 1),
            p(r"\b(AIza[0-9A-Za-z_-]{20,})", 1),
            p(r"\b(pplx-[A-Za-z0-9_-]{10,})", 1),
            p(r"\b(npm_[A-Za-z0-9]{10,})", 1),
            p(r"\b(\d{6,}:[A-Za-z0-9_-]{20,})", 1),
            p(r"\b(smcp_[A-Za-z0-9_-]{8,})", 1),
        ]
    })
}

/// A session key is never a secret, even after `session_key:`.
fn looks_like_session_key(s: &str) -> bool {
    let s = s.trim_matches(|c| c == '"' || c == '\'');
    s.starts_with("agent:") || s == "main" || s == "global"
}

fn mask(secret: &str) -> String {
    let chars: Vec<char> = secret.chars().collect();
    if chars.len() < 18 {
        "***".to_string()
    } else {
        let head: String = chars[..6].iter().collect();
        let tail: String = chars[chars.len() - 4..].iter().collect();
        format!("{head}…{tail}")
    }
}

/// Masks secrets in `text`; returns whether anything was masked.
pub fn redact(text: &str) -> (String, bool) {
    let mut out = text.to_string();
    let mut changed = false;
    for p in patterns() {
        if !p.re.is_match(&out) {
            continue;
        }
        out =
            p.re.replace_all(&out, |c: &Captures| {
                let whole = c.get(0).expect("match").as_str();
                let Some(secret) = c.get(p.group) else { return whole.to_string() };
                if looks_like_session_key(secret.as_str()) || secret.as_str() == "***" || secret.as_str().contains('…')
                {
                    return whole.to_string();
                }
                changed = true;
                let start = secret.start() - c.get(0).expect("match").start();
                let end = start + secret.len();
                format!("{}{}{}", &whole[..start], mask(secret.as_str()), &whole[end..])
            })
            .into_owned();
    }
    (out, changed)
}

/// A run's reply or error as a tool answer hands it to a caller (a waiting `sessions_send`,
/// `tasks/get`): masked like every transcript text, since an agent may echo a key it saw.
pub fn run_text(text: Option<&str>) -> Option<String> {
    text.map(|t| redact(t).0)
}

/// Redacts and cuts one text field.
fn clean_text(text: &str, flags: &mut Flags) -> String {
    let (mut t, redacted) = redact(text);
    flags.content_redacted |= redacted;
    if t.chars().count() > MAX_TEXT_CHARS {
        t = t.chars().take(MAX_TEXT_CHARS).collect::<String>() + CUT_MARKER;
        flags.content_truncated = true;
    }
    t
}

/// Redacts every string inside a JSON value (tool-call arguments, tool results).
fn clean_value(v: &mut Value, flags: &mut Flags) {
    match v {
        Value::String(s) => *s = clean_text(s, flags),
        Value::Array(items) => items.iter_mut().for_each(|i| clean_value(i, flags)),
        Value::Object(map) => map.values_mut().for_each(|i| clean_value(i, flags)),
        _ => {}
    }
}

fn clean_block(block: &mut Map<String, Value>, flags: &mut Flags) {
    match block.get("type").and_then(Value::as_str) {
        Some("image") => {
            if let Some(data) = block.remove("data") {
                let bytes = data.as_str().map_or(0, str::len);
                block.insert("omitted".into(), true.into());
                block.insert("bytes".into(), bytes.into());
            }
        }
        Some("thinking") => {
            block.remove("thinkingSignature");
            if let Some(Value::String(t)) = block.get_mut("thinking") {
                *t = clean_text(t, flags);
            }
        }
        Some("toolCall") => {
            if let Some(args) = block.get_mut("arguments") {
                clean_value(args, flags);
            }
        }
        _ => {
            block.remove("textSignature");
            if let Some(Value::String(t)) = block.get_mut("text") {
                *t = clean_text(t, flags);
            }
        }
    }
}

/// Sanitises one message (the JSON from the store) in place.
pub fn sanitize_message(msg: &mut Value, flags: &mut Flags) {
    let Some(obj) = msg.as_object_mut() else { return };
    match obj.get_mut("content") {
        Some(Value::String(s)) => *s = clean_text(s, flags),
        Some(Value::Array(blocks)) => {
            for b in blocks.iter_mut() {
                match b {
                    Value::Object(block) => clean_block(block, flags),
                    Value::String(s) => *s = clean_text(s, flags),
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

/// A one-line preview of a message's content (for the operator's `show`).
pub fn preview(content: &Value, max_chars: usize) -> String {
    let text = match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .map(|b| match b.get("type").and_then(Value::as_str) {
                Some("text") => b.get("text").and_then(Value::as_str).unwrap_or("").to_string(),
                Some(other) => format!("[{other}]"),
                None => String::new(),
            })
            .collect::<Vec<_>>()
            .join(" "),
        other => other.to_string(),
    };
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() > max_chars {
        one_line.chars().take(max_chars).collect::<String>() + "…"
    } else {
        one_line
    }
}

/// The result of fitting messages into the budget.
#[derive(Debug)]
pub struct Fitted {
    pub messages: Vec<Value>,
    pub dropped: usize,
    pub bytes: usize,
    pub oversized: bool,
}

/// Drops messages until the JSON array fits `budget` bytes: the oldest first, or the newest
/// first when `drop_newest` (an `afterSeq` read, so continuing from the last seq misses nothing).
/// One message is always kept; if it alone is too large, its content is replaced.
pub fn fit_budget(messages: Vec<Value>, budget: usize, drop_newest: bool) -> Fitted {
    let sizes: Vec<usize> = messages.iter().map(|m| serde_json::to_string(m).map_or(0, |s| s.len())).collect();
    let total = |n: usize, sum: usize| 2 + sum + n.saturating_sub(1);
    let mut sum: usize = sizes.iter().sum();
    let (mut lo, mut hi) = (0, messages.len());
    while hi - lo > 1 && total(hi - lo, sum) > budget {
        if drop_newest {
            hi -= 1;
            sum -= sizes[hi];
        } else {
            sum -= sizes[lo];
            lo += 1;
        }
    }
    let dropped = messages.len() - (hi - lo);
    let mut kept: Vec<Value> = messages.into_iter().skip(lo).take(hi - lo).collect();
    let mut oversized = false;
    if kept.len() == 1 && total(1, sum) > budget {
        if let Some(obj) = kept[0].as_object_mut() {
            obj.insert("content".into(), Value::String(TOO_LARGE.into()));
        }
        oversized = true;
        sum = serde_json::to_string(&kept[0]).map_or(0, |s| s.len());
    }
    let bytes = if kept.is_empty() { 2 } else { total(kept.len(), sum) };
    Fitted { messages: kept, dropped, bytes, oversized }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn masks_common_secrets() {
        let cases = [
            ("OPENAI_API_KEY=sk-abcdefghijklmnopqrstuvwxyz", "sk-abc"),
            ("Authorization: Bearer abcdefghijklmnopqrstuvwx", "abcdef…uvwx"),
            ("token: ghp_abcdefghijklmnopqrstuvwxyz0123", "ghp_ab…0123"),
            (r#"{"apiKey": "short"}"#, "***"),
            ("run with --token hunter2", "***"),
            ("SESSIONS_MCP_TOKEN=smcp_run_0123456789abcdef0123", "smcp_r…0123"),
        ];
        for (text, expect) in cases {
            let (out, changed) = redact(text);
            assert!(changed, "{text}");
            assert!(out.contains(expect), "{text} -> {out}");
        }
    }

    #[test]
    fn session_keys_are_never_masked() {
        let text = "session_key: agent:main:subagent:fc5c1234-1111-4222-8333-444455553b12";
        let (out, changed) = redact(text);
        assert!(!changed);
        assert_eq!(out, text);
    }

    #[test]
    fn plain_text_is_untouched() {
        let (out, changed) = redact("the key to success is patience");
        assert!(!changed);
        assert_eq!(out, "the key to success is patience");
    }

    #[test]
    fn long_text_is_cut_and_images_are_sized() {
        let mut f = Flags::default();
        let mut m = json!({"role": "user", "content": [
            {"type": "text", "text": "x".repeat(5000)},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"}
        ]});
        sanitize_message(&mut m, &mut f);
        assert!(f.content_truncated && !f.content_redacted);
        let text = m["content"][0]["text"].as_str().unwrap();
        assert!(text.ends_with(CUT_MARKER));
        assert_eq!(m["content"][1], json!({"type": "image", "mimeType": "image/png", "omitted": true, "bytes": 4}));
        let mut f = Flags::default();
        let mut short = json!({"role": "user", "content": "hello"});
        sanitize_message(&mut short, &mut f);
        assert!(!f.content_truncated && !f.content_redacted);
    }

    #[test]
    fn budget_drops_oldest_or_newest_and_keeps_one() {
        let msgs: Vec<Value> = (0..10).map(|i| json!({"seq": i, "content": "y".repeat(100)})).collect();
        let f = fit_budget(msgs.clone(), 400, false);
        assert!(f.bytes <= 400 && f.dropped > 0);
        assert_eq!(f.messages.last().unwrap()["seq"], 9);
        let f = fit_budget(msgs.clone(), 400, true);
        assert_eq!(f.messages.first().unwrap()["seq"], 0);
        let f = fit_budget(msgs, 50, false);
        assert_eq!(f.messages.len(), 1);
        assert!(f.oversized);
        assert_eq!(f.messages[0]["content"], TOO_LARGE);
    }
}
