//! Channel bridges, black-box (issue 20): a user's message posted by a channel's bridge runs the
//! session its chat names and the reply reaches the bridge's deliverer in the same thread; the
//! same message id twice runs once; a bridge token reaches only its own channel's sessions; bad
//! posts are refused by field and change nothing; the send policy gates inbound messages;
//! `sessions-mcp inject --sender` does the same for scripts; and a spawn with `thread: true` opens
//! a thread through the deliverer, the child answers there, a follow-up in the thread is its next
//! turn (mode "session") until it idles out, and without a thread-capable channel, or with a
//! deliverer that answers garbage, nothing is created.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::http_client::http_to;
use common::{TestEnv, scripted_agent, wait_until};
use serde_json::{Value, json};

const DISCORD: &str = "discord-bridge-token-0123456789";
const TELEGRAM: &str = "telegram-bridge-token-0123456789";
/// An MCP client acting as the discord thread's session ([`THREAD_KEY`]).
const CLIENT: &str = "thread-client-token-0123456789";
const THREAD_KEY: &str = "agent:main:discord:group:123:thread:456";

fn sha(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

fn fake_channel() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/bridge/fake-channel.sh")
}

/// Agents `main` and `ops` answer `heard: <input>` (`hold` keeps a run busy for 30 s); discord
/// and telegram have a bridge and a deliverer (the fake channel, recording into
/// `<tmp>/<channel>/outbox.jsonl`); discord's bridge reaches `main` only (its default), telegram's
/// `main` and `ops`; `session` is merged in.
fn env_with(session: Value) -> TestEnv {
    env_with_discord_bridge(session, json!({}))
}

/// [`env_with`], with `discord_bridge`'s keys added to discord's `bridge`.
fn env_with_discord_bridge(session: Value, discord_bridge: Value) -> TestEnv {
    env_with_main(&heard(), session, discord_bridge)
}

/// Answers `heard: <input>`; `slowly` takes 5 s, `hold` 30 s.
fn heard() -> Value {
    json!({"rules": [{"match": {"input": "slowly"}, "sleepMs": 5000, "reply": "heard: {input}"},
                     {"match": {"input": "hold"}, "sleepMs": 30000, "reply": "heard: {input}"}],
           "default": {"reply": "heard: {input}"}})
}

/// [`env_with_discord_bridge`], with `main` following `main_script`.
fn env_with_main(main_script: &Value, session: Value, discord_bridge: Value) -> TestEnv {
    let mut env = TestEnv::new();
    let script = heard();
    let main = scripted_agent(&env, "main", main_script, json!({}));
    let ops = scripted_agent(&env, "ops", &script, json!({}));
    let mut channels = json!({});
    for (name, token) in [("discord", DISCORD), ("telegram", TELEGRAM)] {
        let dir = env.state_dir().parent().unwrap().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        channels[name] = json!({
            "deliver": ["/bin/sh", fake_channel().to_str().unwrap(), dir.to_str().unwrap()],
            "bridge": {"tokens": [{"sha256": sha(token)}]},
        });
    }
    channels["telegram"]["bridge"]["allowAgents"] = json!(["main", "ops"]);
    if let Value::Object(extra) = discord_bridge {
        for (k, v) in extra {
            channels["discord"]["bridge"][k] = v;
        }
    }
    // Every agent id would run (the default runner), as on a server whose agents share one.
    let defaults = json!({"runner": main["runner"]});
    let config = json!({"agents": {"list": [main, ops], "defaults": defaults}, "channels": channels, "session": session,
                        "server": {"tokens": [{"sha256": sha(CLIENT), "sessionKey": THREAD_KEY}]}});
    env.set_config(&config.to_string());
    env
}

fn outbox(env: &TestEnv, channel: &str) -> Vec<Value> {
    let path = env.state_dir().parent().unwrap().join(channel).join("outbox.jsonl");
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // Only whole lines: the deliverer may be writing the last one.
    let whole = text.rsplit_once('\n').map_or("", |(done, _)| done);
    whole.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {text:?}"))).collect()
}

fn post(port: u16, channel: &str, token: Option<&str>, body: &str) -> (u16, Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    let (status, _, body) = http_to(port, "POST", &format!("/channels/{channel}/messages"), &headers, body);
    (status, serde_json::from_str(&body).unwrap_or_else(|_| json!({"raw": body})))
}

fn message(text: &str, message_id: &str) -> String {
    json!({"chat": {"type": "group", "id": "123"}, "threadId": "456", "sender": {"id": "u1", "name": "Ada"},
           "text": text, "messageId": message_id})
    .to_string()
}

fn session_keys(env: &TestEnv) -> Vec<String> {
    let out = env.run(&["ls", "--json"]);
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    all["sessions"].as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap().to_string()).collect()
}

