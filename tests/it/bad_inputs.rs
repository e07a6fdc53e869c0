//! Bad inputs, end to end: malformed tool arguments of every class must come back as a tool result
//! `{status: "invalid" (or the documented status), error}` whose `error` names the field (and, for
//! unknown arguments, lists the allowed ones), must never change the store, and must never crash
//! the server. Protocol faults (unknown tool, arguments that are not an object) are JSON-RPC
//! errors; a line that is not JSON gets a `-32700 Parse error` with `"id": null`. Process-level bad inputs (a corrupt
//! config, a store file that is not ours, a bad `--as`) make `serve` exit with one clear line.
//!
//! Contract: docs/BEHAVIOUR.md, Session keys, Tools (arguments, results, statuses) and Errors;
//! docs/CONFIGURATION.md.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::Stdio;
use std::sync::mpsc::channel;
use std::time::Duration;

use common::{Client, TestEnv};
use serde_json::{Value, json};

/// One bad input: tool, arguments, expected status, substrings the `error` text must contain.
type Case = (&'static str, Value, &'static str, &'static [&'static str]);

const CHILD: &str = "agent:main:subagent:6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b";

/// main with 3 messages, a sub-agent child of main, and a discord group (outside main's tree).
fn world() -> Value {
    let text = |t: &str| json!([{"type": "text", "text": t}]);
    json!({"sessions": [
        {"key": "agent:main:main", "messages": [
            {"role": "user", "content": text("first")},
            {"role": "assistant", "content": text("second")},
            {"role": "user", "content": text("third")},
        ]},
        {"key": CHILD, "spawnedBy": "agent:main:main", "label": "child",
         "messages": [{"role": "user", "content": text("child task")}]},
        {"key": "agent:main:discord:group:dev", "chatType": "group", "channel": "discord",
         "messages": [{"role": "user", "content": text("hi dev")}]},
    ]})
}

fn seeded() -> TestEnv {
    let env = TestEnv::new();
    env.seed(world());
    env
}

/// A short, printable rendering of arguments (some are 100 KB).
fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 160 {
        format!("{}… ({} bytes)", &s[..s.char_indices().nth(150).map_or(s.len(), |(i, _)| i)], s.len())
    } else {
        s
    }
}

/// Checks one tool answer against the expectation; returns a failure description or None.
fn check(tool: &str, args: &Value, status: &str, needles: &[&str], out: &Value) -> Option<String> {
    let got_status = out["status"].as_str().unwrap_or("<none>");
    let mut problems = Vec::new();
    if got_status != status {
        problems.push(format!("status {got_status:?}, expected {status:?}"));
    }
    match out["error"].as_str() {
        None => problems.push("no `error` string".to_string()),
        Some(err) => {
            let missing: Vec<&str> = needles.iter().copied().filter(|n| !err.contains(n)).collect();
            if !missing.is_empty() {
                problems.push(format!("error does not contain {missing:?}"));
            }
        }
    }
    (!problems.is_empty()).then(|| format!("{tool} {} → {}: {}", show(args), show(out), problems.join("; ")))
}

/// Runs a table of bad inputs against a server over the seeded world. Every case must give the
/// expected status and error text and leave the store fingerprint exactly as it was; the server
/// must still answer afterwards and exit cleanly. All failures are reported together.
fn run_table(class: &str, cases: Vec<Case>) {
    let env = seeded();
    let mut client = env.serve(None);
    // Starting the server creates (or marks) the caller's row: fingerprint after that.
    let before = env.fingerprint();
    let failures = run_cases(&env, &mut client, &before, &cases);
    assert_still_serving(&mut client);
    client.close();
    assert_eq!(env.fingerprint(), before, "{class}: store changed by the end of the run");
    assert!(
        failures.is_empty(),
        "{class}: {} of {} cases failed:\n  {}",
        failures.len(),
        cases.len(),
        failures.join("\n  ")
    );
    eprintln!("{class}: {} cases ok", cases.len());
}

