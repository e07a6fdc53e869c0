//! The agents docs/AGENTS.md documents actually run: the 20-line jsonl/1 example and the echo default.

use crate::common;

use std::path::Path;

use common::TestEnv;

#[test]
fn the_minimal_jsonl_agent_from_the_readme_runs() {
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/agents/minimal_agent.py");
    let env = TestEnv::with_config(&format!(
        "{{agents: {{list: [{{id: 'main'}}, {{id: 'py', runner: {{command: 'python3', args: ['{}']}}}}]}}}}",
        agent.display()
    ));
    let first = env.run(&["inject", "agent:py:main", "hello python"]);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    assert_eq!(String::from_utf8_lossy(&first.stdout).trim(), "I have seen 0 earlier messages. You said: hello python");
    let second = env.run(&["inject", "agent:py:main", "again"]);
    assert_eq!(String::from_utf8_lossy(&second.stdout).trim(), "I have seen 2 earlier messages. You said: again");
    let show: serde_json::Value =
        serde_json::from_slice(&env.run(&["show", "agent:py:main", "--json"]).stdout).unwrap();
    let runs = show["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().all(|r| r["status"] == "ok" && r["mode"] == "inject"));
    assert_eq!(show["messages"][1]["usage"]["outputTokens"], 10, "usage lands on the reply");
}

#[test]
fn zero_config_main_echoes_and_other_agents_need_a_runner() {
    let env = TestEnv::new();
    let out = env.run(&["inject", "cron:job", "hi"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ECHO: hi");
    let out = env.run(&["inject", "agent:ops:main", "hi"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("agent \"ops\" has no runner configured"));
}
