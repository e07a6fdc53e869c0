//! An agent's usage reports are untrusted input (issue 34, points 1 and 4), black-box: a report at
//! the largest 64-bit integer corrupts nothing (every read of the tree still answers, before and
//! after a restart, and the child still announces), and a running total that goes down — even
//! below zero — is never credited to a budget. And they are live (issue 36, point 3): a running
//! child's reported usage shows in `subagents list`, the dashboard and `/metrics` while it works,
//! and a last report lower than an earlier one settles nothing lower.

use crate::common;

use common::{TestEnv, scripted_agent};
use serde_json::{Value, json};

const OPERATOR: &str = "operator-token-usage-0123456789";

fn env(session: Value) -> TestEnv {
    let burn = (1..=60).map(|i| json!({"inputTokens": i * 600, "outputTokens": i * 400})).collect::<Vec<_>>();
    let script = json!({"rules": [
        {"match": {"input": "overflow"}, "usage": {"inputTokens": i64::MAX, "outputTokens": 2}, "reply": "overflowed"},
        {"match": {"input": "negative"},
         "usage": [{"inputTokens": 1000}, {"inputTokens": 2000}, {"inputTokens": -1_000_000}], "reply": "went negative"},
        {"match": {"input": "burn"}, "usage": burn, "usageIntervalMs": 20, "reply": "burnt"},
        {"match": {"input": "live"}, "usage": [{"inputTokens": 600, "outputTokens": 400}, {"inputTokens": 700}],
         "usageIntervalMs": 600_000, "reply": "never"},
        {"match": {"input": "drop"},
         "usage": [{"inputTokens": 900, "outputTokens": 101}, {"inputTokens": 100, "outputTokens": 7}], "reply": "dropped"}
    ], "default": {"reply": "RESULT: {input}"}});
    let mut env = TestEnv::new();
    let main = scripted_agent(&env, "main", &script, json!({}));
    let extra = json!({
        "agents": {"list": [main], "defaults": {"subagents": {"announceStep": false, "maxChildrenPerAgent": 10}}},
        "server": {"operatorTokens": [{"sha256": crate::dashboard::sha(OPERATOR)}]},
        "session": session,
    });
    env.set_config(&common::agents_config(Vec::new(), extra));
    env
}

fn spawn(c: &mut common::Client, task: &str) -> String {
    let r = c.call("sessions_spawn", json!({"task": task}));
    assert_eq!(r["status"], "accepted", "{r}");
    r["childSessionKey"].as_str().unwrap().to_string()
}

fn wait(c: &mut common::Client, keys: &[&str]) -> Value {
    let w =
        c.call("subagents", json!({"action": "wait", "childSessionKeys": keys, "until": "all", "timeoutSeconds": 30}));
    assert_eq!(w["status"], "ok", "{w}");
    assert_eq!(w["finished"].as_array().map(Vec::len), Some(keys.len()), "every child announced: {w}");
    w
}

/// Every read a parent and an operator make of the tree answers, with the sane counts.
fn assert_every_read_answers(env: &TestEnv, c: &mut common::Client, children: &[String]) {
    let list = c.call("sessions_list", json!({}));
    assert_eq!(list["status"], "ok", "sessions_list: {list}");
    let subs = c.call("subagents", json!({"action": "list"}));
    assert_eq!(subs["status"], "ok", "subagents list: {subs}");
    for key in children {
        let row = crate::subagents::row(&subs, key);
        assert_eq!(row["tokens"], json!({"input": 0, "output": 2, "total": 2}), "only the valid count: {row}");
    }
    env.run_counts(); // `ls --json` answers (it asserts success)
    let http = env.serve_http(&[]);
    let (status, _, body) = common::http_client::http_to(
        http.port,
        "GET",
        "/ui/api/view",
        &[("Authorization", &format!("Bearer {OPERATOR}"))],
        "",
    );
    assert_eq!(status, 200, "the operator's dashboard view: {body}");
}

#[test]
fn a_usage_report_at_the_largest_integer_corrupts_nothing_and_the_children_still_announce() {
    let env = env(json!({}));
    let mut c = env.serve(None);
    let children = [spawn(&mut c, "overflow"), spawn(&mut c, "overflow")];
    let w = wait(&mut c, &[&children[0], &children[1]]);
    for f in w["finished"].as_array().unwrap() {
        assert!(f["outcome"].as_str().unwrap().contains("Result: overflowed"), "{f}");
    }
    assert_every_read_answers(&env, &mut c, &children);
    let stderr = c.close();
    let said =
        "a usage report of the agent was ignored: inputTokens: 9223372036854775807 is not a whole number from 0 to";
    assert_eq!(stderr.matches(said).count(), 2, "said once per run: {stderr}");
    let mut again = env.serve(None);
    assert_every_read_answers(&env, &mut again, &children);
    again.close();
}

