//! Who answers a sub-agent's approval (issue 36), one route per test, black-box over stdio: a
//! person at a host that shows elicitations (answering after 3 s, as a person reads), a host that
//! declines at once without showing it (like Codex `exec`) and one known by its `clientInfo.name`,
//! a host with no elicitation at all (like Gemini CLI), a person past `personTimeoutSeconds`, and
//! the official TypeScript SDK as the host. Each asserts who answered — in the
//! transcript and the announce — and that the model never answered an approval the policy kept
//! from it.

use crate::common;

use std::time::Duration;

use common::{Client, TestEnv, text_of, wait_until};
use serde_json::{Value, json};

/// A host client declaring form elicitation (or none), named `name`, over `env`'s serve.
fn host(env: &TestEnv, name: &str, elicits: bool) -> Client {
    let capabilities = if elicits { json!({"elicitation": {"form": {}}}) } else { json!({}) };
    Client::start_as(env.command(&["serve"]), capabilities, name)
}

/// Spawns the asking child and waits for the wait that reports its approval.
fn spawn_and_wait_for_the_ask(c: &mut Client) -> (String, Value) {
    let r = c.call("sessions_spawn", json!({"task": "ask for a.txt"}));
    let child = r["childSessionKey"].as_str().unwrap_or_else(|| panic!("{r}")).to_string();
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    assert_eq!(w["status"], "attention", "{w}");
    assert_eq!(w["requests"][0]["kind"], "approval", "{w}");
    (child, w)
}

/// The `elicitation/create` the server pushed to the host.
fn pushed(c: &mut Client) -> Value {
    wait_until(Duration::from_secs(20), "the elicitation pushed to the host", || {
        c.pump(Duration::from_millis(100));
        c.take_notification("elicitation/create")
    })
}

fn answer_elicitation(c: &mut Client, request: &Value, result: Value) {
    c.send_raw(&json!({"jsonrpc": "2.0", "id": request["id"], "result": result}).to_string());
}

/// The model tries to answer: refused, and the refusal tells it to wait for the person.
fn the_model_is_refused(c: &mut Client, id: &str) {
    let r = c.call("subagents", json!({"action": "respond", "requestId": id, "decision": "allow"}));
    assert_eq!(r["status"], "forbidden", "{r}");
    let error = r["error"].as_str().unwrap();
    assert!(
        error.contains("is an approval for a person, not for you") && error.contains("your answer was not used"),
        "{r}"
    );
}

fn finished_outcome(c: &mut Client) -> String {
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 60}));
    assert_eq!(w["status"], "ok", "{w}");
    w["finished"][0]["outcome"].as_str().unwrap_or_else(|| panic!("{w}")).to_string()
}

fn transcript(env: &TestEnv, child: &str) -> Vec<String> {
    env.show(child)["messages"].as_array().unwrap().iter().map(|m| text_of(&m["content"])).collect()
}

/// The only answer line of the ask in the child's transcript.
fn answer_line(texts: &[String], id: &str) -> String {
    let lines: Vec<&String> = texts.iter().filter(|t| t.starts_with(&format!("[answer to {id} "))).collect();
    assert_eq!(lines.len(), 1, "{texts:?}");
    lines[0].clone()
}

/// TS SDK-like push: the person is asked and answers after 3 s; meanwhile the model is told the
/// child waits for a person, is not invited to answer, and is refused when it tries.
#[test]
fn a_person_at_the_host_answers_the_approval_and_the_model_is_told_to_wait() {
    let env = crate::asks::env_with(json!({}));
    let mut c = host(&env, "ts-like-host", true);
    let (child, w) = spawn_and_wait_for_the_ask(&mut c);
    let request = &w["requests"][0];
    let id = request["requestId"].as_str().unwrap().to_string();
    assert_eq!(request["waitsFor"], "person", "{w}");
    assert!(request["why"].as_str().unwrap().contains("shown to the person at your host (ts-like-host)"), "{w}");
    let note = w["note"].as_str().unwrap();
    assert!(note.contains("do not answer it yourself") && !note.contains("\"respond\""), "{note}");
    let l = c.call("subagents", json!({"action": "list"}));
    assert_eq!(l["children"][0]["pendingRequests"][0]["waitsFor"], "person", "{l}");

    let asked = pushed(&mut c);
    assert!(asked["params"]["message"].as_str().unwrap().contains("asks for approval: May I write ask for a.txt?"));
    the_model_is_refused(&mut c, &id);
    std::thread::sleep(Duration::from_secs(3));
    answer_elicitation(
        &mut c,
        &asked,
        json!({"action": "accept", "content": {"decision": "allow", "text": "from the person"}}),
    );

    let outcome = finished_outcome(&mut c);
    assert!(outcome.contains("Result: decision=allow answer=from the person\n"), "{outcome}");
    assert!(
        outcome.contains("Asked: approval \"May I write ask for a.txt?\": allow by a person at ts-like-host\n"),
        "{outcome}"
    );
    let line = answer_line(&transcript(&env, &child), &id);
    assert_eq!(
        line,
        format!("[answer to {id} by agent:main:main via elicitation, a person at ts-like-host] allow: from the person")
    );
    c.close();
}

