//! `sessions-mcp token create|list|revoke`, black-box (issue 36, point 5): a minted operator
//! token opens the dashboard and `/metrics`, a minted client token calls `tools/list` on `/mcp`
//! as its session, `token list` never shows a token, and a revoked token stops signing in on the
//! server that is already running. Bad arguments are refused with what was wrong.

use crate::common;

use common::TestEnv;
use common::http_client::{Mcp, http_to};
use serde_json::{Value, json};

fn env() -> TestEnv {
    let mut env = TestEnv::new();
    let main = common::scripted_agent(&env, "main", &json!({"default": {"reply": "ok"}}), json!({}));
    env.set_config(&common::agents_config(vec![main], json!({})));
    env
}

/// Runs `token ARGS…` and returns (exit code, stdout, stderr).
fn token(env: &TestEnv, args: &[&str]) -> (i32, String, String) {
    let out = env.run(&[&["token"], args].concat());
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// `token create ARGS… --json`: the minted row with its token.
fn create(env: &TestEnv, args: &[&str]) -> Value {
    let (code, out, err) = token(env, &[&["create", "--json"], args].concat());
    assert_eq!(code, 0, "{out}{err}");
    serde_json::from_str(&out).unwrap()
}

fn get(port: u16, path: &str, token: &str) -> (u16, String) {
    let auth = format!("Bearer {token}");
    let (status, _, body) = http_to(port, "GET", path, &[("Authorization", &auth)], "");
    (status, body)
}

#[test]
fn minted_tokens_sign_in_as_operator_and_client_are_listed_without_the_token_and_stop_at_revoke() {
    let env = env();
    // The plain form prints the token alone on stdout, and what it is on stderr.
    let (code, plain, said) = token(&env, &["create", "--operator", "--label", "laptop"]);
    assert_eq!(code, 0, "{plain}{said}");
    let operator = plain.trim().to_string();
    assert!(operator.starts_with("smcp_operator_") && operator.len() > 70, "{operator}");
    assert!(said.contains("shown only now"), "{said}");
    let client = create(&env, &["--client", "agent:main:desk", "--label", "desk"]);
    assert_eq!((client["kind"].as_str(), client["sessionKey"].as_str()), (Some("client"), Some("agent:main:desk")));
    let client_token = client["token"].as_str().unwrap().to_string();

    let (code, listed, _) = token(&env, &["list", "--json"]);
    assert_eq!(code, 0);
    assert!(!listed.contains(&operator) && !listed.contains(&client_token), "never a token: {listed}");
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let rows = listed["tokens"].as_array().unwrap();
    let labels: Vec<&str> = rows.iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["laptop", "desk"], "{listed}");
    let tail = rows[1]["hashTail"].as_str().unwrap();
    assert_eq!(tail.len(), 4, "{listed}");
    use sha2::Digest;
    assert!(hex::encode(sha2::Sha256::digest(client_token.as_bytes())).ends_with(tail), "the hash's last 4");
    let (_, table, _) = token(&env, &["list"]);
    assert!(table.contains("laptop") && table.contains("agent:main:desk") && !table.contains(&operator), "{table}");

    let http = env.serve_http(&[]);
    let (status, view) = get(http.port, "/ui/api/view", &operator);
    assert_eq!(status, 200, "{view}");
    assert_eq!(serde_json::from_str::<Value>(&view).unwrap()["viewer"]["operator"], true, "{view}");
    let (status, metrics) = get(http.port, "/metrics", &operator);
    assert_eq!(status, 200, "{metrics}");
    let mut desk = Mcp::legacy(http.port, &client_token);
    let tools = desk.rpc("tools/list", json!({}));
    let names: Vec<&str> =
        tools["result"]["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"sessions_list"), "{tools}");
    let (status, _) = get(http.port, "/metrics", &client_token);
    assert_eq!(status, 401, "a client token is not an operator's");
    let (status, view) = get(http.port, "/ui/api/view", &client_token);
    assert_eq!(serde_json::from_str::<Value>(&view).unwrap()["viewer"]["operator"], false, "{status} {view}");

    // Revoked while the server runs: refused at the next request.
    let (code, out, err) = token(&env, &["revoke", "laptop"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("revoked") && out.contains("laptop"), "{out}");
    assert_eq!(get(http.port, "/ui/api/view", &operator).0, 401);
    assert_eq!(get(http.port, "/metrics", &operator).0, 401);
    let (code, _, _) = token(&env, &["revoke", client["id"].as_str().unwrap()]);
    assert_eq!(code, 0);
    let (status, _, body) = desk.post(json!({"jsonrpc": "2.0", "id": 99, "method": "tools/list"}), "tools/list", None);
    assert_eq!(status, 401, "{body}");
    let (_, listed, _) = token(&env, &["list", "--json"]);
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert!(listed["tokens"].as_array().unwrap().iter().all(|t| t["revokedAt"].is_string()), "{listed}");
}

#[test]
fn bad_token_arguments_are_refused_with_what_was_wrong_and_change_nothing() {
    let env = env();
    create(&env, &["--operator", "--label", "ci"]);
    let cases: [(&[&str], &str); 6] = [
        (&["create"], "--operator"),
        (&["create", "--operator", "--client", "agent:main:x"], "cannot be used with"),
        (&["create", "--operator", "--label", "ci"], "already names a live token"),
        (&["create", "--operator", "--label", "tok_x"], "tok_"),
        (&["create", "--client", "agent::"], "--client \"agent::\" is not a session key"),
        (&["revoke", "nobody"], "no live token has the id or label \"nobody\""),
    ];
    for (args, said) in cases {
        let (code, out, err) = token(&env, args);
        assert_ne!(code, 0, "{args:?}: {out}");
        assert!(err.contains(said), "{args:?}: {err}");
    }
    let (_, listed, _) = token(&env, &["list", "--json"]);
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["tokens"].as_array().unwrap().len(), 1, "nothing was made: {listed}");
}
