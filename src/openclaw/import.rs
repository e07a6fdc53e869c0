//! `sessions-mcp import <openclaw-state-dir>`: bring a reference store (OpenClaw 2026.3.x) along.
//!
//! Reads `agents/*/sessions/sessions.json` and the JSONL (v3) transcripts it names. Sessions are
//! created `driven`; messages keep their roles, content blocks, usage and provenance; the gateway's
//! timestamp prefix is stripped from user text (the raw text is kept in `imported.rawText`, never
//! shown to tools); `compaction` lines become system messages; skip-token replies are stored
//! silent. Nothing existing is overwritten: a second import appends only entries whose reference
//! id is not present yet, so importing the same store twice changes nothing. Every file or entry
//! that is not imported gets a report line saying why.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::config::Config;
use crate::config::key_scope;
use crate::keys::{self, AgentId, ChatType, SessionKey, SessionRef};
use crate::store::{
    ImportedSession, Merged, NewMessage, NewSession, SendPolicyOverride, SessionExtras, Store, StoreError,
};

/// Assistant replies that mean "nothing to say": stored `silent`, never returned or delivered.
pub const SKIP_TOKENS: [&str; 3] = ["REPLY_SKIP", "ANNOUNCE_SKIP", "NO_REPLY"];
/// Sessions written per transaction.
const BATCH: usize = 500;

/// What an import did.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub sessions_seen: usize,
    pub sessions_created: usize,
    pub messages_imported: usize,
    pub messages_already_present: usize,
    /// One line per file or entry not imported (or imported with a caveat), with the reason.
    pub notes: Vec<String>,
}

/// Imports the reference store at `dir` into `store`.
pub fn import(dir: &Path, store: &Store, config: &Config) -> Result<Report, StoreError> {
    let mut report = Report::default();
    let agents_dir = dir.join("agents");
    let Ok(entries) = std::fs::read_dir(&agents_dir) else {
        report.notes.push(format!("{}: no agents/ directory; nothing to import", dir.display()));
        return Ok(report);
    };
    let mut agent_dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    agent_dirs.sort();
    let mut pending = Vec::new();
    for agent_dir in agent_dirs {
        read_agent(&agent_dir, config, &mut pending, &mut report);
    }
    // Parents before children, so the spawn tree links as rows arrive. The depth comes from the
    // lineage itself: a reference entry's `spawnDepth` may be missing or wrong.
    let depths = lineage_depths(&pending);
    pending.sort_by_cached_key(|p| (depths.get(&p.session.key).copied().unwrap_or(0), p.session.key.clone()));
    report.sessions_seen = pending.len();
    let progress = std::io::stderr().is_terminal() && pending.len() > BATCH;
    let total = pending.len();
    let mut done = 0;
    for chunk in pending.chunks(BATCH) {
        let merged = store.import_sessions(chunk)?;
        for (p, m) in chunk.iter().zip(merged) {
            report.count(p, m);
        }
        done += chunk.len();
        if progress {
            eprint!("\rimporting: {done}/{total} sessions");
            let _ = std::io::stderr().flush();
        }
    }
    if progress {
        eprintln!();
    }
    Ok(report)
}

impl Report {
    /// Counts what merging `p` did; a key already stored under another sessionId gets a note.
    fn count(&mut self, p: &ImportedSession, m: Merged) {
        self.sessions_created += usize::from(m.created);
        self.messages_imported += m.messages_imported;
        self.messages_already_present += m.messages_already_present;
        if !m.created && m.stored_session_id != p.session.session_id {
            self.notes.push(format!(
                "{}: conflict: the store already has this key with sessionId {} (import has {}); kept the stored session, appended messages not yet present",
                p.session.key, m.stored_session_id, p.session.session_id
            ));
        }
    }
}

/// Each pending session's depth in the lineage among the pending ones (0 for a root, or for a
/// session whose parent is not imported now). A cycle in `spawnedBy` stops the count.
fn lineage_depths(pending: &[ImportedSession]) -> HashMap<SessionKey, usize> {
    let parent: HashMap<&SessionKey, &SessionKey> =
        pending.iter().filter_map(|p| p.session.spawned_by.as_ref().map(|by| (&p.session.key, by))).collect();
    let depth = |key: &SessionKey| {
        let (mut n, mut cur) = (0, key);
        while let Some(up) = parent.get(cur).filter(|_| n < pending.len()) {
            n += 1;
            cur = up;
        }
        n
    };
    pending.iter().map(|p| (p.session.key.clone(), depth(&p.session.key))).collect()
}

