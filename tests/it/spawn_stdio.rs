//! sessions_spawn over stdio, black-box (docs/BEHAVIOUR.md, sessions_spawn, What sub-agents see,
//! Sub-agents): every refusal and that it leaves nothing behind; the accepted answer and its note;
//! the announce (Status/Result/Notes/Stats) in an external requester's inbox and as a completion
//! run in a driven one; the Result fallbacks and skip tokens; run timeouts and failures; the
//! admission caps under concurrency; idempotent replay; nested spawns; cleanup and the archive
//! sweep.

use crate::common;

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Client, TestEnv, max_overlap, runs_of, scripted_agent, text_of, tool_results, wait_until};
use serde_json::{Value, json};

const A: &str = "agent:main:a";
const TOKEN_A: &str = "smcp_run_a";
const CHILD_PREFIX: &str = "agent:main:subagent:";

// ---- helpers ---------------------------------------------------------------------------------

/// A child that answers `RESULT: <task>`, writes `NOTES: all done` in the Notes step and
/// acknowledges completions.
fn child_script() -> Value {
    json!({"rules": [
        {"match": {"mode": "announce"}, "reply": "NOTES: all done"},
        {"match": {"mode": "completion"}, "reply": "noted the completion"}
    ], "default": {"reply": "RESULT: {input}"}})
}

/// A config with these agents, `agents.defaults.subagents = subagents`, and `extra`'s top-level
/// keys (tools, session, runtime, …). Visibility stays at its default (`tree`).
fn config(agents: Vec<Value>, subagents: Value, extra: Value) -> String {
    let mut cfg = json!({"agents": {"list": agents, "defaults": {"subagents": subagents}}});
    if let Value::Object(m) = extra {
        for (k, v) in m {
            cfg[k] = v;
        }
    }
    cfg.to_string()
}

/// An env whose only agent `main` runs `script`.
fn env_with(script: &Value, subagents: Value, extra: Value) -> TestEnv {
    let mut env = TestEnv::new();
    let main = scripted_agent(&env, "main", script, json!({}));
    env.set_config(&config(vec![main], subagents, extra));
    env
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Calls sessions_spawn and asserts `accepted`.
fn spawn(c: &mut Client, args: Value) -> Value {
    let r = c.call("sessions_spawn", args.clone());
    assert_eq!(r["status"], "accepted", "sessions_spawn {args} → {r}");
    r
}

/// The child key of an accepted spawn, checked to be `agent:main:subagent:<uuid>`.
fn child_of(r: &Value) -> String {
    let key = r["childSessionKey"].as_str().unwrap_or_else(|| panic!("childSessionKey: {r}")).to_string();
    let id = key.strip_prefix(CHILD_PREFIX).unwrap_or_else(|| panic!("{key} is not {CHILD_PREFIX}<uuid>"));
    assert!(id.len() == 36 && uuid::Uuid::parse_str(id).is_ok(), "{key}: the suffix is a uuid");
    key
}

/// The afterSeq an external requester was told, checked against the note.
fn after_seq(r: &Value) -> i64 {
    let n = r["inbox"]["afterSeq"].as_i64().unwrap_or_else(|| panic!("inbox.afterSeq: {r}"));
    assert_eq!(r["inbox"]["sessionKey"], "main", "{r}");
    let note = r["note"].as_str().unwrap();
    assert!(note.contains(&format!("after seq {n}")), "the note names afterSeq {n}: {note}");
    assert!(note.contains(&format!("afterSeq: {n}")), "the note says how to read it: {note}");
    assert!(note.contains("subagent_announce"), "{note}");
    n
}

fn inbox(c: &mut Client, after: i64) -> Vec<Value> {
    inbox_of(c, "main", after)
}

/// The messages of `key` after `after` (the inbox of an external requester).
fn inbox_of(c: &mut Client, key: &str, after: i64) -> Vec<Value> {
    let h = c.call("sessions_history", json!({"sessionKey": key, "afterSeq": after}));
    assert_eq!(h["status"], "ok", "{h}");
    h["messages"].as_array().unwrap().clone()
}

fn announces(c: &mut Client, after: i64) -> Vec<Value> {
    announces_of(c, "main", after)
}

fn announces_of(c: &mut Client, key: &str, after: i64) -> Vec<Value> {
    inbox_of(c, key, after).into_iter().filter(|m| m["provenance"]["sourceTool"] == "subagent_announce").collect()
}

/// Waits for the announce of `child` in main's inbox after `after`.
fn wait_announce(c: &mut Client, after: i64, child: &str, secs: u64) -> Value {
    let needle = format!("sessionKey {child} ");
    wait_until(Duration::from_secs(secs), &format!("the announce of {child} in main's inbox"), || {
        announces(c, after).into_iter().find(|m| text_of(&m["content"]).contains(&needle))
    })
}

/// The line of `text` that starts with `prefix`.
fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.lines().find(|l| l.starts_with(prefix))
}

/// Waits until `key`'s run of `mode` (the first one) has ended; returns the show.
fn wait_run_ended(env: &TestEnv, key: &str, mode: &str, secs: u64) -> Value {
    wait_until(Duration::from_secs(secs), &format!("the {mode} run of {key} to end"), || {
        let show = env.show(key);
        runs_of(&show, Some(mode)).first().is_some_and(|r| r["endedAt"].is_i64()).then_some(show)
    })
}

