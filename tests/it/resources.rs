//! Transcripts as MCP resources over stdio: template, list, read through the access façade
//! (invisible and unknown answer alike), and subscriptions with `notifications/resources/updated`:
//! the per-caller cap, one subscription per transcript whatever form its URI takes, and slots
//! given back when an HTTP MCP session ends.

use crate::common;

use std::time::{Duration, Instant};

use common::TestEnv;
use common::http_client::{Mcp, http};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const KID1: &str = "sessions://history/agent:main:subagent:11111111-1111-4111-8111-111111111111";
const KID2: &str = "sessions://history/agent:main:subagent:22222222-2222-4222-8222-222222222222";

fn world(env: &TestEnv) {
    env.seed(json!({"sessions": [
        {"key": "agent:main:main", "messages": [{"role": "user", "content": "hello"}]},
        {"key": "agent:main:subagent:11111111-1111-4111-8111-111111111111", "spawnedBy": "agent:main:main", "label": "kid"},
        {"key": "agent:main:subagent:22222222-2222-4222-8222-222222222222", "spawnedBy": "agent:main:main"},
        {"key": "agent:main:discord:group:dev", "messages": [{"role": "user", "content": "secret group"}]}
    ]}));
}

#[test]
fn templates_list_and_read_follow_visibility() {
    let env = TestEnv::new();
    world(&env);
    let mut c = env.serve(None);
    let t = c.request("resources/templates/list", json!({}));
    assert_eq!(t["result"]["resourceTemplates"][0]["uriTemplate"], "sessions://history/{key}", "{t}");
    let list = c.request("resources/list", json!({}));
    let mut uris: Vec<&str> =
        list["result"]["resources"].as_array().unwrap().iter().map(|r| r["uri"].as_str().unwrap()).collect();
    uris.sort();
    assert_eq!(uris, ["sessions://history/agent:main:main", KID1, KID2], "the caller's tree only");
    let read = c.request("resources/read", json!({"uri": "sessions://history/main"}));
    let text = read["result"]["contents"][0]["text"].as_str().unwrap();
    let history: Value = serde_json::from_str(text).unwrap();
    assert_eq!(history["messages"][0]["content"], "hello");
    assert_eq!(read["result"]["contents"][0]["mimeType"], "application/json");
    // Invisible (exists) and unknown answer alike, apart from the echoed uri.
    let hidden = c.request("resources/read", json!({"uri": "sessions://history/agent:main:discord:group:dev"}));
    let missing = c.request("resources/read", json!({"uri": "sessions://history/agent:main:discord:group:zzz"}));
    assert!(hidden.get("error").is_some(), "{hidden}");
    let norm = |v: &Value, from: &str| {
        v.to_string().replace(from, "U").replace("\"id\":5", "\"id\":N").replace("\"id\":6", "\"id\":N")
    };
    assert_eq!(norm(&hidden, "agent:main:discord:group:dev"), norm(&missing, "agent:main:discord:group:zzz"));
    assert!(!hidden.to_string().contains("secret group"));
}

