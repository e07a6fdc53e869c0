//! A real model as an agent, offline: Gemma 3 270M on node-llama-cpp (`fixtures/agents/gemma/`,
//! installed by its `install.sh`) answers a `sessions_send` through the jsonl/1 runner; its reply,
//! usage and model land in the store and no process is left. Skipped with a printed reason when
//! the model is not installed; under `.ci/run --extended` (`SESSIONS_MCP_EXTENDED` set) a missing
//! model is a failure.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::{TestEnv, agents_config, runs_of};
use serde_json::json;

fn gemma_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/agents/gemma")
}

/// Why the model cannot run here, if it cannot.
fn missing() -> Option<String> {
    let dir = gemma_dir();
    if !dir.join("model/gemma-3-270m-q4_k_m.gguf").exists() || !dir.join("node_modules/node-llama-cpp").exists() {
        return Some(format!("the Gemma model is not installed (run {}/install.sh)", dir.display()));
    }
    let node = std::process::Command::new("node").arg("--version").output();
    (!node.is_ok_and(|o| o.status.success())).then(|| "node is not on PATH".to_string())
}

#[test]
fn a_send_to_a_local_gemma_model_round_trips_with_usage() {
    if let Some(why) = missing() {
        assert!(std::env::var_os("SESSIONS_MCP_EXTENDED").is_none(), "the extended tier needs it: {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let mut env = TestEnv::new();
    let agent = gemma_dir().join("agent.mjs");
    let gemma = json!({"id": "gemma", "runner": {"command": "node", "args": [agent], "timeoutSeconds": 180}});
    env.set_config(&agents_config(vec![json!({"id": "main"}), gemma], json!({})));
    let mut c = env.serve(None);
    let r = c.call(
        "sessions_send",
        json!({"sessionKey": "agent:gemma:main", "message": "What is the capital of France?", "timeoutSeconds": 170}),
    );
    assert_eq!(r["status"], "ok", "{r}");
    let reply = r["reply"].as_str().unwrap_or_default();
    assert!(!reply.trim().is_empty(), "the model said something: {r}");
    eprintln!("gemma replied: {reply:?}");

    let show = env.show("agent:gemma:main");
    let run = &runs_of(&show, Some("send"))[0];
    assert_eq!(run["status"], "ok", "{run}");
    assert!(show["session"]["totalTokens"].as_i64().is_some_and(|n| n > 0), "tokens recorded: {show}");
    assert_eq!(show["session"]["model"], "gemma-3-270m-q4_k_m", "{show}");
    let answer = show["messages"].as_array().unwrap().iter().find(|m| m["role"] == "assistant").unwrap().clone();
    assert!(answer["usage"]["inputTokens"].as_i64().is_some_and(|n| n > 0), "{answer}");
    assert!(answer["usage"]["outputTokens"].as_i64().is_some_and(|n| n > 0), "{answer}");
    let run_id = run["runId"].as_str().unwrap().to_string();
    common::assert_no_process_carries(&[run_id], Duration::from_secs(10));
    c.close();
}
