//! OpenClaw import and export, and the operator CLI (ls, show, policy, prune, doctor), black-box.

use crate::common;

use std::path::{Path, PathBuf};

use common::TestEnv;
use serde_json::{Value, json};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/openclaw-state")
}

fn ok_stdout(out: std::process::Output) -> String {
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn import(env: &TestEnv, dir: &Path) -> Value {
    serde_json::from_str(&ok_stdout(env.run(&["import", dir.to_str().unwrap(), "--json"]))).unwrap()
}

fn json_of(env: &TestEnv, args: &[&str]) -> Value {
    serde_json::from_str(&ok_stdout(env.run(args))).unwrap()
}

fn dump(env: &TestEnv) -> String {
    ok_stdout(env.run(&["dev", "dump"]))
}

/// What the fixture's transcript files hold: message lines per file, by role.
fn fixture_counts() -> (usize, std::collections::BTreeMap<String, usize>) {
    let mut total = 0;
    let mut roles = std::collections::BTreeMap::new();
    for agent in ["main", "ops"] {
        let dir = fixture().join("agents").join(agent).join("sessions");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "jsonl") {
                continue; // sessions.json and *.deleted.* are not transcripts
            }
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let v: Value = serde_json::from_str(line).unwrap();
                if v["type"] == "message" {
                    total += 1;
                    *roles.entry(v["message"]["role"].as_str().unwrap().to_string()).or_default() += 1;
                }
            }
        }
    }
    (total, roles)
}

