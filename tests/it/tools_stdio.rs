//! The read tools over stdio, black-box: list, history, agents_list; visibility, scope, the
//! channel rule, and the no-existence-oracle promise.

use crate::common;

use common::{TestEnv, keys_of};
use serde_json::{Value, json};

const U1: &str = "11111111-1111-4111-8111-111111111111";
const U2: &str = "22222222-2222-4222-8222-222222222222";
const U3: &str = "33333333-3333-4333-8333-333333333333";
const SID_DEV: &str = "aaaaaaaa-0000-4000-8000-000000000001";
const SID_OPS: &str = "aaaaaaaa-0000-4000-8000-000000000002";

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// A world with a spawn tree under main, other sessions of agent main, and agent ops.
fn world() -> Value {
    let t = now();
    json!({"sessions": [
        {"key": "agent:main:main", "updatedAt": t - 1000, "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": [{"type": "text", "text": "hi there"}]},
            {"role": "toolResult", "content": [{"type": "text", "text": "tool output"}], "toolCallId": "c1", "toolName": "bash"},
            {"role": "assistant", "content": "set OPENAI_API_KEY=sk-abcdefghijklmnopqrstuvwxyz123456 please"}
        ]},
        {"key": format!("agent:main:subagent:{U1}"), "spawnedBy": "agent:main:main", "updatedAt": t - 2000,
         "messages": [{"role": "user", "content": "child task"}]},
        {"key": format!("agent:main:subagent:{U2}"), "spawnedBy": format!("agent:main:subagent:{U1}"), "spawnDepth": 2,
         "updatedAt": t - 3000, "lastTo": "secret-peer", "deliveryContext": {"channel": "slack", "to": "secret-peer"}},
        {"key": "agent:main:discord:group:dev", "sessionId": SID_DEV, "channel": "webchat", "lastChannel": "webchat",
         "chatType": "group", "label": "dev room", "updatedAt": t - 4000, "messages": [{"role": "user", "content": "in discord"}]},
        {"key": "agent:main:cron:nightly", "updatedAt": t - 5000},
        {"key": "agent:main:cron:nightly:run:r1", "updatedAt": t - 5500},
        {"key": "agent:main:hook:abc", "updatedAt": t - 6000},
        {"key": "agent:main:old", "archivedAt": t - 10_000, "updatedAt": t - 7000},
        {"key": "agent:main:ancient", "updatedAt": t - 90 * 24 * 3600 * 1000},
        {"key": "agent:ops:main", "sessionId": SID_OPS, "updatedAt": t - 8000, "messages": [{"role": "user", "content": "ops here"}]},
        {"key": "agent:ops:slack:channel:c1", "updatedAt": t - 9000}
    ]})
}

fn env_with(config: &str) -> TestEnv {
    let env = TestEnv::with_config(config);
    env.seed(world());
    env
}

