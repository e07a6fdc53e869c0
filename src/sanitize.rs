//! What transcripts look like when a tool returns them: secrets masked, long text cut, image data
//! replaced by its size, and the whole answer kept under a byte budget. Each flag reports only
//! what actually happened (**Fix**: the reference reported truncation whenever it deleted a field).

use std::sync::OnceLock;

use regex::{Captures, Regex};
use serde_json::{Map, Value};

/// Longest text block returned, in characters.
pub const MAX_TEXT_CHARS: usize = 4000;
const CUT_WORD: &str = "…(truncated)…";
const CUT_MARKER: &str = "\n…(truncated)…";

/// What sanitising did to a batch of messages.
#[derive(Debug, Default, Clone, Copy)]
pub struct Flags {
    pub content_truncated: bool,
    pub content_redacted: bool,
}

/// JSON keys whose string value is a secret, whatever it looks like.
const SECRET_FIELDS: &str = "api_?key|token|secret|password|passwd|access_?token|refresh_?token|client_?secret";

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
            p(&format!(r#"(?i)"(?:{SECRET_FIELDS})"\s*:\s*"([^"]+)""#), 1),
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

/// Whether a JSON key names a secret (`"apiKey"`, `"password"`, …).
fn names_secret(key: &str) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(&format!("(?i)^(?:{SECRET_FIELDS})$")).expect("secret field pattern")).is_match(key)
}

