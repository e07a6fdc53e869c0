//! Property tests of the answer budget (`tools.sessions.maxResultBytes`) over random worlds:
//! sessions with random transcripts (short and long texts, multi-byte and escaped characters,
//! thinking, tool calls, images, tool results, silent messages, heavy per-message fields) and a
//! random budget from the smallest allowed up to a little more than the default. It checks:
//! - no answer of any tool, nor of `resources/read`, is larger than the budget (the JSON text a
//!   host shows, which is also the `structuredContent`);
//! - reading a transcript page by page forwards (`afterSeq`, `nextAfterSeq`) and backwards (the
//!   newest page, then `beforeSeq`, `nextBeforeSeq`) returns every visible message exactly once,
//!   with or without tool results;
//! - a cut message read on with `seq` and `fromChar` gives back its whole text, part by part;
//! - paging `sessions_list` with its cursor lists every visible session exactly once.
//!
//! Cases: `PROPTEST_CASES` (default 32; the extended tier sets 2,000).

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, FileFailurePersistence, TestRunner};
use serde_json::{Map, Value, json};
use sessions_mcp::access::Access;
use sessions_mcp::access::caller::Caller;
use sessions_mcp::cli::seed::seed_world;
use sessions_mcp::config;
use sessions_mcp::sanitize::{self, Flags};
use sessions_mcp::store::Store;
use sessions_mcp::tools::{self, Ctx};

const CUT_MARKER: &str = "\n…(truncated)…";

#[derive(Debug, Clone)]
struct MessageGen {
    role: usize,
    silent: bool,
    blocks: Vec<(usize, String)>,
    heavy: bool,
}

#[derive(Debug, Clone)]
struct WorldGen {
    budget: usize,
    sessions: Vec<(Option<String>, Vec<MessageGen>)>,
    history_limit: Option<u64>,
    list_limit: Option<u64>,
    message_limit: u64,
}

/// Text of a random length: mostly short, sometimes far past one page.
fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![Just("a"), Just("é"), Just("字"), Just("\""), Just("\n"), Just("word "), Just("😀")];
    let len = prop_oneof![4 => 1usize..80, 2 => 200usize..1500, 1 => 1500usize..7000];
    (len, proptest::collection::vec(piece, 1..8)).prop_map(|(len, pieces)| {
        let mut s = String::new();
        let mut i = 0;
        while s.chars().count() < len {
            s.push_str(pieces[i % pieces.len()]);
            i += 1;
        }
        s
    })
}

fn message() -> impl Strategy<Value = MessageGen> {
    (0usize..4, any::<bool>(), proptest::collection::vec((0usize..5, text()), 0..4), any::<bool>())
        .prop_map(|(role, silent, blocks, heavy)| MessageGen { role, silent: silent && role == 0, blocks, heavy })
}

fn world() -> impl Strategy<Value = WorldGen> {
    let session = (proptest::option::of("[a-z]{1,12}"), proptest::collection::vec(message(), 0..30));
    (
        4096usize..12_001,
        proptest::collection::vec(session, 1..6),
        proptest::option::of(1u64..8),
        proptest::option::of(1u64..60),
        0u64..21,
    )
        .prop_map(|(budget, sessions, history_limit, list_limit, message_limit)| WorldGen {
            budget,
            sessions,
            history_limit,
            list_limit,
            message_limit,
        })
}

/// A message as the store holds it: an empty block list is a plain string.
fn content_of(m: &MessageGen) -> Value {
    if m.blocks.is_empty() {
        return json!("");
    }
    if m.blocks.len() == 1 && m.blocks[0].0 == 0 {
        return json!(m.blocks[0].1);
    }
    let blocks: Vec<Value> = m
        .blocks
        .iter()
        .map(|(kind, text)| match kind {
            0 | 1 => json!({"type": "text", "text": text}),
            2 => json!({"type": "thinking", "thinking": text, "thinkingSignature": "sig"}),
            3 => json!({"type": "toolCall", "id": "c1", "name": "search", "arguments": {"q": text}}),
            _ => json!({"type": "image", "mimeType": "image/png", "data": "A".repeat(text.len())}),
        })
        .collect();
    Value::Array(blocks)
}

const ROLES: [&str; 4] = ["user", "assistant", "toolResult", "assistant"];

fn key_of(i: usize) -> String {
    if i == 0 { "agent:main:main".into() } else { format!("agent:main:subagent:s{i}") }
}