/// A person who does not answer within `personTimeoutSeconds`: the approval falls to the model,
/// which answers; the person's form is withdrawn.
#[test]
fn after_the_person_timeout_the_model_may_answer_and_the_persons_form_is_withdrawn() {
    let env = crate::asks::env_with(json!({"approvals": {"personTimeoutSeconds": 2}}));
    let mut c = host(&env, "slow-person-host", true);
    let (child, w) = spawn_and_wait_for_the_ask(&mut c);
    let id = w["requests"][0]["requestId"].as_str().unwrap().to_string();
    assert_eq!(w["requests"][0]["waitsFor"], "person", "{w}");
    let asked = pushed(&mut c);
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    assert_eq!(w["requests"][0]["waitsFor"], "you", "{w}");
    assert!(w["requests"][0]["why"].as_str().unwrap().contains("personTimeoutSeconds"), "{w}");
    let ok =
        c.call("subagents", json!({"action": "respond", "requestId": id, "decision": "allow", "text": "model ok"}));
    assert_eq!(ok["status"], "ok", "{ok}");
    assert!(finished_outcome(&mut c).contains("allow by the model\n"));
    let cancelled = wait_until(Duration::from_secs(20), "the person's form withdrawn", || {
        c.pump(Duration::from_millis(100));
        c.take_notification("notifications/cancelled")
    });
    assert_eq!(cancelled["params"]["requestId"], asked["id"], "{cancelled}");
    assert!(answer_line(&transcript(&env, &child), &id).contains("via subagents, the model] allow: model ok"));
    c.close();
}

/// A host that declines every elicitation at once (as Codex `exec` does) has no person: the
/// child is not denied, the ask falls to the model (the next route with no operator), and the
/// transcript says the host answered by itself.
#[test]
fn a_host_that_declines_at_once_denies_nothing_and_the_ask_goes_to_the_model() {
    // A generous threshold: the test answers as fast as it can, whatever the machine's load.
    let env = crate::asks::env_with(json!({"approvals": {"autoAnswerMs": 10000}}));
    let mut c = host(&env, "auto-declining-host", true);
    let (child, w) = spawn_and_wait_for_the_ask(&mut c);
    let id = w["requests"][0]["requestId"].as_str().unwrap().to_string();
    assert_eq!(w["requests"][0]["waitsFor"], "person", "{w}");
    let asked = pushed(&mut c);
    answer_elicitation(&mut c, &asked, json!({"action": "decline"}));
    // The operator sees which routes were tried and how they went.
    let routes = wait_until(Duration::from_secs(20), "the host's unseen decline recorded", || {
        let out = env.run(&["ls", "--pending", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        let routes = v["pending"][0]["routes"].as_array()?.clone();
        routes.iter().any(|r| r["outcome"] == "unseen").then_some(routes)
    });
    assert_eq!(routes[0]["outcome"], "shown", "{routes:?}");
    assert_eq!(routes[1]["client"], "auto-declining-host", "{routes:?}");
    assert!(routes[1]["ms"].as_u64().is_some(), "{routes:?}");

    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    assert_eq!(w["status"], "attention", "{w}");
    assert_eq!(w["requests"][0]["requestId"], id.as_str(), "{w}");
    assert_eq!(w["requests"][0]["waitsFor"], "you", "the host's decline was no person's: {w}");
    assert!(
        w["requests"][0]["why"].as_str().unwrap().contains("no person answered at your host (auto-declining-host)"),
        "{w}"
    );
    assert!(w["note"].as_str().unwrap().contains("\"respond\""), "{w}");
    let ok =
        c.call("subagents", json!({"action": "respond", "requestId": id, "decision": "allow", "text": "model ok"}));
    assert_eq!(ok["status"], "ok", "{ok}");

    let outcome = finished_outcome(&mut c);
    assert!(outcome.contains("Result: decision=allow answer=model ok\n"), "not denied: {outcome}");
    assert!(outcome.contains("Asked: approval \"May I write ask for a.txt?\": allow by the model\n"), "{outcome}");
    let texts = transcript(&env, &child);
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with(&format!("[input request {id}: auto-declining-host answered it by itself in "))),
        "{texts:?}"
    );
    assert!(answer_line(&texts, &id).contains("via subagents, the model] allow: model ok"), "{texts:?}");
    c.close();
}

