//! Remote agents as children (issue 39, docs/A2A.md), black-box: a small agent built on the
//! official Python A2A SDK's server (`tests/clients/a2a_agent.py`, PyPI `a2a-sdk` pinned in
//! `tests/clients/requirements.txt`) is our agent `remote` (`runner.kind: "a2a"`, its card on
//! loopback, a bearer token by env var). Over stdio: a spawn's result and the session's next turn
//! in the same remote context, an `input-required` travelling up to our MCP client and answered,
//! our cancel reaching the agent, and a restart of our server while the remote task runs (the
//! result arrives once).
//!
//! The interpreter is `$SESSIONS_MCP_PYTHON`, as for tests/it/python_sdk.rs; without one that can
//! import `a2a` the tests say so and pass locally, and fail under CI.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Client, TestEnv, text_of, wait_until};
use serde_json::{Value, json};

const TOKEN_ENV: &str = "REMOTE_AGENT_TOKEN";
const TOKEN: &str = "remote-agent-token-0123456789";

fn python() -> Option<String> {
    crate::python_sdk::python_with("a2a.server", "a2a-sdk")
}

/// The Python remote agent, stopped when dropped.
struct RemoteAgent {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl RemoteAgent {
    fn start(python: &str, streaming: bool) -> RemoteAgent {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("agent.log");
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/a2a_agent.py");
        let mut cmd = Command::new(python);
        cmd.arg(script).arg(&log).env("A2A_AGENT_TOKEN", TOKEN).stdout(Stdio::piped()).stderr(Stdio::inherit());
        if !streaming {
            cmd.arg("--no-streaming");
        }
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().strip_prefix("PORT ").unwrap_or_else(|| panic!("agent said {line:?}")).parse().unwrap();
        let agent = RemoteAgent { child, port, log, _dir: dir };
        wait_until(Duration::from_secs(30), "the remote agent serving its card", || {
            std::net::TcpStream::connect(("127.0.0.1", agent.port)).ok()
        });
        agent
    }

    /// Our config: `main` may spawn `remote`, the Python agent.
    fn env(&self) -> TestEnv {
        self.env_with(json!({}))
    }

    /// [`Self::env`] with these `agents.defaults.subagents`.
    fn env_with(&self, subagents: Value) -> TestEnv {
        self.env_of(subagents, json!({}))
    }

    /// [`Self::env_with`], with these keys added to `remote`'s runner.
    fn env_of(&self, subagents: Value, runner: Value) -> TestEnv {
        let card = format!("http://127.0.0.1:{}/.well-known/agent-card.json", self.port);
        let mut remote =
            json!({"kind": "a2a", "cardUrl": card, "tokenEnv": TOKEN_ENV, "skill": "echo", "timeoutSeconds": 120});
        remote.as_object_mut().unwrap().extend(runner.as_object().unwrap().clone());
        TestEnv::with_config(
            &json!({"agents": {"defaults": {"subagents": subagents}, "list": [
                {"id": "main", "default": true, "subagents": {"allowAgents": ["remote"]}},
                {"id": "remote", "runner": remote},
            ]}})
            .to_string(),
        )
    }

    /// The lines the agent logged starting with `what`.
    fn logged(&self, what: &str) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().filter(|l| l.starts_with(what)).map(String::from).collect()
    }

    fn wait_logged(&self, what: &str, count: usize) -> Vec<String> {
        wait_until(Duration::from_secs(60), &format!("{count} `{what}` line(s) in the agent's log"), || {
            let lines = self.logged(what);
            (lines.len() >= count).then_some(lines)
        })
    }
}

impl Drop for RemoteAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(env: &TestEnv) -> Client {
    env.serve_with(None, &[(TOKEN_ENV, TOKEN)])
}

fn spawn_remote(c: &mut Client, task: &str) -> String {
    let r = c.call("sessions_spawn", json!({"task": task, "agentId": "remote"}));
    r["childSessionKey"].as_str().unwrap_or_else(|| panic!("{r}")).to_string()
}

