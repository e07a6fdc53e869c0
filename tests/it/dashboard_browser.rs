//! The dashboard in a real headless browser (issue 21): Debian's Chromium driven by
//! puppeteer-core (`tests/clients/dashboard.mjs`). It loads `/ui`, signs in, sees a tree made by
//! real spawns, watches a run go from running to completed without a reload, opens a transcript
//! with the keyboard, answers a child's approval with a click, checks that every control has a name, that a client token's page holds only
//! that session's tree, and that a phone-sized screen does not scroll sideways. A failed child's
//! reason and label show in the tree, Runs and the ledger without opening its transcript, on a
//! page signed in with a token `sessions-mcp token create` made.
//!
//! `$SESSIONS_MCP_PUPPETEER` (a node_modules holding puppeteer-core; default `.ci/browser`'s, which
//! `.ci/run` installs) and `$SESSIONS_MCP_CHROMIUM` (default /usr/bin/chromium). Without them the
//! test says so and passes locally; under CI (`CI` set) their absence fails it.
//! `$SESSIONS_MCP_SCREENSHOTS=DIR` also writes docs/OPERATING.md's screenshots there.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use super::dashboard::{DESK, OPERATOR, OTHER, env_with};
use common::http_client::Mcp;
use serde_json::{Value, json};

/// (puppeteer's node_modules, the browser), or None when this machine has not got them.
pub(crate) fn browser() -> Option<(PathBuf, PathBuf)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let modules =
        std::env::var_os("SESSIONS_MCP_PUPPETEER").map_or_else(|| root.join(".ci/browser/node_modules"), PathBuf::from);
    let chromium =
        std::env::var_os("SESSIONS_MCP_CHROMIUM").map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    if node && modules.join("puppeteer-core").is_dir() && chromium.exists() {
        return Some((modules, chromium));
    }
    let what = format!("node, {} and {}", modules.join("puppeteer-core").display(), chromium.display());
    assert!(std::env::var_os("CI").is_none(), "CI needs the browser test's tools: {what}");
    eprintln!("skipped: no {what} (npm install --prefix .ci/browser puppeteer-core; apt-get install chromium)");
    None
}

pub(crate) fn drive(mode: &str, args: &Value) -> Value {
    let (modules, chromium) = browser().expect("checked by the caller");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/dashboard.mjs");
    let out = Command::new("node")
        .arg(script)
        .args([mode, &args.to_string()])
        .env("SESSIONS_MCP_PUPPETEER", modules)
        .env("SESSIONS_MCP_CHROMIUM", chromium)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|_| {
        panic!("the driver printed no result: {stdout}\nstderr: {}", String::from_utf8_lossy(&out.stderr))
    })
}