fn ls(env: &TestEnv) -> Value {
    let out = env.run(&["ls", "--json"]);
    assert!(out.status.success(), "ls: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn ls_row(env: &TestEnv, key: &str) -> Option<Value> {
    ls(env)["sessions"].as_array().unwrap().iter().find(|r| r["key"] == key).cloned()
}

fn listed(c: &mut Client, include_archived: bool) -> Vec<String> {
    let l = c.call("sessions_list", json!({"includeArchived": include_archived, "limit": 200}));
    assert_eq!(l["status"], "ok", "{l}");
    common::keys_of(&l)
}

/// The deliveries of the (only) spawn run of a child.
fn spawn_deliveries(env: &TestEnv, child: &str) -> Vec<Value> {
    let show = env.show(child);
    let spawns = runs_of(&show, Some("spawn"));
    assert_eq!(spawns.len(), 1, "{child}: one spawn run: {spawns:?}");
    spawns[0]["deliveries"].as_array().cloned().unwrap_or_default()
}

/// Checks one refusal: status, the needles in `error`, and an unchanged store. A changed
/// fingerprint is re-checked a few times when `settle` is set (a running run's lease renewal
/// moves the fingerprint every 5 s; a refused call that left something behind changes it every time).
fn refused(env: &TestEnv, c: &mut Client, args: Value, status: &str, needles: &[&str], settle: bool) -> Option<String> {
    for attempt in 0..3 {
        let before = env.fingerprint();
        let r = c.call("sessions_spawn", args.clone());
        let mut problems = Vec::new();
        if r["status"] != status {
            problems.push(format!("status {} (want {status})", r["status"]));
        }
        let err = r["error"].as_str().unwrap_or("");
        for n in needles {
            if !err.contains(n) {
                problems.push(format!("error lacks {n:?}"));
            }
        }
        if !problems.is_empty() {
            return Some(format!("{args} → {r}: {}", problems.join("; ")));
        }
        if env.fingerprint() == before {
            return None;
        }
        if !settle || attempt == 2 {
            return Some(format!("{args} → {r}: the store changed"));
        }
    }
    None
}

fn assert_no_failures(what: &str, failures: Vec<String>) {
    assert!(failures.is_empty(), "{what}: {} failed:\n  {}", failures.len(), failures.join("\n  "));
}

// ---- refusals ----------------------------------------------------------------------------------

#[test]
fn every_refusal_has_its_status_and_message_and_leaves_nothing_behind() {
    let mut env = TestEnv::new();
    let mut main = scripted_agent(&env, "main", &child_script(), json!({}));
    main["subagents"] = json!({"allowAgents": ["main", "bare"]});
    let helper = scripted_agent(&env, "helper", &child_script(), json!({}));
    env.set_config(&config(vec![main, helper, json!({"id": "bare"}), json!({"id": "lonely"})], json!({}), json!({})));
    let mut c = env.serve(None);
    let cases: Vec<(Value, &str, Vec<&str>)> = vec![
        // Arguments first.
        (json!({}), "invalid", vec!["task"]),
        (json!({"task": ""}), "invalid", vec!["task"]),
        (json!({"task": 5}), "invalid", vec!["task"]),
        (json!({"task": "x", "mode": "bogus"}), "invalid", vec!["mode"]),
        (json!({"task": "x", "mode": "session"}), "invalid", vec!["session"]),
        (json!({"task": "x", "cleanup": "never"}), "invalid", vec!["cleanup"]),
        (json!({"task": "x", "sandbox": "maybe"}), "invalid", vec!["sandbox"]),
        (json!({"task": "x", "agentId": "Bad!"}), "invalid", vec!["agentId"]),
        (json!({"task": "x", "model": "-rf"}), "invalid", vec!["model"]),
        (json!({"task": "x", "model": "a b"}), "invalid", vec!["model"]),
        (json!({"task": "x", "thinking": "extreme"}), "invalid", vec!["thinking"]),
        (json!({"task": "x", "runTimeoutSeconds": -1}), "invalid", vec!["runTimeoutSeconds"]),
        (json!({"task": "x", "label": "l".repeat(65)}), "invalid", vec!["label"]),
        (json!({"task": "x", "to": "+15550001"}), "invalid", vec!["to", "sessions_send"]),
        (json!({"task": "x", "channel": "discord"}), "invalid", vec!["channel", "sessions_send"]),
        (json!({"task": "x", "priority": 1}), "invalid", vec!["priority"]),
        (json!({"task": "x", "attachments": "file.txt"}), "invalid", vec!["attachments"]),
        (
            json!({"task": "x", "thread": true}),
            "forbidden",
            vec!["thread=true is unavailable", "\"webchat\" has no thread-capable deliverer", "nothing was created"],
        ),
        (json!({"task": "x", "thread": true, "mode": "session"}), "forbidden", vec!["thread"]),
        (json!({"task": "x", "mode": "session"}), "invalid", vec!["mode=\"session\" requires thread=true"]),
        // A bad argument is reported even for an agent that is not allowed (arguments first).
        (json!({"task": "x", "agentId": "helper", "thinking": "extreme"}), "invalid", vec!["thinking"]),
        // Allowlist.
        (json!({"task": "x", "agentId": "helper"}), "forbidden", vec!["helper", "agents.list[].subagents.allowAgents"]),
        (json!({"task": "x", "agentId": "stranger"}), "forbidden", vec!["agents.list[].subagents.allowAgents"]),
        // Not allowed and without a runner: the allowlist comes first.
        (json!({"task": "x", "agentId": "lonely"}), "forbidden", vec!["agents.list[].subagents.allowAgents"]),
        // Allowed, but no runner.
        (json!({"task": "x", "agentId": "bare"}), "invalid", vec!["\"bare\"", "has no runner configured"]),
        // Sandbox guard.
        (json!({"task": "x", "sandbox": "require"}), "forbidden", vec!["sandbox", "sandbox.mode"]),
        // Attachments are off by default.
        (
            json!({"task": "x", "attachments": [{"name": "a.txt", "content": "hi"}]}),
            "forbidden",
            vec!["tools.sessions_spawn.attachments.enabled"],
        ),
    ];
    let mut failures = Vec::new();
    for (args, status, needles) in cases {
        failures.extend(refused(&env, &mut c, args, status, &needles, false));
    }
    // Nothing was created: main is alone in the store and no run exists.
    let all = ls(&env);
    let keys: Vec<&str> = all["sessions"].as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["agent:main:main"], "{all}");
    assert_eq!(env.unfinished_runs(), 0);
    c.close();
    assert_no_failures("refusals", failures);
}

/// A world with a depth-1 sub-agent of main that holds a run token.
fn depth_one_world() -> (Value, &'static str, &'static str) {
    let child = "agent:main:subagent:0a1b2c3d-4e5f-4a6b-8c7d-8e9f0a1b2c3d";
    let token = "smcp_run_child";
    (
        json!({"sessions": [{"key": child, "spawnedBy": "agent:main:main", "spawnDepth": 1}],
               "runTokens": [{"token": token, "sessionKey": child, "runId": "r-child"}]}),
        child,
        token,
    )
}

/// Serves as the depth-1 sub-agent under `extra` config and checks one refused spawn.
fn depth_one_refusal(extra: Value) -> Vec<String> {
    let (world, _, token) = depth_one_world();
    let env = env_with(&child_script(), json!({}), extra);
    env.seed(world);
    let mut c = env.serve_with(None, &[("SESSIONS_MCP_TOKEN", token)]);
    let failures = refused(&env, &mut c, json!({"task": "go deeper"}), "forbidden", &["maxSpawnDepth"], false)
        .into_iter()
        .collect();
    c.close();
    failures
}

#[test]
fn a_depth_one_subagent_offered_sessions_spawn_is_refused_by_max_spawn_depth() {
    // sessions_spawn allowed explicitly, so the depth check itself answers.
    let failures = depth_one_refusal(json!({"tools": {"subagents": {"tools": {"allow": ["sessions_spawn"]}}}}));
    assert_no_failures("depth (tool allowed)", failures);
}