#[test]
fn a_bridged_message_runs_its_group_session_and_the_reply_reaches_the_bridge_in_its_thread() {
    let env = env_with(json!({}));
    let server = env.serve_http(&[]);
    let (status, answer) = post(server.port, "discord", Some(DISCORD), &message("hello", "m-1"));
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["status"], "accepted", "{answer}");
    assert_eq!(answer["sessionKey"], THREAD_KEY, "{answer}");
    let delivered = wait_until(Duration::from_secs(20), "the reply at the bridge", || outbox(&env, "discord").pop());
    assert_eq!(delivered["kind"], "reply", "{delivered}");
    assert_eq!(delivered["text"], "heard: hello", "{delivered}");
    assert_eq!(delivered["to"], "channel:123", "{delivered}");
    assert_eq!(delivered["threadId"], "456", "the reply goes to the message's thread: {delivered}");
    assert_eq!(delivered["sessionKey"], THREAD_KEY);
    // The transcript says who wrote it, as data.
    let show = env.show(THREAD_KEY);
    let user = show["messages"].as_array().unwrap().iter().find(|m| m["role"] == "user").unwrap().clone();
    let p = &user["provenance"];
    assert_eq!(p["kind"], "external_user", "{user}");
    assert_eq!(p["sourceTool"], "channel_bridge", "{user}");
    assert_eq!(
        (&p["sourceChannel"], &p["senderId"], &p["senderName"]),
        (&json!("discord"), &json!("u1"), &json!("Ada"))
    );
    assert_eq!((&p["threadId"], &p["messageId"]), (&json!("456"), &json!("m-1")), "{user}");
    // The bridge posts the same message again (a retry): nothing new runs.
    let (status, again) = post(server.port, "discord", Some(DISCORD), &message("hello", "m-1"));
    assert_eq!((status, &again["status"]), (202, &json!("duplicate")), "{again}");
    assert_eq!(again["runId"], answer["runId"], "{again}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(common::runs_of(&env.show(THREAD_KEY), None).len(), 1, "one run for one message");
    assert_eq!(outbox(&env, "discord").len(), 1);
    assert!(outbox(&env, "telegram").is_empty());
}

#[test]
fn a_bridge_token_reaches_only_its_own_channel_and_bad_posts_change_nothing() {
    let env = env_with(json!({}));
    let server = env.serve_http(&[]);
    let port = server.port;
    let good = message("hi", "m-2");
    let cases: Vec<(&str, Option<&str>, String, u16, &str)> = vec![
        ("discord", None, good.clone(), 401, "a bridge token is required"),
        ("discord", Some("not-a-bridge-token"), good.clone(), 401, "a bridge token is required"),
        (
            "discord",
            Some(TELEGRAM),
            good.clone(),
            403,
            "bridge token of channel \"telegram\"; it cannot post to channel \"discord\"",
        ),
        ("nochannel", Some(DISCORD), good.clone(), 403, "it cannot post to channel \"nochannel\""),
        (
            "discord",
            Some(DISCORD),
            json!({"sessionKey": "agent:main:telegram:group:9", "sender": {"id": "u1"}, "text": "x"}).to_string(),
            403,
            "is a session of channel \"telegram\", not of \"discord\"",
        ),
        (
            "discord",
            Some(DISCORD),
            json!({"sessionKey": "agent:main:main", "sender": {"id": "u1"}, "text": "x"}).to_string(),
            403,
            "is not a session of a channel",
        ),
        ("discord", Some(DISCORD), "{not json".into(), 400, "the body is not JSON"),
        (
            "discord",
            Some(DISCORD),
            json!({"chat": {"type": "group", "id": "1"}, "text": "x"}).to_string(),
            400,
            "sender is required",
        ),
        (
            "discord",
            Some(DISCORD),
            json!({"chat": {"type": "group", "id": "1"}, "sender": {"id": "u"}, "text": "x", "admin": true})
                .to_string(),
            400,
            "admin is not a field of a bridge message",
        ),
        (
            "discord",
            Some(DISCORD),
            json!({"chat": {"type": "forum", "id": "1"}, "sender": {"id": "u"}, "text": "x"}).to_string(),
            400,
            "chat.type must be group, channel or direct",
        ),
        (
            "discord",
            Some(DISCORD),
            json!({"chat": {"type": "group", "id": "1"}, "sender": {"id": "u"}}).to_string(),
            400,
            "text is required",
        ),
        (
            "discord",
            Some(DISCORD),
            json!({"chat": {"type": "group", "id": "1"}, "sender": {"id": "u"}, "text": "x", "threadId": 7})
                .to_string(),
            400,
            "threadId must be a string, got 7",
        ),
    ];
    for (channel, token, body, status, needle) in cases {
        let (got, answer) = post(port, channel, token, &body);
        assert_eq!(got, status, "{channel} {token:?} {body}: {answer}");
        let err = answer["error"].as_str().unwrap_or_else(|| panic!("{answer}"));
        assert!(err.contains(needle), "{body}: {err}");
    }
    assert!(session_keys(&env).is_empty(), "nothing was created: {:?}", session_keys(&env));
    assert!(outbox(&env, "discord").is_empty() && outbox(&env, "telegram").is_empty());
}