fn read_agent(agent_dir: &Path, config: &Config, pending: &mut Vec<ImportedSession>, report: &mut Report) {
    let sessions_dir = agent_dir.join("sessions");
    let index_path = sessions_dir.join("sessions.json");
    let dir_agent = agent_dir.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    let Ok(text) = std::fs::read_to_string(&index_path) else {
        report.notes.push(format!("{}: missing or unreadable; agent {dir_agent:?} skipped", index_path.display()));
        return;
    };
    let index: Map<String, Value> = match json5::from_str::<Value>(&text) {
        Ok(Value::Object(m)) => m,
        Ok(_) => {
            report.notes.push(format!("{}: not a JSON object; agent {dir_agent:?} skipped", index_path.display()));
            return;
        }
        Err(e) => {
            report.notes.push(format!("{}: invalid JSON ({e}); agent {dir_agent:?} skipped", index_path.display()));
            return;
        }
    };
    let agent = AgentId::parse(&dir_agent).unwrap_or_else(|_| AgentId::main());
    let mut named_files = HashSet::new();
    for (raw_key, entry) in &index {
        let Some(entry) = entry.as_object() else {
            report.notes.push(format!("{}: entry {raw_key:?} is not an object; skipped", index_path.display()));
            continue;
        };
        let key = match keys::parse_ref(raw_key, &key_scope(config, &agent)) {
            Ok(SessionRef::Key(k)) => k,
            Ok(SessionRef::SessionId(_)) | Err(_) => {
                report.notes.push(format!("{}: {raw_key:?} is not a valid session key; skipped", index_path.display()));
                continue;
            }
        };
        let Some(session_id) = entry.get("sessionId").and_then(Value::as_str).filter(|s| keys::is_session_id(s)) else {
            report.notes.push(format!("{}: {raw_key:?} has no valid sessionId; skipped", index_path.display()));
            continue;
        };
        let transcript = transcript_path(&sessions_dir, session_id, entry, raw_key, report);
        if let Some(p) = &transcript {
            named_files.insert(p.clone());
        }
        let messages = match &transcript {
            Some(p) => read_transcript(p, report),
            None => Vec::new(),
        };
        pending.push(build(key, session_id, entry, config, messages));
    }
    report_unnamed_files(&sessions_dir, &named_files, report);
}

/// The transcript of an entry: `sessionFile` when it lies inside this sessions directory (a
/// store moved from elsewhere keeps its absolute paths: they are re-rooted here), else
/// `<sessionId>.jsonl`. Nothing outside the store is ever read.
fn transcript_path(
    sessions_dir: &Path,
    session_id: &str,
    entry: &Map<String, Value>,
    raw_key: &str,
    report: &mut Report,
) -> Option<PathBuf> {
    let default = sessions_dir.join(format!("{session_id}.jsonl"));
    let candidate = match entry.get("sessionFile").and_then(Value::as_str) {
        None => default,
        Some(file) => {
            let p = Path::new(file);
            let name = p.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            let plain_name = !name.is_empty() && !name.contains("..") && !name.starts_with('.');
            let re_rooted = p.parent().is_some_and(|d| d.ends_with("sessions")) && plain_name;
            if re_rooted && !file.contains("/../") {
                sessions_dir.join(name)
            } else {
                report.notes.push(format!(
                    "{raw_key}: sessionFile {file:?} lies outside the state dir; read {} instead",
                    default.display()
                ));
                default
            }
        }
    };
    match std::fs::symlink_metadata(&candidate) {
        Ok(m) if m.is_file() => Some(candidate),
        Ok(_) => {
            report.notes.push(format!(
                "{raw_key}: {} is not a regular file; session imported without messages",
                candidate.display()
            ));
            None
        }
        Err(_) => {
            report.notes.push(format!(
                "{raw_key}: transcript {} is missing; session imported without messages",
                candidate.display()
            ));
            None
        }
    }
}

fn report_unnamed_files(sessions_dir: &Path, named: &HashSet<PathBuf>, report: &mut Report) {
    let Ok(entries) = std::fs::read_dir(sessions_dir) else { return };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    for f in files {
        let name = f.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        if name == "sessions.json" || named.contains(&f) {
            continue;
        }
        let why = if name.contains(".deleted.") {
            "a deleted transcript"
        } else if name.contains(".reset.") {
            "a reset transcript"
        } else {
            "not named in sessions.json"
        };
        report.notes.push(format!("{}: skipped ({why})", f.display()));
    }
}