#[test]
fn a_depth_one_subagent_with_the_default_tool_set_is_refused_naming_max_spawn_depth() {
    // The default tool set offers a leaf no session tools, so the call is refused before the depth
    // check; the refusal must still name the switch that would allow the spawn (docs/BEHAVIOUR.md,
    // Errors: the message names the setting that would allow it) — maxSpawnDepth, since
    // tools.subagents.tools.allow alone would only lead to the depth refusal.
    let failures = depth_one_refusal(json!({}));
    assert_no_failures("depth (default tool set)", failures);
}

#[test]
fn a_sandboxed_requester_and_an_operator_acting_as_a_driven_session_are_refused() {
    let env = env_with(&child_script(), json!({}), json!({}));
    env.seed(json!({"sessions": [{"key": A}, {"key": "agent:main:boxed"}],
        "runTokens": [{"token": "smcp_run_boxed", "sessionKey": "agent:main:boxed", "runId": "r-boxed", "sandboxed": true}]}));
    let mut failures = Vec::new();
    let mut boxed = env.serve_with(None, &[("SESSIONS_MCP_TOKEN", "smcp_run_boxed")]);
    failures.extend(refused(
        &env,
        &mut boxed,
        json!({"task": "x"}),
        "forbidden",
        &["sandboxed", "sandbox.mode"],
        false,
    ));
    boxed.close();
    let mut as_driven = env.serve(Some(A));
    failures.extend(refused(&env, &mut as_driven, json!({"task": "x"}), "forbidden", &["driven"], false));
    as_driven.close();
    assert_no_failures("who is calling", failures);
}

#[test]
fn max_children_per_agent_refuses_the_next_child_and_leaves_nothing_behind() {
    let script =
        json!({"rules": [{"match": {"mode": "spawn"}, "sleepMs": 20000, "reply": "slow"}], "default": {"reply": "ok"}});
    let env = env_with(&script, json!({"maxChildrenPerAgent": 2}), json!({}));
    let mut c = env.serve(None);
    let first = spawn(&mut c, json!({"task": "one", "label": "alpha"}));
    let second = spawn(&mut c, json!({"task": "two", "label": "beta"}));
    let kids = [child_of(&first), child_of(&second)];
    wait_until(Duration::from_secs(10), "both children running", || {
        kids.iter().all(|k| runs_of(&env.show(k), Some("spawn"))[0]["status"] == "running").then_some(())
    });
    // The refusal names who holds the slots: each child's label, key and state.
    let holders = [format!("alpha ({}, running)", kids[0]), format!("beta ({}, running)", kids[1])];
    let failures: Vec<String> = refused(
        &env,
        &mut c,
        json!({"task": "three"}),
        "forbidden",
        &["maxChildrenPerAgent", "agents.defaults.subagents.maxChildrenPerAgent", &holders[0], &holders[1]],
        true,
    )
    .into_iter()
    .collect();
    let rows: Vec<String> = ls(&env)["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap().to_string())
        .filter(|k| k.starts_with(CHILD_PREFIX))
        .collect();
    assert_eq!(rows.len(), 2, "only the two admitted children exist: {rows:?}");
    let _ = c.terminate_and_wait(Duration::from_secs(15));
    assert_no_failures("maxChildrenPerAgent", failures);
}

#[test]
fn a_full_cap_names_ten_of_its_holders_and_counts_the_rest() {
    let script =
        json!({"rules": [{"match": {"mode": "spawn"}, "sleepMs": 20000, "reply": "slow"}], "default": {"reply": "ok"}});
    let env = env_with(&script, json!({"maxChildrenPerAgent": 12, "maxConcurrent": 1}), json!({}));
    let mut c = env.serve(None);
    let kids: Vec<String> =
        (0..12).map(|i| child_of(&spawn(&mut c, json!({"task": "t", "label": format!("job-{i:02}")})))).collect();
    let r = c.call("sessions_spawn", json!({"task": "one too many"}));
    let err = r["error"].as_str().unwrap_or_default();
    assert_eq!(r["status"], "forbidden", "{r}");
    let named = kids.iter().filter(|k| err.contains(k.as_str())).count();
    assert_eq!(named, 10, "ten holders are named: {err}");
    assert!(err.contains("job-00 (") && err.contains("job-09 (") && !err.contains("job-10"), "the oldest first: {err}");
    assert!(err.ends_with(", and 2 more"), "{err}");
    let _ = c.terminate_and_wait(Duration::from_secs(15));
}

#[test]
fn max_queued_refuses_beyond_the_queue_and_leaves_nothing_behind() {
    let script =
        json!({"rules": [{"match": {"mode": "spawn"}, "sleepMs": 20000, "reply": "slow"}], "default": {"reply": "ok"}});
    let env = env_with(&script, json!({"maxConcurrent": 1, "maxQueued": 1}), json!({}));
    let mut owner = env.serve(Some("agent:main:r1"));
    let first = spawn(&mut owner, json!({"task": "one"}));
    let k1 = child_of(&first);
    wait_until(Duration::from_secs(10), "the first child running", || {
        (runs_of(&env.show(&k1), Some("spawn"))[0]["status"] == "running").then_some(())
    });
    let mut r2 = env.serve(Some("agent:main:r2"));
    let second = spawn(&mut r2, json!({"task": "two", "label": "r2-job"}));
    assert_eq!(second["queued"], true, "the only slot is taken: {second}");
    let k2 = child_of(&second);
    let mut r3 = env.serve(Some("agent:main:r3"));
    let mut failures: Vec<String> = refused(
        &env,
        &mut r3,
        json!({"task": "three"}),
        "forbidden",
        &["maxQueued", "agents.defaults.subagents.maxQueued", "none of them is visible to you"],
        true,
    )
    .into_iter()
    .collect();
    // Under `tree` visibility r3 must not learn of r2's child; r2 is told its own child holds it.
    let r = r3.call("sessions_spawn", json!({"task": "three"}));
    let err = r["error"].as_str().unwrap_or_default();
    if err.contains("r2-job") || err.contains(&k2) || err.contains(&k1) {
        failures.push(format!("a refusal names a session its caller cannot see: {r}"));
    }
    let own = format!("r2-job ({k2}, queued)");
    failures.extend(refused(&env, &mut r2, json!({"task": "four"}), "forbidden", &["maxQueued", &own], true));
    drop(r3);
    drop(r2);
    let _ = owner.terminate_and_wait(Duration::from_secs(15));
    assert_no_failures("maxQueued", failures);
}

// ---- the announce ------------------------------------------------------------------------------

/// With no config (and no agent CLI found) the child runs the built-in echo agent: its Result is
/// the echoed task, a Warning line says no real agent did the work, and its Notes step adds
/// nothing (it used to echo the Notes prompt into every announce).
#[test]
fn a_zero_config_spawn_announces_the_echoed_task_without_notes() {
    let env = TestEnv::new();
    let mut c = env.serve(None);
    let r = spawn(&mut c, json!({"task": "say hi"}));
    let child = child_of(&r);
    let text = text_of(&wait_announce(&mut c, after_seq(&r), &child, 20)["content"]);
    assert!(text.starts_with("Status: completed successfully\nResult: ECHO: say hi\nWarning: no real agent is configured, so the built-in echo agent runs sub-agents here"), "{text}");
    assert!(line(&text, "Notes:").is_none() && !text.contains("Write short notes"), "{text}");
    assert_eq!(text.lines().count(), 4, "Status, Result, Warning, Stats: {text}");
    let show = env.show(&child);
    assert_eq!(runs_of(&show, Some("announce")).len(), 1, "the Notes step still ran: {show}");
}

/// The child's runs carry the sub-agent context as `system` (the spawn wrote it into the run's
/// flow state; until the flow state was typed nothing read it back, and children ran without it).
#[test]
fn the_child_gets_the_sub_agent_context_as_its_system_text() {
    let mut env = TestEnv::new();
    let req_file = env.dir.path().join("requests.jsonl");
    let body = "IFS= read -r line\nprintf '%s\\n' \"$line\" >> \"$1\"\nprintf '%s\\n' '{\"type\":\"final\",\"text\":\"done\"}'\n";
    let main = common::shell_agent(&env, "main", body, &[req_file.to_str().unwrap()], json!({}));
    env.set_config(&config(vec![main], json!({}), json!({})));
    let mut c = env.serve(None);
    let r = spawn(&mut c, json!({"task": "count the files", "label": "counter"}));
    let child = child_of(&r);
    wait_run_ended(&env, &child, "spawn", 20);
    let requests = std::fs::read_to_string(&req_file).unwrap();
    let req: Value = requests
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["mode"] == "spawn")
        .unwrap_or_else(|| panic!("no spawn request in {requests}"));
    let system = req["system"].as_str().unwrap_or_else(|| panic!("no system text: {req}"));
    assert!(system.starts_with("Sub-agent context."), "{system}");
    assert!(system.contains("Label: counter.") && system.contains(&format!("Your session: {child}.")), "{system}");
    assert!(system.contains("Requester session: agent:main:main."), "{system}");
}

