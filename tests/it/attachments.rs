//! Spawn attachments, black-box: receipts match the written files, every bad name, encoding and
//! size is refused before anything is created, limits hold one byte over and exactly at, a
//! planted symlink is never followed, and neither is one swapped in while spawns stage their
//! files (from the test, and from inside a sandboxed agent's jail).

use crate::common;

use std::path::{Path, PathBuf};

use base64::Engine;
use common::TestEnv;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const LIMITS: &str = "{tools: {sessions_spawn: {attachments: {enabled: true, maxFiles: 3, maxFileBytes: 16, maxTotalBytes: 24}}}, \
                      agents: {defaults: {subagents: {maxChildrenPerAgent: 50}}}}";

fn attachments_dir(env: &TestEnv) -> PathBuf {
    env.state_dir().join("workspaces/main/.openclaw/attachments")
}

fn file(name: &str, content: &str) -> Value {
    json!({"name": name, "content": content})
}

#[test]
fn receipts_match_the_written_files() {
    let env = TestEnv::with_config(LIMITS);
    let mut c = env.serve(None);
    let bin = [0u8, 1, 2, 255];
    let r = c.call(
        "sessions_spawn",
        json!({"task": "read them", "attachments": [
            file("notes.txt", "hello attachments"[..16].as_ref()),
            {"name": "blob.bin", "content": base64::engine::general_purpose::STANDARD.encode(bin), "encoding": "base64", "mimeType": "application/octet-stream"}
        ]}),
    );
    assert_eq!(r["status"], "accepted", "{r}");
    let a = &r["attachments"];
    assert_eq!(a["count"], 2);
    assert_eq!(a["totalBytes"], 20);
    let dir = env.state_dir().join("workspaces/main").join(a["relDir"].as_str().unwrap());
    for f in a["files"].as_array().unwrap() {
        let bytes = std::fs::read(dir.join(f["name"].as_str().unwrap())).unwrap();
        assert_eq!(f["bytes"], bytes.len());
        assert_eq!(f["sha256"], hex::encode(Sha256::digest(&bytes)), "receipt = sha256sum of the file");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(dir.join(f["name"].as_str().unwrap())).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    assert_eq!(std::fs::read(dir.join("blob.bin")).unwrap(), bin);
    let manifest: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(".manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["files"].as_array().unwrap().len(), 2);
    // No transcript holds the content.
    let child = r["childSessionKey"].as_str().unwrap();
    let show = String::from_utf8(env.run(&["show", child, "--json"]).stdout).unwrap();
    assert!(!show.contains("hello attachmen"), "content is not in the child's transcript");
}

#[test]
fn bad_attachments_are_refused_and_leave_nothing() {
    let env = TestEnv::with_config(LIMITS);
    let before = {
        drop(env.serve(None));
        env.fingerprint()
    };
    let mut c = env.serve(None);
    let cases: Vec<(Value, &str)> = vec![
        (json!([file("../x", "a")]), "name"),
        (json!([file("a/b", "a")]), "name"),
        (json!([file(".", "a")]), "name"),
        (json!([file("..", "a")]), "name"),
        (json!([file(".manifest.json", "a")]), "name"),
        (json!([file("a\u{7}b", "a")]), "name"),
        (json!([file("a\\b", "a")]), "name"),
        (json!([file("same", "a"), file("same", "b")]), "twice"),
        (json!([{"name": "b", "content": "not base64!", "encoding": "base64"}]), "base64"),
        (json!([{"name": "b", "content": "QQ", "encoding": "base64"}]), "base64"),
        (json!([{"name": "b", "content": "x", "encoding": "rot13"}]), "encoding"),
        (json!([file("big", &"x".repeat(17))]), "maxFileBytes"),
        (json!([file("a", &"x".repeat(16)), file("b", &"x".repeat(9))]), "maxTotalBytes"),
        (json!([file("a", ""), file("b", ""), file("c", ""), file("d", "")]), "maxFiles"),
    ];
    for (attachments, needle) in cases {
        let r = c.call("sessions_spawn", json!({"task": "x", "attachments": attachments}));
        assert_eq!(r["status"], "invalid", "{attachments}: {r}");
        assert!(r["error"].as_str().unwrap().contains(needle), "{attachments}: {r}");
    }
    drop(c);
    assert_eq!(env.fingerprint(), before, "nothing stored");
    assert!(!attachments_dir(&env).exists() || std::fs::read_dir(attachments_dir(&env)).unwrap().count() == 0);
}

#[test]
fn limits_hold_exactly_at_and_one_over() {
    let env = TestEnv::with_config(LIMITS);
    let mut c = env.serve(None);
    let at = c.call(
        "sessions_spawn",
        json!({"task": "x", "attachments": [file("a", &"x".repeat(16)), file("b", &"y".repeat(8))]}),
    );
    assert_eq!(at["status"], "accepted", "exactly at maxFileBytes and maxTotalBytes: {at}");
    let three =
        c.call("sessions_spawn", json!({"task": "x", "attachments": [file("a", "1"), file("b", "2"), file("c", "3")]}));
    assert_eq!(three["status"], "accepted", "exactly at maxFiles: {three}");
    let over = c.call(
        "sessions_spawn",
        json!({"task": "x", "attachments": [file("a", &"x".repeat(16)), file("b", &"y".repeat(9))]}),
    );
    assert_eq!(over["status"], "invalid");
}

#[test]
fn a_planted_symlink_is_never_followed() {
    let env = TestEnv::with_config(LIMITS);
    let outside = tempfile::tempdir().unwrap();
    let workspace = env.state_dir().join("workspaces/main");
    std::fs::create_dir_all(&workspace).unwrap();
    std::os::unix::fs::symlink(outside.path(), workspace.join(".openclaw")).unwrap();
    let mut c = env.serve(None);
    let r = c.call("sessions_spawn", json!({"task": "x", "attachments": [file("a.txt", "hi")]}));
    assert_eq!(r["status"], "error", "{r}");
    assert!(r["error"].as_str().unwrap().contains("symlink"), "{r}");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0, "nothing written through the link");
    let ls: Value = serde_json::from_slice(&env.run(&["ls", "--json"]).stdout).unwrap();
    assert_eq!(ls["sessions"].as_array().unwrap().len(), 1, "no child was created: {ls}");
    assert!(Path::new(&workspace).join(".openclaw").is_symlink());
}

#[test]
fn attachments_off_by_default_name_the_switch() {
    let env = TestEnv::new();
    let mut c = env.serve(None);
    let r = c.call("sessions_spawn", json!({"task": "x", "attachments": [file("a", "b")]}));
    assert_eq!(r["status"], "forbidden");
    assert!(r["error"].as_str().unwrap().contains("tools.sessions_spawn.attachments.enabled"));
}

// ---------------------------------------------------------------------------------------------
// The swap race (issue 14, points 2 and 3): `.openclaw/attachments` is exchanged with a symlink
// to a directory outside the workspace, over and over, while many spawns stage their files.
// The exchange (renameat2) is Linux-only, so is the race.
#[cfg(target_os = "linux")]
mod race {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use rustix::fs::{CWD, RenameFlags, renameat_with};

    use super::*;

    /// Spawns in the race: enough for the swap to land inside many stagings, few enough for a loaded
    /// 2-core machine.
    const RACE_SPAWNS: usize = 100;

    fn race_config(extra_agents: &str) -> String {
        format!(
            "{{tools: {{sessions_spawn: {{attachments: {{enabled: true}}}}}}, \
              agents: {{defaults: {{subagents: {{maxChildrenPerAgent: 500, maxQueued: 500, announceStep: false}}}}, list: [{{id: 'main', subagents: {{allowAgents: ['*']}}}}{extra_agents}]}}}}"
        )
    }

    fn race_content(i: usize) -> String {
        format!("attachment of spawn {i}")
    }

    /// Spawns `RACE_SPAWNS` children of `main`, each with one file.
    fn spawn_many(c: &mut common::Client) -> Vec<Value> {
        (0..RACE_SPAWNS)
            .map(|i| {
                c.call(
                    "sessions_spawn",
                    json!({"task": "read f.txt", "attachments": [file("f.txt", &race_content(i))]}),
                )
            })
            .collect()
    }

    /// After the race: nothing outside; every accepted spawn has its files in place; every refused
    /// spawn created no child; no staging directory is left. Lists every violation at once.
    fn check_race(env: &TestEnv, outside: &Path, results: &[Value]) {
        let mut problems = Vec::new();
        let escaped: Vec<_> = std::fs::read_dir(outside).unwrap().flatten().map(|e| e.file_name()).collect();
        if !escaped.is_empty() {
            problems.push(format!("{} entries written outside the workspace: {escaped:?}", escaped.len()));
        }
        let workspace = env.state_dir().join("workspaces/main");
        let (mut accepted, mut refused) = (Vec::new(), 0);
        for (i, r) in results.iter().enumerate() {
            if r["status"] == "accepted" {
                let dir = workspace.join(r["attachments"]["relDir"].as_str().unwrap());
                match std::fs::read_to_string(dir.join("f.txt")) {
                    Ok(got) if got == race_content(i) && dir.join(".manifest.json").is_file() => {}
                    other => problems.push(format!("spawn {i} accepted without its files in place: {other:?}")),
                }
                accepted.push(r["childSessionKey"].as_str().unwrap().to_string());
            } else if r["status"] == "error" && r["error"].as_str().unwrap().starts_with("attachments: ") {
                refused += 1;
            } else {
                problems.push(format!("spawn {i}: unexpected answer {r}"));
            }
        }
        let ls: Value = serde_json::from_slice(&env.run(&["ls", "--json"]).stdout).unwrap();
        let mut children: Vec<String> = ls["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s["key"].as_str().filter(|k| k.starts_with("agent:main:subagent:")).map(String::from))
            .collect();
        children.sort();
        accepted.sort();
        if children != accepted {
            problems.push(format!(
                "{} children exist for {} accepted spawns ({refused} refused): a refused spawn created its child",
                children.len(),
                accepted.len()
            ));
        }
        let names: Vec<String> = std::fs::read_dir(attachments_dir(env))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if names.len() != accepted.len() || names.iter().any(|n| n.starts_with(".staging-")) {
            problems.push(format!("{} directories for {} accepted spawns: {names:?}", names.len(), accepted.len()));
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        eprintln!("race: {} of {} spawns accepted, {refused} refused", accepted.len(), results.len());
    }

    /// `.openclaw/attachments` (a real directory) and `.openclaw/decoy` (a symlink to `outside`).
    fn plant_decoy(env: &TestEnv, outside: &Path) -> (PathBuf, PathBuf) {
        let real = attachments_dir(env);
        std::fs::create_dir_all(&real).unwrap();
        let decoy = real.with_file_name("decoy");
        std::os::unix::fs::symlink(outside, &decoy).unwrap();
        (real, decoy)
    }

    #[test]
    fn a_symlink_swapped_in_during_staging_is_never_followed() {
        let env = TestEnv::with_config(&race_config(""));
        let outside = tempfile::tempdir().unwrap();
        let (real, decoy) = plant_decoy(&env, outside.path());
        let mut c = env.serve(None);
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let exchange = || renameat_with(CWD, &real, CWD, &decoy, RenameFlags::EXCHANGE).unwrap();
                let mut swaps = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    exchange();
                    swaps += 1;
                }
                if real.is_symlink() {
                    exchange();
                }
                swaps
            })
        };
        let results = spawn_many(&mut c);
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().unwrap();
        assert!(swaps > 0);
        eprintln!("race: {swaps} exchanges");
        check_race(&env, outside.path(), &results);
    }

    /// The same race run by the attacker the issue names: a sandboxed agent whose workspace is
    /// writable (`runner.sandbox.workspace: "rw"`), swapping from inside its bubblewrap jail.
    #[test]
    fn a_jailed_agent_with_a_writable_workspace_cannot_redirect_staging() {
        if !common::bwrap_works() {
            return;
        }
        let mut env = TestEnv::new();
        let outside = tempfile::tempdir().unwrap();
        let workspace = env.state_dir().join("workspaces/main");
        let (real, decoy) = plant_decoy(&env, outside.path());
        let (ready, stop) = (workspace.join("ready"), workspace.join("stop"));
        // Swaps with renameat2(RENAME_EXCHANGE) until told to stop, then puts the real directory back.
        let swapper = env.dir.path().join("swapper.py");
        std::fs::write(
            &swapper,
            format!(
                r#"import ctypes, os, sys, time
sys.stdin.readline()
libc = ctypes.CDLL(None, use_errno=True)
real, decoy = b"{real}", b"{decoy}"
exchange = lambda: libc.renameat2(-100, real, -100, decoy, 2) == 0 or sys.exit("renameat2: " + os.strerror(ctypes.get_errno()))
open("{ready}", "w").close()
deadline, swaps = time.time() + 120, 0
while not os.path.exists("{stop}") and time.time() < deadline:
    exchange()
    swaps += 1
if os.path.islink(real):
    exchange()
print('{{"type":"final","text":"swaps=%d"}}' % swaps, flush=True)
"#,
                real = real.display(),
                decoy = decoy.display(),
                ready = ready.display(),
                stop = stop.display(),
            ),
        )
        .unwrap();
        env.set_config(&race_config(&format!(
            ", {{id: 'intruder', workspace: '{}', sandbox: {{mode: 'all'}}, runner: {{command: '/usr/bin/python3', args: ['{}'], sandbox: {{workspace: 'rw'}}}}}}",
            workspace.display(),
            swapper.display()
        )));
        let mut c = env.serve(None);
        let intruder = c.call("sessions_spawn", json!({"task": "swap", "agentId": "intruder", "sandbox": "require"}));
        assert_eq!(intruder["status"], "accepted", "{intruder}");
        common::wait_until(Duration::from_secs(60), "the jailed swapper to start", || ready.exists().then_some(()));
        let results = spawn_many(&mut c);
        std::fs::write(&stop, "").unwrap();
        let key = intruder["childSessionKey"].as_str().unwrap().to_string();
        let answer = common::wait_until(Duration::from_secs(60), "the swapper's final reply", || {
            let show = env.show(&key);
            let reply = show["messages"].as_array()?.iter().find(|m| m["role"] == "assistant")?.clone();
            Some(common::text_of(&reply["content"]))
        });
        assert!(answer.starts_with("swaps=") && answer != "swaps=0", "the jail swapped: {answer}");
        eprintln!("race in the jail: {answer}");
        check_race(&env, outside.path(), &results);
    }
}