#[test]
fn the_send_policy_refuses_an_inbound_message_where_a_rule_says_so() {
    let policy = json!({"sendPolicy": {"default": "allow", "rules": [
        {"action": "deny", "match": {"channel": "discord", "chatType": "group"}}]}});
    let env = env_with(policy);
    let server = env.serve_http(&[]);
    let (status, answer) = post(server.port, "discord", Some(DISCORD), &message("hello", "m-3"));
    assert_eq!(status, 403, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("rule"), "{answer}");
    // A direct chat on the same channel is not matched by the rule: it runs, and its reply goes
    // to the sender.
    let direct = json!({"chat": {"type": "direct", "id": "u7"}, "sender": {"id": "u7"}, "text": "psst"}).to_string();
    let (status, answer) = post(server.port, "discord", Some(DISCORD), &direct);
    assert_eq!(status, 202, "{answer}");
    let delivered = wait_until(Duration::from_secs(20), "the direct reply", || outbox(&env, "discord").pop());
    assert_eq!((&delivered["to"], &delivered["text"]), (&json!("user:u7"), &json!("heard: psst")), "{delivered}");
    assert_eq!(session_keys(&env), ["agent:main:discord:direct:u7"], "the refused group session was never made");
}

#[test]
fn a_policy_turned_off_while_a_bridged_message_runs_denies_its_reply_delivery() {
    let env = env_with(json!({}));
    let server = env.serve_http(&[]);
    let key = "agent:main:discord:group:123:thread:456";
    let (status, answer) = post(server.port, "discord", Some(DISCORD), &message("answer slowly", "m-9"));
    assert_eq!(status, 202, "{answer}");
    wait_until(Duration::from_secs(20), "the run to start", || {
        common::runs_of(&env.try_show(key).ok()?, None).first().is_some_and(|r| r["status"] == "running").then_some(())
    });
    let off = env.run(&["policy", key, "off"]);
    assert!(off.status.success(), "{}", String::from_utf8_lossy(&off.stderr));
    let delivery = wait_until(Duration::from_secs(20), "the reply's delivery record", || {
        common::runs_of(&env.show(key), Some("inject"))[0]["deliveries"].as_array()?.first().cloned()
    });
    assert_eq!(delivery["status"], "skipped", "{delivery}");
    assert!(delivery["lastError"].as_str().unwrap_or("").contains("policy"), "{delivery}");
    assert!(outbox(&env, "discord").is_empty(), "nothing reached the channel");
}

