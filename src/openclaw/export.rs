//! `sessions-mcp export`: the reference's layout under `<stateDir>/export/` —
//! `agents/<agentId>/sessions/sessions.json` and one `<sessionId>.jsonl` (v3) per session — so
//! that `import <stateDir>/export` round-trips. It never overwrites a file it did not write: every
//! file it writes is recorded with its sha256 in `.sessions-mcp-export.json`, and a file is
//! replaced only while it still has that hash (transcripts also carry `"exportedBy"` in their
//! header line).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::store::{MessageRow, SessionRow, Store, StoreError, iso};

const MANIFEST: &str = ".sessions-mcp-export.json";
const MARKER: &str = "sessions-mcp";

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub directory: String,
    pub sessions: usize,
    pub messages: usize,
    /// Files not written, and why.
    pub refused: Vec<String>,
}

struct Writer {
    root: PathBuf,
    manifest: BTreeMap<String, String>,
    refused: Vec<String>,
}

impl Writer {
    fn open(root: PathBuf) -> Self {
        let manifest = std::fs::read_to_string(root.join(MANIFEST))
            .ok()
            .and_then(|t| serde_json::from_str::<BTreeMap<String, String>>(&t).ok())
            .unwrap_or_default();
        Writer { root, manifest, refused: Vec::new() }
    }

    /// Writes `rel` unless a file is there that this exporter did not write (or was changed since).
    fn write(&mut self, rel: &str, bytes: &[u8]) -> std::io::Result<bool> {
        let path = self.root.join(rel);
        if let Ok(existing) = std::fs::read(&path) {
            let ours = self.manifest.get(rel).is_some_and(|h| *h == sha256_hex(&existing));
            if !ours {
                self.refused
                    .push(format!("{}: exists and was not written by sessions-mcp export; left as is", path.display()));
                return Ok(false);
            }
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("tmp-export");
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &path)?;
        self.manifest.insert(rel.to_string(), sha256_hex(bytes));
        Ok(true)
    }

    fn finish(self) -> std::io::Result<Vec<String>> {
        let text = serde_json::to_string_pretty(&self.manifest).expect("manifest serialises");
        std::fs::write(self.root.join(MANIFEST), text)?;
        Ok(self.refused)
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("writing the export: {0}")]
    Io(#[from] std::io::Error),
}

/// Exports every session of `store` under `<state_dir>/export/`.
pub fn export(store: &Store, state_dir: &Path) -> Result<Report, ExportError> {
    let root = crate::config::export_dir(state_dir);
    std::fs::create_dir_all(&root)?;
    let mut writer = Writer::open(root.clone());
    let mut report = Report { directory: root.display().to_string(), ..Default::default() };
    let sessions = store.all_sessions()?;
    let mut indexes: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    let mut written_paths = Vec::new();
    for s in &sessions {
        let messages = store.all_messages(s.id)?;
        let rel = format!("agents/{}/sessions/{}.jsonl", s.agent_id, s.session_id);
        let path = root.join(&rel);
        if writer.write(&rel, transcript(s, &messages).as_bytes())? {
            written_paths.push((s.id, path.display().to_string()));
        }
        report.sessions += 1;
        report.messages += messages.len();
        indexes.entry(s.agent_id.to_string()).or_default().insert(s.key.to_string(), entry(s, &path));
    }
    for (agent, index) in indexes {
        let rel = format!("agents/{agent}/sessions/sessions.json");
        let text = serde_json::to_string_pretty(&Value::Object(index)).expect("index serialises") + "\n";
        writer.write(&rel, text.as_bytes())?;
    }
    report.refused = writer.finish()?;
    store.set_transcript_paths(&written_paths)?;
    Ok(report)
}

/// The sessions.json entry of a session (the reference's field names).
fn entry(s: &SessionRow, path: &Path) -> Value {
    let mut e = Map::new();
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v.filter(|v| !v.is_null()) {
            e.insert(k.to_string(), v);
        }
    };
    put("sessionId", Some(s.session_id.clone().into()));
    put("updatedAt", Some(s.updated_at.into()));
    put("sessionFile", Some(path.display().to_string().into()));
    put("channel", s.channel.clone().map(Value::from));
    put("chatType", s.chat_type.map(|c| c.as_str().into()));
    put("label", s.label.clone().map(Value::from));
    put("displayName", s.display_name.clone().map(Value::from));
    put("deliveryContext", s.delivery_context.clone());
    put("lastChannel", s.last_channel.clone().map(Value::from));
    put("lastTo", s.last_to.clone().map(Value::from));
    put("lastAccountId", s.last_account_id.clone().map(Value::from));
    put("spawnedBy", s.spawned_by.as_ref().map(|k| k.as_str().into()));
    put("spawnDepth", (s.spawn_depth > 0).then(|| s.spawn_depth.into()));
    put("subagentRole", s.subagent_role.clone().map(Value::from));
    put("sendPolicy", s.send_policy.map(|p| p.as_str().into()));
    put("model", s.model.clone().map(Value::from));
    put("thinkingLevel", s.thinking_level.clone().map(Value::from));
    put("verboseLevel", s.verbose_level.clone().map(Value::from));
    put("contextTokens", s.context_tokens.map(Value::from));
    put("systemSent", s.system_sent.map(Value::from));
    put("abortedLastRun", s.aborted_last_run.map(Value::from));
    put("inputTokens", Some(s.tokens_in.into()));
    put("outputTokens", Some(s.tokens_out.into()));
    put("totalTokens", Some(s.tokens_total.into()));
    put("cost", s.cost.map(Value::from));
    Value::Object(e)
}