#[test]
fn fixture_imports_with_its_sessions_messages_and_provenance() {
    let env = TestEnv::new();
    let report = import(&env, &fixture());
    let (total, roles) = fixture_counts();
    assert_eq!(report["sessionsSeen"], 5);
    assert_eq!(report["sessionsCreated"], 5);
    assert_eq!(report["messagesImported"], total);
    let notes: Vec<&str> = report["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains(".deleted.") && notes[0].contains("deleted transcript"));

    let ls = json_of(&env, &["ls", "--json"]);
    let rows = ls["sessions"].as_array().unwrap();
    let keys: Vec<&str> = rows.iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!(keys.len(), 5);
    for k in ["agent:main:main", "agent:main:discord:group:dev", "agent:main:hook:abc", "agent:ops:main"] {
        assert!(keys.contains(&k), "{k} in {keys:?}");
    }
    let dev = rows.iter().find(|r| r["key"] == "agent:main:discord:group:dev").unwrap();
    assert_eq!(dev["channel"], "discord", "the key's channel wins over the stored webchat stamp");
    assert_eq!(dev["kind"], "group");
    assert_eq!(dev["driver"], "driven");
    let hook = rows.iter().find(|r| r["key"] == "agent:main:hook:abc").unwrap();
    assert_eq!(hook["kind"], "hook");
    let child = rows.iter().find(|r| r["label"] == "calc").unwrap();
    assert_eq!(child["totalTokens"], 1200);
    assert_eq!(
        ls["runs"],
        json!({"queued": 0, "running": 0, "ok": 0, "error": 0, "timeout": 0, "cancelled": 0, "interrupted": 0})
    );

    let mut by_role = std::collections::BTreeMap::new();
    for key in &keys {
        let show = json_of(&env, &["show", key, "--json"]);
        for m in show["messages"].as_array().unwrap() {
            *by_role.entry(m["role"].as_str().unwrap().to_string()).or_insert(0usize) += 1;
            if m["role"] == "user" {
                let text = m["content"][0]["text"].as_str().unwrap();
                assert!(!text.starts_with("[Mon 2026-11-30"), "gateway stamp stripped: {text}");
                assert!(m.get("imported").is_none(), "raw text is never shown");
            }
            if m["role"] == "assistant" {
                assert_eq!(m["usage"]["totalTokens"], 1234, "usage kept");
                assert_eq!(m["model"], "fake-1");
            }
        }
    }
    assert_eq!(by_role, roles);
    let main = json_of(&env, &["show", "agent:main:main", "--json"]);
    let first = &main["messages"][0];
    assert_eq!(
        first["provenance"],
        json!({"kind": "inter_session", "sourceSessionKey": "agent:main:discord:group:dev",
        "sourceChannel": "discord", "sourceTool": "sessions_send"})
    );
    assert_eq!(
        first["content"][0]["text"], "ECHO: [Mon 2026-11-30 03:36 UTC] hello group",
        "only the leading stamp goes"
    );
    assert_eq!(main["messages"][1]["silent"], true, "REPLY_SKIP is stored silent");
    let sub = json_of(&env, &["show", "agent:main:subagent:fc5c88b6-006b-47d4-9c54-c84216083b12", "--json"]);
    assert_eq!(sub["session"]["label"], "calc");
    assert_eq!(sub["session"]["channel"], "internal");
}

#[test]
fn a_second_import_changes_nothing() {
    let env = TestEnv::new();
    import(&env, &fixture());
    let before = env.fingerprint();
    let again = import(&env, &fixture());
    assert_eq!(again["sessionsCreated"], 0);
    assert_eq!(again["messagesImported"], 0);
    assert_eq!(again["messagesAlreadyPresent"], fixture_counts().0);
    assert_eq!(env.fingerprint(), before);
}

#[test]
fn send_policy_of_the_imported_discord_group() {
    let mut env = TestEnv::new();
    import(&env, &fixture());
    env.set_config(
        "{session: {sendPolicy: {rules: [{action: 'deny', match: {channel: 'discord', chatType: 'group'}}]}}}",
    );
    let show = json_of(&env, &["show", "agent:main:discord:group:dev", "--json"]);
    assert_eq!(show["sendPolicyEffective"], json!({"action": "deny", "rule": 0, "source": "rule"}));
    let main = json_of(&env, &["show", "agent:main:main", "--json"]);
    assert_eq!(main["sendPolicyEffective"], json!({"action": "allow", "rule": null, "source": "default"}));
    // The operator's override wins, and inherit clears it.
    ok_stdout(env.run(&["policy", "agent:main:discord:group:dev", "on"]));
    let show = json_of(&env, &["show", "discord:group:dev", "--json"]);
    assert_eq!(show["sendPolicyEffective"], json!({"action": "allow", "rule": null, "source": "override"}));
    assert_eq!(show["session"]["sendPolicy"], "allow");
    ok_stdout(env.run(&["policy", "f102265c-6bbe-4e11-a223-4cc29e848949", "inherit"]));
    let show = json_of(&env, &["show", "agent:main:discord:group:dev", "--json"]);
    assert_eq!(show["sendPolicyEffective"]["source"], "rule");
    let bad = env.run(&["policy", "agent:main:main", "sometimes"]);
    assert_eq!(bad.status.code(), Some(2));
    let missing = env.run(&["policy", "agent:main:nope", "off"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no session"));
}

#[test]
fn imported_sessions_read_through_the_tools() {
    let env = TestEnv::with_config("{tools: {sessions: {visibility: 'agent'}}}");
    import(&env, &fixture());
    let mut c = env.serve(None);
    let h = c.call("sessions_history", json!({"sessionKey": "main"}));
    let msgs = h["messages"].as_array().unwrap();
    assert!(msgs.iter().all(|m| m["role"] != "assistant" || m["content"][0]["text"] != "REPLY_SKIP"), "silent hidden");
    let all = c.call("sessions_history", json!({"sessionKey": "main", "includeTools": true}));
    assert!(all["messages"].as_array().unwrap().len() > msgs.len());
    let l = c.call("sessions_list", json!({"kinds": ["group"]}));
    assert_eq!(l["sessions"][0]["channel"], "discord");
    assert!(l["sessions"][0].get("transcriptPath").is_none());
    c.close();
    ok_stdout(env.run(&["export"]));
    let mut c = env.serve(None);
    let l = c.call("sessions_list", json!({"kinds": ["group"]}));
    let path = l["sessions"][0]["transcriptPath"].as_str().expect("transcriptPath once exported");
    assert!(Path::new(path).is_file() && path.ends_with("f102265c-6bbe-4e11-a223-4cc29e848949.jsonl"));
}

fn round_trip(source: &TestEnv) {
    let report = json_of(source, &["export", "--json"]);
    assert_eq!(report["refused"], json!([]));
    let export_dir = source.state_dir().join("export");
    let fresh = TestEnv::new();
    let imported = import(&fresh, &export_dir);
    assert_eq!(imported["notes"], json!([]), "a clean export imports without notes");
    assert_eq!(imported["sessionsCreated"], report["sessions"]);
    assert_eq!(imported["messagesImported"], report["messages"]);
    let (a, b) = (dump(source), dump(&fresh));
    assert_eq!(a.lines().count(), b.lines().count());
    for (x, y) in a.lines().zip(b.lines()) {
        assert_eq!(x, y);
    }
}

#[test]
fn round_trip_of_the_fixture() {
    let env = TestEnv::new();
    import(&env, &fixture());
    round_trip(&env);
}

#[test]
fn round_trip_of_ten_thousand_sessions() {
    let env = TestEnv::new();
    env.seed_generated(&["--sessions", "10000", "--messages", "30000"]);
    env.seed(json!({"sessions": [
        {"key": "agent:main:main", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image", "data": "QUJD", "mimeType": "image/png"}],
             "provenance": {"kind": "external_user"}},
            {"role": "assistant", "content": [{"type": "toolCall", "id": "c1", "name": "bash", "arguments": {"cmd": "ls"}}],
             "usage": {"input": 3, "output": 4}, "model": "m1", "stopReason": "toolUse"},
            {"role": "toolResult", "content": [{"type": "text", "text": "a.txt"}], "toolCallId": "c1", "toolName": "bash", "isError": false},
            {"role": "system", "content": [{"type": "text", "text": "Compaction summary"}]},
            {"role": "assistant", "content": "NO_REPLY", "silent": true}
        ]},
        {"key": "agent:ops:telegram:direct:42", "chatType": "direct", "label": "tg", "lastTo": "42", "lastChannel": "telegram",
         "deliveryContext": {"channel": "telegram", "to": "42"}, "sendPolicy": "deny"},
        {"key": "agent:main:subagent:44444444-4444-4444-8444-444444444444", "spawnedBy": "agent:main:main", "label": "kid"}
    ]}));
    round_trip(&env);
}

#[test]
fn export_never_overwrites_a_file_it_did_not_write() {
    let env = TestEnv::new();
    import(&env, &fixture());
    let foreign = env.state_dir().join("export/agents/ops/sessions/sessions.json");
    std::fs::create_dir_all(foreign.parent().unwrap()).unwrap();
    std::fs::write(&foreign, "{\"mine\": true}").unwrap();
    let report = json_of(&env, &["export", "--json"]);
    assert_eq!(report["refused"].as_array().unwrap().len(), 1);
    assert_eq!(std::fs::read_to_string(&foreign).unwrap(), "{\"mine\": true}");
    // Its own files are rewritten freely; a file edited since is not.
    let report = json_of(&env, &["export", "--json"]);
    assert_eq!(report["refused"].as_array().unwrap().len(), 1);
    let ours = env.state_dir().join("export/agents/main/sessions/sessions.json");
    std::fs::write(&ours, "{}").unwrap();
    let report = json_of(&env, &["export", "--json"]);
    assert_eq!(report["refused"].as_array().unwrap().len(), 2);
    assert_eq!(std::fs::read_to_string(&ours).unwrap(), "{}");
}

#[test]
fn bad_stores_get_a_report_line_each_and_the_rest_imports() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let copy = |from: &Path, to: &Path| {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap();
    };
    let src = fixture().join("agents/main/sessions");
    let main = root.join("agents/main/sessions");
    for f in ["eaa8e48e-8c72-47a9-a593-cc38f3007e58.jsonl", "f102265c-6bbe-4e11-a223-4cc29e848949.jsonl"] {
        copy(&src.join(f), &main.join(f));
    }
    // A truncated last line.
    let hook = std::fs::read_to_string(src.join("eddabc65-3e99-40d4-8cb1-742e2baacba6.jsonl")).unwrap();
    std::fs::write(main.join("eddabc65-3e99-40d4-8cb1-742e2baacba6.jsonl"), &hook[..hook.len() - 40]).unwrap();
    let mut index: Value = serde_json::from_str(&std::fs::read_to_string(src.join("sessions.json")).unwrap()).unwrap();
    // A transcript that is missing (the sub-agent's file is not copied), a key that is not a key,
    // and a sessionFile outside the state dir.
    index["not a key!"] = json!({"sessionId": "99999999-9999-4999-8999-999999999999"});
    index["agent:main:discord:group:dev"]["sessionFile"] = json!("/etc/passwd");
    std::fs::write(main.join("sessions.json"), index.to_string()).unwrap();
    // Invalid JSON in another agent's sessions.json.
    let ops = root.join("agents/ops/sessions");
    std::fs::create_dir_all(&ops).unwrap();
    std::fs::write(ops.join("sessions.json"), "{ not json").unwrap();

    let env = TestEnv::new();
    let report = import(&env, root);
    let notes: Vec<String> =
        report["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()).collect();
    let has = |needle: &str| notes.iter().any(|n| n.contains(needle));
    assert!(has("not valid JSON (truncated?)"), "{notes:?}");
    assert!(has("invalid JSON") && has("agent \"ops\" skipped"), "{notes:?}");
    assert!(has("4eb536f7-9b23-476f-b627-95ff73014ada.jsonl is missing"), "{notes:?}");
    assert!(has("\"not a key!\" is not a valid session key"), "{notes:?}");
    assert!(has("\"/etc/passwd\" lies outside the state dir"), "{notes:?}");
    assert_eq!(notes.len(), 5, "{notes:?}");
    assert_eq!(report["sessionsCreated"], 4);
    let dev = json_of(&env, &["show", "agent:main:discord:group:dev", "--json"]);
    assert_eq!(dev["messages"].as_array().unwrap().len(), 12, "read from <sessionId>.jsonl, never /etc/passwd");
    let hook = json_of(&env, &["show", "agent:main:hook:abc", "--json"]);
    assert_eq!(hook["messages"].as_array().unwrap().len(), 3, "lines before the truncated one");
}

#[test]
fn prune_removes_only_old_deleted_and_archived_sessions() {
    let env = TestEnv::new();
    let day = 86_400_000i64;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    env.seed(json!({"sessions": [
        {"key": "agent:main:keep", "messages": [{"role": "user", "content": "x"}]},
        {"key": "agent:main:old-archived", "archivedAt": now - 40 * day, "messages": [{"role": "user", "content": "x"}]},
        {"key": "agent:main:new-archived", "archivedAt": now - day},
        {"key": "agent:main:old-deleted", "deletedAt": now - 40 * day}
    ]}));
    let out = ok_stdout(env.run(&["prune", "--older-than", "30d"]));
    assert!(out.contains("pruned 2 sessions (1 messages"), "{out}");
    let keys: Vec<String> = json_of(&env, &["ls", "--json"])["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(keys.contains(&"agent:main:new-archived".to_string()));
    assert_eq!(env.run(&["prune", "--older-than", "soon"]).status.code(), Some(2));
}

#[test]
fn ls_and_show_print_tables() {
    let env = TestEnv::new();
    import(&env, &fixture());
    let ls = ok_stdout(env.run(&["ls"]));
    assert!(ls.lines().next().unwrap().starts_with("KEY"));
    assert!(ls.contains("agent:main:discord:group:dev") && ls.contains("discord"));
    let show = ok_stdout(env.run(&["show", "agent:main:main"]));
    assert!(show.contains("sessionId eaa8e48e-8c72-47a9-a593-cc38f3007e58"));
    assert!(show.contains("(silent)"));
    let missing = env.run(&["show", "agent:main:nope"]);
    assert!(!missing.status.success());
}

#[test]
fn doctor_reports_paths_and_one_line_per_config_problem() {
    let env = TestEnv::new();
    let out = ok_stdout(env.run(&["doctor"]));
    assert!(
        out.contains("state dir:")
            && out.contains("(not present: all defaults)")
            && out.ends_with("ok\n")
            && out.contains("supervisor: ")
            && out.contains("sessions-mcp-supervise"),
        "{out}"
    );
    let env = TestEnv::with_config(
        "{tools: {sesions: {}}, agents: {defaults: {subagents: {maxSpawnDepth: 9}}}, session: {bogus: 1}}",
    );
    let out = env.run(&["doctor"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    let problems: Vec<&str> = text.lines().filter(|l| l.starts_with("config problem:")).collect();
    assert_eq!(problems.len(), 3, "{text}");
    assert!(problems.iter().any(|p| p.contains("maxSpawnDepth must be 1-5")), "{text}");
    assert!(problems.iter().any(|p| p.contains("tools.sesions") && p.contains("tools.sessions")), "{text}");
    assert!(problems.iter().any(|p| p.contains("session.bogus")), "{text}");
    let env = TestEnv::with_config("{agents: {defaults: {subagents: {maxSpawnDepth: 9}}}}");
    let text = String::from_utf8(env.run(&["doctor"]).stdout).unwrap();
    assert!(text.contains("maxSpawnDepth must be 1-5"), "{text}");
    let env = TestEnv::with_config("{agents: {defaults: {heartbeat: {every: '30m'}}}}");
    let text = ok_stdout(env.run(&["doctor"]));
    assert!(text.contains("agents.defaults.heartbeat is an OpenClaw key"), "{text}");
}

#[test]
fn serve_refuses_a_state_dir_holding_an_openclaw_store() {
    let env = TestEnv::new();
    let agents = env.state_dir().join("agents/main/sessions");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::write(agents.join("sessions.json"), "{}").unwrap();
    let out = env.command(&["serve"]).stdin(std::process::Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("OpenClaw store"));
    let forced = env.command(&["serve", "--force"]).stdin(std::process::Stdio::null()).output().unwrap();
    assert!(forced.status.success());
}

/// Regression: a reference store without `spawnDepth` imported a grandchild before its parent
/// (both sorted as depth 1, by key), so the spawn-tree index missed it: under `tree`,
/// `sessions_list` left out a session that `sessions_history` let the caller read.
#[test]
fn an_imported_grandchild_is_listed_in_its_tree_whatever_the_file_order() {
    let src = tempfile::tempdir().unwrap();
    let sessions = src.path().join("agents/main/sessions");
    std::fs::create_dir_all(&sessions).unwrap();
    let entry = |id: &str, parent: Option<&str>| {
        let mut e = json!({"sessionId": id, "sessionFile": format!("{id}.jsonl"), "updatedAt": 1_796_000_000_000i64});
        if let Some(p) = parent {
            e["spawnedBy"] = json!(p);
        }
        e
    };
    let index = json!({
        "agent:main:main": entry("s-main", None),
        "agent:main:subagent:a-grandchild": entry("s-grandchild", Some("agent:main:subagent:b-child")),
        "agent:main:subagent:b-child": entry("s-child", Some("agent:main:main")),
    });
    std::fs::write(sessions.join("sessions.json"), index.to_string()).unwrap();
    for id in ["s-main", "s-grandchild", "s-child"] {
        let line = json!({"type": "message", "id": format!("m-{id}"), "message": {"role": "user", "content": "hi"}});
        std::fs::write(sessions.join(format!("{id}.jsonl")), format!("{line}\n")).unwrap();
    }
    let env = TestEnv::new();
    import(&env, src.path());
    let mut c = env.serve(None);
    let listed = c.call("sessions_list", json!({}));
    let keys: Vec<&str> = listed["sessions"].as_array().unwrap().iter().filter_map(|r| r["key"].as_str()).collect();
    assert!(keys.contains(&"agent:main:subagent:a-grandchild"), "{listed}");
    let h = c.call("sessions_history", json!({"sessionKey": "agent:main:subagent:a-grandchild"}));
    assert_eq!(h["status"], "ok", "{h}");
}

/// Runs a command of the binary as a user with the usual umask 022 would.
fn with_umask_022(mut cmd: std::process::Command) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: umask is async-signal-safe and touches no memory.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o022);
            Ok(())
        });
    }
    cmd
}