pub(crate) fn finished(c: &mut Client) -> Value {
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 90}));
    assert_eq!(w["status"], "ok", "{w}");
    w["finished"][0].clone()
}

/// The agent got two messages, and they share their context (field 1) or task (field 2). The
/// announce step a `sessions_send` runs after its reply may have reached the agent by now, or not:
/// it is not counted.
fn two_messages_sharing(agent: &RemoteAgent, field: usize, what: &str) {
    let mut messages = agent.logged("message ");
    messages.retain(|m| !m.ends_with(" Agent-to-agent announce step."));
    let id = |line: &str| line.split(' ').nth(field).unwrap().to_string();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(id(&messages[0]), id(&messages[1]), "{what}: {messages:?}");
}

/// Waits until the child's run has stored its remote task.
pub(crate) fn wait_remote_task(env: &TestEnv, child: &str) -> String {
    wait_until(Duration::from_secs(30), "the remote task id stored", || {
        env.show(child)["runs"][0]["remoteTaskId"].as_str().map(String::from)
    })
}

/// Waits until the child's last run ended, and returns it.
pub(crate) fn ended_run(env: &TestEnv, child: &str) -> Value {
    wait_until(Duration::from_secs(60), "the run to end", || {
        let show = env.show(child);
        (show["runs"][0]["status"] != "running").then(|| show["runs"][0].clone())
    })
}

pub(crate) fn assistant_texts(env: &TestEnv, key: &str) -> Vec<String> {
    let show = env.show(key);
    let messages = show["messages"].as_array().unwrap();
    messages.iter().filter(|m| m["role"] == "assistant").map(|m| text_of(&m["content"])).collect()
}

/// A spawn is a task: its artifact and final message are the result, the usage the peer reported
/// is the run's, the remote task id is stored, and the session's next turn continues the same
/// remote context. Over a peer that does not stream (send, then `GetTask`).
#[test]
fn a_spawn_on_the_remote_agent_returns_its_result_and_the_next_turn_continues_its_context() {
    let Some(python) = python() else { return };
    for streaming in [true, false] {
        let agent = RemoteAgent::start(&python, streaming);
        let env = agent.env();
        let mut c = serve(&env);
        let child = spawn_remote(&mut c, "hello there");
        let done = finished(&mut c);
        let outcome = done["outcome"].as_str().unwrap();
        assert!(outcome.contains("echo: hello there") && outcome.contains("done"), "streaming {streaming}: {done}");
        assert_eq!(assistant_texts(&env, &child), ["echo: hello there\n\ndone"], "streaming {streaming}");
        let show = env.show(&child);
        let run = &show["runs"][0];
        assert_eq!(run["status"], "ok", "{show}");
        assert!(run["remoteTaskId"].as_str().is_some_and(|t| !t.is_empty()), "{show}");

        let r = c.call("sessions_send", json!({"sessionKey": child, "message": "second turn", "timeoutSeconds": 60}));
        assert_eq!(r["status"], "ok", "{r}");
        assert!(r["reply"].as_str().unwrap().contains("echo: second turn"), "{r}");
        two_messages_sharing(&agent, 1, "one remote context for the session");
        assert_eq!(agent.logged("card").len(), 1, "streaming {streaming}: two turns read the card once");
        c.close();
    }
}

/// The card cached from earlier turns names an endpoint the peer has since moved away from (it
/// answers 404 there): the next turn reads the card again, once, and reaches the peer where the
/// card now says; nothing was started at the old place.
#[test]
fn a_cached_card_whose_endpoint_went_away_is_read_again_once() {
    let Some(python) = python() else { return };
    let agent = RemoteAgent::start(&python, true);
    let env = agent.env();
    let mut c = serve(&env);
    let child = spawn_remote(&mut c, "move");
    let done = finished(&mut c);
    assert!(done["outcome"].as_str().unwrap().contains("moved"), "{done}");
    assert_eq!(agent.logged("card").len(), 1);
    let r = c.call("sessions_send", json!({"sessionKey": child, "message": "after the move", "timeoutSeconds": 60}));
    assert_eq!(r["status"], "ok", "{r}");
    assert!(r["reply"].as_str().unwrap().contains("echo: after the move"), "{r}");
    assert_eq!(agent.logged("card").len(), 2, "the card read again once");
    two_messages_sharing(&agent, 1, "the session's context carried over to the moved endpoint");
    c.close();
}