#[test]
fn an_external_requester_is_accepted_and_gets_the_announce_in_its_inbox() {
    let env = env_with(&child_script(), json!({}), json!({}));
    let mut c = env.serve(None);
    // Something in main first, so afterSeq is not trivially 0.
    let warmup = spawn(&mut c, json!({"task": "warm up"}));
    wait_announce(&mut c, after_seq(&warmup), &child_of(&warmup), 20);
    env.wait_idle(Duration::from_secs(10));

    let r = spawn(&mut c, json!({"task": "write the report", "label": "report"}));
    let child = child_of(&r);
    assert_eq!(r["mode"], "run", "{r}");
    assert_eq!(r["queued"], false, "{r}");
    assert!(r["runId"].as_str().is_some_and(|s| !s.is_empty()), "{r}");
    let after = after_seq(&r);
    assert!(after >= 1, "main already holds the warm-up announce: {r}");
    let m = wait_announce(&mut c, after, &child, 20);
    env.wait_idle(Duration::from_secs(10));

    let text = text_of(&m["content"]);
    assert!(text.starts_with("Status: completed successfully\nResult: RESULT: write the report\n"), "{text}");
    assert_eq!(line(&text, "Notes: "), Some("Notes: NOTES: all done"), "{text}");
    let stats = line(&text, "Stats: ").unwrap_or_else(|| panic!("a Stats line: {text}"));
    assert!(stats.starts_with("Stats: runtime "), "{stats}");
    let child_show = env.show(&child);
    let session_id = child_show["session"]["sessionId"].as_str().unwrap();
    assert!(stats.contains(&format!("sessionKey {child} ")), "{stats}");
    assert!(stats.contains(&format!("sessionId {session_id}")), "{stats}");
    assert!(stats.contains(&format!("transcript sessions://history/{child}")), "{stats}");
    assert_eq!(text.lines().count(), 4, "Status, Result, Notes, Stats: {text}");
    assert_eq!(m["role"], "user", "{m}");
    assert_eq!(m["provenance"]["sourceTool"], "subagent_announce", "{m}");
    assert_eq!(m["provenance"]["sourceSessionKey"], child.as_str(), "{m}");
    assert_eq!(m["provenance"]["kind"], "inter_session", "{m}");
    let after_msgs = inbox(&mut c, after);
    assert_eq!(after_msgs.len(), 1, "exactly one message after afterSeq: {after_msgs:?}");
    assert_eq!(after_msgs[0]["seq"].as_i64(), Some(after + 1), "{after_msgs:?}");

    // The child: the task (with provenance) started its spawn run; the Notes step ran after it.
    let spawns = runs_of(&child_show, Some("spawn"));
    assert_eq!(spawns.len(), 1, "{spawns:?}");
    assert_eq!(spawns[0]["runId"], r["runId"]);
    assert_eq!(spawns[0]["status"], "ok");
    let notes = runs_of(&child_show, Some("announce"));
    assert_eq!(notes.len(), 1, "one Notes step: {notes:?}");
    assert_eq!(notes[0]["status"], "ok");
    assert!(notes[0]["startedAt"].as_i64() >= spawns[0]["endedAt"].as_i64(), "{notes:?} after {spawns:?}");
    let msgs = child_show["messages"].as_array().unwrap();
    assert_eq!(msgs[0]["role"], "user");
    assert_eq!(text_of(&msgs[0]["content"]), "write the report");
    assert_eq!(msgs[0]["provenance"]["sourceTool"], "sessions_spawn", "{}", msgs[0]);
    assert_eq!(msgs[0]["provenance"]["sourceSessionKey"], "agent:main:main", "{}", msgs[0]);
    assert!(
        msgs.iter().any(|m| m["role"] == "user" && text_of(&m["content"]).starts_with("Your task has ended")),
        "the Notes prompt is in the child: {msgs:?}"
    );
    assert_eq!(child_show["session"]["label"], "report", "{}", child_show["session"]);
    // The ledger: one announce delivered to main's inbox, on the spawn run.
    let d = spawn_deliveries(&env, &child);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!((d[0]["kind"].as_str(), d[0]["status"].as_str()), (Some("announce"), Some("delivered")), "{d:?}");
    // The server never starts a run in an external session.
    assert_eq!(env.show("main")["runs"], json!([]));
    c.close();
}

#[test]
fn without_the_announce_step_there_is_no_notes_line_and_no_notes_run() {
    let env = env_with(&child_script(), json!({"announceStep": false}), json!({}));
    let mut c = env.serve(None);
    let r = spawn(&mut c, json!({"task": "quick job"}));
    let child = child_of(&r);
    let m = wait_announce(&mut c, after_seq(&r), &child, 20);
    env.wait_idle(Duration::from_secs(10));
    let text = text_of(&m["content"]);
    assert!(text.starts_with("Status: completed successfully\nResult: RESULT: quick job\nStats: runtime "), "{text}");
    assert!(line(&text, "Notes:").is_none(), "{text}");
    let show = env.show(&child);
    assert_eq!(runs_of(&show, Some("announce")).len(), 0, "no Notes step: {}", show["runs"]);
    assert!(
        show["messages"].as_array().unwrap().iter().all(|m| !text_of(&m["content"]).starts_with("Your task has ended")),
        "{}",
        show["messages"]
    );
    c.close();
}

