//! Transcripts as MCP resources over stdio: template, list, read through the access façade
//! (invisible and unknown answer alike), and subscriptions with `notifications/resources/updated`.

mod common;

use std::time::{Duration, Instant};

use common::TestEnv;
use serde_json::{Value, json};

fn world(env: &TestEnv) {
    env.seed(json!({"sessions": [
        {"key": "agent:main:main", "messages": [{"role": "user", "content": "hello"}]},
        {"key": "agent:main:subagent:11111111-1111-4111-8111-111111111111", "spawnedBy": "agent:main:main", "label": "kid"},
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
    assert_eq!(
        uris,
        [
            "sessions://history/agent:main:main",
            "sessions://history/agent:main:subagent:11111111-1111-4111-8111-111111111111"
        ],
        "the caller's tree only"
    );
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