fn run_cases(env: &TestEnv, client: &mut Client, before: &str, cases: &[Case]) -> Vec<String> {
    let mut failures = Vec::new();
    for (tool, args, status, needles) in cases {
        // `call` asserts the text mirror, isError and output-schema conformance; a panic there
        // is a failure of this case, not the end of the table.
        match catch_unwind(AssertUnwindSafe(|| client.call(tool, args.clone()))) {
            Ok(out) => failures.extend(check(tool, args, status, needles, &out)),
            Err(p) => failures.push(format!("{tool} {}: call panicked: {}", show(args), panic_text(&p))),
        }
        let now = env.fingerprint();
        if now != before {
            failures.push(format!("{tool} {}: store fingerprint changed", show(args)));
        }
    }
    failures
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

fn assert_still_serving(client: &mut Client) {
    let list = client.request("tools/list", json!({}));
    let tools = list["result"]["tools"].as_array().unwrap_or_else(|| panic!("tools/list after bad inputs: {list}"));
    assert_eq!(tools.len(), 6, "{list}");
    let ok = client.call("agents_list", json!({}));
    assert_eq!(ok["status"], "ok", "{ok}");
}

const LIST_ARGS: &[&str] = &["allowed", "kinds", "limit", "activeMinutes", "messageLimit", "includeArchived", "cursor"];
const HISTORY_ARGS: &[&str] = &["allowed", "sessionKey", "limit", "includeTools", "afterSeq", "includeRuns"];
const SEND_ARGS: &[&str] =
    &["allowed", "sessionKey", "label", "agentId", "message", "timeoutSeconds", "idempotencyKey"];
const SPAWN_ARGS: &[&str] = &[
    "allowed",
    "task",
    "label",
    "agentId",
    "model",
    "thinking",
    "runTimeoutSeconds",
    "thread",
    "mode",
    "cleanup",
    "sandbox",
    "attachments",
    "attachAs",
    "idempotencyKey",
];

fn history(key: impl Into<Value>) -> Value {
    json!({"sessionKey": key.into()})
}

fn send_to(key: impl Into<Value>) -> Value {
    json!({"sessionKey": key.into(), "message": "hello"})
}

// ---------------------------------------------------------------------------------------------
// Tool-level classes
// ---------------------------------------------------------------------------------------------

#[test]
fn malformed_session_keys_are_invalid_and_name_sessionkey() {
    let long_rest = format!("agent:main:{}", "x".repeat(513));
    let cases: Vec<Case> = vec![
        ("sessions_history", history(""), "invalid", &["sessionKey", "empty"]),
        ("sessions_history", history("   \t "), "invalid", &["sessionKey", "empty"]),
        ("sessions_history", history("ma\0in"), "invalid", &["sessionKey", "NUL"]),
        ("sessions_history", history("agent:main:\u{0}"), "invalid", &["sessionKey", "control"]),
        ("sessions_history", history("main\u{7}"), "invalid", &["sessionKey", "control"]),
        ("sessions_history", history("agent:main:\u{1b}[31mred"), "invalid", &["sessionKey", "control"]),
        ("sessions_history", history("agent:main:x\u{7f}"), "invalid", &["sessionKey", "control"]),
        ("sessions_history", history("häh"), "invalid", &["sessionKey", "non-ASCII"]),
        ("sessions_history", history("agent:main:café"), "invalid", &["sessionKey", "non-ASCII"]),
        ("sessions_history", history("agent:main:discord group"), "invalid", &["sessionKey", "whitespace"]),
        ("sessions_history", history("agent:Bad!:x"), "invalid", &["sessionKey", "agent id"]),
        ("sessions_history", history("agent::main"), "invalid", &["sessionKey", "agent id"]),
        ("sessions_history", history("agent:ops"), "invalid", &["sessionKey", "agent:ops:"]),
        ("sessions_history", history("agent:ops:"), "invalid", &["sessionKey", "agent:ops:"]),
        ("sessions_history", history("cron:"), "invalid", &["sessionKey", "cron:"]),
        ("sessions_history", history("hook:"), "invalid", &["sessionKey", "hook:"]),
        ("sessions_history", history("discord:group:"), "invalid", &["sessionKey", "discord:group:"]),
        ("sessions_history", history("subagent:not-a-uuid"), "invalid", &["sessionKey", "UUID", "not-a-uuid"]),
        ("sessions_history", history("weird:thing"), "invalid", &["sessionKey", "weird:thing"]),
        ("sessions_history", history(long_rest.clone()), "invalid", &["sessionKey", "512"]),
        // The same grammar on sessions_send (parsed before anything is sent).
        ("sessions_send", send_to("agent:Bad!:x"), "invalid", &["sessionKey", "agent id"]),
        ("sessions_send", send_to("subagent:not-a-uuid"), "invalid", &["sessionKey", "UUID"]),
        ("sessions_send", send_to("weird:thing"), "invalid", &["sessionKey", "weird:thing"]),
        ("sessions_send", send_to("ma\0in"), "invalid", &["sessionKey", "NUL"]),
        ("sessions_send", send_to(long_rest), "invalid", &["sessionKey", "512"]),
    ];
    run_table("session keys", cases);
}

/// docs/BEHAVIOUR.md, Session keys: NUL and control characters are `invalid` — also at either end
/// of the key (tab, CR and LF are control characters; trimming them away would accept them
/// silently).
#[test]
fn session_keys_with_control_chars_at_the_ends_are_invalid() {
    let cases: Vec<Case> = vec![
        ("sessions_history", history("main\n"), "invalid", &["sessionKey", "control"]),
        ("sessions_history", history("\tmain"), "invalid", &["sessionKey", "control"]),
        ("sessions_history", history("agent:main:main\r\n"), "invalid", &["sessionKey", "control"]),
        ("sessions_send", send_to("main\n"), "invalid", &["sessionKey", "control"]),
    ];
    run_table("control characters at the ends of keys", cases);
}

#[test]
fn reserved_keys_are_invalid() {
    let cases: Vec<Case> = vec![
        ("sessions_history", history("unknown"), "invalid", &["sessionKey", "\"unknown\" is reserved"]),
        ("sessions_history", history("UNKNOWN"), "invalid", &["sessionKey", "reserved"]),
        // `global` names a session only under session.scope = "global"; default is per-sender.
        ("sessions_history", history("global"), "invalid", &["sessionKey", "\"global\" is reserved"]),
        ("sessions_send", send_to("unknown"), "invalid", &["sessionKey", "reserved"]),
        ("sessions_send", send_to("global"), "invalid", &["sessionKey", "reserved"]),
    ];
    run_table("reserved keys", cases);
}

#[test]
fn wrong_types_are_invalid_and_name_the_field() {
    let cases: Vec<Case> = vec![
        ("sessions_history", history(42), "invalid", &["sessionKey", "string", "number"]),
        ("sessions_history", history(true), "invalid", &["sessionKey", "string", "boolean"]),
        ("sessions_history", history(json!(["main"])), "invalid", &["sessionKey", "string", "list"]),
        ("sessions_history", history(json!({"key": "main"})), "invalid", &["sessionKey", "string", "object"]),
        ("sessions_history", history(Value::Null), "invalid", &["sessionKey", "required"]),
        ("sessions_history", json!({}), "invalid", &["sessionKey", "required"]),
        ("sessions_history", json!({"sessionKey": "main", "limit": "10"}), "invalid", &["limit", "number", "string"]),
        ("sessions_history", json!({"sessionKey": "main", "limit": [10]}), "invalid", &["limit", "number"]),
        (
            "sessions_history",
            json!({"sessionKey": "main", "includeTools": "true"}),
            "invalid",
            &["includeTools", "true or false"],
        ),
        ("sessions_history", json!({"sessionKey": "main", "includeTools": 1}), "invalid", &["includeTools"]),
        ("sessions_history", json!({"sessionKey": "main", "afterSeq": "0"}), "invalid", &["afterSeq", "number"]),
        ("sessions_history", json!({"sessionKey": "main", "afterSeq": true}), "invalid", &["afterSeq", "number"]),
        ("sessions_history", json!({"sessionKey": "main", "includeRuns": "yes"}), "invalid", &["includeRuns"]),
        ("sessions_list", json!({"limit": "5"}), "invalid", &["limit", "number", "string"]),
        ("sessions_list", json!({"limit": {"n": 5}}), "invalid", &["limit", "number", "object"]),
        ("sessions_list", json!({"kinds": 5}), "invalid", &["kinds"]),
        ("sessions_list", json!({"kinds": [1]}), "invalid", &["kinds", "string"]),
        ("sessions_list", json!({"kinds": {"main": true}}), "invalid", &["kinds"]),
        ("sessions_list", json!({"includeArchived": "false"}), "invalid", &["includeArchived", "true or false"]),
        ("sessions_list", json!({"messageLimit": [2]}), "invalid", &["messageLimit", "number"]),
        ("sessions_list", json!({"activeMinutes": "60"}), "invalid", &["activeMinutes", "number"]),
        ("sessions_list", json!({"cursor": 7}), "invalid", &["cursor", "string"]),
        ("sessions_send", json!({"sessionKey": "main", "message": 42}), "invalid", &["message", "string"]),
        ("sessions_send", json!({"sessionKey": "main", "message": null}), "invalid", &["message", "required"]),
        ("sessions_send", json!({"sessionKey": "main", "message": ["hi"]}), "invalid", &["message", "string", "list"]),
        ("sessions_send", json!({"sessionKey": 7, "message": "hi"}), "invalid", &["sessionKey", "string"]),
        (
            "sessions_send",
            json!({"sessionKey": "main", "message": "hi", "timeoutSeconds": "30"}),
            "invalid",
            &["timeoutSeconds", "number"],
        ),
        ("sessions_send", json!({"label": 5, "message": "hi"}), "invalid", &["label", "string"]),
        (
            "sessions_send",
            json!({"sessionKey": "main", "message": "hi", "idempotencyKey": {}}),
            "invalid",
            &["idempotencyKey", "string"],
        ),
        ("sessions_spawn", json!({"task": null}), "invalid", &["task", "required"]),
        ("sessions_spawn", json!({"task": 7}), "invalid", &["task", "string"]),
        ("sessions_spawn", json!({"task": "x", "thread": "true"}), "invalid", &["thread", "true or false"]),
        (
            "sessions_spawn",
            json!({"task": "x", "runTimeoutSeconds": "60"}),
            "invalid",
            &["runTimeoutSeconds", "number"],
        ),
        ("sessions_spawn", json!({"task": "x", "attachments": "file.txt"}), "invalid", &["attachments"]),
        ("sessions_spawn", json!({"task": "x", "agentId": 5}), "invalid", &["agentId", "string"]),
        ("sessions_spawn", json!({"task": "x", "label": ["a"]}), "invalid", &["label", "string"]),
        ("sessions_spawn", json!({"task": "x", "mode": 1}), "invalid", &["mode"]),
    ];
    run_table("wrong types", cases);
}

#[test]
fn negative_and_zero_numbers_are_invalid() {
    let cases: Vec<Case> = vec![
        ("sessions_list", json!({"limit": 0}), "invalid", &["limit", "at least 1"]),
        ("sessions_list", json!({"limit": 0.9}), "invalid", &["limit", "at least 1"]),
        ("sessions_list", json!({"limit": -1}), "invalid", &["limit", "negative"]),
        ("sessions_list", json!({"limit": -0.5}), "invalid", &["limit", "negative"]),
        ("sessions_list", json!({"activeMinutes": 0}), "invalid", &["activeMinutes", "at least 1"]),
        ("sessions_list", json!({"activeMinutes": -5}), "invalid", &["activeMinutes", "negative"]),
        ("sessions_list", json!({"messageLimit": -1}), "invalid", &["messageLimit", "negative"]),
        ("sessions_history", json!({"sessionKey": "main", "limit": 0}), "invalid", &["limit", "at least 1"]),
        ("sessions_history", json!({"sessionKey": "main", "limit": -1}), "invalid", &["limit", "negative"]),
        ("sessions_history", json!({"sessionKey": "main", "afterSeq": -1}), "invalid", &["afterSeq", "negative"]),
        ("sessions_history", json!({"sessionKey": "main", "afterSeq": -0.1}), "invalid", &["afterSeq", "negative"]),
        // -1 must never become 0 (fire-and-forget).
        (
            "sessions_send",
            json!({"sessionKey": "main", "message": "hi", "timeoutSeconds": -1}),
            "invalid",
            &["timeoutSeconds", "negative"],
        ),
        (
            "sessions_spawn",
            json!({"task": "x", "runTimeoutSeconds": -1}),
            "invalid",
            &["runTimeoutSeconds", "negative"],
        ),
    ];
    run_table("negative and zero numbers", cases);
}

#[test]
fn huge_strings_are_invalid_and_name_the_field() {
    let key_100k = "a".repeat(100 * 1024);
    let msg_over = "m".repeat(64 * 1024 + 1);
    let task_over = "t".repeat(64 * 1024 + 1);
    let cases: Vec<Case> = vec![
        ("sessions_history", history(key_100k.clone()), "invalid", &["sessionKey", "too long"]),
        ("sessions_history", history(format!("agent:main:{key_100k}")), "invalid", &["sessionKey", "too long"]),
        ("sessions_send", send_to(key_100k.clone()), "invalid", &["sessionKey", "too long"]),
        (
            "sessions_send",
            json!({"sessionKey": "main", "message": msg_over}),
            "invalid",
            &["message", "too long", "65536"],
        ),
        ("sessions_send", json!({"label": "l".repeat(300), "message": "hi"}), "invalid", &["label", "too long"]),
        (
            "sessions_send",
            json!({"sessionKey": "main", "message": "hi", "idempotencyKey": "k".repeat(300)}),
            "invalid",
            &["idempotencyKey", "too long"],
        ),
        ("sessions_spawn", json!({"task": task_over}), "invalid", &["task", "too long"]),
        ("sessions_spawn", json!({"task": "x", "label": "l".repeat(65)}), "invalid", &["label", "too long"]),
        ("sessions_list", json!({"cursor": key_100k}), "invalid", &["cursor", "too long"]),
    ];
    run_table("huge strings", cases);
}

#[test]
fn unknown_arguments_are_rejected_listing_the_allowed_ones() {
    let cases: Vec<Case> = vec![
        ("agents_list", json!({"verbose": true}), "invalid", &["verbose", "allowed: none"]),
        ("agents_list", json!({"agentId": "main"}), "invalid", &["agentId", "allowed: none"]),
        ("sessions_list", json!({"bogus": 1}), "invalid", LIST_ARGS),
        ("sessions_list", json!({"kind": ["main"]}), "invalid", LIST_ARGS),
        ("sessions_list", json!({"Limit": 5}), "invalid", LIST_ARGS),
        ("sessions_history", json!({"sessionKey": "main", "verbose": true}), "invalid", HISTORY_ARGS),
        ("sessions_history", json!({"SessionKey": "main"}), "invalid", HISTORY_ARGS),
        ("sessions_history", json!({"session-key": "main"}), "invalid", HISTORY_ARGS),
        ("sessions_history", json!({"key": "main"}), "invalid", HISTORY_ARGS),
        ("sessions_send", json!({"sessionKey": "main", "message": "hi", "priority": "high"}), "invalid", SEND_ARGS),
        ("sessions_send", json!({"sessionKey": "main", "text": "hi"}), "invalid", SEND_ARGS),
        ("sessions_spawn", json!({"task": "x", "priority": 1}), "invalid", SPAWN_ARGS),
        ("sessions_spawn", json!({"prompt": "x"}), "invalid", SPAWN_ARGS),
    ];
    run_table("unknown arguments", cases);
}

#[test]
fn camel_case_and_its_snake_case_alias_together_are_invalid() {
    let cases: Vec<Case> = vec![
        (
            "sessions_history",
            json!({"sessionKey": "main", "session_key": "main"}),
            "invalid",
            &["sessionKey", "session_key", "twice"],
        ),
        (
            "sessions_history",
            json!({"sessionKey": "main", "includeTools": true, "include_tools": true}),
            "invalid",
            &["includeTools", "include_tools", "twice"],
        ),
        (
            "sessions_history",
            json!({"sessionKey": "main", "afterSeq": 0, "after_seq": 0}),
            "invalid",
            &["afterSeq", "after_seq", "twice"],
        ),
        (
            "sessions_list",
            json!({"messageLimit": 1, "message_limit": 1}),
            "invalid",
            &["messageLimit", "message_limit", "twice"],
        ),
        ("sessions_list", json!({"activeMinutes": 5, "active_minutes": 5}), "invalid", &["activeMinutes", "twice"]),
        (
            "sessions_send",
            json!({"sessionKey": "main", "session_key": "main", "message": "hi"}),
            "invalid",
            &["sessionKey", "twice"],
        ),
        (
            "sessions_spawn",
            json!({"task": "x", "agentId": "main", "agent_id": "main"}),
            "invalid",
            &["agentId", "twice"],
        ),
    ];
    run_table("alias and camelCase together", cases);
}

/// Every tool called with `{}`: each field its input schema requires is named as required, with
/// its allowed values when the schema gives an enum (read from tools/list, so a tool added later
/// is held to it too). Then the fields an action of `subagents` requires, the same way.
#[test]
fn missing_required_arguments_are_named_with_their_allowed_values() {
    let env = seeded();
    let mut client = env.serve(None);
    let list = client.request("tools/list", json!({}));
    let mut cases: Vec<(String, Value, Vec<String>)> = vec![];
    for tool in list["result"]["tools"].as_array().unwrap() {
        let schema = &tool["inputSchema"];
        let Some(required) = schema["required"].as_array() else { continue };
        let field = required[0].as_str().unwrap();
        let mut needles = vec![format!("{field} required")];
        if let Some(values) = schema["properties"][field]["enum"].as_array() {
            let values: Vec<&str> = values.iter().map(|v| v.as_str().unwrap()).collect();
            needles.push(format!("allowed: {}", values.join(", ")));
        }
        cases.push((tool["name"].as_str().unwrap().to_string(), json!({}), needles));
    }
    let names: Vec<&str> = cases.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(names.len(), 4, "tools with a required field: {names:?}");
    for (args, needles) in [
        (json!({"action": "cancel"}), vec!["childSessionKey required"]),
        (json!({"action": "steer", "childSessionKey": CHILD}), vec!["message required"]),
        (json!({"action": "respond"}), vec!["requestId required"]),
        (json!({"action": "respond", "requestId": "r1"}), vec!["decision required; allowed: allow, deny"]),
        (json!({"action": " "}), vec!["action must not be empty; allowed: list, wait, cancel, steer, respond"]),
    ] {
        cases.push(("subagents".into(), args, needles.into_iter().map(String::from).collect()));
    }
    cases.push(("sessions_send".into(), json!({"message": "hi"}), vec!["sessionKey or label required".into()]));
    let before = env.fingerprint();
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(tool, args, needles)| {
            let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
            check(tool, args, "invalid", &needles, &client.call(tool, args.clone()))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(env.fingerprint(), before);
}

#[test]
fn unknown_kinds_are_invalid_listing_the_kinds() {
    let many: Vec<&str> = std::iter::repeat_n("main", 17).collect();
    let cases: Vec<Case> = vec![
        (
            "sessions_list",
            json!({"kinds": ["bogus"]}),
            "invalid",
            &["kinds", "bogus", "main, group, cron, hook, node, other"],
        ),
        (
            "sessions_list",
            json!({"kinds": ["main", "chat"]}),
            "invalid",
            &["kinds", "chat", "main, group, cron, hook, node, other"],
        ),
        ("sessions_list", json!({"kinds": "weird"}), "invalid", &["kinds", "weird"]),
        ("sessions_list", json!({"kinds": ["subagent"]}), "invalid", &["kinds", "subagent"]),
        ("sessions_list", json!({"kinds": [""]}), "invalid", &["kinds"]),
        ("sessions_list", json!({"kinds": []}), "invalid", &["kinds"]),
        ("sessions_list", json!({"kinds": many}), "invalid", &["kinds"]),
    ];
    run_table("unknown kinds", cases);
}

#[test]
fn bad_cursors_are_invalid() {
    let env = seeded();
    // A second child, so that a page of 2 (main + one child) leaves one behind.
    env.seed(json!({"sessions": [{"key": "agent:main:subagent:0a1b2c3d-4e5f-4a6b-8c7d-8e9f0a1b2c3d", "spawnedBy": "agent:main:main", "updatedAt": 1_000}]}));
    let mut client = env.serve(None);
    let before = env.fingerprint();
    let mut failures = Vec::new();
    // docs/BEHAVIOUR.md, sessions_list: `hasMore` means "pass nextCursor to continue" — a page that
    // says there is more must carry the cursor, whatever the limit.
    for limit in [1, 2] {
        let page = client.call("sessions_list", json!({"limit": limit}));
        assert_eq!(page["status"], "ok", "{page}");
        if page["hasMore"] == true && page["nextCursor"].as_str().is_none() {
            failures.push(format!(
                "sessions_list {{\"limit\":{limit}}} → {page}: hasMore is true but there is no nextCursor"
            ));
        }
    }
    let page = client.call("sessions_list", json!({"limit": 2}));
    let real = page["nextCursor"].as_str().unwrap_or_else(|| panic!("nextCursor: {page}")).to_string();
    let cases: Vec<Case> = vec![
        ("sessions_list", json!({"cursor": "not-a-cursor"}), "invalid", &["cursor", "nextCursor"]),
        ("sessions_list", json!({"cursor": "%%%%"}), "invalid", &["cursor"]),
        ("sessions_list", json!({"cursor": "e30"}), "invalid", &["cursor"]), // base64url of "{}"
        ("sessions_list", json!({"cursor": format!("{real}x")}), "invalid", &["cursor"]),
        // A real cursor with other filters than the page it came from.
        ("sessions_list", json!({"cursor": real.clone(), "kinds": ["other"]}), "invalid", &["cursor", "filters"]),
        ("sessions_list", json!({"cursor": real.clone(), "includeArchived": true}), "invalid", &["cursor", "filters"]),
        ("sessions_list", json!({"cursor": real.clone(), "activeMinutes": 60}), "invalid", &["cursor", "filters"]),
    ];
    failures.extend(run_cases(&env, &mut client, &before, &cases));
    // The real cursor still works with the same filters and yields the remaining child.
    let next = client.call("sessions_list", json!({"limit": 2, "cursor": real}));
    assert_eq!(next["status"], "ok", "{next}");
    assert_eq!(next["count"], 1, "{next}");
    assert_still_serving(&mut client);
    client.close();
    assert_eq!(env.fingerprint(), before);
    assert!(failures.is_empty(), "bad cursors: {} failed:\n  {}", failures.len(), failures.join("\n  "));
}

#[test]
fn spawn_rejects_threads_channel_delivery_and_too_many_attachments() {
    let fifty_one: Vec<Value> = (0..51).map(|i| json!({"name": format!("f{i}.txt"), "content": "x"})).collect();
    let cases: Vec<Case> = vec![
        (
            "sessions_spawn",
            json!({"task": "x", "thread": true}),
            "forbidden",
            &["thread=true is unavailable", "has no thread-capable deliverer", "nothing was created"],
        ),
        ("sessions_spawn", json!({"task": "x", "mode": "session"}), "invalid", &["requires thread=true"]),
        (
            "sessions_spawn",
            json!({"task": "x", "to": "user:42"}),
            "invalid",
            &["to is a channel-delivery argument", "sessions_send"],
        ),
        (
            "sessions_spawn",
            json!({"task": "x", "channel": "discord"}),
            "invalid",
            &["channel is a channel-delivery argument", "sessions_send"],
        ),
        (
            "sessions_spawn",
            json!({"task": "x", "target": "discord:group:dev"}),
            "invalid",
            &["target is a channel-delivery argument", "sessions_send"],
        ),
        ("sessions_spawn", json!({"task": "x", "threadId": "1"}), "invalid", &["threadId", "sessions_send"]),
        ("sessions_spawn", json!({"task": "x", "replyTo": "m1"}), "invalid", &["replyTo", "sessions_send"]),
        ("sessions_spawn", json!({"task": "x", "attachments": fifty_one}), "invalid", &["attachments", "50"]),
        ("sessions_spawn", json!({"task": "x", "attachments": {"name": "a"}}), "invalid", &["attachments"]),
        ("sessions_spawn", json!({}), "invalid", &["task", "required"]),
        ("sessions_spawn", json!({"task": "   "}), "invalid", &["task", "empty"]),
        ("sessions_spawn", json!({"task": "x", "agentId": "Bad!"}), "invalid", &["agentId"]),
    ];
    run_table("sessions_spawn", cases);
}

/// docs/BEHAVIOUR.md, sessions_spawn: argument checks come first, each with its own error naming
/// the field; Errors: bad arguments are `invalid`, attachments while disabled are `forbidden`.
#[test]
fn spawn_rejects_bad_enum_values_models_and_disabled_attachments() {
    let attachment = json!({"name": "a.txt", "content": "hello"});
    let cases: Vec<Case> = vec![
        ("sessions_spawn", json!({"task": "x", "mode": "session"}), "invalid", &["mode"]),
        ("sessions_spawn", json!({"task": "x", "mode": "bogus"}), "invalid", &["mode"]),
        ("sessions_spawn", json!({"task": "x", "cleanup": "sometimes"}), "invalid", &["cleanup"]),
        ("sessions_spawn", json!({"task": "x", "sandbox": "maybe"}), "invalid", &["sandbox"]),
        ("sessions_spawn", json!({"task": "x", "thinking": "extreme"}), "invalid", &["thinking"]),
        ("sessions_spawn", json!({"task": "x", "model": "-rf"}), "invalid", &["model"]),
        // docs/BEHAVIOUR.md, Errors: attachments disabled (the default) is `forbidden`.
        (
            "sessions_spawn",
            json!({"task": "x", "attachments": [attachment]}),
            "forbidden",
            &["attachments", "tools.sessions_spawn.attachments.enabled"],
        ),
    ];
    run_table("sessions_spawn argument values", cases);
}

#[test]
fn send_argument_combinations_are_invalid() {
    let cases: Vec<Case> = vec![
        ("sessions_send", json!({}), "invalid", &["message", "required"]),
        ("sessions_send", json!({"message": "hi"}), "invalid", &["sessionKey", "label"]),
        ("sessions_send", json!({"sessionKey": "", "message": "hi"}), "invalid", &["sessionKey"]),
        (
            "sessions_send",
            json!({"sessionKey": "main", "label": "child", "message": "hi"}),
            "invalid",
            &["sessionKey", "label"],
        ),
        (
            "sessions_send",
            json!({"sessionKey": "main", "agentId": "main", "message": "hi"}),
            "invalid",
            &["agentId", "label"],
        ),
        ("sessions_send", json!({"label": "child", "agentId": "Bad!", "message": "hi"}), "invalid", &["agentId"]),
        ("sessions_send", json!({"sessionKey": "main", "message": "   "}), "invalid", &["message", "empty"]),
    ];
    run_table("sessions_send combinations", cases);
}

#[test]
fn documented_non_invalid_statuses_for_unreachable_targets() {
    let cases: Vec<Case> = vec![
        // Outside main's tree (tools.sessions.visibility defaults to tree).
        ("sessions_history", history("agent:main:discord:group:dev"), "forbidden", &["tools.sessions.visibility"]),
        ("sessions_history", history("discord:group:dev"), "forbidden", &["tools.sessions.visibility"]),
        // A sessionId candidate with no visible match.
        ("sessions_history", history("no-such-session-id"), "not_found", &["sessionId", "no-such-session-id"]),
    ];
    run_table("unreachable targets", cases);
}

#[test]
fn snake_case_aliases_are_accepted() {
    let env = seeded();
    let mut client = env.serve(None);
    let before = env.fingerprint();

    let h = client.call("sessions_history", json!({"session_key": "main"}));
    assert_eq!(h["status"], "ok", "{h}");
    assert_eq!(h["sessionKey"], "main", "{h}");
    assert_eq!(h["messages"].as_array().unwrap().len(), 3, "{h}");

    let h = client.call("sessions_history", json!({"session_key": "main", "include_tools": true, "after_seq": 1}));
    assert_eq!(h["status"], "ok", "{h}");
    let msgs = h["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 2, "after_seq 1 leaves the last two of three: {h}");
    assert!(msgs.iter().all(|m| m["seq"].as_i64().unwrap() > 1), "{h}");

    let h = client.call("sessions_history", json!({"session_key": CHILD, "include_runs": true}));
    assert_eq!(h["status"], "ok", "{h}");
    assert!(h["runs"].is_array(), "include_runs is honoured: {h}");

    let l = client.call("sessions_list", json!({"message_limit": 2}));
    assert_eq!(l["status"], "ok", "{l}");
    let main = l["sessions"].as_array().unwrap().iter().find(|r| r["key"] == "main").expect("main row");
    assert_eq!(main["messages"].as_array().map(Vec::len), Some(2), "message_limit is honoured: {l}");

    let l = client.call("sessions_list", json!({"active_minutes": 60, "include_archived": false}));
    assert_eq!(l["status"], "ok", "{l}");
    assert_eq!(common::keys_of(&l).len(), 2, "main and its child: {l}");

    client.close();
    assert_eq!(env.fingerprint(), before, "reads with aliases change nothing");
}

// ---------------------------------------------------------------------------------------------
// Protocol level
// ---------------------------------------------------------------------------------------------

#[test]
fn unknown_tools_and_non_object_arguments_are_json_rpc_errors() {
    let env = seeded();
    let mut client = env.serve(None);
    let before = env.fingerprint();
    for name in ["sessions_delete", "", "SESSIONS_LIST", "sessions_list ", "sessions.list"] {
        let resp = client.request("tools/call", json!({"name": name, "arguments": {}}));
        assert!(resp.get("result").is_none(), "{name:?}: an unknown tool is not a tool result: {resp}");
        let err = &resp["error"];
        assert_eq!(err["code"], -32602, "{name:?}: {resp}");
        let msg = err["message"].as_str().unwrap_or_default();
        assert!(msg.contains("unknown tool") && msg.contains(&format!("{name:?}")), "{name:?}: {resp}");
        for tool in ["agents_list", "sessions_history", "sessions_list", "sessions_send", "sessions_spawn"] {
            assert!(msg.contains(tool), "{name:?}: the error lists the tools: {resp}");
        }
    }
    // `arguments` that is not an object is a protocol fault: a JSON-RPC error, nothing run.
    for args in [json!([]), json!("main"), json!(5)] {
        let resp = client.request("tools/call", json!({"name": "sessions_history", "arguments": args}));
        assert!(resp.get("error").is_some() && resp.get("result").is_none(), "arguments {args}: {resp}");
    }
    // No `arguments` at all is an empty object: the tool names what is missing.
    let resp = client.request("tools/call", json!({"name": "sessions_history"}));
    assert_eq!(resp["result"]["structuredContent"]["status"], "invalid", "{resp}");
    assert!(resp["result"]["structuredContent"]["error"].as_str().unwrap().contains("sessionKey"), "{resp}");
    assert_still_serving(&mut client);
    client.close();
    assert_eq!(env.fingerprint(), before);
}

/// Talks to `serve` line by line, to see every line it writes (the shared client hides replies
/// whose id it did not ask for): each line rmcp cannot parse gets exactly one `-32700` with
/// `"id": null` saying what was wrong, and the request after it is still answered.
#[test]
fn lines_that_are_not_json_get_a_parse_error_and_the_server_keeps_answering() {
    let env = seeded();
    let mut child = env
        .command(&["serve"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut send = |line: &[u8]| {
        stdin.write_all(line).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    };
    let recv = || -> Value {
        let line = rx.recv_timeout(Duration::from_secs(30)).expect("a reply");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"))
    };
    send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).to_string().as_bytes());
    let init = recv();
    assert_eq!(init["id"], 1, "{init}");
    send(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    let before = env.fingerprint();

    let over_long =
        format!(r#"{{"jsonrpc":"2.0","id":7,"method":"ping","params":{{"x":"{}"}}}}"#, "a".repeat(17 << 20));
    let garbage: Vec<(&str, Vec<u8>, &str)> = vec![
        ("words", b"this is not json".to_vec(), "is not JSON"),
        ("truncated", br#"{"jsonrpc":"2.0","id":99,"method":"tools/list""#.to_vec(), "is not JSON"),
        ("truncated key", br#"{"jsonrpc":"#.to_vec(), "is not JSON"),
        ("braces", b"}{".to_vec(), "is not JSON"),
        ("control bytes", b"\x01\x02\x03 binary-ish".to_vec(), "is not JSON"),
        ("single quotes", b"'single quotes'".to_vec(), "is not JSON"),
        (
            "invalid UTF-8",
            b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\",\"x\":\"\xff\xfe\"}".to_vec(),
            "is not valid UTF-8",
        ),
        (
            "lone surrogate",
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"\ud800"}}"#.to_vec(),
            "hex escape",
        ),
        ("10,000 levels", "[".repeat(10_000).into_bytes(), "recursion limit"),
        ("17 MiB", over_long.into_bytes(), "is longer than 16777216 bytes"),
    ];
    for (i, (what, line, why)) in garbage.iter().enumerate() {
        send(line);
        let id = 100 + i as u64;
        send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {}}).to_string().as_bytes());
        let (error, reply) = match (recv(), recv()) {
            (a, b) if a["id"] == id => (b, a),
            (a, b) => (a, b),
        };
        assert_eq!(error["id"], Value::Null, "{what}: {error}");
        assert!(
            error.as_object().is_some_and(|o| o.contains_key("id")),
            "{what}: id must be null, not absent: {error}"
        );
        assert_eq!(error["error"]["code"], -32700, "{what}: {error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("Parse error: line ") && message.contains(why),
            "{what}: {message:?} should say {why:?}"
        );
        assert_eq!(reply["id"], id, "{what}: the server stopped answering: {reply}");
        assert_eq!(reply["result"]["tools"].as_array().map(Vec::len), Some(6), "{reply}");
    }
    // A tool call still works after all that.
    send(json!({"jsonrpc": "2.0", "id": 200, "method": "tools/call", "params": {"name": "sessions_history", "arguments": {"sessionKey": "main"}}}).to_string().as_bytes());
    let reply = recv();
    assert_eq!(reply["id"], 200, "{reply}");
    assert_eq!(reply["result"]["structuredContent"]["status"], "ok", "{reply}");
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "no stray replies");

    drop(stdin);
    let status = child.wait().expect("wait");
    assert!(status.success(), "serve exits 0 when stdin closes after garbage: {status}");
    assert_eq!(env.fingerprint(), before);
}

// ---------------------------------------------------------------------------------------------
// Process level
// ---------------------------------------------------------------------------------------------

/// `serve` with this config must exit 2 with one stderr line containing every needle, and the
/// store must be unchanged.
fn assert_config_refused(config: &str, needles: &[&str]) {
    let mut env = seeded();
    let before = env.fingerprint();
    env.set_config(config);
    let out = env.run(&["serve"]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "config {config:?}: exit code (stderr: {stderr})");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "config {config:?}: exactly one clear stderr line, got {lines:?}");
    for n in needles {
        assert!(lines[0].contains(n), "config {config:?}: stderr line should contain {n:?}: {}", lines[0]);
    }
    assert!(out.stdout.is_empty(), "config {config:?}: nothing on stdout (it is the MCP channel)");
    assert_eq!(env.fingerprint(), before, "config {config:?}: store unchanged");
}