#[test]
fn a_driven_requester_gets_a_completion_run() {
    let env = env_with(&child_script(), json!({}), json!({}));
    env.seed(json!({"sessions": [{"key": A}], "runTokens": [{"token": TOKEN_A, "sessionKey": A, "runId": "r-a"}]}));
    let mut c = env.serve_with(None, &[("SESSIONS_MCP_TOKEN", TOKEN_A)]);
    let r = spawn(&mut c, json!({"task": "dig"}));
    let child = child_of(&r);
    assert!(r.get("inbox").is_none(), "a driven requester has no inbox: {r}");
    let note = r["note"].as_str().unwrap();
    assert!(note.contains("next message") && note.contains("do not poll"), "{note}");
    wait_run_ended(&env, A, "completion", 20);
    env.wait_idle(Duration::from_secs(10));
    let show = env.show(A);
    let completions = runs_of(&show, Some("completion"));
    assert_eq!(completions.len(), 1, "{completions:?}");
    assert_eq!(completions[0]["status"], "ok", "{completions:?}");
    let run_id = completions[0]["runId"].as_str().unwrap();
    let input = show["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user" && m["runId"] == run_id)
        .unwrap_or_else(|| panic!("the completion input in {A}: {}", show["messages"]))
        .clone();
    let text = text_of(&input["content"]);
    assert!(text.starts_with("A sub-agent you spawned has finished:"), "{text}");
    assert!(
        text.contains("Status: completed successfully\nResult: RESULT: dig\nNotes: NOTES: all done\nStats: runtime "),
        "{text}"
    );
    assert!(text.contains(&format!("sessionKey {child} ")), "{text}");
    assert_eq!(input["provenance"]["sourceTool"], "subagent_announce", "{input}");
    assert_eq!(input["provenance"]["sourceSessionKey"], child.as_str(), "{input}");
    let replies: Vec<String> = show["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "assistant" && m["runId"] == run_id)
        .map(|m| text_of(&m["content"]))
        .collect();
    assert_eq!(replies, ["noted the completion"]);
    let d = spawn_deliveries(&env, &child);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0]["kind"], "completion", "{d:?}");
    c.close();
}

#[test]
fn an_empty_reply_announces_the_last_tool_result() {
    let script = json!({"rules": [
        {"match": {"mode": "spawn"}, "toolCalls": [
            {"name": "search", "arguments": {"q": "a"}, "result": "first tool output"},
            {"name": "search", "arguments": {"q": "b"}, "result": "the answer is 42"}
        ], "reply": ""},
        {"match": {"mode": "announce"}, "reply": "NOTES: used tools"}
    ], "default": {"reply": "?"}});
    let env = env_with(&script, json!({}), json!({}));
    let mut c = env.serve(None);
    let r = spawn(&mut c, json!({"task": "use tools"}));
    let child = child_of(&r);
    let m = wait_announce(&mut c, after_seq(&r), &child, 20);
    let text = text_of(&m["content"]);
    assert_eq!(line(&text, "Result: "), Some("Result: the answer is 42"), "{text}");
    assert!(text.starts_with("Status: completed successfully\n"), "{text}");
    c.close();
}

#[test]
fn announce_skip_as_the_final_reply_announces_nothing() {
    let script = json!({"rules": [
        {"match": {"mode": "spawn"}, "reply": "ANNOUNCE_SKIP"},
        {"match": {"mode": "announce"}, "reply": "NOTES: should never run"}
    ], "default": {"reply": "?"}});
    let env = env_with(&script, json!({}), json!({}));
    let mut c = env.serve(None);
    let r = spawn(&mut c, json!({"task": "stay quiet"}));
    let child = child_of(&r);
    let after = after_seq(&r);
    wait_run_ended(&env, &child, "spawn", 20);
    env.wait_idle(Duration::from_secs(10));
    // Give a late announce a chance to show up before asserting there is none.
    std::thread::sleep(Duration::from_millis(500));
    env.wait_idle(Duration::from_secs(10));
    assert_eq!(inbox(&mut c, after), Vec::<Value>::new(), "nothing announced");
    let show = env.show(&child);
    assert_eq!(runs_of(&show, Some("spawn"))[0]["status"], "ok");
    assert_eq!(runs_of(&show, Some("announce")).len(), 0, "no Notes step: {}", show["runs"]);
    assert_eq!(spawn_deliveries(&env, &child), Vec::<Value>::new(), "no delivery in the ledger");
    c.close();
}

#[test]
fn a_notes_step_answering_announce_skip_announces_without_notes() {
    let script = json!({"rules": [
        {"match": {"mode": "spawn"}, "reply": "the work is done"},
        {"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"}
    ], "default": {"reply": "?"}});
    let env = env_with(&script, json!({}), json!({}));
    let mut c = env.serve(None);
    let r = spawn(&mut c, json!({"task": "work"}));
    let child = child_of(&r);
    let m = wait_announce(&mut c, after_seq(&r), &child, 20);
    let text = text_of(&m["content"]);
    assert!(text.starts_with("Status: completed successfully\nResult: the work is done\nStats: runtime "), "{text}");
    assert!(line(&text, "Notes:").is_none(), "{text}");
    assert!(!text.contains("ANNOUNCE_SKIP"), "{text}");
    env.wait_idle(Duration::from_secs(10));
    assert_eq!(runs_of(&env.show(&child), Some("announce")).len(), 1, "the Notes step ran");
    c.close();
}

#[test]
fn a_child_past_its_run_timeout_is_announced_as_timed_out() {
    let script = json!({"rules": [
        {"match": {"mode": "spawn"}, "sleepMs": 8000, "reply": "too late"},
        {"match": {"mode": "announce"}, "reply": "NOTES: should not run"}
    ], "default": {"reply": "?"}});
    let env = env_with(&script, json!({}), json!({}));
    let mut c = env.serve(None);
    let started = Instant::now();
    let r = spawn(&mut c, json!({"task": "sleep a lot", "runTimeoutSeconds": 1}));
    let child = child_of(&r);
    let m = wait_announce(&mut c, after_seq(&r), &child, 20);
    assert!(started.elapsed() < Duration::from_secs(7), "the run was stopped at its timeout, not its end");
    let text = text_of(&m["content"]);
    assert!(text.starts_with("Status: timed out\nResult: "), "{text}");
    assert!(line(&text, "Notes:").is_none(), "Notes only after success: {text}");
    assert!(!text.contains("too late"), "{text}");
    env.wait_idle(Duration::from_secs(10));
    let show = env.show(&child);
    assert_eq!(runs_of(&show, Some("spawn"))[0]["status"], "timeout", "{}", show["runs"]);
    assert_eq!(runs_of(&show, Some("announce")).len(), 0, "{}", show["runs"]);
    let d = spawn_deliveries(&env, &child);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0]["status"], "delivered", "{d:?}");
    c.close();
}

