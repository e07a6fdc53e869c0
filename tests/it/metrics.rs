//! `/metrics`, black-box (issue 21, part 1): scraped over HTTP and parsed, it has the store's runs
//! by status and agent, queue depth, deliveries, tokens, cost and sessions by agent, and this
//! process's run-duration, wait-to-start and tool-latency histograms; it needs an operator token
//! (a client token is refused) unless `server.metricsPublic`, which serve refuses off loopback.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::http_client::{Mcp, http_to};
use common::{TestEnv, scripted_agent, wait_until};
use serde_json::json;

const OPERATOR: &str = "operator-token-0123456789";
const CLIENT: &str = "client-token-0123456789";

fn sha(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

fn env_with(server: serde_json::Value) -> TestEnv {
    let mut env = TestEnv::new();
    let usage = json!({"inputTokens": 120, "outputTokens": 30, "costUsd": 0.25});
    let worker =
        scripted_agent(&env, "worker", &json!({"default": {"reply": "done: {input}", "usage": usage}}), json!({}));
    let mut server = server;
    server["tokens"] = json!([{"sha256": sha(CLIENT), "sessionKey": "agent:main:desk"}]);
    env.set_config(&common::agents_config(vec![json!({"id": "main"}), worker], json!({"server": server})));
    env
}

fn scrape(port: u16, token: Option<&str>) -> (u16, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    let (status, _, body) = http_to(port, "GET", "/metrics", &headers, "");
    (status, body)
}

/// The samples of an exposition: `name{labels}` → value, checking every line parses.
fn parse(text: &str) -> BTreeMap<String, f64> {
    assert!(text.ends_with("# EOF\n"), "an OpenMetrics exposition ends with # EOF: {text}");
    let mut samples = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("a sample line: {line:?}"));
        samples.insert(series.to_string(), value.parse().unwrap_or_else(|_| panic!("a number: {line:?}")));
    }
    samples
}

#[test]
fn metrics_are_scraped_and_parsed_with_the_stores_counts_and_this_processs_histograms() {
    let env = env_with(json!({"operatorTokens": [{"sha256": sha(OPERATOR)}]}));
    let server = env.serve_http(&[]);
    let mut desk = Mcp::legacy(server.port, CLIENT);
    let r =
        desk.call("sessions_send", json!({"sessionKey": "agent:worker:main", "message": "go", "timeoutSeconds": 30}));
    assert_eq!(r["reply"], "done: go", "{r}");
    let (status, text) = wait_until(Duration::from_secs(20), "the run's metrics", || {
        let (status, text) = scrape(server.port, Some(OPERATOR));
        text.contains("sessions_mcp_run_duration_seconds_count{agent=\"worker\"").then_some((status, text))
    });
    assert_eq!(status, 200, "{text}");
    let samples = parse(&text);
    let get = |series: &str| *samples.get(series).unwrap_or_else(|| panic!("{series} in:\n{text}"));
    // The send and its announce step, both in the worker's session.
    let worker_runs = common::runs_of(&env.show("agent:worker:main"), None).len() as f64;
    assert_eq!(get("sessions_mcp_runs{status=\"ok\",agent=\"worker\"}"), worker_runs);
    assert_eq!(get("sessions_mcp_queue_depth"), 0.0);
    // Each of its runs reported 120 in / 30 out and $0.25.
    assert_eq!(get("sessions_mcp_tokens{agent=\"worker\",direction=\"input\"}"), 120.0 * worker_runs);
    assert_eq!(get("sessions_mcp_tokens{agent=\"worker\",direction=\"output\"}"), 30.0 * worker_runs);
    assert_eq!(get("sessions_mcp_cost_usd{agent=\"worker\"}"), 0.25 * worker_runs);
    assert!(get("sessions_mcp_sessions{agent=\"worker\"}") >= 1.0);
    assert_eq!(get("sessions_mcp_run_duration_seconds_count{agent=\"worker\",status=\"ok\",mode=\"send\"}"), 1.0);
    assert_eq!(get("sessions_mcp_run_wait_seconds_count{agent=\"worker\",mode=\"send\"}"), 1.0);
    assert!(get("sessions_mcp_tool_call_duration_seconds_count{tool=\"sessions_send\",status=\"ok\"}") >= 1.0);
    // A client's token, or none, gets nothing.
    for token in [Some(CLIENT), None, Some("nonsense")] {
        let (status, body) = scrape(server.port, token);
        assert_eq!(status, 401, "{token:?}: {body}");
        assert!(body.contains("server.operatorTokens"), "{body}");
    }
}

#[test]
fn public_metrics_need_no_token_on_loopback_and_are_refused_on_another_bind() {
    let env = env_with(json!({"metricsPublic": true}));
    let server = env.serve_http(&[]);
    let (status, text) = scrape(server.port, None);
    assert_eq!(status, 200, "{text}");
    parse(&text);
    let out = env.run(&["serve", "--http", "0.0.0.0:0", "--insecure-remote"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("server.metricsPublic"), "{out:?}");
}

#[test]
fn an_agent_label_is_a_configured_agent_and_every_other_agent_id_is_counted_as_other() {
    let env = env_with(json!({"operatorTokens": [{"sha256": sha(OPERATOR)}]}));
    // Sessions and runs of ids no config names (a store from before the bridges were checked, or
    // agents removed since): each would otherwise be a label value, and series, of its own.
    let ghosts: Vec<String> = (0..30).map(|i| format!("agent:ghost-{i}:discord:group:{i}")).collect();
    let sessions: Vec<_> = ghosts.iter().map(|k| json!({"key": k})).collect();
    let runs: Vec<_> = ghosts
        .iter()
        .enumerate()
        .map(|(i, k)| json!({"runId": format!("r-{i}"), "sessionKey": k, "status": "ok"}))
        .collect();
    env.seed(json!({"sessions": sessions, "runs": runs}));
    let server = env.serve_http(&[]);
    let (status, text) = scrape(server.port, Some(OPERATOR));
    assert_eq!(status, 200, "{text}");
    assert!(!text.contains("ghost"), "no label value from an unconfigured agent id:\n{text}");
    let samples = parse(&text);
    assert_eq!(samples.get("sessions_mcp_sessions{agent=\"_other\"}"), Some(&30.0), "{text}");
    assert_eq!(samples.get("sessions_mcp_runs{status=\"ok\",agent=\"_other\"}"), Some(&30.0), "{text}");
}

#[test]
fn metrics_from_a_foreign_host_or_origin_are_refused_as_the_dashboard_is() {
    let env = env_with(json!({"metricsPublic": true}));
    let server = env.serve_http(&[]);
    for foreign in [("Host", "evil.example"), ("Origin", "http://evil.example"), ("Host", "evil.example:80")] {
        let (status, _, body) = http_to(server.port, "GET", "/metrics", &[foreign], "");
        assert_eq!(status, 403, "{foreign:?} (DNS rebinding): {body}");
        assert!(body.contains("server.allowedHosts"), "{body}");
    }
    let origin = format!("http://localhost:{}", server.port);
    let (status, _, body) = http_to(server.port, "GET", "/metrics", &[("Origin", origin.as_str())], "");
    assert_eq!(status, 200, "an allowed Origin: {body}");
}