#[test]
fn inject_with_a_sender_is_a_channel_users_message_for_scripts() {
    let env = env_with(json!({}));
    let out =
        env.run(&["inject", THREAD_KEY, "from a script", "--sender", "u9", "--message-id", "s-1", "--timeout", "30"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "heard: from a script");
    let delivered = wait_until(Duration::from_secs(20), "the reply at the bridge", || outbox(&env, "discord").pop());
    assert_eq!((&delivered["threadId"], &delivered["text"]), (&json!("456"), &json!("heard: from a script")));
    let again = env.run(&["inject", THREAD_KEY, "from a script", "--sender", "u9", "--message-id", "s-1"]);
    assert!(String::from_utf8_lossy(&again.stdout).contains("message already received"), "{again:?}");
    let refused = env.run(&["inject", "agent:main:main", "x", "--sender", "u9"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--sender needs a channel session key"), "{refused:?}");
}

#[test]
fn a_bridge_reaches_only_the_agents_of_its_channel_and_an_unknown_agent_id_creates_nothing() {
    let env = env_with(json!({}));
    let server = env.serve_http(&[]);
    let chat = |agent: &str| {
        json!({"chat": {"type": "group", "id": "1"}, "agentId": agent, "sender": {"id": "u"}, "text": "x"}).to_string()
    };
    let key = |key: &str| json!({"sessionKey": key, "sender": {"id": "u"}, "text": "x"}).to_string();
    // Invented ids, a configured agent the channel is not for, and the same through a key.
    let mut bodies: Vec<(String, &str)> = (0..40).map(|i| (chat(&format!("ghost-{i}")), "\"ghost-")).collect();
    bodies.push((chat("ops"), "\"ops\""));
    bodies.push((key("agent:ops:discord:group:1"), "\"ops\""));
    bodies.push((key("agent:ghost-x:discord:group:1"), "\"ghost-x\""));
    for (body, named) in &bodies {
        let (status, answer) = post(server.port, "discord", Some(DISCORD), body);
        assert_eq!(status, 403, "{body}: {answer}");
        let err = answer["error"].as_str().unwrap_or_else(|| panic!("{answer}"));
        assert!(err.contains(named), "{err}");
        assert!(err.contains("reaches only main (channels.discord.bridge.allowAgents)"), "{err}");
    }
    assert!(session_keys(&env).is_empty(), "nothing was created: {:?}", session_keys(&env));
    let workspaces = env.state_dir().join("workspaces");
    let made: Vec<_> =
        std::fs::read_dir(&workspaces).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    assert!(made.is_empty(), "no workspace was made: {made:?}");
    // A channel configured for `ops` reaches it.
    let (status, answer) = post(server.port, "telegram", Some(TELEGRAM), &chat("ops"));
    assert_eq!((status, &answer["sessionKey"]), (202, &json!("agent:ops:telegram:group:1")), "{answer}");
}

#[test]
fn a_channel_queues_at_most_max_queued_runs_and_a_post_past_them_queues_nothing() {
    let env = env_with_discord_bridge(json!({}), json!({"maxQueuedRuns": 2}));
    let server = env.serve_http(&[]);
    let (status, answer) = post(server.port, "discord", Some(DISCORD), &message("hold 1", "m-1"));
    assert_eq!(status, 202, "{answer}");
    wait_until(Duration::from_secs(20), "the first run to start", || {
        common::runs_of(&env.try_show(THREAD_KEY).ok()?, None)
            .first()
            .is_some_and(|r| r["status"] == "running")
            .then_some(())
    });
    // Two more wait behind it: the channel's queue is full.
    for id in ["m-2", "m-3"] {
        let (status, answer) = post(server.port, "discord", Some(DISCORD), &message("hold", id));
        assert_eq!((status, &answer["status"]), (202, &json!("accepted")), "{id}: {answer}");
    }
    let (status, answer) = post(server.port, "discord", Some(DISCORD), &message("hold", "m-4"));
    assert_eq!(status, 429, "{answer}");
    assert_eq!((&answer["limit"], &answer["max"]), (&json!("channels.discord.bridge.maxQueuedRuns"), &json!(2)));
    let err = answer["error"].as_str().unwrap();
    assert!(err.contains("channel \"discord\" already has 2 runs queued"), "{err}");
    assert_eq!(common::runs_of(&env.show(THREAD_KEY), None).len(), 3, "the refused post queued nothing");
    // A retry of a queued message is still its duplicate, and another channel has its own queue.
    let (status, again) = post(server.port, "discord", Some(DISCORD), &message("hold", "m-2"));
    assert_eq!((status, &again["status"]), (202, &json!("duplicate")), "{again}");
    let (status, other) = post(server.port, "telegram", Some(TELEGRAM), &message("hi", "m-4"));
    assert_eq!((status, &other["status"]), (202, &json!("accepted")), "{other}");
}

#[test]
fn a_bridge_message_id_and_a_tools_idempotency_key_of_the_same_text_are_different_things() {
    let env = env_with(json!({}));
    let server = env.serve_http(&[]);
    let mut thread = common::http_client::Mcp::legacy(server.port, CLIENT);
    let spawn = |mcp: &mut common::http_client::Mcp, key: &str| {
        mcp.rpc(
            "tools/call",
            json!({"name": "sessions_spawn",
                                     "arguments": {"task": "look", "idempotencyKey": key}}),
        )["result"]
            .clone()
    };
    // The session's own spawn first, then a user's message whose id spells the same. (The
    // session is the MCP client's, so a message is appended to its inbox rather than run.)
    let spawned = spawn(&mut thread, "message:m-77");
    assert_eq!(spawned["structuredContent"]["status"], "accepted", "{spawned}");
    let (status, answer) = post(server.port, "discord", Some(DISCORD), &message("hello", "m-77"));
    assert_eq!((status, &answer["status"]), (202, &json!("appended")), "the user's message arrives: {answer}");
    // The other way round: a user's message first, then a spawn with that key.
    let (status, answer) = post(server.port, "discord", Some(DISCORD), &message("again", "m-78"));
    assert_eq!((status, &answer["status"]), (202, &json!("appended")), "{answer}");
    let spawned = spawn(&mut thread, "message:m-78");
    assert_eq!(spawned["structuredContent"]["status"], "accepted", "the spawn is not refused: {spawned}");
    // Each still dedupes its own: the spawn repeats, the message is a duplicate.
    let repeated = spawn(&mut thread, "message:m-78");
    assert_eq!(repeated["structuredContent"]["runId"], spawned["structuredContent"]["runId"], "{repeated}");
    let (status, again) = post(server.port, "discord", Some(DISCORD), &message("again", "m-78"));
    assert_eq!((status, &again["status"]), (202, &json!("duplicate")), "{again}");
}

#[test]
fn a_bridge_post_with_a_foreign_host_or_origin_is_refused_and_creates_nothing() {
    let env = env_with(json!({}));
    let server = env.serve_http(&[]);
    let auth = format!("Bearer {DISCORD}");
    for foreign in [("Host", "evil.example"), ("Origin", "http://evil.example")] {
        let headers = [("Content-Type", "application/json"), ("Authorization", auth.as_str()), foreign];
        let (status, _, body) =
            http_to(server.port, "POST", "/channels/discord/messages", &headers, &message("hi", "m-5"));
        assert_eq!(status, 403, "{foreign:?}: {body}");
        assert!(body.contains("server.allowedHosts"), "{body}");
    }
    assert!(session_keys(&env).is_empty(), "nothing was created: {:?}", session_keys(&env));
}

const GROUP_KEY: &str = "agent:main:discord:group:123";

/// Agent `main` spawns a thread-bound `worker` for `thread <task>` (mode `mode`); the worker
/// answers `child: <input>`. Discord opens threads; a session child idles out after 2 s.
fn env_with_threads(mode: &str) -> TestEnv {
    env_with_threads_and_worker(mode, json!({"default": {"reply": "child: {input}"}}))
}

/// [`env_with_threads`], with the worker following `worker_script`.
fn env_with_threads_and_worker(mode: &str, worker_script: Value) -> TestEnv {
    let mut env = TestEnv::new();
    let main_script = json!({"rules": [
        {"match": {"inputRegex": "^thread (.*)$"},
         "call": {"tool": "sessions_spawn", "arguments": {"task": "{1}", "agentId": "worker", "thread": true, "mode": mode}},
         "reply": "spawned: {result}"}
    ], "default": {"reply": "main heard: {input}"}});
    let mut main = scripted_agent(&env, "main", &main_script, json!({}));
    main["subagents"] = json!({"allowAgents": ["worker"]});
    let worker = scripted_agent(&env, "worker", &worker_script, json!({}));
    let dir = env.state_dir().parent().unwrap().join("discord");
    std::fs::create_dir_all(&dir).unwrap();
    let channels = json!({"discord": {
        "deliver": ["/bin/sh", fake_channel().to_str().unwrap(), dir.to_str().unwrap()],
        "threads": true,
        "threadBindings": {"idleHours": 2.0 / 3600.0},
        "bridge": {"tokens": [{"sha256": sha(DISCORD)}]},
    }});
    let subagents = json!({"announceStep": false, "sweepIntervalSeconds": 1});
    env.set_config(
        &json!({"agents": {"list": [main, worker], "defaults": {"subagents": subagents}}, "channels": channels})
            .to_string(),
    );
    env
}

fn threads(env: &TestEnv) -> Vec<Value> {
    let path = env.state_dir().parent().unwrap().join("discord").join("threads.jsonl");
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let whole = text.rsplit_once('\n').map_or("", |(done, _)| done);
    whole.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn group_post(port: u16, text: &str, thread: Option<&str>) -> Value {
    let body =
        json!({"chat": {"type": "group", "id": "123"}, "threadId": thread, "sender": {"id": "u1"}, "text": text});
    let (status, answer) = post(port, "discord", Some(DISCORD), &body.to_string());
    assert_eq!(status, 202, "{answer}");
    answer
}

fn child_key(env: &TestEnv) -> String {
    session_keys(env).into_iter().find(|k| k.contains(":subagent:")).expect("a child")
}

#[test]
fn a_thread_bound_session_child_answers_in_its_thread_takes_follow_ups_and_idles_out() {
    let env = env_with_threads("session");
    let server = env.serve_http(&[]);
    group_post(server.port, "thread research the logs", None);
    let replied = wait_until(Duration::from_secs(20), "the child's reply in its thread", || {
        outbox(&env, "discord").into_iter().find(|d| d["text"] == "child: research the logs")
    });
    assert_eq!((&replied["to"], &replied["threadId"]), (&json!("channel:123"), &json!("t-1")), "{replied}");
    let opened = &threads(&env)[0];
    assert_eq!(
        (&opened["kind"], &opened["to"], &opened["mode"]),
        (&json!("thread_open"), &json!("channel:123"), &json!("session"))
    );
    assert_eq!(opened["requesterSessionKey"], GROUP_KEY, "{opened}");
    // The spawn's answer, as main's agent saw it, names the thread.
    let main_reply = wait_until(Duration::from_secs(20), "main's reply", || {
        outbox(&env, "discord").into_iter().find(|d| d["text"].as_str().unwrap().starts_with("spawned: "))
    });
    let spawned: Value =
        serde_json::from_str(main_reply["text"].as_str().unwrap().trim_start_matches("spawned: ")).unwrap();
    assert_eq!((&spawned["mode"], &spawned["thread"]["threadId"]), (&json!("session"), &json!("t-1")), "{spawned}");
    assert!(spawned["note"].as_str().unwrap().contains("continue in-thread for follow-ups"), "{spawned}");
    let child = child_key(&env);
    // A follow-up in the thread is the same child's next turn.
    let follow = group_post(server.port, "and the metrics", Some("t-1"));
    assert_eq!(follow["sessionKey"], child.as_str(), "the thread's message goes to its child: {follow}");
    let again = wait_until(Duration::from_secs(20), "the follow-up's reply", || {
        outbox(&env, "discord").into_iter().find(|d| d["text"] == "child: and the metrics")
    });
    assert_eq!(again["threadId"], "t-1", "{again}");
    // Between its turns its requester sees it idle.
    let mut c = env.serve(Some(GROUP_KEY));
    let list = c.call("subagents", json!({"action": "list"}));
    let row = list["children"].as_array().unwrap().iter().find(|r| r["sessionKey"] == child.as_str()).cloned();
    assert_eq!(row.as_ref().map(|r| r["runState"].clone()), Some(json!("idle")), "{list}");
    c.close();
    let show = env.show(&child);
    let users: Vec<String> = show["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| common::text_of(&m["content"]))
        .collect();
    assert_eq!(users, ["research the logs", "and the metrics"], "one transcript, both turns");
    // Idle for its 2 s, it is archived; a later message in the thread starts a new session there.
    wait_until(Duration::from_secs(20), "the idle child to be archived", || {
        (env.show(&child)["session"]["archived"] == true).then_some(())
    });
    let later = group_post(server.port, "anyone there?", Some("t-1"));
    assert_eq!(later["sessionKey"], format!("{GROUP_KEY}:thread:t-1"), "{later}");
    assert_eq!(common::runs_of(&env.show(&child), Some("inject")).len(), 1, "the archived child took no turn");
}

#[test]
fn a_thread_run_child_answers_in_its_thread_and_is_not_kept_for_follow_ups() {
    let env = env_with_threads("run");
    let server = env.serve_http(&[]);
    group_post(server.port, "thread count the rows", None);
    let replied = wait_until(Duration::from_secs(20), "the child's reply in its thread", || {
        outbox(&env, "discord").into_iter().find(|d| d["text"] == "child: count the rows")
    });
    assert_eq!(replied["threadId"], "t-1", "{replied}");
    wait_until(Duration::from_secs(20), "the exchange to end", || (env.unfinished_runs() == 0).then_some(()));
    let follow = group_post(server.port, "more?", Some("t-1"));
    assert_eq!(follow["sessionKey"], format!("{GROUP_KEY}:thread:t-1"), "a run child takes no follow-ups: {follow}");
}

#[test]
fn thread_true_without_a_thread_capable_channel_or_with_a_broken_deliverer_creates_nothing() {
    // An external caller's channel is webchat: no threads there.
    let env = env_with_threads("session");
    let mut c = env.serve(None);
    let r = c.call("sessions_spawn", json!({"task": "x", "agentId": "worker", "thread": true}));
    assert_eq!(r["status"], "forbidden", "{r}");
    let err = r["error"].as_str().unwrap();
    assert!(
        err.contains("thread=true is unavailable: your channel \"webchat\" has no thread-capable deliverer"),
        "{err}"
    );
    assert!(err.contains("channels.webchat.threads: true"), "{err}");
    let r = c.call("sessions_spawn", json!({"task": "x", "mode": "session"}));
    assert!(r["error"].as_str().unwrap().contains("mode=\"session\" requires thread=true"), "{r}");
    c.close();
    assert!(threads(&env).is_empty(), "no thread was asked for");
    // A deliverer that answers garbage to thread_open fails the spawn; no child is made.
    let dir = env.state_dir().parent().unwrap().join("discord");
    std::fs::write(dir.join("thread_open"), "garbage").unwrap();
    let server = env.serve_http(&[]);
    group_post(server.port, "thread doomed", None);
    let reply = wait_until(Duration::from_secs(20), "main's reply", || {
        outbox(&env, "discord").into_iter().find(|d| d["text"].as_str().unwrap().starts_with("spawned: "))
    });
    let text = reply["text"].as_str().unwrap();
    assert!(text.contains("did not open a thread: it printed \\\"garbage\\\""), "{text}");
    assert!(text.contains("nothing was created"), "{text}");
    assert!(!session_keys(&env).iter().any(|k| k.contains(":subagent:")), "{:?}", session_keys(&env));
}

/// Agent `main` spawns children that ask an approval (`crate::asks::script`); discord has a
/// deliverer and a bridge, telegram too.
fn env_with_asking_children() -> TestEnv {
    env_with_main(&crate::asks::script(), json!({}), json!({}))
}

/// The approval the fake channel got, once delivered.
fn asked_in_channel(env: &TestEnv, channel: &str) -> Value {
    wait_until(Duration::from_secs(20), "the approval posted to the channel", || {
        outbox(env, channel).into_iter().find(|d| d["kind"] == "ask")
    })
}

fn chat_answer(port: u16, chat: &str, thread: Option<&str>, sender: &str, text: &str) -> (u16, Value) {
    let body = json!({"chat": {"type": "group", "id": chat}, "threadId": thread, "sender": {"id": sender},
                      "text": text});
    post(port, "discord", Some(DISCORD), &body.to_string())
}

/// The only answer line of ask `id` in `key`'s transcript.
fn answer_line(env: &TestEnv, key: &str, id: &str) -> String {
    let show = env.show(key);
    let texts: Vec<String> =
        show["messages"].as_array().unwrap().iter().map(|m| common::text_of(&m["content"])).collect();
    let lines: Vec<&String> = texts.iter().filter(|t| t.starts_with(&format!("[answer to {id} "))).collect();
    assert_eq!(lines.len(), 1, "{texts:?}");
    lines[0].clone()
}

/// An MCP client acting as a discord chat's session spawns a child that asks an approval: it is
/// posted to that chat, the model is told it waits for a person there and is refused when it
/// answers, a code not asked in a chat is unknown there (another chat, another channel, an
/// invented one), and a person's `allow <code>` through the bridge answers it: the child goes on,
/// and the transcript and the announce say a person answered via discord.
#[test]
fn a_childs_approval_is_posted_to_the_chat_of_its_tree_and_a_person_answers_it_through_the_bridge() {
    let env = env_with_asking_children();
    let server = env.serve_http(&[]);
    let mut c = env.serve(Some(GROUP_KEY));
    let r = c.call("sessions_spawn", json!({"task": "ask for a.txt"}));
    let child = r["childSessionKey"].as_str().unwrap_or_else(|| panic!("{r}")).to_string();
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    assert_eq!(w["status"], "attention", "{w}");
    let request = &w["requests"][0];
    let id = request["requestId"].as_str().unwrap().to_string();
    assert_eq!(request["waitsFor"], "person", "{w}");
    assert!(request["why"].as_str().unwrap().contains("posted to the chat on discord"), "{w}");

    let asked = asked_in_channel(&env, "discord");
    let code = &id[..8];
    assert_eq!((&asked["to"], &asked["requestId"], &asked["code"]), (&json!("channel:123"), &json!(id), &json!(code)));
    let text = asked["text"].as_str().unwrap();
    assert!(text.contains("asks for approval: May I write ask for a.txt?"), "{text}");
    assert!(text.contains(&format!("Reply \"allow {code}\" or \"deny {code} <why>\"")), "{text}");

    let refused = c.call("subagents", json!({"action": "respond", "requestId": id, "decision": "deny"}));
    assert_eq!(refused["status"], "forbidden", "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("is an approval for a person, not for you"), "{refused}");

    // Not asked in that chat: unknown there, as an invented code is.
    for (chat, text) in [("999", format!("allow {code}")), ("123", "allow 0123abcd".to_string())] {
        let (status, answer) = chat_answer(server.port, chat, None, "u9", &text);
        assert_eq!(status, 404, "{answer}");
        assert!(answer["error"].as_str().unwrap().starts_with("no approval "), "{answer}");
    }
    let other = json!({"chat": {"type": "group", "id": "123"}, "sender": {"id": "u9"}, "text": format!("deny {code}")});
    let (status, answer) = post(server.port, "telegram", Some(TELEGRAM), &other.to_string());
    assert_eq!(status, 404, "another channel's chat of the same id: {answer}");

    let (status, answer) = chat_answer(server.port, "123", Some("456"), "u1", &format!("Allow {code} go ahead"));
    assert_eq!(
        (status, &answer["status"], &answer["decision"]),
        (200, &json!("answered"), &json!("allow")),
        "{answer}"
    );
    assert_eq!(answer["requestId"], id.as_str());
    let (status, again) = chat_answer(server.port, "123", Some("456"), "u1", &format!("Allow {code} go ahead"));
    assert_eq!((status, &again["status"]), (200, &json!("duplicate")), "a bridge's retry: {again}");
    let (status, late) = chat_answer(server.port, "123", None, "u2", &format!("deny {code}"));
    assert_eq!(status, 409, "{late}");
    assert!(
        late["error"].as_str().unwrap().contains("was already answered (allow) by discord:u1 via channel"),
        "{late}"
    );

    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 60}));
    assert_eq!(w["status"], "ok", "{w}");
    let outcome = w["finished"][0]["outcome"].as_str().unwrap_or_else(|| panic!("{w}"));
    assert!(outcome.contains("Result: decision=allow answer=go ahead\n"), "{outcome}");
    assert!(outcome.contains(": allow by a person via discord\n"), "{outcome}");
    assert_eq!(
        answer_line(&env, &child, &id),
        format!("[answer to {id} by discord:u1 via channel, a person via discord] allow: go ahead")
    );
    // The answers ran nothing and reached no session as messages.
    let chat = env.show(GROUP_KEY);
    let texts: Vec<String> =
        chat["messages"].as_array().unwrap().iter().map(|m| common::text_of(&m["content"])).collect();
    assert!(
        !texts.iter().any(|t| t.contains(&format!("allow {code}")) || t.contains(&format!("deny {code}"))),
        "{texts:?}"
    );
    c.close();
}

/// A driven chat session spawns a thread-bound child that asks an approval: it is posted in the
/// child's thread and not put to the parent's model; a person answers in the thread and the child
/// goes on there.
#[test]
fn a_thread_bound_childs_approval_is_posted_in_its_thread_and_answered_there() {
    let env = env_with_threads_and_worker("run", crate::asks::script());
    let server = env.serve_http(&[]);
    group_post(server.port, "thread ask for b.txt", None);
    let asked = asked_in_channel(&env, "discord");
    assert_eq!((&asked["to"], &asked["threadId"]), (&json!("channel:123"), &json!("t-1")), "{asked}");
    let id = asked["requestId"].as_str().unwrap().to_string();
    let child = child_key(&env);
    assert_eq!(asked["sessionKey"], child.as_str(), "{asked}");

    let (status, answer) = chat_answer(server.port, "123", Some("t-1"), "u1", &format!("deny {} not b.txt", &id[..8]));
    assert_eq!((status, &answer["status"]), (200, &json!("answered")), "{answer}");
    let replied = wait_until(Duration::from_secs(20), "the child's reply in its thread", || {
        outbox(&env, "discord").into_iter().find(|d| d["kind"] == "reply" && d["threadId"] == "t-1")
    });
    assert_eq!(replied["text"], "decision=deny answer=not b.txt", "{replied}");
    assert_eq!(
        answer_line(&env, &child, &id),
        format!("[answer to {id} by discord:u1 via channel, a person via discord] deny: not b.txt")
    );
    assert!(common::runs_of(&env.show(GROUP_KEY), Some("ask")).is_empty(), "the parent's model was not asked");
}

/// The chat cannot be reached (the deliverer fails): the chat's route ends, said in the child's
/// transcript, and the approval falls to the model as the policy allows (`afterPerson`).
#[test]
fn an_approval_the_channel_cannot_deliver_falls_to_the_next_route() {
    let env = env_with_asking_children();
    std::fs::write(env.state_dir().parent().unwrap().join("discord").join("fail"), "1").unwrap();
    let mut c = env.serve(Some(GROUP_KEY));
    let r = c.call("sessions_spawn", json!({"task": "ask for c.txt"}));
    let child = r["childSessionKey"].as_str().unwrap_or_else(|| panic!("{r}")).to_string();
    let pending = wait_until(Duration::from_secs(30), "the approval to fall to the model", || {
        let l = c.call("subagents", json!({"action": "list"}));
        let request = l["children"][0]["pendingRequests"][0].clone();
        (request["waitsFor"] == "you").then_some(request)
    });
    let id = pending["requestId"].as_str().unwrap().to_string();
    let ok = c.call("subagents", json!({"action": "respond", "requestId": id, "decision": "allow"}));
    assert_eq!(ok["status"], "ok", "{ok}");
    let show = env.show(&child);
    let texts: Vec<String> =
        show["messages"].as_array().unwrap().iter().map(|m| common::text_of(&m["content"])).collect();
    let line = format!("[input request {id}: it could not be posted to discord (the deliverer exited with Some(1)");
    assert!(texts.iter().any(|t| t.starts_with(&line)), "{texts:?}");
    assert!(answer_line(&env, &child, &id).contains("via subagents, the model] allow"));
    c.close();
}