/// A peer's text is bounded like a local agent's stdout (`runner.maxStdoutBytes`): past it the run
/// ends `error` saying so, as a local run does, and the reply kept is cut at the bound. Streamed
/// (the artifact in appended pieces) and polled (one task carrying it whole).
#[test]
fn a_remote_agents_output_past_max_stdout_bytes_fails_the_run_and_is_cut_there() {
    let Some(python) = python() else { return };
    for streaming in [true, false] {
        let agent = RemoteAgent::start(&python, streaming);
        let env = agent.env_of(json!({}), json!({"maxStdoutBytes": 100_000}));
        let mut c = serve(&env);
        let child = spawn_remote(&mut c, "big 150000");
        let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 90}));
        let says = "protocol: the remote agent's output exceeded maxStdoutBytes (100000)";
        assert!(
            w.to_string().contains(says),
            "streaming {streaming}: {}",
            &w.to_string()[..2000.min(w.to_string().len())]
        );
        let run = ended_run(&env, &child);
        assert_eq!(
            (run["status"].as_str(), run["error"].as_str()),
            (Some("error"), Some(says)),
            "streaming {streaming}"
        );
        let texts = assistant_texts(&env, &child);
        let lengths: Vec<usize> = texts.iter().map(String::len).collect();
        assert_eq!(lengths, [100_000], "streaming {streaming}: the reply cut at the bound");
        let other =
            texts[0].find(|ch| ch != 'x').map(|at| &texts[0][at.saturating_sub(20)..(at + 80).min(texts[0].len())]);
        assert_eq!(other, None, "streaming {streaming}: the cut reply is the artifact's");
        c.close();
    }
}

/// The remote task goes `input-required`: our MCP client sees the question in `subagents wait`,
/// answers it with `respond`, and the answer goes into the same task, which completes.
#[test]
fn an_input_required_travels_up_to_our_client_and_its_answer_completes_the_same_task() {
    let Some(python) = python() else { return };
    let agent = RemoteAgent::start(&python, true);
    let env = agent.env();
    let mut c = serve(&env);
    let child = spawn_remote(&mut c, "ask: which colour?");
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 60}));
    assert_eq!(w["status"], "attention", "{w}");
    let request = &w["requests"][0];
    assert_eq!(
        (request["kind"].as_str(), request["childSessionKey"].as_str()),
        (Some("question"), Some(child.as_str())),
        "{w}"
    );
    assert!(w.to_string().contains("which colour?"), "{w}");
    let id = request["requestId"].as_str().unwrap();
    let r = c.call("subagents", json!({"action": "respond", "requestId": id, "decision": "allow", "text": "blue"}));
    assert_eq!(r["status"], "ok", "{r}");
    let done = finished(&mut c);
    assert!(done["outcome"].as_str().unwrap().contains("answer was: blue"), "{done}");
    two_messages_sharing(&agent, 2, "the answer went into the same task");
    c.close();
}