/// The façade under test, and the store beside it for the test's own reads.
fn build(w: &WorldGen) -> (Access, Store, tempfile::TempDir) {
    let sessions: Vec<Value> = w
        .sessions
        .iter()
        .enumerate()
        .map(|(i, (label, messages))| {
            let messages: Vec<Value> = messages
                .iter()
                .map(|m| {
                    let mut v = json!({"role": ROLES[m.role], "content": content_of(m), "silent": m.silent});
                    if m.heavy {
                        v["usage"] = json!({"input": 12, "output": 34, "cost": {"total": 0.01}});
                        v["api"] = json!("anthropic-messages");
                        v["provider"] = json!("anthropic");
                    }
                    v
                })
                .collect();
            let mut s = json!({"key": key_of(i), "messages": messages, "updatedAt": 1_700_000_000_000i64 + i as i64});
            if i > 0 {
                s["spawnedBy"] = json!("agent:main:main");
            }
            if let Some(l) = label {
                s["label"] = json!(l);
            }
            if i == 0 {
                s["driver"] = json!("external");
            }
            s
        })
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&Store::path_in(dir.path())).expect("store");
    seed_world(&store, &serde_json::from_value(json!({"sessions": sessions})).expect("world")).expect("seed");
    let text = format!("{{tools: {{sessions: {{maxResultBytes: {}}}}}}}", w.budget);
    let config = Arc::new(config::parse(&text).expect("config").0);
    (Access::new(store.clone(), config), store, dir)
}

/// Calls a tool; checks the answer fits the budget and is not an error; returns its JSON.
async fn call(
    access: &Access,
    caller: &Caller,
    budget: usize,
    tool: &str,
    args: Value,
) -> Result<Value, TestCaseError> {
    let ctx = Ctx::plain(access, caller);
    let r = tools::call(&ctx, tool, args.as_object().cloned()).await.expect("known tool");
    let structured = r.structured_content.clone().expect("structured");
    let text_len = common::text_of(&serde_json::to_value(&r.content).expect("content")).len();
    let size = structured.to_string().len().max(text_len);
    prop_assert!(size <= budget, "{tool} {args}: {size} bytes > budget {budget}");
    prop_assert_eq!(r.is_error, Some(false), "{} {}: {}", tool, args, structured);
    Ok(structured)
}

fn seqs(answer: &Value) -> Vec<i64> {
    answer["messages"].as_array().expect("messages").iter().filter_map(|m| m["seq"].as_i64()).collect()
}

/// The seqs a reader should see, from the world itself.
fn visible(messages: &[MessageGen], all_seqs: &[i64], include_tools: bool) -> Vec<i64> {
    messages
        .iter()
        .zip(all_seqs)
        .filter(|(m, _)| include_tools || (ROLES[m.role] != "toolResult" && !m.silent))
        .map(|(_, s)| *s)
        .collect()
}

/// Follows `next` from `first` until the pointer is gone; the seqs in reading order.
async fn follow(
    access: &Access,
    caller: &Caller,
    w: &WorldGen,
    base: Value,
    pointer: (&str, &str),
    pages: usize,
) -> Result<(Vec<i64>, Vec<Value>), TestCaseError> {
    let (mut seen, mut cut) = (Vec::new(), Vec::new());
    let mut args = base.clone();
    for _ in 0..pages {
        let page = call(access, caller, w.budget, "sessions_history", args.clone()).await?;
        let mut here = seqs(&page);
        if pointer.0 == "beforeSeq" {
            here.reverse();
        }
        seen.extend(here);
        cut.extend(page["messages"].as_array().expect("messages").iter().filter(|m| m.get("rest").is_some()).cloned());
        match page.get(pointer.1).and_then(Value::as_i64) {
            Some(next) => {
                args = base.clone();
                args[pointer.0] = json!(next);
            }
            None => return Ok((seen, cut)),
        }
    }
    Err(TestCaseError::fail(format!("paging {pointer:?} did not end within {pages} pages")))
}

/// Reads a cut message on from `from` to its end; the parts joined.
async fn read_rest(
    access: &Access,
    caller: &Caller,
    w: &WorldGen,
    key: &str,
    seq: i64,
    from: u64,
) -> Result<String, TestCaseError> {
    let (mut text, mut from) = (String::new(), from);
    for _ in 0..200 {
        let args = json!({"sessionKey": key, "seq": seq, "fromChar": from});
        let page = call(access, caller, w.budget, "sessions_history", args).await?;
        let m = &page["messages"][0];
        let part = m["content"].as_str().expect("a part is text");
        match m.get("rest") {
            Some(rest) => {
                text.push_str(part.strip_suffix(CUT_MARKER).expect("a cut part ends with the marker"));
                let next = rest["fromChar"].as_u64().expect("fromChar");
                prop_assert!(next > from, "reading on from {from} made no progress");
                from = next;
            }
            None => return Ok(text + part),
        }
    }
    Err(TestCaseError::fail("a message did not end within 200 parts"))
}

