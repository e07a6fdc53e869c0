//! Federation over A2A (issue 39, docs/A2A.md): two of our deployments, the origin configured with
//! the remote's agent as a child (`runner.kind: "a2a"`), the remote serving it over A2A to the
//! origin's client token. A model at the origin spawns on the remote; the remote's run asks an
//! approval, which reaches the person at the origin's host and goes back into the same task; the
//! result arrives through the origin's ledger and `subagents wait`, once, across a restart of the
//! origin; the origin's cancel stops the remote run.

use crate::a2a_inbound::{ALICE, rpc, sha};
use crate::a2a_outbound::{assistant_texts, ended_run, finished, wait_remote_task};
use crate::common;

use std::time::Duration;

use common::{Client, HttpServer, TestEnv, scripted_agent, wait_until};
use serde_json::{Value, json};

const TOKEN_ENV: &str = "FEDERATION_PEER_TOKEN";

/// The remote deployment: `main`, served over A2A, to the origin signed in as `agent:main:origin`.
/// It asks an approval on "approve", takes a few seconds on "slow", a minute on "long".
struct Remote {
    env: TestEnv,
    server: HttpServer,
}

impl Remote {
    fn start() -> Remote {
        let mut env = TestEnv::new();
        let script = json!({"rules": [
            {"match": {"input": "approve"}, "ask": {"kind": "approval", "text": "May I deploy the release?", "details": {"toolName": "Deploy"}},
             "reply": "deployed: decision={decision} answer={answer}"},
            {"match": {"input": "slow"}, "sleepMs": 5000, "reply": "slow done"},
            {"match": {"input": "long"}, "sleepMs": 60_000, "reply": "too late"},
        ], "default": {"reply": "ECHO: {input}"}});
        let mut main = scripted_agent(&env, "main", &script, json!({}));
        main["description"] = json!("Deploys releases, asking first.");
        env.set_config(
            &json!({
                "agents": {"list": [main]},
                "server": {"tokens": [{"sha256": sha(ALICE), "sessionKey": "agent:main:origin"}], "a2a": {"agents": ["main"]}},
            })
            .to_string(),
        );
        let server = env.serve_http(&[]);
        Remote { env, server }
    }

    /// The origin's config: its `main` may spawn `remote`, this deployment's `main`.
    fn origin(&self) -> TestEnv {
        let card = format!("http://127.0.0.1:{}/a2a/main/.well-known/agent-card.json", self.server.port);
        TestEnv::with_config(
            &json!({"agents": {"list": [
                {"id": "main", "default": true, "subagents": {"allowAgents": ["remote"]}},
                {"id": "remote", "runner": {"kind": "a2a", "cardUrl": card, "tokenEnv": TOKEN_ENV, "timeoutSeconds": 120}},
            ]}})
            .to_string(),
        )
    }

    /// The state of our task `id` as the origin sees it over A2A (`GetTask` with its token).
    fn task_state(&self, id: &str) -> Value {
        let (status, body) = rpc(self.server.port, ALICE, "GetTask", json!({"id": id}));
        assert_eq!(status, 200, "{body}");
        body["result"]["status"]["state"].clone()
    }
}

/// The origin's host: a client that shows elicitations to its person, the peer token in its env.
fn origin_host(origin: &TestEnv) -> Client {
    let mut cmd = origin.command(&["serve"]);
    cmd.env(TOKEN_ENV, ALICE);
    Client::start_as(cmd, json!({"elicitation": {"form": {}}}), "origin-host")
}

fn spawn_remote(c: &mut Client, task: &str) -> String {
    let r = c.call("sessions_spawn", json!({"task": task, "agentId": "remote"}));
    r["childSessionKey"].as_str().unwrap_or_else(|| panic!("{r}")).to_string()
}

/// The remote run's approval is an approval at the origin, for the person at its host (not the
/// model): answered there, it goes back into the remote task, whose result is the child's.
#[test]
fn a_spawn_on_the_remote_deployment_asks_the_person_at_the_origin_and_returns_its_result() {
    let remote = Remote::start();
    let origin = remote.origin();
    let mut c = origin_host(&origin);
    let child = spawn_remote(&mut c, "approve the release");

    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 60}));
    assert_eq!(w["status"], "attention", "{w}");
    let request = &w["requests"][0];
    assert_eq!((request["kind"].as_str(), request["waitsFor"].as_str()), (Some("approval"), Some("person")), "{w}");
    assert!(w.to_string().contains("May I deploy the release?"), "the remote's question: {w}");
    let asked = wait_until(Duration::from_secs(20), "the elicitation pushed to the origin's host", || {
        c.pump(Duration::from_millis(100));
        c.take_notification("elicitation/create")
    });
    assert!(asked["params"]["message"].as_str().unwrap().contains("May I deploy the release?"), "{asked}");
    let answer = json!({"action": "accept", "content": {"decision": "allow", "text": "ship it"}});
    c.send_raw(&json!({"jsonrpc": "2.0", "id": asked["id"], "result": answer}).to_string());

    let done = finished(&mut c);
    let outcome = done["outcome"].as_str().unwrap();
    assert!(outcome.contains("Status: completed successfully"), "{outcome}");
    assert!(outcome.contains("deployed: decision=allow answer=ship it"), "{outcome}");
    let run = ended_run(&origin, &child);
    let task = run["remoteTaskId"].as_str().unwrap();
    assert_eq!(remote.task_state(task), "TASK_STATE_COMPLETED");
    c.close();
}

/// The origin's server dies while the remote run works; the next one follows the same task and
/// the result arrives once (the remote ran one task, was sent one message).
#[test]
fn a_restart_of_the_origin_while_the_remote_works_delivers_the_result_once() {
    let remote = Remote::start();
    let origin = remote.origin();
    let mut c = origin_host(&origin);
    let child = spawn_remote(&mut c, "slow");
    let task = wait_remote_task(&origin, &child);
    c.kill_now();

    let mut again = origin_host(&origin);
    let run = ended_run(&origin, &child);
    assert_eq!((run["status"].as_str(), run["remoteTaskId"].as_str()), (Some("ok"), Some(task.as_str())), "{run}");
    assert_eq!(assistant_texts(&origin, &child), ["slow done"], "the result, once");
    let done = finished(&mut again);
    assert!(done["outcome"].as_str().unwrap().contains("slow done"), "{done}");
    assert_eq!(remote.task_state(&task), "TASK_STATE_COMPLETED");
    assert_eq!(remote.env.run_counts()["ok"], 1, "the remote ran one task: {}", remote.env.run_counts());
    again.close();
}

/// `subagents cancel` at the origin cancels the remote task, and the remote run stops.
#[test]
fn a_cancel_at_the_origin_stops_the_work_on_the_remote() {
    let remote = Remote::start();
    let origin = remote.origin();
    let mut c = origin_host(&origin);
    let child = spawn_remote(&mut c, "long");
    let task = wait_remote_task(&origin, &child);
    wait_until(Duration::from_secs(30), "the remote task working", || {
        (remote.task_state(&task) == "TASK_STATE_WORKING").then_some(())
    });
    let r = c.call("subagents", json!({"action": "cancel", "childSessionKey": child}));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(ended_run(&origin, &child)["status"], "cancelled");
    wait_until(Duration::from_secs(30), "the remote run cancelled", || {
        (remote.task_state(&task) == "TASK_STATE_CANCELED").then_some(())
    });
    assert_eq!(remote.env.unfinished_runs(), 0, "nothing left running on the remote");
    c.close();
}