/// `auth-required` is an approval of the run; an allow goes into the same task as `yes`.
#[test]
fn an_auth_required_is_an_approval_and_its_allow_goes_into_the_task() {
    let Some(python) = python() else { return };
    let agent = RemoteAgent::start(&python, false);
    let env = agent.env();
    let mut c = serve(&env);
    let child = spawn_remote(&mut c, "auth: sign in to the registry");
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 60}));
    assert_eq!(w["status"], "attention", "{w}");
    let request = &w["requests"][0];
    assert_eq!(request["kind"], "approval", "{w}");
    assert!(w.to_string().contains("the remote agent asks for authorization: sign in to the registry"), "{w}");
    let id = request["requestId"].as_str().unwrap();
    let r = c.call("subagents", json!({"action": "respond", "requestId": id, "decision": "allow"}));
    assert_eq!(r["status"], "ok", "{r}");
    let done = finished(&mut c);
    assert!(done["outcome"].as_str().unwrap().contains("answer was: yes"), "{done}");
    assert_eq!(env.show(&child)["runs"][0]["status"], "ok");
    two_messages_sharing(&agent, 2, "the answer went into the same task");
    c.close();
}

/// A token budget cannot be promised for a peer that need not report usage: refused unless the
/// operator allows it; then the usage the peer does report counts against it.
#[test]
fn a_token_budget_refuses_a_remote_agent_unless_allowed_and_then_counts_what_the_peer_reports() {
    let Some(python) = python() else { return };
    let agent = RemoteAgent::start(&python, true);
    for allow in [false, true] {
        let env = agent.env_with(json!({"allowUnmetered": allow}));
        let mut c = serve(&env);
        let r = c.call("sessions_spawn", json!({"task": "metered", "agentId": "remote", "budget": {"tokens": 1000}}));
        if !allow {
            assert_eq!(r["status"], "forbidden", "{r}");
            let err = r["error"].as_str().unwrap();
            assert!(
                err.contains("agent \"remote\" is a remote agent (A2A), whose peer need not report its usage"),
                "{err}"
            );
        } else {
            assert_eq!(r["status"], "accepted", "{r}");
            let done = finished(&mut c);
            let outcome = done["outcome"].as_str().unwrap();
            assert!(
                outcome.contains("tokens 15 (in 12 / out 3)") && outcome.contains("budget 15/1,000 tokens"),
                "{outcome}"
            );
            assert!(!outcome.contains("unmetered"), "{outcome}");
        }
        c.close();
    }
}

/// `subagents cancel` sends `CancelTask`: the Python agent records the cancel of our task. Over a
/// streaming peer, and one polled (the send returns the task at once).
#[test]
fn our_cancel_reaches_the_remote_agent() {
    let Some(python) = python() else { return };
    for streaming in [true, false] {
        cancel_reaches(&python, streaming);
    }
}

fn cancel_reaches(python: &str, streaming: bool) {
    let agent = RemoteAgent::start(python, streaming);
    let env = agent.env();
    let mut c = serve(&env);
    let child = spawn_remote(&mut c, "slow 60");
    let task = wait_remote_task(&env, &child);
    let r = c.call("subagents", json!({"action": "cancel", "childSessionKey": child}));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(agent.wait_logged("cancel ", 1), [format!("cancel {task}")]);
    let run = ended_run(&env, &child);
    assert_eq!(run["status"], "cancelled", "{run}");
    assert!(agent.logged("done ").is_empty(), "the remote work was stopped");
    c.close();
}

/// The run's deadline cancels the remote task too, and the run ends `timeout`.
#[test]
fn the_runs_deadline_cancels_the_remote_task() {
    let Some(python) = python() else { return };
    let agent = RemoteAgent::start(&python, true);
    let env = agent.env();
    let mut c = serve(&env);
    let r = c.call("sessions_spawn", json!({"task": "slow 60", "agentId": "remote", "runTimeoutSeconds": 2}));
    let child = r["childSessionKey"].as_str().unwrap_or_else(|| panic!("{r}")).to_string();
    let run = ended_run(&env, &child);
    assert_eq!((run["status"].as_str(), run["error"].as_str()), (Some("timeout"), Some("timed out after 2s")), "{run}");
    let task = run["remoteTaskId"].as_str().unwrap();
    assert_eq!(agent.wait_logged("cancel ", 1), [format!("cancel {task}")]);
    c.close();
}