async fn check_world(w: WorldGen) -> Result<(), TestCaseError> {
    let (access, store, _dir) = build(&w);
    let caller = Caller::external_main();
    for (i, (_, messages)) in w.sessions.iter().enumerate() {
        let key = key_of(i);
        let row = store.session_by_key(&sessions_mcp::keys::SessionKey::from_canonical(key.clone()));
        let id = row.expect("read").expect("seeded").id;
        let all: Vec<i64> =
            store.history_after(id, -1, 100_000, true).expect("all").messages.iter().map(|m| m.seq).collect();
        for include_tools in [false, true] {
            let expected = visible(messages, &all, include_tools);
            let mut base = json!({"sessionKey": key, "includeTools": include_tools});
            if let Some(limit) = w.history_limit {
                base["limit"] = json!(limit);
            }
            let pages = messages.len() + 2;
            let mut forward = base.clone();
            forward["afterSeq"] = json!(0);
            let (seen, cut) = follow(&access, &caller, &w, forward, ("afterSeq", "nextAfterSeq"), pages).await?;
            prop_assert_eq!(&seen, &expected, "forwards, includeTools {}", include_tools);
            let (mut back, _) =
                follow(&access, &caller, &w, base.clone(), ("beforeSeq", "nextBeforeSeq"), pages).await?;
            back.reverse();
            prop_assert_eq!(&back, &expected, "backwards, includeTools {}", include_tools);
            if include_tools {
                for m in cut {
                    let seq = m["seq"].as_i64().expect("seq");
                    let raw = &messages[all.iter().position(|s| *s == seq).expect("known seq")];
                    let whole = sanitize::whole_text(&content_of(raw), &mut Flags::default());
                    prop_assert_eq!(m["rest"]["totalChars"].as_u64(), Some(whole.chars().count() as u64));
                    prop_assert_eq!(&read_rest(&access, &caller, &w, &key, seq, 0).await?, &whole);
                    let from = m["rest"]["fromChar"].as_u64().expect("fromChar");
                    let tail: String = whole.chars().skip(from as usize).collect();
                    prop_assert_eq!(&read_rest(&access, &caller, &w, &key, seq, from).await?, &tail);
                }
            }
        }
        for m in call(&access, &caller, w.budget, "sessions_history", json!({"sessionKey": key})).await?["messages"]
            .as_array()
            .expect("messages")
        {
            for heavy in ["usage", "api", "provider", "cost", "details"] {
                prop_assert!(m.get(heavy).is_none(), "{heavy} in {m}");
            }
        }
    }
    check_list(&access, &caller, &w).await?;
    call(&access, &caller, w.budget, "agents_list", json!({})).await?;
    check_resources(&access, &caller, &w).await
}

async fn check_list(access: &Access, caller: &Caller, w: &WorldGen) -> Result<(), TestCaseError> {
    let mut base = json!({"messageLimit": w.message_limit});
    if let Some(limit) = w.list_limit {
        base["limit"] = json!(limit);
    }
    let mut listed = Vec::new();
    let mut args = base.clone();
    for _ in 0..w.sessions.len() + 2 {
        let page = call(access, caller, w.budget, "sessions_list", args.clone()).await?;
        listed.extend(common::keys_of(&page));
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(cursor) => {
                args = base.clone();
                args["cursor"] = json!(cursor);
            }
            None => break,
        }
    }
    let unique: BTreeSet<&String> = listed.iter().collect();
    prop_assert_eq!(unique.len(), listed.len(), "a session was listed twice: {:?}", listed);
    let expected: BTreeSet<String> =
        (0..w.sessions.len()).map(|i| if i == 0 { "main".to_string() } else { key_of(i) }).collect();
    prop_assert_eq!(unique.into_iter().cloned().collect::<BTreeSet<_>>(), expected);
    Ok(())
}

/// `resources/read` of each transcript, newest page and the page before it, fits the budget.
async fn check_resources(access: &Access, caller: &Caller, w: &WorldGen) -> Result<(), TestCaseError> {
    let mut rpc = common::inproc::Rpc::start(access.clone(), caller.clone()).await;
    for i in 0..w.sessions.len() {
        let mut uri = format!("sessions://history/{}", key_of(i));
        for _ in 0..2 {
            let read = rpc.request("resources/read", json!({"uri": uri})).await;
            let text = read["result"]["contents"][0]["text"].as_str().expect("a transcript");
            prop_assert!(text.len() <= w.budget, "{uri}: {} bytes > {}", text.len(), w.budget);
            let answer: Map<String, Value> = serde_json::from_str(text).expect("json");
            let Some(before) = answer.get("nextBeforeSeq").and_then(Value::as_i64) else { break };
            uri = format!("sessions://history/{}?beforeSeq={before}", key_of(i));
        }
    }
    Ok(())
}

#[test]
fn every_answer_fits_the_budget_and_every_page_is_lossless() {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(32);
    let config = RunnerConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..RunnerConfig::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio");
    TestRunner::new(config).run(&world(), |w| rt.block_on(check_world(w))).unwrap_or_else(|e| panic!("{e}"));
}