#[test]
fn a_failing_child_is_announced_as_failed() {
    let script = json!({"rules": [
        {"match": {"mode": "spawn"}, "error": {"code": "tool_error", "message": "the tool exploded"}},
        {"match": {"mode": "announce"}, "reply": "NOTES: should not run"}
    ], "default": {"reply": "?"}});
    let env = env_with(&script, json!({}), json!({}));
    let mut c = env.serve(None);
    let r = spawn(&mut c, json!({"task": "explode"}));
    let child = child_of(&r);
    let m = wait_announce(&mut c, after_seq(&r), &child, 20);
    let text = text_of(&m["content"]);
    let status = line(&text, "Status: ").unwrap();
    assert!(status.starts_with("Status: failed: "), "{text}");
    assert!(status.contains("the tool exploded"), "the error is named: {text}");
    assert!(line(&text, "Notes:").is_none(), "{text}");
    env.wait_idle(Duration::from_secs(10));
    let show = env.show(&child);
    assert_eq!(runs_of(&show, Some("spawn"))[0]["status"], "error", "{}", show["runs"]);
    assert_eq!(runs_of(&show, Some("announce")).len(), 0, "{}", show["runs"]);
    c.close();
}

// ---- admission under concurrency ----------------------------------------------------------------

/// One spawn attempt of the cap test.
struct Attempt {
    accepted: Option<String>,
    error: String,
}

#[test]
fn fifty_concurrent_spawns_from_one_requester_never_exceed_max_children_per_agent() {
    let (iterations, budget) = cap_iterations();
    let script =
        json!({"rules": [{"match": {"mode": "spawn"}, "sleepMs": 2000, "reply": "slept"}], "default": {"reply": "ok"}});
    // The agent's runner may run all five children at once (its default maxConcurrent is 4).
    let mut env = TestEnv::new();
    let main = scripted_agent(&env, "main", &script, json!({"maxConcurrent": 8}));
    env.set_config(&config(vec![main], json!({"maxChildrenPerAgent": 5, "announceStep": false}), json!({})));
    let mut clients: Vec<Client> = (0..4).map(|_| env.serve(None)).collect();
    let started = Instant::now();
    let mut all_children = Vec::new();
    for iteration in 0..iterations {
        let mut handles = Vec::new();
        for (i, mut c) in clients.drain(..).enumerate() {
            let calls = if i < 2 { 13 } else { 12 };
            handles.push(std::thread::spawn(move || {
                let mut out = Vec::new();
                for n in 0..calls {
                    let r = c.call("sessions_spawn", json!({"task": format!("job {iteration}.{i}.{n}")}));
                    out.push(Attempt {
                        accepted: (r["status"] == "accepted")
                            .then(|| r["childSessionKey"].as_str().unwrap().to_string()),
                        error: if r["status"] == "accepted" { String::new() } else { format!("{r}") },
                    });
                }
                (c, out)
            }));
        }
        let mut attempts = Vec::new();
        for h in handles {
            let (c, out) = h.join().expect("a caller thread panicked");
            clients.push(c);
            attempts.extend(out);
        }
        let last_answer = now_ms();
        assert_eq!(attempts.len(), 50);
        for a in attempts.iter().filter(|a| a.accepted.is_none()) {
            assert!(
                a.error.contains("\"forbidden\"") && a.error.contains("maxChildrenPerAgent"),
                "iteration {iteration}: a refusal names the cap: {}",
                a.error
            );
        }
        let children: Vec<String> = attempts.iter().filter_map(|a| a.accepted.clone()).collect();
        // Wait for this round's children to finish before the next round.
        let shows: Vec<Value> = children.iter().map(|k| wait_run_ended(&env, k, "spawn", 30)).collect();
        let spawn_runs: Vec<Value> = shows.iter().flat_map(|s| runs_of(s, Some("spawn"))).collect();
        let done_before_last = spawn_runs.iter().filter(|r| r["endedAt"].as_i64().unwrap() < last_answer).count();
        assert!(
            children.len() >= 5 && children.len() <= 5 + done_before_last,
            "iteration {iteration}: {} accepted while {done_before_last} children had ended (cap 5)",
            children.len()
        );
        let overlap = max_overlap(&spawn_runs);
        assert!(overlap <= 5, "iteration {iteration}: {overlap} child runs overlapped (cap 5)");
        all_children.extend(children);
        if started.elapsed() > budget && iteration + 1 < iterations {
            eprintln!("stopping after {} iterations: the time budget is spent", iteration + 1);
            break;
        }
    }
    let unique: HashSet<&String> = all_children.iter().collect();
    assert_eq!(unique.len(), all_children.len(), "child keys are unique");
    eprintln!("{} iterations in {:?}", all_children.len() / 5, started.elapsed());
    env.wait_idle(Duration::from_secs(20));
}