/// Reads message lines in file order (branches ignored); returns (reference id, message).
fn read_transcript(path: &Path, report: &mut Report) -> Vec<(String, NewMessage)> {
    let Ok(file) = std::fs::File::open(path) else {
        report.notes.push(format!("{}: unreadable; session imported without messages", path.display()));
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let Ok(line) = line else {
            report.notes.push(format!("{}:{}: unreadable line; skipped", path.display(), i + 1));
            continue;
        };
        if line.trim().is_empty() {
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            report.notes.push(format!("{}:{}: not valid JSON (truncated?); line skipped", path.display(), i + 1));
            continue;
        };
        let id = v.get("id").and_then(Value::as_str).map(String::from).unwrap_or_else(|| format!("line-{}", i + 1));
        let line_ts = v.get("timestamp").and_then(Value::as_str).and_then(parse_iso_ms);
        match v.get("type").and_then(Value::as_str) {
            Some("message") => match v.get("message").and_then(Value::as_object) {
                Some(m) => match message(m, &id, line_ts) {
                    Ok(msg) => out.push((id, msg)),
                    Err(why) => report.notes.push(format!("{}:{}: {why}; line skipped", path.display(), i + 1)),
                },
                None => {
                    report.notes.push(format!("{}:{}: message line without a message; skipped", path.display(), i + 1))
                }
            },
            Some("compaction") => {
                let summary =
                    v.get("summary").and_then(Value::as_str).filter(|s| !s.is_empty()).unwrap_or("Compaction");
                let imported = json!({"id": id, "kind": "compaction"});
                out.push((
                    id,
                    NewMessage {
                        role: "system".into(),
                        content: json!([{"type": "text", "text": summary}]),
                        timestamp: line_ts,
                        extra: Some(Map::from_iter([("imported".to_string(), imported)])),
                        ..Default::default()
                    },
                ));
            }
            _ => {}
        }
    }
    out
}

/// `[Mon 2026-11-30 03:36 UTC] ` at the start of user text: the gateway's stamp, not the user's.
fn strip_gateway_prefix(text: &str) -> Option<&str> {
    let rest = text.strip_prefix('[')?;
    let end = rest.find("] ")?;
    let stamp = &rest[..end];
    let looks_like_stamp = stamp.len() <= 40
        && stamp.contains(':')
        && stamp.split_whitespace().any(|w| w.len() == 10 && w.as_bytes()[4] == b'-' && w.as_bytes()[7] == b'-');
    looks_like_stamp.then(|| &rest[end + 2..])
}

fn message(m: &Map<String, Value>, id: &str, line_ts: Option<i64>) -> Result<NewMessage, String> {
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant" | "toolResult" | "system")) => r.to_string(),
        Some("tool") => "toolResult".to_string(),
        other => return Err(format!("unknown message role {other:?}")),
    };
    let mut content = m.get("content").cloned().unwrap_or(Value::String(String::new()));
    let mut imported = Map::from_iter([("id".to_string(), Value::from(id))]);
    if role == "user"
        && let Some(raw) = strip_first_text(&mut content)
    {
        imported.insert("rawText".into(), raw.into());
    }
    let silent = role == "assistant" && whole_text(&content).is_some_and(|t| SKIP_TOKENS.contains(&t.trim()));
    let known = ["role", "content", "timestamp", "provenance", "usage", "model", "stopReason"];
    let mut extra: Map<String, Value> =
        m.iter().filter(|(k, _)| !known.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
    extra.insert("imported".into(), Value::Object(imported));
    Ok(NewMessage {
        role,
        content,
        timestamp: m.get("timestamp").and_then(Value::as_i64).or(line_ts),
        run_id: None,
        provenance: m.get("provenance").cloned(),
        usage: m.get("usage").cloned(),
        model: m.get("model").and_then(Value::as_str).map(String::from),
        stop_reason: m.get("stopReason").and_then(Value::as_str).map(String::from),
        silent,
        chain_id: None,
        extra: Some(extra),
    })
}

/// Strips the gateway stamp from the first text of `content`; returns the raw text if it did.
fn strip_first_text(content: &mut Value) -> Option<String> {
    let text = match content {
        Value::String(s) => s,
        Value::Array(blocks) => blocks
            .iter_mut()
            .find(|b| b.get("type").and_then(Value::as_str) == Some("text"))?
            .get_mut("text")
            .and_then(|t| match t {
                Value::String(s) => Some(s),
                _ => None,
            })?,
        _ => return None,
    };
    let stripped = strip_gateway_prefix(text)?.to_string();
    Some(std::mem::replace(text, stripped))
}

/// The message's text when it is text only.
fn whole_text(content: &Value) -> Option<String> {
    match content {
        Value::String(s) => Some(s.clone()),
        Value::Array(blocks) => {
            let texts: Option<Vec<&str>> = blocks
                .iter()
                .map(|b| {
                    (b.get("type").and_then(Value::as_str) == Some("text")).then(|| b.get("text")?.as_str()).flatten()
                })
                .collect();
            texts.map(|t| t.concat())
        }
        _ => None,
    }
}