/// The JSONL (v3) transcript: a header, then one entry per message, chained by parentId.
fn transcript(s: &SessionRow, messages: &[MessageRow]) -> String {
    let mut out = String::new();
    let header = json!({"type": "session", "version": 3, "id": s.session_id, "timestamp": iso(s.created_at),
                        "cwd": "", "exportedBy": MARKER});
    out.push_str(&header.to_string());
    out.push('\n');
    let mut parent: Option<String> = None;
    for m in messages {
        let imported = m.extra.get("imported");
        let id = imported
            .and_then(|i| i.get("id"))
            .and_then(Value::as_str)
            .map(String::from)
            // Unique within the session and never shaped like the reference's 8-hex ids.
            .unwrap_or_else(|| format!("smcp-{}", m.seq));
        let line = if m.role == "system" {
            let summary = m.content.get(0).and_then(|b| b.get("text")).or(Some(&m.content)).and_then(Value::as_str);
            json!({"type": "compaction", "id": id, "parentId": parent, "timestamp": iso(m.timestamp),
                   "summary": summary.unwrap_or("Compaction"), "firstKeptEntryId": null, "tokensBefore": 0})
        } else {
            json!({"type": "message", "id": id, "parentId": parent, "timestamp": iso(m.timestamp), "message": message(m)})
        };
        out.push_str(&line.to_string());
        out.push('\n');
        parent = Some(id);
    }
    out
}

/// The message as the reference stores it (the raw user text, with the gateway stamp, if known).
fn message(m: &MessageRow) -> Value {
    let mut msg = Map::new();
    msg.insert("role".into(), m.role.clone().into());
    let mut content = m.content.clone();
    if let Some(raw) = m.extra.get("imported").and_then(|i| i.get("rawText")).and_then(Value::as_str) {
        restore_raw(&mut content, raw);
    }
    msg.insert("content".into(), content);
    msg.insert("timestamp".into(), m.timestamp.into());
    for (k, v) in &m.extra {
        if k != "imported" {
            msg.insert(k.clone(), v.clone());
        }
    }
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            msg.insert(k.into(), v);
        }
    };
    put("provenance", m.provenance.clone());
    put("usage", m.usage.clone());
    put("model", m.model.clone().map(Value::from));
    put("stopReason", m.stop_reason.clone().map(Value::from));
    Value::Object(msg)
}

fn restore_raw(content: &mut Value, raw: &str) {
    match content {
        Value::String(s) => *s = raw.to_string(),
        Value::Array(blocks) => {
            if let Some(b) = blocks.iter_mut().find(|b| b.get("type").and_then(Value::as_str) == Some("text")) {
                b["text"] = raw.into();
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{AgentId, SessionKey, SessionKind};
    use crate::store::{NewSession, Store};

    #[test]
    fn generated_entry_ids_are_unique_within_a_session() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let key = SessionKey::from_canonical("agent:main:x");
        let row = store.insert_session(&NewSession::new(key, AgentId::main(), SessionKind::Other, false)).unwrap();
        let messages: Vec<MessageRow> = (1..=50_000)
            .map(|seq| MessageRow {
                seq,
                role: "user".into(),
                content: json!("x"),
                timestamp: seq,
                run_id: None,
                provenance: None,
                usage: None,
                model: None,
                stop_reason: None,
                silent: false,
                extra: Map::new(),
            })
            .collect();
        let text = transcript(&row, &messages);
        let ids: std::collections::HashSet<String> = text
            .lines()
            .skip(1)
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(ids.len(), 50_000);
    }
}