#[test]
fn a_subscribed_transcript_notifies_when_it_grows() {
    let env = TestEnv::new();
    world(&env);
    let mut c = env.serve(None);
    let r = c.request("resources/subscribe", json!({"uri": "sessions://history/main"}));
    assert!(r.get("result").is_some(), "{r}");
    let bad = c.request("resources/subscribe", json!({"uri": "sessions://history/agent:main:discord:group:dev"}));
    assert!(bad.get("error").is_some(), "{bad}");
    // Something lands in main's inbox: an owner message injected by another process.
    let out = env.run(&["inject", "main", "you have mail"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(n) = c.take_notification("notifications/resources/updated") {
            assert_eq!(n["params"]["uri"], "sessions://history/main");
            break;
        }
        assert!(Instant::now() < deadline, "no update notification");
        c.pump(Duration::from_millis(100));
    }
}

/// 50 spellings of `main`'s URI: aliases, and `agent:main:main` in every mix of case.
fn forms_of_main() -> Vec<String> {
    let mut forms = vec!["main".to_string(), "MAIN".to_string(), "Main".to_string()];
    let canonical = "agent:main:main";
    for mask in 0u32.. {
        if forms.len() == 50 {
            break;
        }
        let letters = canonical.chars().enumerate();
        let form: String =
            letters.map(|(i, c)| if mask & (1 << i) != 0 { c.to_ascii_uppercase() } else { c }).collect();
        if !forms.contains(&form) {
            forms.push(form);
        }
    }
    forms.into_iter().map(|f| format!("sessions://history/{f}")).collect()
}

fn with_cap(cap: u32) -> TestEnv {
    let env = TestEnv::with_config(&format!("{{server: {{maxSubscriptions: {cap}}}}}"));
    world(&env);
    env
}

fn subscribe(c: &mut common::Client, uri: &str) -> Value {
    c.request("resources/subscribe", json!({"uri": uri}))
}

#[test]
fn subscribing_past_the_cap_names_the_cap_and_its_config_key() {
    let env = with_cap(2);
    let mut c = env.serve(None);
    for uri in ["sessions://history/main", KID1] {
        let r = subscribe(&mut c, uri);
        assert!(r.get("result").is_some(), "{uri}: {r}");
    }
    let refused = subscribe(&mut c, KID2);
    let message = refused["error"]["message"].as_str().unwrap_or_else(|| panic!("accepted past the cap: {refused}"));
    assert!(message.contains("server.maxSubscriptions = 2") && message.contains("already watches 2"), "{message}");
    assert_eq!(refused["error"]["data"], json!({"limit": 2, "configKey": "server.maxSubscriptions"}));
}

#[test]
fn every_form_of_one_uri_is_one_subscription() {
    let env = with_cap(2);
    let mut c = env.serve(None);
    for uri in forms_of_main() {
        let r = subscribe(&mut c, &uri);
        assert!(r.get("result").is_some(), "{uri}: {r}");
    }
    assert!(subscribe(&mut c, KID1).get("result").is_some(), "50 forms of main took one slot");
    assert!(subscribe(&mut c, KID2).get("error").is_some(), "main and kid 1 fill the cap of 2");
    // One unsubscribe, in yet another form, ends main's subscription and frees its slot.
    let r = c.request("resources/unsubscribe", json!({"uri": "sessions://history/AGENT:MAIN:MAIN"}));
    assert!(r.get("result").is_some(), "{r}");
    assert!(subscribe(&mut c, KID2).get("result").is_some(), "the slot came back");
    assert!(subscribe(&mut c, "sessions://history/main").get("error").is_some(), "main is no longer held");
}

#[test]
fn one_append_notifies_once_however_many_forms_were_subscribed() {
    let env = TestEnv::new();
    world(&env);
    let mut c = env.serve(None);
    let forms = forms_of_main();
    for uri in &forms {
        assert!(subscribe(&mut c, uri).get("result").is_some());
    }
    let out = env.run(&["inject", "main", "you have mail"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        if let Some(n) = c.take_notification("notifications/resources/updated") {
            break n;
        }
        assert!(Instant::now() < deadline, "no update notification");
        c.pump(Duration::from_millis(100));
    };
    assert_eq!(first["params"]["uri"], forms[49].as_str(), "the form subscribed last is the one notified");
    // Copies would be written right behind the first one.
    c.pump(Duration::from_millis(500));
    assert!(c.take_notification("notifications/resources/updated").is_none(), "one append, one notification");
}

const DESK: &str = "desk-token-0123456789";

/// Token `DESK` acting as `agent:main:desk` (one message), with `server.maxSubscriptions: 1`.
fn desk_with_one_subscription() -> TestEnv {
    let env = TestEnv::with_config(&format!(
        "{{server: {{maxSubscriptions: 1, tokens: [{{sha256: '{}', sessionKey: 'agent:main:desk'}}]}}}}",
        hex::encode(Sha256::digest(DESK.as_bytes()))
    ));
    env.seed(json!({"sessions": [{"key": "agent:main:desk", "messages": [{"role": "user", "content": "hi"}]}]}));
    env
}

#[test]
fn an_http_session_gives_its_subscriptions_back_when_it_ends() {
    let env = desk_with_one_subscription();
    let server = env.serve_http(&[]);
    let desk = json!({"uri": "sessions://history/agent:main:desk"});
    let mut first = Mcp::legacy(server.port, DESK);
    let r = first.rpc("resources/subscribe", desk.clone());
    assert!(r.get("result").is_some(), "{r}");
    // The cap is the caller's, over all its MCP sessions.
    let mut second = Mcp::legacy(server.port, DESK);
    let refused = second.rpc("resources/subscribe", desk.clone());
    assert!(refused.get("error").is_some(), "the token's second MCP session went past its cap: {refused}");
    let sid = first.session.clone().unwrap();
    let auth = format!("Bearer {DESK}");
    let (status, _, body) = http(server.port, "DELETE", &[("Authorization", &auth), ("Mcp-Session-Id", &sid)], "");
    assert!((200..300).contains(&status), "DELETE: {status} {body}");
    // The ended session's service is dropped shortly after the DELETE; the wait is a hang guard.
    common::wait_until(Duration::from_secs(30), "the deleted session's slot", || {
        second.rpc("resources/subscribe", desk.clone()).get("result").map(|_| ())
    });
}

#[test]
fn a_listen_counts_every_uri_it_names_against_the_cap() {
    let env = desk_with_one_subscription();
    let server = env.serve_http(&[]);
    let mut c = Mcp::modern(server.port, DESK);
    // A session desk may not see counts too, so that the cap cannot tell whether it exists.
    let uris = ["sessions://history/agent:main:desk", "sessions://history/agent:main:other"];
    let r = c.rpc("subscriptions/listen", json!({"notifications": {"resourceSubscriptions": uris}}));
    let message = r["error"]["message"].as_str().unwrap_or_else(|| panic!("accepted past the cap: {r}"));
    assert!(message.contains("server.maxSubscriptions = 1"), "{message}");
}
