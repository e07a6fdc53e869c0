//! The README tells the truth: its tool examples conform to the input schemas and run, and the
//! shipped `mcp.json` (also shown in the README) starts a working server.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::{Client, TestEnv, assert_valid, schema_dir};
use serde_json::{Value, json};

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap()
}

/// Code blocks whose info string is `json tool=<name>`.
fn tool_examples(text: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(tool) = line.strip_prefix("```json tool=") else { continue };
        let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
        let value = serde_json::from_str(&body.join("\n")).unwrap_or_else(|e| panic!("README example for {tool}: {e}"));
        out.push((tool.trim().to_string(), value));
    }
    out
}

/// Code blocks whose info string is `json5`: config examples.
fn config_examples(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim_end() == "```json5" {
            out.push(lines.by_ref().take_while(|l| !l.starts_with("```")).collect::<Vec<_>>().join("\n"));
        }
    }
    out
}

/// Every config example loads as it is written, and every agent one of them lets an agent spawn
/// is an agent it configures (the allowAgents omission of an earlier README), with its preset's or
/// its own runner.
#[test]
fn readme_config_examples_load_and_their_spawnable_agents_exist() {
    let examples = config_examples(&readme());
    assert!(examples.len() >= 8, "{} json5 blocks", examples.len());
    // A placeholder (`"<hex sha256 of the token>"`) stands for a value of its kind.
    let placeholder = regex::Regex::new(r#""<[^">]*>""#).unwrap();
    for text in examples {
        let text = placeholder.replace_all(&text, |m: &regex::Captures| {
            if m[0].contains("sha256") { format!("\"{}\"", "a".repeat(64)) } else { "\"x\"".to_string() }
        });
        let (config, _) = sessions_mcp::config::parse(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
        for agent in config.configured_agents() {
            let (_, allowed) = sessions_mcp::policy::spawnable(&config, &agent);
            for id in allowed {
                assert!(
                    config.is_configured(&id),
                    "{agent} may spawn {id}, which the example does not configure:\n{text}"
                );
            }
        }
        // An agent given a runner is there to be run: the default agent (the one a host's
        // session is) may spawn it.
        let (_, reachable) = sessions_mcp::policy::spawnable(&config, &config.default_agent());
        for entry in config.agents.list.iter().filter(|a| a.runner.is_some()) {
            let id = sessions_mcp::keys::AgentId::parse(&entry.id).unwrap();
            assert!(reachable.contains(&id), "agent {id} has a runner but the default agent may not spawn it:\n{text}");
        }
    }
}

#[test]
fn readme_examples_conform_to_the_input_schemas_and_run() {
    let examples = tool_examples(&readme());
    let tools: Vec<&str> = examples.iter().map(|(t, _)| t.as_str()).collect();
    for name in ["sessions_list", "sessions_history", "agents_list", "sessions_send", "sessions_spawn", "subagents"] {
        assert!(tools.contains(&name), "README has an example for {name}");
    }
    let env = TestEnv::with_config("{tools: {sessions: {visibility: 'agent'}}}");
    env.seed(json!({"sessions": [{"key": "agent:main:cron:nightly"}]}));
    let mut c = env.serve(None);
    for (tool, args) in &examples {
        assert_valid(&schema_dir().join(format!("{tool}.input.json")), args);
        let result = c.call(tool, args.clone());
        let status = result["status"].as_str().unwrap();
        assert_ne!(status, "invalid", "README example for {tool} is invalid: {result}");
        match tool.as_str() {
            "sessions_spawn" | "sessions_send" => assert_eq!(status, "accepted", "{result}"),
            _ => assert_eq!(status, "ok", "{tool}: {result}"),
        }
    }
}

fn shipped_mcp_json() -> Value {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn readme_shows_the_shipped_mcp_json() {
    let text = readme();
    let start = text.find("```json\n{\n  \"mcpServers\"").expect("README shows mcp.json");
    let body = &text[start + "```json\n".len()..];
    let block = &body[..body.find("```").unwrap()];
    assert_eq!(serde_json::from_str::<Value>(block).unwrap(), shipped_mcp_json());
}

#[test]
fn mcp_json_starts_a_working_server() {
    let config = shipped_mcp_json();
    let entry = &config["mcpServers"]["sessions"];
    assert_eq!(entry["command"], "sessions-mcp");
    let env = TestEnv::new();
    // A host runs `command` from PATH; point PATH at the built binary's directory.
    let bin_dir = Path::new(common::bin()).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new("sessions-mcp");
    cmd.env("PATH", &path).env("SESSIONS_MCP_STATE_DIR", env.state_dir()).env_remove("SESSIONS_MCP_TOKEN");
    for arg in entry["args"].as_array().unwrap() {
        cmd.arg(arg.as_str().unwrap());
    }
    for (k, v) in entry["env"].as_object().unwrap() {
        cmd.env(k, v.as_str().unwrap());
    }
    let mut client = Client::start(cmd);
    let tools = client.request("tools/list", json!({}));
    assert_eq!(tools["result"]["tools"].as_array().unwrap().len(), 6);
    assert_eq!(client.call("sessions_list", json!({}))["sessions"][0]["key"], "main");
    client.close();
}