/// Every path under `dir` (links not followed) with its permission bits.
fn modes_under(dir: &Path) -> Vec<(PathBuf, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(p) = pending.pop() {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        out.push((p.clone(), meta.permissions().mode() & 0o777));
        if meta.is_dir() {
            pending.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
    }
    out
}

#[test]
fn everything_the_server_writes_is_private_whatever_the_umask_and_doctor_fixes_old_stores() {
    let body = "IFS= read -r line\nprintf x > agent-file\nprintf '%s\\n' '{\"type\":\"final\",\"text\":\"wrote\"}'\n";
    // The modes of SQLite's files are part of what it checks.
    let env = common::env_with_shell_worker(body).on_sqlite();
    let mut c = common::Client::start(with_umask_022(env.command(&["serve"])));
    let r = c.call("sessions_send", json!({"sessionKey": "agent:worker:main", "message": "go", "timeoutSeconds": 20}));
    assert_eq!(r["reply"], "wrote", "{r}");
    env.wait_idle(std::time::Duration::from_secs(10));
    let export = with_umask_022(env.command(&["export"])).output().unwrap();
    assert!(export.status.success(), "{export:?}");
    let agent_file = env.state_dir().join("workspaces/worker/agent-file");
    let modes = modes_under(&env.state_dir());
    assert!(modes.iter().any(|(p, _)| p.ends_with("sessions.db-wal")), "the store is in WAL mode: {modes:?}");
    assert!(modes.iter().any(|(p, _)| p.starts_with(env.state_dir().join("export"))), "{modes:?}");
    let shared: Vec<_> = modes.iter().filter(|(p, m)| m & 0o077 != 0 && *p != agent_file).collect();
    assert!(shared.is_empty(), "group/other may read these: {shared:?}");
    let agent_mode = modes.iter().find(|(p, _)| *p == agent_file).map(|(_, m)| *m);
    assert_eq!(agent_mode, Some(0o644), "the agent keeps the user's umask for its own files");
    let out = ok_stdout(env.run(&["doctor"]));
    assert!(out.contains("modes: private to the owner"), "{out}");
    drop(c);

    // A store made before this change: doctor names what is shared and --fix-modes makes it private.
    use std::os::unix::fs::PermissionsExt;
    for p in [env.state_dir(), env.state_dir().join("sessions.db")] {
        let mode = if p.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let out = env.run(&["doctor"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("sessions.db is 0644: other local users may read it"), "{text}");
    assert!(text.contains("--fix-modes"), "{text}");
    let text = ok_stdout(env.run(&["doctor", "--fix-modes"]));
    assert!(text.contains("modes: made 2 of 2 private"), "{text}");
    assert!(ok_stdout(env.run(&["doctor"])).contains("modes: private to the owner"));
}
