//! One function per fuzz target. Each feeds arbitrary bytes to a parser of untrusted input and
//! checks what must hold for any input (besides not panicking).

use std::io::Write;
use std::sync::{Arc, OnceLock};

use serde_json::{Value, json};
use sessions_mcp::access::Access;
use sessions_mcp::access::caller::Caller;
use sessions_mcp::config::key_scope;
use sessions_mcp::config::{AttachmentsConfig, Config};
use sessions_mcp::keys::{AgentId, SessionRef, parse_ref};
use sessions_mcp::server::SessionsServer;
use sessions_mcp::store::Store;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Runs the entry point named `target` (the fuzz target's name).
pub fn run(target: &str, data: &[u8]) {
    match target {
        "keys" => keys(data),
        "config" => config(data),
        "attachments" => attachments(data),
        "runner_events" => runner_events(data),
        "import" => import(data),
        "jsonrpc" => jsonrpc(data),
        other => panic!("no fuzz target {other}"),
    }
}

/// Session keys and agent ids: a parsed key is canonical (lower case, printable) and parses to
/// itself again.
pub fn keys(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = AgentId::parse(text);
    let scope = key_scope(&Config::default(), &AgentId::main());
    if let Ok(SessionRef::Key(key)) = parse_ref(text, &scope) {
        let s = key.as_str();
        assert!(s.bytes().all(|b| (0x21..=0x7e).contains(&b) && !b.is_ascii_uppercase()), "not canonical: {s:?}");
        assert_eq!(parse_ref(s, &scope).ok(), Some(SessionRef::Key(key.clone())), "{s:?} does not parse to itself");
    }
}

/// JSON5 config: `parse` accepts exactly what `problems` (doctor) finds nothing wrong with.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let parsed = sessions_mcp::config::parse(text);
    let problems = sessions_mcp::config::problems(text);
    assert_eq!(parsed.is_ok(), problems.is_empty(), "parse {:?} but problems {problems:?}", parsed.err());
}

/// Spawn attachments (names, utf8/base64 content, sizes) as the tool receives them.
pub fn attachments(data: &[u8]) {
    let Ok(Value::Array(list)) = serde_json::from_slice::<Value>(data) else { return };
    let limits = AttachmentsConfig { enabled: true, max_files: 8, max_file_bytes: 4096, max_total_bytes: 8192 };
    if let Ok(files) = sessions_mcp::engine::attachments::validate(&list, &limits) {
        assert!(files.len() <= 8, "more files than maxFiles");
    }
}

/// The agent output decoders (`jsonl/1` and the four CLI adapters, picked by the first byte) and
/// the run's event rules: any stdout is read without panicking, and a sessions_spawn tool call
/// never keeps attachment content in the transcript.
pub fn runner_events(data: &[u8]) {
    use sessions_mcp::config::RunnerKind;
    let Some((pick, rest)) = data.split_first() else { return };
    let kinds = [
        RunnerKind::Jsonl,
        RunnerKind::ClaudeStreamJson,
        RunnerKind::CodexExecJson,
        RunnerKind::Text,
        RunnerKind::GeminiStreamJson,
    ];
    let kind = kinds[usize::from(*pick) % kinds.len()];
    let (messages, _reply) = sessions_mcp::runner::decode_stdout(kind, "run-fuzz", &String::from_utf8_lossy(rest));
    for m in messages {
        for block in m.content.as_array().into_iter().flatten() {
            if block["name"].as_str().is_some_and(|n| n.ends_with("sessions_spawn")) {
                for a in block["arguments"]["attachments"].as_array().into_iter().flatten() {
                    assert!(a.get("content").is_none_or(|c| c == "[attachment content omitted]"), "{a}");
                }
            }
        }
    }
}

/// The reference-store importer: the first byte picks what is fuzzed, `sessions.json` or a
/// transcript (`<id>.jsonl`); the other file is a valid one.
pub fn import(data: &[u8]) {
    let Some((mode, rest)) = data.split_first() else { return };
    let valid_index = json!({"agent:main:main": {"sessionId": "s1", "sessionFile": "s1.jsonl", "updatedAt": 1}});
    let valid_line = br#"{"type":"message","id":"m1","message":{"role":"user","content":"hi"}}"#;
    let (index, transcript): (&[u8], &[u8]) =
        if mode % 2 == 0 { (rest, valid_line) } else { (&serde_json::to_vec(&valid_index).expect("json"), rest) };
    let dir = tempfile::tempdir_in(scratch()).expect("tempdir");
    let sessions = dir.path().join("agents/main/sessions");
    std::fs::create_dir_all(&sessions).expect("dirs");
    std::fs::File::create(sessions.join("sessions.json")).and_then(|mut f| f.write_all(index)).expect("index");
    std::fs::File::create(sessions.join("s1.jsonl")).and_then(|mut f| f.write_all(transcript)).expect("transcript");
    let store = Store::open(&Store::path_in(&dir.path().join("state"))).expect("store");
    let _ = sessions_mcp::openclaw::import::import(dir.path(), &store, &Config::default());
}

/// JSON-RPC through the whole server (the stdio transport over a duplex pipe): after any lines
/// the server still answers a ping.
pub fn jsonrpc(data: &[u8]) {
    let (rt, access) = server_world();
    rt.block_on(async {
        let (client, server) = tokio::io::duplex(1 << 20);
        let handler = SessionsServer::new(access.clone(), operator(), None);
        let (server_read, server_write) = tokio::io::split(server);
        let task = tokio::spawn(sessions_mcp::server::serve_lines(handler, server_read, server_write));
        let (read, mut write) = tokio::io::split(client);
        let hello = r#"{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"fuzz","version":"0"}}}"#;
        let mut input = format!("{hello}\n{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}}\n");
        input.push_str(&String::from_utf8_lossy(data).replace('\r', "\n"));
        input.push_str("\n{\"jsonrpc\":\"2.0\",\"id\":\"last-ping\",\"method\":\"ping\"}\n");
        let writer = tokio::spawn(async move {
            let _ = write.write_all(input.as_bytes()).await;
            write
        });
        let mut lines = BufReader::new(read).lines();
        let answered = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if serde_json::from_str::<Value>(&line).is_ok_and(|v| v["id"] == "last-ping") {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(answered.ok(), Some(true), "the server stopped answering");
        drop(writer.await);
        // Wait for the aborted server so that nothing of this input outlives it (the leak
        // checker runs at exit, and the runtime is shared by every input).
        task.abort();
        let _ = task.await;
    });
}

/// One tokio runtime and one seeded store for every jsonrpc input.
fn server_world() -> &'static (tokio::runtime::Runtime, Access) {
    static WORLD: OnceLock<(tokio::runtime::Runtime, Access)> = OnceLock::new();
    WORLD.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio");
        let dir = tempfile::tempdir_in(scratch()).expect("tempdir").keep();
        let store = Store::open(&Store::path_in(&dir)).expect("store");
        let world = json!({"sessions": [
            {"key": "agent:main:main", "messages": [{"role": "user", "content": "hello"}]},
            {"key": "agent:main:discord:group:g1", "label": "team", "messages": [{"role": "assistant", "content": "hi"}]},
        ]});
        sessions_mcp::cli::seed::seed_world(&store, &serde_json::from_value(world).expect("world")).expect("seed");
        (rt, Access::new(store, Arc::new(Config::default())))
    })
}

fn operator() -> Caller {
    Caller::external_main()
}

/// tmpfs when there is one (the importer writes a store per input).
fn scratch() -> std::path::PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() }
}