/// Our server dies (SIGKILL), or stops gracefully (SIGTERM), while the remote task runs; the next
/// one takes the run over and follows the task (it never sends the message again, and a graceful
/// stop does not cancel it): the result arrives once. A peer that does not stream is polled.
#[test]
fn a_remote_run_survives_a_restart_of_our_server_and_its_result_arrives_once() {
    let Some(python) = python() else { return };
    for (graceful, streaming) in [(false, true), (true, true), (false, false)] {
        let agent = RemoteAgent::start(&python, streaming);
        let env = agent.env();
        let mut c = serve(&env);
        let child = spawn_remote(&mut c, "slow 6");
        wait_remote_task(&env, &child);
        if graceful {
            assert!(c.terminate_and_wait(Duration::from_secs(30)).success());
            assert_eq!(env.show(&child)["runs"][0]["status"], "running", "left running for the next owner");
        } else {
            c.kill_now();
        }

        let mut again = serve(&env);
        let run = ended_run(&env, &child);
        assert_eq!(run["status"], "ok", "graceful {graceful}, streaming {streaming}: {run}");
        assert_eq!(assistant_texts(&env, &child), ["slow done"], "the result, once");
        assert_eq!(agent.logged("message ").len(), 1, "the message was never sent again");
        assert!(agent.logged("cancel ").is_empty(), "the remote task was not cancelled");
        let done = finished(&mut again);
        assert!(done["outcome"].as_str().unwrap().contains("slow done"), "{done}");
        again.close();
    }
}

/// A question the remote task waits on when our server dies is asked again by the next one (the
/// first ask withdrawn, one open request), and its answer still completes the same task.
#[test]
fn a_question_open_at_a_restart_is_asked_again_once_and_answered_into_the_same_task() {
    let Some(python) = python() else { return };
    let agent = RemoteAgent::start(&python, true);
    let env = agent.env();
    let mut c = serve(&env);
    let child = spawn_remote(&mut c, "ask: still there?");
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 60}));
    assert_eq!(w["status"], "attention", "{w}");
    let first = w["requests"][0]["requestId"].as_str().unwrap().to_string();
    c.kill_now();

    let mut again = serve(&env);
    let w = wait_until(Duration::from_secs(60), "the question asked again", || {
        let w = again.call("subagents", json!({"action": "wait", "timeoutSeconds": 5}));
        let asked = w["requests"].as_array().is_some_and(|r| r.iter().any(|q| q["requestId"] != first.as_str()));
        asked.then_some(w)
    });
    let requests = w["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 1, "only the new ask is open: {w}");
    let id = requests[0]["requestId"].as_str().unwrap();
    let r = again.call("subagents", json!({"action": "respond", "requestId": id, "decision": "allow", "text": "yes"}));
    assert_eq!(r["status"], "ok", "{r}");
    let run = ended_run(&env, &child);
    assert_eq!(run["status"], "ok", "{run}");
    assert!(
        assistant_texts(&env, &child).iter().any(|t| t == "answer was: yes"),
        "{:?}",
        assistant_texts(&env, &child)
    );
    two_messages_sharing(&agent, 2, "the answer went into the task the first server started");
    again.close();
}

/// What a caller is told when the remote agent cannot be used: its token variable unset, or a
/// token the agent refuses.
#[test]
fn a_missing_or_refused_token_fails_the_run_saying_which() {
    let Some(python) = python() else { return };
    let agent = RemoteAgent::start(&python, true);
    let env = agent.env();
    for (token, says) in [
        (None, "the remote agent's token variable REMOTE_AGENT_TOKEN (runner.tokenEnv) is not set on the server"),
        (Some("a-wrong-token"), "401"),
    ] {
        let mut c = match token {
            Some(t) => env.serve_with(None, &[(TOKEN_ENV, t)]),
            None => env.serve(None),
        };
        spawn_remote(&mut c, "hello");
        let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 60}));
        let text = w.to_string();
        assert!(text.contains(says), "{says}: {w}");
        c.close();
    }
    assert!(agent.logged("message ").is_empty(), "nothing reached the agent");
}