/// Whether `s` is already a mask (redacting twice changes nothing).
fn is_masked(s: &str) -> bool {
    s == "***" || s.contains('…')
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
                if looks_like_session_key(secret.as_str()) || is_masked(secret.as_str()) {
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

/// Masks secrets in every string inside a JSON value (an ask's details and options, a tool
/// call's arguments), and the whole of a string filed under a key that names a secret
/// (`{"password": "hunter2"}`, which the text patterns only see in JSON text). Returns whether
/// anything was masked.
pub fn redact_value(value: &mut Value) -> bool {
    let mut changed = false;
    each_string(value, false, &mut |s, under_secret_key| {
        if under_secret_key && !s.is_empty() && !looks_like_session_key(s) && !is_masked(s) {
            *s = mask(s);
            changed = true;
        } else if let (masked, true) = redact(s) {
            *s = masked;
            changed = true;
        }
    });
    changed
}

/// Calls `f` on every string inside `value`, with whether its key names a secret.
fn each_string(value: &mut Value, under_secret_key: bool, f: &mut dyn FnMut(&mut String, bool)) {
    match value {
        Value::String(s) => f(s, under_secret_key),
        Value::Array(items) => items.iter_mut().for_each(|i| each_string(i, under_secret_key, f)),
        Value::Object(map) => map.iter_mut().for_each(|(k, i)| each_string(i, names_secret(k), f)),
        _ => {}
    }
}

/// An ask's words as anyone is shown them.
#[derive(Debug, Clone, PartialEq)]
pub struct AskWords {
    pub text: String,
    pub options: Option<Value>,
    pub details: Option<Value>,
}

/// An ask's words as `subagents` list and wait, the dashboard, an elicitation and the
/// answerer's prompt show them: masked like the transcript that records the ask, since the
/// asking agent wrote them.
pub fn ask_words(text: &str, options: Option<&Value>, details: Option<&Value>) -> AskWords {
    let masked = |v: Option<&Value>| {
        v.cloned().map(|mut v| {
            redact_value(&mut v);
            v
        })
    };
    AskWords { text: redact(text).0, options: masked(options), details: masked(details) }
}

/// Redacts and cuts text fields: at `max_chars` for a page of messages, never for a
/// continuation read (which pages through a message's whole text instead).
struct Cleaner<'a> {
    max_chars: usize,
    flags: &'a mut Flags,
    cut: bool,
}

impl Cleaner<'_> {
    fn text(&mut self, text: &str) -> String {
        let (t, redacted) = redact(text);
        self.flags.content_redacted |= redacted;
        self.cut(t)
    }

    fn cut(&mut self, text: String) -> String {
        if text.chars().count() <= self.max_chars {
            return text;
        }
        self.cut = true;
        text.chars().take(self.max_chars).collect::<String>() + CUT_MARKER
    }

    /// Redacts and cuts every string inside a JSON value (tool-call arguments, tool results).
    fn value(&mut self, v: &mut Value) {
        self.flags.content_redacted |= redact_value(v);
        each_string(v, false, &mut |s, _| *s = self.cut(std::mem::take(s)));
    }

    fn block(&mut self, block: &mut Map<String, Value>) {
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
                    *t = self.text(t);
                }
            }
            Some("toolCall") => {
                if let Some(args) = block.get_mut("arguments") {
                    self.value(args);
                }
            }
            _ => {
                block.remove("textSignature");
                if let Some(Value::String(t)) = block.get_mut("text") {
                    *t = self.text(t);
                }
            }
        }
    }

    fn content(&mut self, content: &mut Value) {
        match content {
            Value::String(s) => *s = self.text(s),
            Value::Array(blocks) => {
                for b in blocks.iter_mut() {
                    match b {
                        Value::Object(block) => self.block(block),
                        Value::String(s) => *s = self.text(s),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
}

/// Per-message fields the model pays for and does not need (the reference strips `usage`,
/// `cost` and `details`; `api` and `provider` say no more than `model`). `show` and `export`
/// keep them.
const HEAVY_FIELDS: [&str; 5] = ["usage", "cost", "details", "api", "provider"];

/// Sanitises one message (the JSON from the store) in place. A message whose text was cut gets
/// `rest: {fromChar, totalChars}`: pass its `seq` and `fromChar` to `sessions_history` to read on.
pub fn sanitize_message(msg: &mut Value, flags: &mut Flags) {
    let Some(obj) = msg.as_object_mut() else { return };
    for field in HEAVY_FIELDS {
        obj.remove(field);
    }
    let Some(content) = obj.get_mut("content") else { return };
    let raw = content.clone();
    let mut cleaner = Cleaner { max_chars: MAX_TEXT_CHARS, flags, cut: false };
    cleaner.content(content);
    if !cleaner.cut {
        return;
    }
    cleaner.flags.content_truncated = true;
    let from_char = cut_position(&flatten(content));
    let total_chars = whole_text(&raw, &mut Flags::default()).chars().count();
    if obj.contains_key("seq") {
        obj.insert("rest".into(), rest(from_char, total_chars));
    }
}

fn rest(from_char: usize, total_chars: usize) -> Value {
    serde_json::json!({"fromChar": from_char, "totalChars": total_chars})
}

/// A message's content as one text, secrets masked and nothing cut: what a continuation read
/// (`seq`, `fromChar`) pages through. Blocks are joined by a blank line; a thinking block reads
/// `[thinking] …`, a tool call `[toolCall name] {arguments}`, an image `[image mime, N bytes]`.
pub fn whole_text(content: &Value, flags: &mut Flags) -> String {
    let mut content = content.clone();
    Cleaner { max_chars: usize::MAX, flags, cut: false }.content(&mut content);
    flatten(&content)
}

fn flatten(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks.iter().map(flatten_block).collect::<Vec<_>>().join("\n\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn flatten_block(block: &Value) -> String {
    let field = |k: &str| block.get(k).and_then(Value::as_str).unwrap_or("");
    match block.get("type").and_then(Value::as_str) {
        _ if block.is_string() => block.as_str().unwrap_or("").to_string(),
        Some("text") => field("text").to_string(),
        Some("thinking") => format!("[thinking] {}", field("thinking")),
        Some("toolCall") => {
            let args = block.get("arguments").map(Value::to_string).unwrap_or_default();
            format!("[toolCall {}] {args}", field("name"))
        }
        Some("image") => {
            format!("[image {}, {} bytes]", field("mimeType"), block.get("bytes").and_then(Value::as_u64).unwrap_or(0))
        }
        _ => block.to_string(),
    }
}

/// Where the first cut marker of a flattened text begins, in characters (the marker may sit
/// inside tool-call arguments, where its newline is escaped).
fn cut_position(shown: &str) -> usize {
    let Some(at) = shown.find(CUT_WORD) else { return shown.chars().count() };
    let before = &shown[..at];
    let before = before.strip_suffix("\\n").or_else(|| before.strip_suffix('\n')).unwrap_or(before);
    before.chars().count()
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
/// One message is always kept; if it alone is too large, its text is cut to fit, with `rest`
/// saying where to read on.
pub fn fit_budget(messages: Vec<Value>, budget: usize, drop_newest: bool) -> Fitted {
    let sizes: Vec<usize> = messages.iter().map(json_len).collect();
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
    if let [only] = kept.as_mut_slice()
        && total(1, sum) > budget
    {
        shrink_message(only, budget.saturating_sub(total(1, 0)));
        oversized = true;
        sum = json_len(only);
    }
    let bytes = if kept.is_empty() { 2 } else { total(kept.len(), sum) };
    Fitted { messages: kept, dropped, bytes, oversized }
}

/// Size of a value as the JSON a host receives.
pub fn json_len<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    serde_json::to_string(value).map_or(usize::MAX, |s| s.len())
}

/// The byte offset of every character of `text`, and of its end.
fn char_bounds(text: &str) -> Vec<usize> {
    text.char_indices().map(|(i, _)| i).chain([text.len()]).collect()
}

/// The largest `n` in `lo..=hi` for which `fits(n)` holds, given that it holds for `lo` or for
/// nothing (then `lo`). A binary search: escaping makes JSON size grow unevenly with length.
fn largest_fitting(mut lo: usize, mut hi: usize, mut fits: impl FnMut(usize) -> bool) -> usize {
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) { lo = mid } else { hi = mid - 1 }
    }
    lo
}

/// Cuts one sanitised message to `budget` bytes of JSON: its text up to where it was already
/// cut, as much of it as fits.
fn shrink_message(msg: &mut Value, budget: usize) {
    let shown = flatten(msg.get("content").unwrap_or(&Value::Null));
    let chars = shown.chars().count();
    let rest_of = |k: &str| msg.pointer(&format!("/rest/{k}")).and_then(Value::as_u64).map(|n| n as usize);
    let (limit, total) = (rest_of("fromChar").unwrap_or(chars), rest_of("totalChars").unwrap_or(chars));
    fit_text(msg, &shown, TextPart { from: 0, limit, total }, budget);
}

/// The longest prefix of `text`, marked as cut, whose JSON string takes at most `max_json`
/// bytes (a reply or an error text that would not let its answer fit).
pub fn cut_to_json_len(text: &str, max_json: usize) -> String {
    let bounds = char_bounds(text);
    let cut = |n: usize| text[..bounds[n]].to_string() + CUT_MARKER;
    cut(largest_fitting(0, bounds.len() - 1, |n| json_len(&cut(n)) <= max_json))
}

/// Which characters of a message's text may go into its `content`.
#[derive(Debug, Clone, Copy)]
pub struct TextPart {
    /// The first character to show.
    pub from: usize,
    /// Show nothing at or past this character of `text`.
    pub limit: usize,
    /// The whole text's length, for `rest`.
    pub total: usize,
}

/// Sets the message's `content` to as much of `text` from `part.from` as keeps the message within
/// `budget` bytes of JSON (a cut part ends with the marker), and `rest` to where the next part
/// starts; messages without a seq cannot be read on, so they get no `rest`.
pub fn fit_text(msg: &mut Value, text: &str, part: TextPart, budget: usize) {
    let Some(obj) = msg.as_object_mut() else { return };
    let bounds = char_bounds(text);
    let (from, limit) = (part.from.min(bounds.len() - 1), part.limit.min(bounds.len() - 1));
    let has_seq = obj.contains_key("seq");
    let mut set = |end: usize| {
        let mut shown = text[bounds[from]..bounds[end]].to_string();
        obj.remove("rest");
        if end < part.total {
            shown.push_str(CUT_MARKER);
            if has_seq {
                obj.insert("rest".into(), rest(end, part.total));
            }
        }
        obj.insert("content".into(), Value::String(shown));
        json_len(&*obj)
    };
    let end = largest_fitting(from, limit.max(from), |end| set(end) <= budget);
    set(end);
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
    fn an_asks_words_are_masked_in_text_options_and_details() {
        let details = json!({"toolName": "Bash", "input": {"command": "curl -H 'Authorization: Bearer abcdefghijklmnop1234'"},
            "password": "hunter2", "session": "agent:main:main", "apiKey": "***"});
        let words = ask_words(
            "use sk-abcdefghijklmnopqrstuvwxyz?",
            Some(&json!(["sk-0123456789abcdefghij", "no"])),
            Some(&details),
        );
        assert_eq!(words.text, "use sk-abc…wxyz?");
        assert_eq!(words.options, Some(json!(["sk-012…ghij", "no"])));
        let d = words.details.unwrap();
        assert_eq!(d["input"]["command"], "curl -H 'Authorization: Bearer abcdef…1234'");
        assert_eq!(d["password"], "***");
        assert_eq!(
            (d["session"].as_str(), d["apiKey"].as_str(), d["toolName"].as_str()),
            (Some("agent:main:main"), Some("***"), Some("Bash"))
        );
        let plain = ask_words("May I run ls?", None, None);
        assert_eq!((plain.text.as_str(), plain.options, plain.details), ("May I run ls?", None, None));
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
        let f = fit_budget(msgs, 120, false);
        assert_eq!(f.messages.len(), 1);
        assert!(f.oversized && f.bytes <= 120, "{f:?}");
        let content = f.messages[0]["content"].as_str().unwrap();
        assert!(content.starts_with('y') && content.ends_with(CUT_MARKER), "{content}");
        let shown = content.len() - CUT_MARKER.len();
        assert_eq!(f.messages[0]["rest"], json!({"fromChar": shown, "totalChars": 100}));
    }

    #[test]
    fn a_cut_message_says_where_its_text_goes_on() {
        let mut f = Flags::default();
        let mut m = json!({"seq": 7, "role": "assistant", "usage": {"input": 1}, "api": "x", "provider": "y",
            "content": [{"type": "text", "text": "ab"}, {"type": "text", "text": "é".repeat(5000)}]});
        sanitize_message(&mut m, &mut f);
        assert!(m.get("usage").is_none() && m.get("api").is_none() && m.get("provider").is_none());
        // "ab", the blank line, then 4000 of the 5000 characters.
        assert_eq!(m["rest"], json!({"fromChar": 2 + 2 + 4000, "totalChars": 2 + 2 + 5000}));
        let whole = whole_text(&m.clone()["content"], &mut Flags::default());
        assert!(whole.starts_with("ab\n\né"));
        let mut raw = json!({"seq": 7, "role": "assistant", "content": [{"type": "text", "text": "ab"},
            {"type": "text", "text": "é".repeat(5000)}]});
        let text = whole_text(&raw["content"], &mut Flags::default());
        fit_text(&mut raw, &text, TextPart { from: 4004, limit: 5004, total: 5004 }, 10_000);
        assert_eq!(raw["content"], "é".repeat(1000));
        assert!(raw.get("rest").is_none());
    }

    #[test]
    fn a_cut_inside_tool_call_arguments_is_found() {
        let mut f = Flags::default();
        let mut m =
            json!({"seq": 1, "content": [{"type": "toolCall", "name": "w", "arguments": {"a": "z".repeat(4100)}}]});
        sanitize_message(&mut m, &mut f);
        let prefix = "[toolCall w] {\"a\":\"".chars().count();
        assert_eq!(m["rest"]["fromChar"], prefix + 4000);
    }

    #[test]
    fn a_cut_text_fits_its_json_length() {
        let text = "\"quoted\" ".repeat(100);
        let cut = cut_to_json_len(&text, 200);
        assert!(serde_json::to_string(&cut).unwrap().len() <= 200);
        assert!(cut.ends_with(CUT_MARKER) && text.starts_with(cut.trim_end_matches(CUT_MARKER)));
    }
}
