//! The `text` adapter end to end: a sessions_send to an agent whose runner is a shell script with
//! `kind: "text"` gets the script's stdout as its reply. The prompt arrives on stdin (then EOF),
//! the system text through `systemPromptArg`, and the next turn replays the transcript as
//! `### user` / `### assistant` blocks (a text CLI has no session of its own to resume). A non-zero
//! exit fails the run with the stderr tail.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{TestEnv, agents_config, runs_of, shell_agent, text_of, wait_until};
use serde_json::{Value, json};

const KEY: &str = "agent:texty:main";

/// Saves its stdin and argv under the run's id in its workdir, then answers with the last line
/// (and stays silent in the announce step that follows each exchange).
const ECHO_LAST_LINE: &str = r#"prompt=$(cat)
last=$(printf '%s\n' "$prompt" | tail -n 1)
if [ "$last" = "Agent-to-agent announce step." ]; then echo ANNOUNCE_SKIP; exit 0; fi
printf '%s' "$prompt" > "prompt.$SESSIONS_MCP_RUN_ID"
printf '%s\n' "$@" > "args.$SESSIONS_MCP_RUN_ID"
printf 'heard: %s\n' "$last"
"#;

fn text_env(body: &str) -> TestEnv {
    let mut env = TestEnv::new();
    let workspace = env.dir.path().join("ws");
    let runner = json!({"kind": "text", "systemPromptArg": "--system"});
    let mut agent = shell_agent(&env, "texty", body, &["--model={model}"], runner);
    agent["workspace"] = workspace.display().to_string().into();
    env.set_config(&agents_config(vec![json!({"id": "main"}), agent], json!({})));
    env.seed(json!({"sessions": [{"key": KEY}]}));
    env
}

fn saved(workspace: &Path, what: &str, run_id: &str) -> String {
    std::fs::read_to_string(workspace.join(format!("{what}.{run_id}"))).unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn send(env: &TestEnv, message: &str) -> Value {
    let mut c = env.serve(None);
    let r = c.call("sessions_send", json!({"sessionKey": KEY, "message": message, "timeoutSeconds": 30}));
    drop(c);
    r
}

#[test]
fn a_text_agent_round_trips_its_stdout_and_replays_the_transcript_next_turn() {
    let env = text_env(ECHO_LAST_LINE);
    let ws = env.dir.path().join("ws");
    let first = send(&env, "ping");
    assert_eq!(first["status"], "ok", "{first}");
    assert_eq!(first["reply"], "heard: ping");
    let run1 = first["runId"].as_str().unwrap();
    let args = saved(&ws, "args", run1);
    assert!(args.starts_with("--system\nAgent-to-agent message."), "system text via systemPromptArg: {args}");
    assert!(saved(&ws, "prompt", run1).ends_with("\nping"), "the first prompt is the input alone");

    let second = send(&env, "pong");
    assert_eq!(second["reply"], "heard: pong", "{second}");
    let prompt = saved(&ws, "prompt", second["runId"].as_str().unwrap());
    assert!(prompt.starts_with("### user\n"), "{prompt}");
    assert!(prompt.contains("ping\n\n### assistant\nheard: ping\n\n### user\n"), "replayed: {prompt}");
    assert!(prompt.ends_with("\npong"), "{prompt}");

    let show = env.show(KEY);
    let assistant: Vec<String> = show["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "assistant" && m["silent"] != true)
        .map(|m| text_of(&m["content"]))
        .collect();
    assert_eq!(assistant, ["heard: ping", "heard: pong"]);
}

#[test]
fn a_text_agent_that_exits_non_zero_fails_the_run_with_its_stderr() {
    let env = text_env("cat >/dev/null\necho 'model not found' >&2\nexit 3\n");
    let r = send(&env, "ping");
    assert_eq!(r["status"], "error", "{r}");
    let error = r["error"].as_str().unwrap_or_default();
    assert!(error.contains("status 3") && error.contains("model not found"), "{r}");
    let run = wait_until(Duration::from_secs(10), "the run row", || {
        runs_of(&env.show(KEY), Some("send")).into_iter().find(|x| x["endedAt"].is_i64())
    });
    assert_eq!(run["status"], "error", "{run}");
}
