//! The stores the benchmarks run on, each seeded in one transaction (`Store::seed`) and cached
//! for the whole run: every row that needs "100,000 sessions" shares one state directory. Each
//! world is a state directory holding `sessions.db` and the `config.json5` its servers read.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::keys::{AgentId, SessionKey, SessionKind};
use crate::store::{NewMessage, NewSession, SeedRows, SeedSession, Store};

/// The scripted agent's script in a [`Worlds::with_agent`] state directory.
pub const SCRIPT_FILE: &str = "agent-script.json";
/// Messages per session in the list worlds: more than `messageLimit 5` reads.
const MESSAGES_PER_SESSION: u64 = 6;
/// Config of worlds whose caller (`main`) lists every session of its agent.
pub(super) const AGENT_VISIBILITY: &str = "{tools: {sessions: {visibility: 'agent'}}}";

/// The generated state directories of one bench run, removed when it ends.
pub struct Worlds {
    root: TempDir,
    made: HashSet<String>,
}

impl Worlds {
    pub fn new() -> std::io::Result<Self> {
        Ok(Worlds { root: TempDir::new("worlds")?, made: HashSet::new() })
    }

    /// A state directory nobody has written to (the empty store is created by its first user).
    pub fn empty(&mut self) -> anyhow::Result<PathBuf> {
        self.get("empty", AGENT_VISIBILITY, |_| Ok(()))
    }

    /// `n` sessions of agent main with a few messages each.
    pub fn sessions(&mut self, n: u64) -> anyhow::Result<PathBuf> {
        self.get(&format!("sessions-{n}"), AGENT_VISIBILITY, |store| seed_flat(store, n))
    }

    /// `agent:main:main` with `n` spawned children (for `tree` visibility).
    pub fn tree(&mut self, n: u64) -> anyhow::Result<PathBuf> {
        self.get(&format!("tree-{n}"), "{tools: {sessions: {visibility: 'tree'}}}", |store| seed_tree(store, n))
    }

    /// One session per size, [`history_key`]`(size)`, holding that many messages (a quarter of them
    /// tool results).
    pub fn histories(&mut self, sizes: &[u64]) -> anyhow::Result<PathBuf> {
        let name = format!("history-{}", sizes.iter().map(u64::to_string).collect::<Vec<_>>().join("-"));
        self.get(&name, AGENT_VISIBILITY, |store| sizes.iter().try_for_each(|&n| seed_history(store, n)))
    }

    /// Empty sessions `targets` of agent main, whose runs the built-in agent answers with `script`
    /// (written to [`SCRIPT_FILE`] in the state directory).
    pub fn with_agent(&mut self, name: &str, script: &serde_json::Value, targets: &[&str]) -> anyhow::Result<PathBuf> {
        let script_path = self.root.path().join(name).join(SCRIPT_FILE);
        let exe = std::env::current_exe()?;
        let config = json!({
            "tools": {"sessions": {"visibility": "agent"}},
            "agents": {"list": [{"id": "main", "runner": {"command": exe, "args": ["agent", "--script", script_path]}}]},
        });
        self.get(name, &config.to_string(), |store| {
            std::fs::write(&script_path, script.to_string())?;
            let sessions = targets.iter().map(|key| SeedSession::new(session(SessionKey::from_canonical(*key)), []));
            Ok(store.seed(sessions, &SeedRows::default())?)
        })
    }

    /// An empty store under `config` (the fan-out worlds bring their own agent and caps).
    pub fn with_config(&mut self, name: &str, config: &serde_json::Value) -> anyhow::Result<PathBuf> {
        self.get(name, &config.to_string(), |_| Ok(()))
    }

    /// A fresh state directory under the run's root, not cached (for imports).
    pub fn scratch(&self, name: &str) -> PathBuf {
        self.root.path().join(format!("{name}-{}", uuid::Uuid::new_v4()))
    }

    fn get(
        &mut self,
        name: &str,
        config: &str,
        seed: impl FnOnce(&Store) -> anyhow::Result<()>,
    ) -> anyhow::Result<PathBuf> {
        let dir = self.root.path().join(name);
        if self.made.insert(name.to_string()) {
            let started = std::time::Instant::now();
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("config.json5"), config)?;
            seed(&Store::open(&Store::path_in(&dir))?)?;
            tracing::info!(world = name, seconds = started.elapsed().as_secs_f64(), "bench: store generated");
        }
        Ok(dir)
    }
}

/// The session of the history world with `n` messages.
pub fn history_key(n: u64) -> String {
    format!("agent:main:bench:history:{n}")
}

pub(super) fn session(key: SessionKey) -> NewSession {
    NewSession::new(key, AgentId::main(), SessionKind::Other, false)
}

/// Message `i` of a transcript: user text, an assistant text with a tool call, its tool result,
/// an assistant answer, in turn.
fn transcript_message(i: u64) -> NewMessage {
    let text = format!("message {i}: a short line of transcript text for the benchmark");
    let (role, content) = match i % 4 {
        0 => ("user", json!([{"type": "text", "text": text}])),
        1 => (
            "assistant",
            json!([{"type": "text", "text": text},
                   {"type": "toolCall", "id": format!("call{i}"), "name": "read", "arguments": {"path": "notes.md"}}]),
        ),
        2 => ("toolResult", json!([{"type": "text", "text": format!("contents of notes.md for call{}", i - 1)}])),
        _ => ("assistant", json!([{"type": "text", "text": text}])),
    };
    NewMessage { role: role.into(), content, ..Default::default() }
}

/// A session and the first `n` messages of a transcript.
fn with_transcript(s: NewSession, n: u64) -> SeedSession<impl Iterator<Item = NewMessage>> {
    SeedSession::new(s, (0..n).map(transcript_message))
}

pub(super) fn seed_flat(store: &Store, sessions: u64) -> anyhow::Result<()> {
    let key = |i: u64| SessionKey::for_agent(&AgentId::main(), &format!("bench:{i}"));
    Ok(store
        .seed((0..sessions).map(|i| with_transcript(session(key(i)), MESSAGES_PER_SESSION)), &SeedRows::default())?)
}

fn seed_tree(store: &Store, children: u64) -> anyhow::Result<()> {
    let main = AgentId::main();
    let parent = SessionKey::from_canonical("agent:main:main");
    let child = |_| {
        let mut s = session(SessionKey::for_agent(&main, &format!("subagent:{}", uuid::Uuid::new_v4())));
        s.spawned_by = Some(parent.clone());
        s.spawn_depth = 1;
        s
    };
    let root = NewSession::new(parent.clone(), main.clone(), SessionKind::Main, true);
    let sessions = std::iter::once(root).chain((0..children).map(child));
    Ok(store.seed(sessions.map(|s| SeedSession::new(s, [])), &SeedRows::default())?)
}

pub(super) fn seed_history(store: &Store, messages: u64) -> anyhow::Result<()> {
    let s = session(SessionKey::from_canonical(history_key(messages)));
    Ok(store.seed([with_transcript(s, messages)], &SeedRows::default())?)
}

/// A temporary directory removed on drop (no test-only crates in the binary).
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(what: &str) -> std::io::Result<Self> {
        let p = std::env::temp_dir().join(format!("sessions-mcp-bench-{what}-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&p)?;
        Ok(TempDir(p))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