#[test]
fn corrupt_config_files_make_serve_exit_2_with_one_line() {
    // Not JSON5 at all.
    assert_config_refused("{ tools: { sessions: ", &["config.json5", "JSON5"]);
    assert_config_refused("this is not a config", &["config.json5", "JSON5"]);
    // A misspelled key: named, with the nearest known one.
    assert_config_refused("{ tools: { sesions: { visibility: 'all' } } }", &["tools.sesions", "tools.sessions"]);
    // Out of range.
    assert_config_refused(
        "{ agents: { defaults: { subagents: { maxSpawnDepth: 9 } } } }",
        &["agents.defaults.subagents.maxSpawnDepth", "1-5", "9"],
    );
    assert_config_refused("{ agents: { defaults: { subagents: { maxSpawnDepth: 0 } } } }", &["maxSpawnDepth"]);
    // A bad value of a known key.
    assert_config_refused("{ tools: { sessions: { visibility: 'everything' } } }", &["tools.sessions.visibility"]);
    assert_config_refused("{ agents: { defaults: { subagents: { maxSpawnDepth: 'two' } } } }", &["maxSpawnDepth"]);
    // Not an object at the top level.
    assert_config_refused("[1, 2, 3]", &["config.json5", "object"]);
}

#[test]
fn an_explicit_config_that_does_not_exist_is_refused() {
    let env = seeded();
    let missing = env.dir.path().join("nope.json5");
    let out = env.command(&["serve", "--config", missing.to_str().unwrap()]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().filter(|l| !l.trim().is_empty()).count(), 1, "{stderr}");
    assert!(stderr.contains("nope.json5"), "{stderr}");
}