#[test]
fn initialize_and_tools_list_describe_six_tools() {
    let env = env_with("{}");
    let mut c = env.serve(None);
    let resp = c.request("tools/list", json!({}));
    let tools = resp["result"]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["agents_list", "sessions_history", "sessions_list", "sessions_send", "sessions_spawn", "subagents"]
    );
    assert_eq!(resp["result"]["cacheScope"], "private");
    for t in tools {
        let name = t["name"].as_str().unwrap();
        assert_eq!(t["inputSchema"]["type"], "object", "{name}");
        assert_eq!(t["outputSchema"]["type"], "object", "{name}");
        assert!(t["title"].as_str().is_some_and(|s| !s.is_empty()), "{name}");
        let a = &t["annotations"];
        let read_only = matches!(name, "agents_list" | "sessions_history" | "sessions_list");
        assert_eq!(a["readOnlyHint"], read_only, "{name}");
        assert_eq!(a["openWorldHint"], !read_only, "{name}");
        assert_eq!(a["destructiveHint"], false, "{name}");
        if !read_only {
            assert_eq!(a["idempotentHint"], false, "{name}");
        }
        let on_disk: Value = serde_json::from_str(
            &std::fs::read_to_string(common::schema_dir().join(format!("{name}.input.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(t["inputSchema"], on_disk, "{name} input schema matches schemas/");
    }
    let c2 = env.serve(None);
    drop(c2);
    let out = env.run(&["schemas", "--check", "--dir", common::schema_dir().to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn server_info_and_instructions_name_sessions_mcp_and_the_inbox() {
    let env = TestEnv::new();
    let mut cmd = env.command(&["serve"]);
    cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    {
        use std::io::Write;
        let stdin = child.stdin.as_mut().unwrap();
        writeln!(stdin, r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"t","version":"1"}}}}}}"#).unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let line = String::from_utf8(out.stdout).unwrap();
    let v: Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    assert_eq!(v["result"]["serverInfo"]["name"], "sessions-mcp");
    assert_eq!(v["result"]["serverInfo"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["result"]["protocolVersion"], "2025-06-18");
    let instructions = v["result"]["instructions"].as_str().unwrap();
    assert!(instructions.contains("afterSeq") && instructions.contains("sessions_history"), "{instructions}");
    assert!(out.status.success());
}

#[test]
fn stdin_closed_before_initialize_exits_cleanly() {
    let env = TestEnv::new();
    let out = env.command(&["serve"]).stdin(std::process::Stdio::null()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty());
}

#[test]
fn tree_visibility_lists_the_transitive_tree_only() {
    let env = env_with("{}");
    let mut c = env.serve(None);
    let list = c.call("sessions_list", json!({}));
    assert_eq!(list["status"], "ok");
    assert_eq!(
        keys_of(&list),
        ["main".to_string(), format!("agent:main:subagent:{U1}"), format!("agent:main:subagent:{U2}")]
    );
    assert_eq!(list["scope"]["effective"], "tree");
    assert_eq!(list["scope"]["visibility"], "tree");
    assert_eq!(list["hasMore"], false);
    assert_eq!(list["count"], 3);
    // The grandchild is visible (tree is transitive — Differs from the reference).
    let h = c.call("sessions_history", json!({"sessionKey": format!("subagent:{U2}")}));
    assert_eq!(h["status"], "ok", "{h}");
    let denied = c.call("sessions_history", json!({"sessionKey": "discord:group:dev"}));
    assert_eq!(denied["status"], "forbidden");
    assert!(denied["error"].as_str().unwrap().contains("tools.sessions.visibility=tree"));
}

#[test]
fn list_filters_apply_before_the_limit() {
    let env = env_with("{tools: {sessions: {visibility: 'agent'}}}");
    let mut c = env.serve(None);
    let all = c.call("sessions_list", json!({}));
    let keys = keys_of(&all);
    assert!(keys.contains(&"agent:main:discord:group:dev".to_string()));
    assert!(!keys.iter().any(|k| k.contains(":run:")), "cron run keys are never listed");
    assert!(!keys.contains(&"agent:main:old".to_string()), "archived rows need includeArchived");
    assert!(!keys.iter().any(|k| k.starts_with("agent:ops:")), "other agents need visibility all + agentToAgent");
    let updated: Vec<i64> =
        all["sessions"].as_array().unwrap().iter().map(|r| r["updatedAt"].as_i64().unwrap()).collect();
    assert!(updated.windows(2).all(|w| w[0] >= w[1]), "newest first: {updated:?}");

    let groups = c.call("sessions_list", json!({"kinds": ["group"], "limit": 1}));
    assert_eq!(keys_of(&groups), ["agent:main:discord:group:dev"]);
    assert_eq!(groups["sessions"][0]["kind"], "group");
    let crons = c.call("sessions_list", json!({"kinds": "cron"}));
    assert_eq!(keys_of(&crons), ["agent:main:cron:nightly"]);
    let hooks = c.call("sessions_list", json!({"kinds": ["hook", "main"]}));
    assert_eq!(keys_of(&hooks), ["main", "agent:main:hook:abc"]);
    let archived = c.call("sessions_list", json!({"includeArchived": true}));
    assert!(keys_of(&archived).contains(&"agent:main:old".to_string()));
    let recent = c.call("sessions_list", json!({"activeMinutes": 60}));
    assert!(!keys_of(&recent).contains(&"agent:main:ancient".to_string()));
    assert!(keys_of(&all).contains(&"agent:main:ancient".to_string()));
}

#[test]
fn limit_is_clamped_and_the_cursor_pages_without_gaps() {
    // A budget that holds all 46 rows: this is about clamping (the default budget pages them).
    let env = TestEnv::with_config("{tools: {sessions: {visibility: 'agent', maxResultBytes: 1048576}}}");
    env.seed_generated(&["--sessions", "45", "--messages", "90"]);
    let mut c = env.serve(None);
    let big = c.call("sessions_list", json!({"limit": 5000.7, "messageLimit": 99}));
    assert_eq!(big["limitApplied"], json!({"limit": 200, "messageLimit": 20}));
    assert_eq!(big["count"], 46);
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut args = json!({"limit": 10});
        if let Some(cur) = &cursor {
            args["cursor"] = json!(cur);
        }
        let page = c.call("sessions_list", args);
        pages += 1;
        assert!(page["count"].as_u64().unwrap() <= 10);
        seen.extend(keys_of(&page));
        if page["hasMore"] == true {
            cursor = Some(page["nextCursor"].as_str().expect("nextCursor with hasMore").to_string());
        } else {
            assert!(page.get("nextCursor").is_none());
            break;
        }
    }
    assert_eq!(pages, 5);
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "no row twice");
    assert_eq!(seen.len(), 46, "45 generated + main");
    let other_filters =
        c.call("sessions_list", json!({"limit": 10, "kinds": ["other"], "cursor": cursor.unwrap_or_default()}));
    assert_eq!(other_filters["status"], "invalid");
}

#[test]
fn list_messages_skip_tool_results_and_are_sanitised() {
    let env = env_with("{}");
    let mut c = env.serve(None);
    let list = c.call("sessions_list", json!({"messageLimit": 3}));
    let main_row = &list["sessions"][0];
    assert_eq!(main_row["key"], "main");
    let msgs = main_row["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3);
    assert!(msgs.iter().all(|m| m["role"] != "toolResult"));
    assert_eq!(list["contentRedacted"], true);
    assert!(!msgs[2]["content"].as_str().unwrap().contains("sk-abcdefghijklmnopqrstuvwxyz123456"));
    // The sandbox-only hiding of lastTo does not apply to an unsandboxed caller.
    let child =
        list["sessions"].as_array().unwrap().iter().find(|r| r["key"] == format!("agent:main:subagent:{U2}")).unwrap();
    assert_eq!(child["lastTo"], "secret-peer");
}

#[test]
fn history_by_key_session_id_after_seq_and_tools() {
    let env = env_with("{tools: {sessions: {visibility: 'agent'}}}");
    let mut c = env.serve(None);
    let h = c.call("sessions_history", json!({"sessionKey": "main"}));
    assert_eq!(h["sessionKey"], "main");
    let seqs: Vec<i64> = h["messages"].as_array().unwrap().iter().map(|m| m["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, [1, 2, 4], "toolResult (seq 3) left out without includeTools");
    let with_tools = c.call("sessions_history", json!({"sessionKey": "agent:main:main", "includeTools": true}));
    assert_eq!(with_tools["messages"].as_array().unwrap().len(), 4);
    assert_eq!(with_tools["messages"][2]["toolName"], "bash");
    let after = c.call("sessions_history", json!({"sessionKey": "main", "afterSeq": 1, "limit": 1}));
    assert_eq!(after["messages"][0]["seq"], 2);
    assert_eq!(after["hasMore"], true, "seq 4 follows");
    let tail = c.call("sessions_history", json!({"sessionKey": "main", "limit": 1}));
    assert_eq!(tail["messages"][0]["seq"], 4);
    assert_eq!(tail["hasMore"], true);
    let by_id = c.call("sessions_history", json!({"sessionKey": SID_DEV}));
    assert_eq!(by_id["status"], "ok");
    assert_eq!(by_id["sessionKey"], "agent:main:discord:group:dev");
    let upper = c.call("sessions_history", json!({"sessionKey": SID_DEV.to_uppercase()}));
    assert_eq!(upper["sessionKey"], "agent:main:discord:group:dev");
    let runs = c.call("sessions_history", json!({"sessionKey": "main", "includeRuns": true}));
    assert_eq!(runs["runs"], json!([]));
    assert_eq!(h["truncated"], false);
    assert_eq!(h["contentRedacted"], true);
    let missing = c.call("sessions_history", json!({"sessionKey": "agent:main:nope"}));
    assert_eq!(missing["status"], "not_found");
}

#[test]
fn history_budget_and_cuts_set_honest_flags() {
    let env = TestEnv::new();
    let t = now();
    let long: Vec<Value> =
        (0..50).map(|i| json!({"role": "user", "content": format!("{i} {}", "z".repeat(3000))})).collect();
    env.seed(json!({"sessions": [
        {"key": "agent:main:main", "updatedAt": t, "messages": long},
        {"key": "agent:main:subagent:33333333-3333-4333-8333-333333333333", "spawnedBy": "agent:main:main",
         "messages": [{"role": "assistant", "content": [{"type": "text", "text": "w".repeat(5000)},
                                                         {"type": "image", "data": "QUJD", "mimeType": "image/png"}]}]}
    ]}));
    let mut c = env.serve(None);
    let h = c.call("sessions_history", json!({"sessionKey": "main"}));
    assert_eq!(h["droppedMessages"], true);
    assert_eq!(h["contentTruncated"], false);
    assert_eq!(h["contentRedacted"], false);
    assert_eq!(h["truncated"], true);
    assert_eq!(h["hasMore"], true);
    assert!(h.to_string().len() <= 10_000, "the whole answer fits the default budget");
    assert_eq!(h["nextBeforeSeq"], h["messages"][0]["seq"], "the older page is one call away");
    assert!(h.get("nextAfterSeq").is_none(), "nothing is newer than the newest page");
    let msgs = h["messages"].as_array().unwrap();
    assert_eq!(msgs.last().unwrap()["seq"], 50, "the newest are kept");
    let fresh = c.call("sessions_history", json!({"sessionKey": "main", "afterSeq": 0}));
    assert_eq!(fresh["messages"][0]["seq"], 1, "afterSeq keeps the oldest and drops the newest");
    assert_eq!(fresh["hasMore"], true);
    let last = fresh["messages"].as_array().unwrap().last().unwrap()["seq"].as_i64().unwrap();
    let next = c.call("sessions_history", json!({"sessionKey": "main", "afterSeq": last}));
    assert_eq!(next["messages"][0]["seq"], last + 1, "continuing from the last seq misses nothing");

    let cut = c.call("sessions_history", json!({"sessionKey": format!("subagent:{U3}")}));
    assert_eq!(cut["contentTruncated"], true);
    assert_eq!(cut["droppedMessages"], false);
    let blocks = &cut["messages"][0]["content"];
    assert!(blocks[0]["text"].as_str().unwrap().ends_with("…(truncated)…"));
    assert_eq!(
        cut["messages"][0]["rest"],
        json!({"fromChar": 4000, "totalChars": 5000 + "\n\n[image image/png, 4 bytes]".chars().count()})
    );
    assert_eq!(blocks[1], json!({"type": "image", "mimeType": "image/png", "omitted": true, "bytes": 4}));
}

#[test]
fn main_resolves_under_every_visibility_and_global_scope() {
    for v in ["self", "tree", "agent", "all"] {
        let env = env_with(&format!("{{tools: {{sessions: {{visibility: '{v}'}}}}}}"));
        let mut c = env.serve(None);
        let h = c.call("sessions_history", json!({"sessionKey": "main"}));
        assert_eq!(h["status"], "ok", "{v}: {h}");
        assert_eq!(h["sessionKey"], "main");
        let l = c.call("sessions_list", json!({}));
        assert_eq!(keys_of(&l)[0], "main", "{v}");
        assert_eq!(l["scope"]["effective"], v);
    }
    let env = TestEnv::with_config("{session: {scope: 'global'}}");
    let mut c = env.serve(None);
    let l = c.call("sessions_list", json!({}));
    assert_eq!(keys_of(&l), ["main"]);
    assert_eq!(l["sessions"][0]["transcriptUri"], "sessions://history/global");
    for name in ["main", "global", "agent:main:main"] {
        let h = c.call("sessions_history", json!({"sessionKey": name}));
        assert_eq!(h["sessionKey"], "main", "{name}");
    }
    // `global` is reserved under the default per-sender scope.
    let env = TestEnv::new();
    let mut c = env.serve(None);
    assert_eq!(c.call("sessions_history", json!({"sessionKey": "global"}))["status"], "invalid");
}

#[test]
fn main_of_another_agent_resolves_to_the_callers_agent() {
    // Differs: `main` is the caller's agent's main, not the default agent's.
    let env = env_with("{agents: {list: [{id: 'main'}, {id: 'ops'}]}}");
    let mut c = env.serve(Some("agent:ops:main"));
    let h = c.call("sessions_history", json!({"sessionKey": "main"}));
    assert_eq!(h["sessionKey"], "main");
    assert_eq!(h["messages"][0]["content"], "ops here");
    let denied = c.call("sessions_history", json!({"sessionKey": "agent:main:main"}));
    assert_eq!(denied["status"], "forbidden");
}

/// Replaces `from` with `to` in the JSON text of a value.
fn echo_replaced(v: &Value, from: &str, to: &str) -> String {
    v.to_string().replace(from, to)
}

#[test]
fn invisible_sessions_look_the_same_whether_or_not_they_exist() {
    let env = env_with("{}");
    let mut c = env.serve(None);
    let pairs = [
        ("agent:main:discord:group:dev", "agent:main:discord:group:zzz"),
        ("discord:group:dev", "discord:group:zzz"),
        ("agent:ops:main", "agent:qqq:main"),
        ("agent:ops:slack:channel:c1", "agent:ops:slack:channel:c9"),
        ("cron:nightly:run:r1", "cron:nightly:run:r9"),
    ];
    for (exists, missing) in pairs {
        for tool in ["sessions_history", "sessions_send"] {
            let mut args_a = json!({"sessionKey": exists});
            let mut args_b = json!({"sessionKey": missing});
            if tool == "sessions_send" {
                args_a["message"] = json!("hi");
                args_b["message"] = json!("hi");
            }
            let a = c.call_result(tool, args_a);
            let b = c.call_result(tool, args_b);
            assert_eq!(
                echo_replaced(&a, exists, "K"),
                echo_replaced(&b, missing, "K"),
                "{tool}: {exists} vs {missing}"
            );
        }
    }
    // By sessionId: an existing invisible id and an unknown one answer alike.
    let a = c.call_result("sessions_history", json!({"sessionKey": SID_OPS}));
    let b = c.call_result("sessions_history", json!({"sessionKey": "aaaaaaaa-0000-4000-8000-00000000ffff"}));
    assert_eq!(echo_replaced(&a, SID_OPS, "ID"), echo_replaced(&b, "aaaaaaaa-0000-4000-8000-00000000ffff", "ID"));
    assert_eq!(a["structuredContent"]["status"], "not_found");
}

#[test]
fn sandboxed_callers_are_clamped_to_their_tree() {
    let env = TestEnv::with_config("{tools: {sessions: {visibility: 'all'}}}");
    let t = now();
    env.seed(json!({"sessions": [
        {"key": "agent:main:box", "driver": "external", "sandboxed": true, "updatedAt": t},
        {"key": format!("agent:main:subagent:{U1}"), "spawnedBy": "agent:main:box", "sandboxed": true,
         "lastTo": "peer-1", "deliveryContext": {"channel": "slack", "to": "peer-1", "accountId": "a"}, "updatedAt": t - 1},
        {"key": "agent:main:discord:group:dev", "updatedAt": t - 2}
    ]}));
    let mut c = env.serve(Some("agent:main:box"));
    let l = c.call("sessions_list", json!({}));
    assert_eq!(
        l["scope"],
        json!({"visibility": "all", "effective": "tree", "sandboxed": true,
        "note": l["scope"]["note"].clone()})
    );
    assert!(l["scope"]["note"].as_str().unwrap().contains("sandboxed"));
    assert_eq!(keys_of(&l), ["agent:main:box".to_string(), format!("agent:main:subagent:{U1}")]);
    let child = &l["sessions"][1];
    assert!(child.get("lastTo").is_none(), "lastTo hidden from sandboxed callers");
    assert_eq!(child["deliveryContext"], json!({"channel": "slack", "accountId": "a"}));
    let denied = c.call("sessions_history", json!({"sessionKey": "discord:group:dev"}));
    assert_eq!(denied["status"], "forbidden");
    assert!(denied["error"].as_str().unwrap().contains("sessionToolsVisibility"));
    // The clamp only narrows: `self` stays `self`.
    let env = TestEnv::with_config("{tools: {sessions: {visibility: 'self'}}}");
    env.seed(json!({"sessions": [{"key": "agent:main:box", "driver": "external", "sandboxed": true}]}));
    let mut c = env.serve(Some("agent:main:box"));
    assert_eq!(c.call("sessions_list", json!({}))["scope"]["effective"], "self");
}

#[test]
fn cross_agent_access_needs_all_and_agent_to_agent() {
    let cases = [
        (
            "{tools: {sessions: {visibility: 'agent'}, agentToAgent: {enabled: true}}}",
            "forbidden",
            "tools.sessions.visibility=all",
        ),
        ("{tools: {sessions: {visibility: 'all'}}}", "forbidden", "tools.agentToAgent.enabled=true"),
        (
            "{tools: {sessions: {visibility: 'all'}, agentToAgent: {enabled: true, allow: ['main']}}}",
            "forbidden",
            "tools.agentToAgent.allow",
        ),
        ("{tools: {sessions: {visibility: 'all'}, agentToAgent: {enabled: true, allow: ['main', 'op*']}}}", "ok", ""),
        ("{tools: {sessions: {visibility: 'all'}, agentToAgent: {enabled: true}}}", "ok", ""),
    ];
    for (cfg, status, needle) in cases {
        let env = env_with(cfg);
        let mut c = env.serve(None);
        let h = c.call("sessions_history", json!({"sessionKey": "agent:ops:main"}));
        assert_eq!(h["status"], status, "{cfg}: {h}");
        if !needle.is_empty() {
            assert!(h["error"].as_str().unwrap().contains(needle), "{cfg}: {h}");
        }
        let l = c.call("sessions_list", json!({}));
        assert_eq!(keys_of(&l).iter().any(|k| k.starts_with("agent:ops:")), status == "ok", "{cfg}");
    }
}

#[test]
fn channel_rule_shows_the_keys_channel_over_an_internal_stamp() {
    let env = env_with("{tools: {sessions: {visibility: 'agent'}}}");
    let mut c = env.serve(None);
    let l = c.call("sessions_list", json!({"kinds": ["group"]}));
    assert_eq!(l["sessions"][0]["channel"], "discord");
    let l = c.call("sessions_list", json!({"kinds": ["cron", "hook", "main"]}));
    let channels: Vec<(&str, &str)> = l["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["key"].as_str().unwrap(), r["channel"].as_str().unwrap()))
        .collect();
    assert!(channels.contains(&("main", "webchat")), "{channels:?}");
    assert!(channels.contains(&("agent:main:cron:nightly", "internal")), "{channels:?}");
    assert!(channels.contains(&("agent:main:hook:abc", "internal")), "{channels:?}");
}

#[test]
fn agents_list_follows_the_allowlist() {
    let env = TestEnv::with_config(
        "{agents: {list: [{id: 'main', subagents: {allowAgents: ['zeta', 'ops']}}, {id: 'ops', name: ' Ops '}]}}",
    );
    let mut c = env.serve(None);
    let a = c.call("agents_list", json!({}));
    assert_eq!(
        a,
        json!({"status": "ok", "requester": "main", "allowAny": false, "agents": [
            {"id": "main", "configured": true, "discovered": false, "runner": "echo", "available": true,
             "note": "the built-in echo agent: it answers \"ECHO: <input>\" and does no work (no real agent is configured)"},
            {"id": "ops", "name": "Ops", "configured": true, "discovered": false, "runner": "none", "available": false,
             "note": "no runner is configured: set agents.list[].runner.preset (claude, codex, gemini, echo) or runner.command"},
            {"id": "zeta", "configured": false, "discovered": false, "runner": "none", "available": false,
             "note": "no runner is configured: set agents.list[].runner.preset (claude, codex, gemini, echo) or runner.command"}
        ]})
    );
    let env =
        TestEnv::with_config("{agents: {list: [{id: 'main', subagents: {allowAgents: ['*']}}, {id: 'b'}, {id: 'a'}]}}");
    let mut c = env.serve(None);
    let a = c.call("agents_list", json!({}));
    assert_eq!(a["allowAny"], true);
    let ids: Vec<&str> = a["agents"].as_array().unwrap().iter().map(|x| x["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["main", "a", "b"]);
    let env = TestEnv::new();
    let mut c = env.serve(None);
    let a = c.call("agents_list", json!({}));
    assert_eq!(a["agents"].as_array().map(Vec::len), Some(1), "{a}");
    assert_eq!(a["agents"][0]["runner"], "echo", "{a}");
    assert!(a["note"].as_str().unwrap().starts_with("Only the built-in echo agent exists here"), "{a}");
}

#[test]
fn a_refused_spawn_stores_nothing_and_send_reaches_the_child() {
    let env = env_with("{}");
    let before = {
        let c = env.serve(None);
        drop(c);
        env.fingerprint()
    };
    let mut c = env.serve(None);
    let s = c.call("sessions_spawn", json!({"task": "do it", "agentId": "ops"}));
    assert_eq!(s["status"], "forbidden", "{s}");
    assert!(s["error"].as_str().unwrap().contains("allowAgents"));
    assert_eq!(env.fingerprint(), before, "a refused spawn stores nothing");
    // The child of main runs the default agent (main's built-in echo) and its reply comes back.
    let s = c.call("sessions_send", json!({"sessionKey": format!("subagent:{U1}"), "message": "hi"}));
    assert_eq!(s["status"], "ok", "{s}");
    assert_eq!(s["reply"], "ECHO: hi");
    assert_eq!(s["inbox"]["sessionKey"], "main");
    let after = s["inbox"]["afterSeq"].as_i64().unwrap();
    let inbox = c.call("sessions_history", json!({"sessionKey": "main", "afterSeq": after}));
    assert_eq!(inbox["messages"][0]["content"][0]["text"], "ECHO: hi", "{inbox}");
    assert_eq!(inbox["messages"][0]["provenance"]["sourceSessionKey"], format!("agent:main:subagent:{U1}"));
}

#[test]
fn as_on_a_driven_session_is_read_only() {
    let env = env_with("{tools: {sessions: {visibility: 'agent'}}}");
    let mut c = env.serve(Some("discord:group:dev"));
    let l = c.call("sessions_list", json!({}));
    assert_eq!(l["status"], "ok");
    assert_eq!(c.call("sessions_history", json!({"sessionKey": "main"}))["status"], "ok");
    let s = c.call("sessions_send", json!({"sessionKey": "main", "message": "hi"}));
    assert_eq!(s["status"], "forbidden");
    assert!(s["error"].as_str().unwrap().contains("driven by its agent"));
    let s = c.call("sessions_spawn", json!({"task": "x"}));
    assert_eq!(s["status"], "forbidden");
}

#[test]
fn identity_errors_exit_2_with_one_line() {
    let env = TestEnv::new();
    let bad_token = env
        .command(&["serve"])
        .env("SESSIONS_MCP_TOKEN", "smcp_run_nope")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(bad_token.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad_token.stderr).contains("SESSIONS_MCP_TOKEN is not a valid token"));
    let in_run = env
        .command(&["serve", "--as", "main"])
        .env("SESSIONS_MCP_RUN_ID", "r1")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(in_run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&in_run.stderr).contains("only SESSIONS_MCP_TOKEN"));
    let env = TestEnv::with_config("{security: {requireToken: true}}");
    let out = env.command(&["serve"]).stdin(std::process::Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("security.requireToken"));
}

#[test]
fn a_static_token_acts_as_its_session() {
    let token = "client-token-0123456789";
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(token.as_bytes()))
    };
    let env =
        TestEnv::with_config(&format!("{{server: {{tokens: [{{sha256: '{sha}', sessionKey: 'agent:main:desk'}}]}}}}"));
    let mut c = env.serve_with(None, &[("SESSIONS_MCP_TOKEN", token)]);
    let l = c.call("sessions_list", json!({}));
    assert_eq!(keys_of(&l), ["agent:main:desk"]);
    let text = l.to_string();
    assert!(!text.contains(token));
}

#[test]
fn sub_agents_get_only_the_reading_tools_unless_allowed() {
    let world = |env: &TestEnv, expires: Option<i64>| {
        env.seed(json!({"sessions": [
            {"key": "agent:main:main"},
            {"key": format!("agent:main:subagent:{U1}"), "spawnedBy": "agent:main:main"}
        ], "runTokens": [
            {"token": "smcp_run_child", "sessionKey": format!("agent:main:subagent:{U1}"), "runId": "r1", "expiresAt": expires}
        ]}));
    };
    let env = TestEnv::new();
    world(&env, None);
    let mut c = env.serve_with(None, &[("SESSIONS_MCP_TOKEN", "smcp_run_child")]);
    let tools = c.request("tools/list", json!({}));
    let names: Vec<&str> =
        tools["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["sessions_history", "sessions_list"]);
    assert_eq!(keys_of(&c.call("sessions_list", json!({}))), [format!("agent:main:subagent:{U1}")], "its own tree");
    let denied = c.call("sessions_send", json!({"sessionKey": "main", "message": "hi"}));
    assert_eq!(denied["status"], "forbidden");
    assert!(denied["error"].as_str().unwrap().contains("tools.subagents.tools.allow"));

    let env = TestEnv::with_config("{tools: {subagents: {tools: {allow: ['sessions_list']}}}}");
    world(&env, None);
    let mut c =
        env.serve_with(Some("main"), &[("SESSIONS_MCP_TOKEN", "smcp_run_child"), ("SESSIONS_MCP_RUN_ID", "r1")]);
    let tools = c.request("tools/list", json!({}));
    let names: Vec<&str> =
        tools["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["sessions_list"]);
    let l = c.call("sessions_list", json!({}));
    assert_eq!(keys_of(&l), [format!("agent:main:subagent:{U1}")], "the token's session, not --as");
    assert_eq!(c.call("sessions_history", json!({"sessionKey": "main"}))["status"], "forbidden");

    // A token whose run ended (expired) is refused at start: exit 2, no fallback to the operator.
    let env = TestEnv::new();
    world(&env, Some(1));
    let out = env
        .command(&["serve"])
        .env("SESSIONS_MCP_TOKEN", "smcp_run_child")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