/// A host known by its name to decline unseen (`codex-mcp-client`, by default) is not asked at
/// all; with an operator watching, the approval waits for the operator, not the model.
#[test]
fn a_host_known_to_decline_is_not_asked_and_the_operator_answers_before_the_model() {
    let env = crate::asks::env_with(json!({"approvals": {"operatorWatches": true}}));
    let mut c = host(&env, "codex-mcp-client", true);
    let (child, w) = spawn_and_wait_for_the_ask(&mut c);
    let request = &w["requests"][0];
    let id = request["requestId"].as_str().unwrap().to_string();
    assert_eq!(request["waitsFor"], "person", "{w}");
    let why = request["why"].as_str().unwrap();
    assert!(why.contains("the operator answers it") && !why.contains("your host"), "{why}");
    the_model_is_refused(&mut c, &id);

    let out = env.run(&["respond", &id, "allow", "from the operator"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let outcome = finished_outcome(&mut c);
    assert!(outcome.contains("Result: decision=allow answer=from the operator\n"), "{outcome}");
    assert!(outcome.contains(": allow by the operator\n"), "{outcome}");
    assert!(c.take_notification("elicitation/create").is_none(), "a host known to decline is not asked");
    let line = answer_line(&transcript(&env, &child), &id);
    assert!(line.contains("by operator via operator, the operator] allow"), "{line}");
    c.close();
}

/// No elicitation at all (as Gemini CLI): no person is reachable, so by default the model answers
/// and the wait says it is the model's; a rule `modelMayAnswer: never` keeps the approval from the
/// model, and it ends by its own timeout with `onTimeout`.
#[test]
fn with_no_elicitation_the_model_answers_only_as_the_policy_allows() {
    let env = crate::asks::env_with(json!({}));
    let mut c = host(&env, "gemini-cli-mcp-client", false);
    let (child, w) = spawn_and_wait_for_the_ask(&mut c);
    let id = w["requests"][0]["requestId"].as_str().unwrap().to_string();
    assert_eq!(w["requests"][0]["waitsFor"], "you", "{w}");
    assert!(w["requests"][0]["why"].as_str().unwrap().starts_with("no person was asked"), "{w}");
    let ok = c.call("subagents", json!({"action": "respond", "requestId": id, "decision": "deny", "text": "no"}));
    assert_eq!(ok["status"], "ok", "{ok}");
    assert!(finished_outcome(&mut c).contains("deny by the model\n"));
    assert!(answer_line(&transcript(&env, &child), &id).contains("via subagents, the model] deny: no"));
    c.close();

    let rules = json!([{"tool": "Wri*", "modelMayAnswer": "never"}]);
    let env = crate::asks::env_with(json!({"approvals": {"rules": rules, "timeoutSeconds": 3, "onTimeout": "deny"}}));
    let mut c = host(&env, "gemini-cli-mcp-client", false);
    let (child, w) = spawn_and_wait_for_the_ask(&mut c);
    let id = w["requests"][0]["requestId"].as_str().unwrap().to_string();
    assert_eq!(w["requests"][0]["waitsFor"], "person", "{w}");
    assert!(w["requests"][0]["why"].as_str().unwrap().contains("no person can be reached"), "{w}");
    the_model_is_refused(&mut c, &id);
    let outcome = finished_outcome(&mut c);
    assert!(outcome.contains("Result: decision=deny answer=no answer within approvals.timeoutSeconds"), "{outcome}");
    assert!(outcome.contains(": deny by no one in time\n"), "{outcome}");
    assert!(answer_line(&transcript(&env, &child), &id).contains("by timeout via timeout, no one in time] deny"));
    c.close();
}

/// The official TypeScript SDK as the host (`tests/clients/ts_elicit.mjs`): the person answers the
/// pushed elicitation after 3 s; the script's model answers what the wait calls its own and is
/// refused the approval, so the child gets the person's answer.
#[test]
fn a_typescript_sdk_host_gets_its_persons_answer_not_the_models() {
    let Some(sdk) = crate::mcp_apps::ext_apps(false) else { return };
    let env = crate::asks::env_with(json!({}));
    let serve = env.command(&["serve"]);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/ts_elicit.mjs");
    let out = std::process::Command::new("node")
        .arg(&script)
        .arg(&sdk)
        .arg("--")
        .arg(serve.get_program())
        .args(serve.get_args())
        .envs(serve.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("ok"),
        "the TypeScript SDK host failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