#[test]
fn a_store_file_that_is_not_a_database_is_refused_and_left_alone() {
    for junk in [
        "this is definitely not an SQLite database\n".repeat(200).into_bytes(),
        b"hello".to_vec(),
        (0..8192u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect::<Vec<u8>>(),
    ] {
        let env = TestEnv::sqlite();
        std::fs::create_dir_all(env.state_dir()).unwrap();
        let db = env.state_dir().join("sessions.db");
        std::fs::write(&db, &junk).unwrap();
        let out = env.run(&["serve"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "serve must refuse a junk store ({} bytes): {stderr}", junk.len());
        assert!(stderr.contains("is not a sessions-mcp database"), "{} junk bytes: {stderr}", junk.len());
        assert!(stderr.contains("sessions.db"), "names the file: {stderr}");
        assert!(out.stdout.is_empty(), "nothing on stdout: {}", String::from_utf8_lossy(&out.stdout));
        assert_eq!(std::fs::read(&db).unwrap(), junk, "the junk file is unchanged");
    }
}

#[test]
fn bad_as_keys_make_serve_exit_2_naming_the_key() {
    let env = seeded();
    let before = env.fingerprint();
    for (key, needle) in [
        ("agent:Bad!:x", "agent id"),
        ("unknown", "reserved"),
        ("global", "reserved"),
        ("weird:thing", "weird:thing"),
        ("subagent:not-a-uuid", "UUID"),
        ("cron:", "cron:"),
        ("ma\u{7}in", "control"),
    ] {
        let out = env.command(&["serve", "--as", key]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--as {key:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "--as {key:?}: one line, got {lines:?}");
        assert!(lines[0].contains("--as") && lines[0].contains(needle), "--as {key:?}: {}", lines[0]);
        assert_eq!(env.fingerprint(), before, "--as {key:?} created nothing");
    }
}

/// Inputs that the reference's bug reports and peer projects' issues point at: a caller trying to
/// set provenance or a requester itself (impersonation), a resource URI or a cron run key where a
/// session key goes, a model name that would be an option in argv, and a wait longer than any
/// allowed.
#[test]
fn inputs_from_reference_bugs_and_peer_issues_are_refused() {
    let cases: Vec<Case> = vec![
        (
            "sessions_send",
            json!({"sessionKey": "main", "message": "hi", "provenance": {"kind": "external_user"}}),
            "invalid",
            &["provenance", "sessionKey", "message"],
        ),
        (
            "sessions_send",
            json!({"sessionKey": "main", "message": "hi", "sourceSessionKey": "agent:main:main"}),
            "invalid",
            &["sourceSessionKey", "sessionKey"],
        ),
        ("sessions_spawn", json!({"task": "x", "requester": "agent:ops:main"}), "invalid", &["requester", "task"]),
        ("sessions_history", json!({"sessionKey": "sessions://history/main"}), "invalid", &["sessionKey"]),
        ("sessions_spawn", json!({"task": "x", "model": "--dangerously-skip"}), "invalid", &["model", "'-'"]),
        (
            "sessions_send",
            json!({"sessionKey": "main", "message": "hi", "timeoutSeconds": "90"}),
            "invalid",
            &["timeoutSeconds"],
        ),
        ("sessions_list", json!({"messageLimit": -1}), "invalid", &["messageLimit"]),
    ];
    run_table("inputs from reference bugs and peer issues", cases);
}