fn build(
    key: SessionKey,
    session_id: &str,
    e: &Map<String, Value>,
    config: &Config,
    messages: Vec<(String, NewMessage)>,
) -> ImportedSession {
    let s = |k: &str| e.get(k).and_then(Value::as_str).map(str::trim).filter(|v| !v.is_empty()).map(String::from);
    let i = |k: &str| e.get(k).and_then(Value::as_i64);
    let agent = key.agent_id(&config.default_agent());
    let scope = key_scope(config, &agent);
    let chat_type = s("chatType").as_deref().and_then(ChatType::parse);
    let dc = e.get("deliveryContext").filter(|v| v.is_object()).cloned();
    let dc_field = |f: &str| dc.as_ref().and_then(|d| d.get(f)).and_then(Value::as_str).map(String::from);
    let (dc_channel, dc_to, dc_account) = (dc_field("channel"), dc_field("to"), dc_field("accountId"));
    let mut n = NewSession::new(key.clone(), agent, keys::kind_of(&key, &scope, chat_type), false);
    n.session_id = session_id.to_string();
    n.chat_type = chat_type;
    n.channel = s("channel");
    n.last_channel = s("lastChannel").or(dc_channel);
    n.last_to = s("lastTo").or(dc_to);
    n.delivery_context = dc;
    n.label = s("label").map(|l| l.chars().take(64).collect());
    n.display_name = s("displayName");
    n.spawned_by = s("spawnedBy").and_then(|p| match keys::parse_ref(&p, &scope) {
        Ok(SessionRef::Key(k)) => Some(k),
        _ => None,
    });
    n.spawn_depth = i("spawnDepth").unwrap_or(i64::from(n.spawned_by.is_some()));
    n.subagent_role = s("subagentRole");
    n.model = s("model");
    n.updated_at = i("updatedAt").unwrap_or(n.updated_at);
    n.created_at = n.updated_at;
    n.origin = Some(json!({"importedFrom": "openclaw", "entry": e}));
    let extras = SessionExtras {
        last_account_id: s("lastAccountId").or(dc_account),
        send_policy: s("sendPolicy").as_deref().and_then(SendPolicyOverride::parse),
        model_provider: s("modelProvider"),
        thinking_level: s("thinkingLevel"),
        verbose_level: s("verboseLevel"),
        context_tokens: i("contextTokens"),
        system_sent: e.get("systemSent").and_then(Value::as_bool),
        aborted_last_run: e.get("abortedLastRun").and_then(Value::as_bool),
        tokens_in: i("inputTokens").unwrap_or(0),
        tokens_out: i("outputTokens").unwrap_or(0),
        tokens_total: i("totalTokens").unwrap_or(0),
        cost: e.get("cost").and_then(Value::as_f64),
    };
    ImportedSession { session: n, extras, messages }
}

/// ISO 8601 / RFC 3339 → ms since the epoch.
pub fn parse_iso_ms(s: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    Some((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_only_the_gateway_stamp() {
        assert_eq!(strip_gateway_prefix("[Mon 2026-11-30 03:36 UTC] hello"), Some("hello"));
        assert_eq!(
            strip_gateway_prefix("[Mon 2026-11-30 03:36 UTC] ECHO: [Mon 2026-11-30 03:36 UTC] x"),
            Some("ECHO: [Mon 2026-11-30 03:36 UTC] x")
        );
        assert_eq!(strip_gateway_prefix("[note] hello"), None);
        assert_eq!(strip_gateway_prefix("hello"), None);
    }

    #[test]
    fn messages_keep_blocks_and_mark_skip_tokens_silent() {
        let m = json!({"role": "assistant", "content": [{"type": "text", "text": "ANNOUNCE_SKIP"}],
                       "usage": {"input": 1}, "model": "m", "api": "x"});
        let msg = message(m.as_object().unwrap(), "abc", None).unwrap();
        assert!(msg.silent);
        assert_eq!(msg.extra.as_ref().unwrap()["api"], "x");
        assert_eq!(msg.extra.as_ref().unwrap()["imported"]["id"], "abc");
        let u = json!({"role": "user", "content": "[Mon 2026-11-30 03:36 UTC] hi", "timestamp": 5});
        let msg = message(u.as_object().unwrap(), "u1", None).unwrap();
        assert_eq!(msg.content, "hi");
        assert_eq!(msg.extra.as_ref().unwrap()["imported"]["rawText"], "[Mon 2026-11-30 03:36 UTC] hi");
        assert_eq!(msg.timestamp, Some(5));
        assert!(message(json!({"role": "alien"}).as_object().unwrap(), "x", None).is_err());
    }

    #[test]
    fn iso_timestamps_parse_to_ms() {
        assert_eq!(parse_iso_ms("1970-01-01T00:00:01.500Z"), Some(1500));
        assert_eq!(parse_iso_ms("nope"), None);
    }
}