#[test]
fn a_running_total_that_goes_down_is_never_credited_and_a_sibling_is_still_stopped_at_the_limit() {
    let env = env(json!({"budget": {"tokens": 50_000}}));
    let mut c = env.serve(None);
    let negative = spawn(&mut c, "negative");
    wait(&mut c, &[&negative]);
    let list = c.call("subagents", json!({"action": "list"}));
    assert_eq!(list["budget"]["spent"]["tokens"], 2000, "the highest running total counts: {list}");
    assert_eq!(list["budget"]["remaining"]["tokens"], 48_000, "never above the limit: {list}");
    let burner = spawn(&mut c, "burn");
    let w = wait(&mut c, &[&burner]);
    assert_eq!(w["finished"][0]["runState"], "budget_exceeded", "60,000 tokens do not fit in 48,000: {w}");
    let list = c.call("subagents", json!({"action": "list"}));
    let remaining = list["budget"]["remaining"]["tokens"].as_i64().unwrap();
    assert!(remaining <= 0, "the tree is spent, not credited: {list}");
    c.close();
}

/// The row of `key` in `subagents list` once its tokens are above zero.
fn tokens_while_running(c: &mut common::Client, key: &str) -> Value {
    common::wait_until(std::time::Duration::from_secs(30), "the running child's live usage", || {
        let list = c.call("subagents", json!({"action": "list"}));
        let row = crate::subagents::row(&list, key).clone();
        (row["tokens"]["total"].as_i64() > Some(0)).then_some(row)
    })
}

#[test]
fn a_running_childs_reported_usage_shows_in_subagents_list_the_dashboard_and_metrics_while_it_works() {
    let env = env(json!({}));
    let mut c = env.serve(None);
    let child = spawn(&mut c, "live");
    let row = tokens_while_running(&mut c, &child);
    assert_eq!(row["runState"], "running", "{row}");
    assert_eq!(row["tokens"], json!({"input": 600, "output": 400, "total": 1000}), "{row}");
    let http = env.serve_http(&[]);
    let view = crate::dashboard::view(http.port, OPERATOR);
    let nodes = crate::dashboard::nodes(&view);
    let node = crate::dashboard::node(&nodes, &child).unwrap_or_else(|| panic!("{child} in {view}"));
    assert_eq!((node["state"].as_str(), &node["tokens"]), (Some("running"), &json!({"in": 600, "out": 400})), "{node}");
    let run = view["runs"].as_array().unwrap().iter().find(|r| r["sessionKey"] == child.as_str()).unwrap();
    assert_eq!(run["tokens"], json!({"in": 600, "out": 400}), "the Runs table: {run}");
    let auth = format!("Bearer {OPERATOR}");
    let (status, _, metrics) =
        common::http_client::http_to(http.port, "GET", "/metrics", &[("Authorization", &auth)], "");
    assert_eq!(status, 200, "{metrics}");
    assert!(metrics.contains("sessions_mcp_tokens{agent=\"main\",direction=\"input\"} 600"), "{metrics}");
    drop(http);
    c.call("subagents", json!({"action": "cancel", "childSessionKey": child}));
    let list = c.call("subagents", json!({"action": "list"}));
    let row = crate::subagents::row(&list, &child);
    assert_eq!(row["tokens"]["total"], 1000, "a stop keeps what was reported, counted once: {row}");
    c.close();
}

#[test]
fn a_last_report_lower_than_an_earlier_one_settles_at_the_higher_in_the_announce_and_subagents_list() {
    let env = env(json!({}));
    let mut c = env.serve(None);
    let within = c.call("sessions_spawn", json!({"task": "drop", "budget": {"tokens": 2000}}));
    let over = c.call("sessions_spawn", json!({"task": "drop", "budget": {"tokens": 1000}}));
    let keys = [&within, &over].map(|r| r["childSessionKey"].as_str().unwrap().to_string());
    let w = wait(&mut c, &[&keys[0], &keys[1]]);
    let outcome = |key: &str| {
        let f = w["finished"].as_array().unwrap().iter().find(|f| f["childSessionKey"] == key).unwrap();
        f["outcome"].as_str().unwrap().to_string()
    };
    let within_said = outcome(&keys[0]);
    assert!(within_said.contains("tokens 1.0k (in 900 / out 101)"), "{within_said}");
    assert!(within_said.contains("budget 1,001/2,000 tokens"), "{within_said}");
    let over_said = outcome(&keys[1]);
    assert!(over_said.starts_with("Status: budget exceeded: 1,001 tokens of 1,000 tokens"), "{over_said}");
    assert!(over_said.contains("budget 1,001/1,000 tokens"), "never the lower 107: {over_said}");
    let list = c.call("subagents", json!({"action": "list"}));
    for key in &keys {
        let row = crate::subagents::row(&list, key);
        assert_eq!(row["tokens"], json!({"input": 900, "output": 101, "total": 1001}), "{row}");
    }
    c.close();
}