/// 20 iterations in the default tier; `.ci/run --extended` sets `SPAWN_CAP_ITERATIONS=500` (and
/// the time budget is lifted).
fn cap_iterations() -> (usize, Duration) {
    let iterations: usize = std::env::var("SPAWN_CAP_ITERATIONS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    (iterations, Duration::from_secs(if iterations > 20 { 3600 } else { 90 }))
}

#[test]
fn fifty_spawns_from_ten_requesters_never_run_more_than_max_concurrent() {
    let (iterations, budget) = cap_iterations();
    let script = json!({"rules": [{"match": {"mode": "spawn"}, "sleepMs": 100, "reply": "done: {input}"}], "default": {"reply": "ok"}});
    let env = env_with(&script, json!({"maxConcurrent": 3, "announceStep": false}), json!({}));
    let requesters: Vec<String> = (1..=10).map(|i| format!("agent:main:r{i}")).collect();
    let mut clients: Vec<Client> = requesters.iter().map(|k| env.serve(Some(k))).collect();
    let started = Instant::now();
    let (mut queued_total, mut widest, mut runs_total) = (0, 0, 0);
    for iteration in 0..iterations {
        let handles: Vec<_> = clients
            .drain(..)
            .enumerate()
            .map(|(i, mut c)| {
                std::thread::spawn(move || {
                    let results: Vec<Value> = (0..5)
                        .map(|n| c.call("sessions_spawn", json!({"task": format!("task {iteration}.{i}.{n}")})))
                        .collect();
                    (c, results)
                })
            })
            .collect();
        let mut results = Vec::new();
        for h in handles {
            let (c, r) = h.join().expect("a caller thread panicked");
            clients.push(c);
            results.push(r);
        }
        for r in results.iter().flatten() {
            assert_eq!(r["status"], "accepted", "iteration {iteration}: {r}");
        }
        queued_total += results.iter().flatten().filter(|r| r["queued"] == true).count();
        // Every requester gets its five announces, all successful: nothing queued is lost.
        for (i, c) in clients.iter_mut().enumerate() {
            let after = results[i][0]["inbox"]["afterSeq"].as_i64().unwrap();
            assert_eq!(results[i][0]["inbox"]["sessionKey"], requesters[i].as_str(), "{}", results[i][0]);
            let got = wait_until(Duration::from_secs(60), &format!("the announces for {}", requesters[i]), || {
                let a = announces_of(c, &requesters[i], after);
                (a.len() >= 5).then_some(a)
            });
            for k in results[i].iter().map(child_of) {
                let m = got
                    .iter()
                    .find(|m| text_of(&m["content"]).contains(&format!("sessionKey {k} ")))
                    .unwrap_or_else(|| panic!("iteration {iteration}, {}: no announce for {k}", requesters[i]));
                assert!(text_of(&m["content"]).starts_with("Status: completed successfully\n"), "{m}");
            }
        }
        let spawn_runs: Vec<Value> =
            results.iter().flatten().flat_map(|r| runs_of(&env.show(&child_of(r)), Some("spawn"))).collect();
        assert_eq!(spawn_runs.len(), 50);
        assert!(spawn_runs.iter().all(|r| r["status"] == "ok"), "{spawn_runs:?}");
        let overlap = max_overlap(&spawn_runs);
        assert!(overlap <= 3, "iteration {iteration}: {overlap} spawn runs overlapped (maxConcurrent 3)");
        widest = widest.max(overlap);
        runs_total += spawn_runs.len();
        if started.elapsed() > budget && iteration + 1 < iterations {
            eprintln!("stopping after {} iterations: the time budget is spent", iteration + 1);
            break;
        }
    }
    assert!(queued_total > 0, "with 50 children and 3 slots some are answered queued: true");
    assert!(widest >= 2, "the slots were used in parallel ({widest})");
    eprintln!(
        "{} iterations, {runs_total} spawn runs in {:?}: {queued_total} answered queued: true; max overlap {widest} (cap 3)",
        runs_total / 50,
        started.elapsed()
    );
}

#[test]
fn a_child_that_must_wait_for_a_slot_is_answered_queued() {
    let script =
        json!({"rules": [{"match": {"mode": "spawn"}, "sleepMs": 3000, "reply": "done"}], "default": {"reply": "ok"}});
    let env = env_with(&script, json!({"maxConcurrent": 1, "announceStep": false}), json!({}));
    let mut c = env.serve(None);
    // Both calls at once: whatever the first child's state (queued or running), it holds the only
    // slot, so the second cannot start now.
    let id1 = c.start_call("sessions_spawn", json!({"task": "first"}));
    let id2 = c.start_call("sessions_spawn", json!({"task": "second"}));
    let r1 = c.finish_call("sessions_spawn", id1);
    let r2 = c.finish_call("sessions_spawn", id2);
    assert_eq!((r1["status"].as_str(), r2["status"].as_str()), (Some("accepted"), Some("accepted")), "{r1} {r2}");
    let queued = [r1["queued"].as_bool().unwrap(), r2["queued"].as_bool().unwrap()];
    assert_eq!(queued.iter().filter(|q| **q).count(), 1, "exactly one of the two waits for the slot: {r1} {r2}");
    let _ = c.terminate_and_wait(Duration::from_secs(15));
}

// ---- idempotency ---------------------------------------------------------------------------------

#[test]
fn an_idempotent_replay_returns_the_first_spawn_and_creates_nothing() {
    let env = env_with(&child_script(), json!({}), json!({}));
    let mut c = env.serve(None);
    let args = json!({"task": "only once", "idempotencyKey": "spawn-k1"});
    let first = spawn(&mut c, args.clone());
    let child = child_of(&first);
    let again = spawn(&mut c, args.clone());
    assert_eq!(again["runId"], first["runId"], "{again}");
    assert_eq!(again["childSessionKey"], first["childSessionKey"], "{again}");
    let after = after_seq(&first);
    wait_announce(&mut c, after, &child, 20);
    env.wait_idle(Duration::from_secs(10));

    let before = env.fingerprint();
    let later = spawn(&mut c, args.clone());
    assert_eq!(later["runId"], first["runId"], "{later}");
    assert_eq!(later["childSessionKey"], first["childSessionKey"], "{later}");
    assert_eq!(env.fingerprint(), before, "a replay creates nothing");

    let mut other = args.clone();
    other["task"] = json!("something else");
    let bad = c.call("sessions_spawn", other);
    assert_eq!(bad["status"], "invalid", "{bad}");
    assert!(bad["error"].as_str().unwrap().contains("idempotencyKey"), "{bad}");
    assert_eq!(env.fingerprint(), before, "a mismatched key creates nothing");

    let children: Vec<Value> = ls(&env)["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["key"].as_str().unwrap().starts_with(CHILD_PREFIX))
        .cloned()
        .collect();
    assert_eq!(children.len(), 1, "one child: {children:?}");
    assert_eq!(runs_of(&env.show(&child), Some("spawn")).len(), 1);
    assert_eq!(announces(&mut c, after).len(), 1, "one announce");
    c.close();
}

// ---- depth ------------------------------------------------------------------------------------

#[test]
fn with_max_spawn_depth_two_a_child_spawns_a_grandchild_cannot_and_the_orchestrator_waits() {
    let script = json!({"rules": [
        {"match": {"mode": "spawn", "input": "orchestrate"},
         "call": {"tool": "sessions_spawn", "arguments": {"task": "leaf work"}},
         "reply": "orchestrator spawned: {result}"},
        {"match": {"mode": "spawn", "input": "leaf work"},
         "call": {"tool": "sessions_spawn", "arguments": {"task": "even deeper"}},
         "sleepMs": 500,
         "reply": "leaf done"},
        {"match": {"mode": "completion"}, "reply": "orchestrator read the completion"},
        {"match": {"mode": "announce"}, "reply": "NOTES: tree done"}
    ], "default": {"reply": "?"}});
    let env = env_with(&script, json!({"maxSpawnDepth": 2}), json!({}));
    let mut c = env.serve(None);
    let r = spawn(&mut c, json!({"task": "orchestrate"}));
    let child = child_of(&r);
    let after = after_seq(&r);
    let m = wait_announce(&mut c, after, &child, 30);
    env.wait_idle(Duration::from_secs(15));

    // The child's spawn was accepted (with the driven note); the grandchild's was forbidden.
    let child_show = env.show(&child);
    let results = tool_results(&child_show);
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0]["status"], "accepted", "{results:?}");
    let note = results[0]["note"].as_str().unwrap_or("");
    assert!(note.contains("next message"), "a driven requester's note: {note}");
    let grandchild = results[0]["childSessionKey"].as_str().unwrap().to_string();
    assert!(grandchild.starts_with(CHILD_PREFIX), "{grandchild}");
    let gc_show = env.show(&grandchild);
    let gc_results = tool_results(&gc_show);
    assert_eq!(gc_results.len(), 1, "{gc_results:?}");
    assert_eq!(gc_results[0]["status"], "forbidden", "a grandchild at the leaf depth cannot spawn: {gc_results:?}");
    assert!(
        !ls(&env)["sessions"].as_array().unwrap().iter().any(|r| {
            let k = r["key"].as_str().unwrap();
            k.starts_with(CHILD_PREFIX) && k != child && k != grandchild
        }),
        "no third-level child"
    );

    // The grandchild announced to the child (a completion run there), and only then did the
    // child's Notes step run and its announce reach main.
    let gc_spawn = runs_of(&gc_show, Some("spawn"));
    assert_eq!(gc_spawn[0]["status"], "ok");
    assert_eq!(spawn_deliveries(&env, &grandchild)[0]["kind"], "completion");
    let completions = runs_of(&child_show, Some("completion"));
    assert_eq!(completions.len(), 1, "{}", child_show["runs"]);
    let completion_input = child_show["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["runId"] == completions[0]["runId"] && m["role"] == "user")
        .map(|m| text_of(&m["content"]))
        .unwrap_or_default();
    assert!(completion_input.starts_with("A sub-agent you spawned has finished:"), "{completion_input}");
    assert!(completion_input.contains(&format!("sessionKey {grandchild} ")), "{completion_input}");
    let notes = runs_of(&child_show, Some("announce"));
    assert_eq!(notes.len(), 1, "one Notes step in the orchestrator: {}", child_show["runs"]);
    let completion_end = completions[0]["endedAt"].as_i64().unwrap();
    assert!(
        notes[0]["startedAt"].as_i64().unwrap() >= completion_end,
        "Notes after the completion: {}",
        child_show["runs"]
    );
    assert!(
        m["timestamp"].as_i64().unwrap_or(0) >= completion_end,
        "the orchestrator announced after its child completed: {m} vs {completion_end}"
    );
    assert!(
        gc_spawn[0]["endedAt"].as_i64().unwrap() <= m["timestamp"].as_i64().unwrap_or(0),
        "the announce to main came after the grandchild ended"
    );
    let text = text_of(&m["content"]);
    // The orchestrator's Result is its last reply, written after it read its child's (issue 34).
    assert!(text.starts_with("Status: completed successfully\nResult: orchestrator read the completion\n"), "{text}");
    assert_eq!(line(&text, "Notes: "), Some("Notes: NOTES: tree done"), "{text}");
    // main hears only of its own child.
    let all = announces(&mut c, after);
    assert_eq!(all.len(), 1, "{all:?}");
    c.close();
}

// ---- cleanup and archive ------------------------------------------------------------------------

#[test]
fn cleanup_delete_removes_the_child_after_the_announce() {
    let script = json!({"rules": [
        {"match": {"mode": "spawn"}, "sleepMs": 700, "reply": "RESULT: {input}"},
        {"match": {"mode": "announce"}, "reply": "NOTES: gone soon"}
    ], "default": {"reply": "?"}});
    let env = env_with(&script, json!({}), json!({}));
    let mut c = env.serve(None);
    let r = spawn(&mut c, json!({"task": "ephemeral", "cleanup": "delete"}));
    let child = child_of(&r);
    assert!(listed(&mut c, false).contains(&child), "listed while it runs");
    let m = wait_announce(&mut c, after_seq(&r), &child, 20);
    assert!(text_of(&m["content"]).starts_with("Status: completed successfully\nResult: RESULT: ephemeral\n"));
    env.wait_idle(Duration::from_secs(10));
    assert!(!listed(&mut c, false).contains(&child), "gone from sessions_list");
    assert!(!listed(&mut c, true).contains(&child), "gone even with includeArchived");
    assert!(ls_row(&env, &child).is_none(), "gone from ls: {:?}", ls_row(&env, &child));
    // Its requester may still read its history for a while (docs/BEHAVIOUR.md, Visibility).
    let h = c.call("sessions_history", json!({"sessionKey": child}));
    assert_eq!(h["status"], "ok", "{h}");
    c.close();
}

fn archive_env() -> TestEnv {
    env_with(&child_script(), json!({"archiveAfterMinutes": 0.02, "sweepIntervalSeconds": 1}), json!({}))
}

#[test]
fn cleanup_keep_archives_the_child_after_archive_after_minutes() {
    let env = archive_env();
    let mut c = env.serve(None);
    let r = spawn(&mut c, json!({"task": "keep me", "cleanup": "keep"}));
    let child = child_of(&r);
    wait_announce(&mut c, after_seq(&r), &child, 20);
    let announced = Instant::now();
    assert!(listed(&mut c, false).contains(&child), "listed right after the announce");
    wait_until(Duration::from_secs(10), "the child to be archived", || {
        (!listed(&mut c, false).contains(&child)).then_some(())
    });
    assert!(announced.elapsed() >= Duration::from_millis(1000), "not archived before archiveAfterMinutes");
    assert!(listed(&mut c, true).contains(&child), "includeArchived shows it");
    assert_eq!(ls_row(&env, &child).expect("still in ls")["archived"], true);
    let h = c.call("sessions_history", json!({"sessionKey": child}));
    assert_eq!(h["status"], "ok", "history of an archived child still works: {h}");
    c.close();
}

#[test]
fn cleanup_keep_archives_the_child_also_after_the_owner_restarted() {
    let env = archive_env();
    let mut first = env.serve(None);
    let r = spawn(&mut first, json!({"task": "outlive your owner"}));
    let child = child_of(&r);
    let after = after_seq(&r);
    // The client leaves at once; the owner drains (runs the child, announces) and exits.
    first.close_stdin();
    let status = first.wait_exit(Duration::from_secs(20)).expect("the first owner exits after draining");
    assert!(status.success(), "{status}");
    let row = ls_row(&env, &child).expect("the child exists");
    assert_eq!(row["archived"], false, "not archived yet when the first owner left: {row}");
    // A new owner's sweep archives it.
    let mut second = env.serve(None);
    let m = wait_announce(&mut second, after, &child, 5);
    assert!(text_of(&m["content"]).starts_with("Status: completed successfully\n"));
    wait_until(Duration::from_secs(10), "the child to be archived by the new owner", || {
        (!listed(&mut second, false).contains(&child)).then_some(())
    });
    assert!(listed(&mut second, true).contains(&child));
    assert_eq!(ls_row(&env, &child).unwrap()["archived"], true);
    second.close();
}
