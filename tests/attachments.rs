//! Spawn attachments, black-box: receipts match the written files, every bad name, encoding and
//! size is refused before anything is created, limits hold one byte over and exactly at, and a
//! planted symlink is never followed.

mod common;

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