#[test]
fn the_dashboard_in_headless_chromium_shows_the_tree_live_opens_a_transcript_and_keeps_a_clients_view_to_its_tree() {
    if browser().is_none() {
        return;
    }
    let env = env_with();
    let server = env.serve_http(&[]);
    let port = server.port;
    let child = Mcp::legacy(port, DESK).call("sessions_spawn", json!({"task": "long job", "label": "builder"}));
    let child = child["childSessionKey"].as_str().unwrap().to_string();
    let asking = Mcp::legacy(port, DESK).call("sessions_spawn", json!({"task": "ask to deploy", "label": "deployer"}));
    let asking = asking["childSessionKey"].as_str().unwrap().to_string();
    let other = Mcp::legacy(port, OTHER).call("sessions_spawn", json!({"task": "secret work"}));
    let other = other["childSessionKey"].as_str().unwrap().to_string();
    let mut args = json!({"base": format!("http://127.0.0.1:{port}"), "operator": OPERATOR, "desk": DESK,
                          "child": child, "otherChild": other, "asking": asking});
    if let Some(dir) = std::env::var_os("SESSIONS_MCP_SCREENSHOTS") {
        args["screenshots"] = json!(dir.to_string_lossy());
    }
    let r = drive("check", &args);
    assert_eq!(r["ok"], true, "{r}");
    assert!(["queued", "running"].contains(&r["firstState"].as_str().unwrap()), "{r}");
    assert_eq!(r["runRow"], "ok", "{r}");
    let transcript = r["transcript"].as_array().unwrap();
    let task = transcript.iter().find(|m| m["from"] == "session").unwrap_or_else(|| panic!("{r}"));
    assert_eq!(task["head"], "session agent:main:desk via sessions_spawn", "{task}");
    assert!(task["text"].as_str().unwrap().contains("long job"), "{task}");
    assert!(transcript.iter().any(|m| m["from"] == "agent" && m["text"] == "long done"), "{r}");
    let operator_keys: Vec<&str> = r["operatorKeys"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for key in ["agent:main:desk", child.as_str(), "agent:main:other", other.as_str()] {
        assert!(operator_keys.contains(&key), "the operator sees {key}: {operator_keys:?}");
    }
    assert_eq!(r["askText"], "May I deploy?", "{r}");
    assert!(r["askNotice"].as_str().unwrap().starts_with("allow "), "{r}");
    assert_eq!(r["asksLeft"], 0, "{r}");
    let show = env.show(&asking);
    let answer = show["messages"].as_array().unwrap().iter().any(|m| {
        common::text_of(&m["content"])
            .contains("by operator via dashboard, the operator at the dashboard] allow: ship it")
    });
    assert!(answer, "the answer is in the child's transcript with who gave it: {show}");
    let mut desk_keys: Vec<String> = serde_json::from_value(r["deskKeys"].clone()).unwrap();
    desk_keys.sort();
    let mut expected = vec!["agent:main:desk".to_string(), child.clone(), asking.clone()];
    expected.sort();
    assert_eq!(desk_keys, expected, "{r}");
    assert_eq!(r["deskHasOther"], false, "{r}");
    assert_eq!(r["deskWho"], "Viewing as agent:main:desk");
    assert_eq!(r["unnamed"], json!([]), "every control has a name: {r}");
    assert_eq!(r["errors"], json!([]), "no script errors: {r}");
    assert!(r["phoneOverflow"].as_i64().unwrap() <= 0, "no sideways scroll on a phone: {r}");
}

#[test]
fn a_failed_childs_reason_and_label_show_without_its_transcript_on_a_page_signed_in_with_a_minted_token() {
    if browser().is_none() {
        return;
    }
    let env = env_with();
    let out = env.run(&["token", "create", "--operator", "--label", "browser"]);
    assert!(out.status.success(), "{out:?}");
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let server = env.serve_http(&[]);
    let child =
        Mcp::legacy(server.port, DESK).call("sessions_spawn", json!({"task": "fail the build", "label": "breaker"}));
    let child = child["childSessionKey"].as_str().unwrap().to_string();
    let r =
        drive("reasons", &json!({"base": format!("http://127.0.0.1:{}", server.port), "token": token, "child": child}));
    assert_eq!(r["ok"], true, "{r}");
    let reason = r["treeReason"].as_str().unwrap();
    assert!(reason.contains("the build broke: exit 2") && !reason.contains("see the log"), "the first line: {r}");
    assert_eq!(r["runReason"], r["treeReason"], "{r}");
    assert_eq!(r["treeLabel"], "breaker", "{r}");
    let run_session = r["runSession"].as_str().unwrap();
    assert!(run_session.contains("breaker") && run_session.contains("fail the build"), "label and task: {r}");
    let ledger = r["ledgerSessions"].as_array().unwrap();
    assert!(ledger.iter().any(|s| s.as_str().unwrap().contains("breaker")), "the ledger names it: {r}");
    assert_eq!(r["transcriptOpen"], false, "{r}");
    assert_eq!(r["errors"], json!([]), "no script errors: {r}");
}
