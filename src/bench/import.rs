//! `sessions-mcp import` of a generated reference (OpenClaw 2026.3) store: `sessions.json` plus
//! one JSONL v3 transcript per session, user / assistant with usage / tool result in turn, as the
//! reference's own benchmark generator writes them. Each import goes into a fresh state directory.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use serde_json::{Map, Value, json};

use super::client;
use super::{Bench, Group, Row, Samples};

/// Messages per generated session.
const PER_SESSION: u64 = 100;
/// Imports timed in full mode (one in quick mode).
const REPEATS: usize = 3;

pub async fn run(bench: &mut Bench) -> anyhow::Result<()> {
    let messages = bench.sizes.import_messages;
    let reference = bench.worlds.scratch("reference");
    write_reference(&reference, messages)?;
    let mut samples = Samples::default();
    let repeats = if bench.quick { 1 } else { REPEATS };
    for _ in 0..repeats {
        let target = bench.worlds.scratch("imported");
        std::fs::create_dir_all(&target)?;
        let t = Instant::now();
        let out = client::command(&target.join("import.log"))?
            .arg("import")
            .arg(&reference)
            .arg("--json")
            .arg("--state-dir")
            .arg(&target)
            .output()
            .await
            .context("cannot start `sessions-mcp import`")?;
        samples.push_since(t);
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let imported = report["messagesImported"].as_u64().unwrap_or(0);
        anyhow::ensure!(
            out.status.success() && imported == messages,
            "import imported {imported} of {messages} messages; see {}",
            target.join("import.log").display()
        );
    }
    let rate = format!("{:.0} messages/s", messages as f64 / (samples.pct(0.5) / 1e3));
    let what = format!("import of a reference store, {messages} messages in {} sessions", messages / PER_SESSION);
    bench.push(Row::latency(Group::Import, what, &samples).with_rate(rate));
    Ok(())
}

fn write_reference(dir: &Path, messages: u64) -> anyhow::Result<()> {
    let sessions_dir = dir.join("agents/main/sessions");
    std::fs::create_dir_all(&sessions_dir)?;
    let base_ms: i64 = 1_796_000_000_000;
    let mut index = Map::new();
    for s in 0..messages.div_ceil(PER_SESSION) {
        let id = uuid::Uuid::new_v4().to_string();
        let count = PER_SESSION.min(messages - s * PER_SESSION);
        let mut out = std::io::BufWriter::new(std::fs::File::create(sessions_dir.join(format!("{id}.jsonl")))?);
        let header =
            json!({"type": "session", "version": 3, "id": id, "timestamp": crate::store::iso(base_ms), "cwd": "/tmp"});
        writeln!(out, "{header}")?;
        for i in 0..count {
            let ts = base_ms + (s * PER_SESSION + i) as i64 * 1000;
            let line = json!({"type": "message", "id": format!("{s:06x}{i:04x}"), "timestamp": crate::store::iso(ts),
                              "message": reference_message(i, ts)});
            writeln!(out, "{line}")?;
        }
        out.flush()?;
        index.insert(format!("agent:main:bench:{s}"), json!({"sessionId": id, "updatedAt": base_ms + s as i64}));
    }
    std::fs::write(sessions_dir.join("sessions.json"), Value::Object(index).to_string())?;
    Ok(())
}

fn reference_message(i: u64, ts: i64) -> Value {
    let text = format!("message {i}: a short line of transcript text, about as long as the reference's");
    match i % 3 {
        0 => {
            json!({"role": "user", "content": [{"type": "text", "text": format!("[Mon 2026-11-30 03:36 UTC] {text}")}],
                    "timestamp": ts})
        }
        1 => json!({"role": "assistant", "content": [{"type": "text", "text": text}], "timestamp": ts,
                    "usage": {"input": 1200, "output": 34, "totalTokens": 1234}, "stopReason": "stop"}),
        _ => json!({"role": "toolResult", "toolCallId": format!("call{i}"), "toolName": "read",
                    "content": [{"type": "text", "text": text}], "timestamp": ts}),
    }
}
