//! One turn through the library's runner, without a server: `Runner::execute` with a steer
//! channel and an input-request channel, for what only the runner's caller can do.

use std::path::Path;

use serde_json::{Value, json};
use sessions_mcp::keys::AgentId;
use sessions_mcp::runner::{Hooks, Input, InputRequest, Launch, Outcome, Runner, RunnerSpec, Steer, resolve_runner};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;

/// The runner settings of agent `id` in `config` (an `agents` config; its workspace must exist).
pub fn spec(config: &Value, id: &str) -> RunnerSpec {
    let (config, _) = sessions_mcp::config::parse(&config.to_string()).expect("the config parses");
    let agent = AgentId::parse(id).expect("an agent id");
    resolve_runner(&config, &agent, Path::new("/nonexistent"), Path::new(super::bin())).expect("the runner resolves")
}

/// A scripted agent `a` answering every turn with `actions`, in a fresh workspace, with `limits`
/// (more `runner` keys: `idleTimeoutSeconds`, …) over the defaults.
pub fn scripted(actions: Value, limits: Value) -> (tempfile::TempDir, RunnerSpec) {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(&script, json!({"default": actions}).to_string()).unwrap();
    let mut runner = json!({"command": super::bin(), "args": ["agent", "--script", script]});
    runner.as_object_mut().unwrap().extend(limits.as_object().cloned().unwrap_or_default());
    let config = json!({"agents": {"list": [{"id": "a", "workspace": dir.path(), "runner": runner}]}});
    let spec = spec(&config, "a");
    (dir, spec)
}

/// A `jsonl/1` send request whose input is `text`.
pub fn request(text: &str) -> Input {
    Input::Request(json!({"type": "run", "protocol": 1, "mode": "send", "messages": [],
                          "input": {"role": "user", "content": text}}))
}

/// Runs one turn of `spec`: its `command` and `args` in its workdir with exactly `env`, reading
/// `input`, taking steers from `steers`, until the turn ends or `cancel`.
pub async fn execute(
    spec: &RunnerSpec,
    input: Input,
    env: Vec<(String, String)>,
    steers: UnboundedReceiver<Steer>,
    cancel: CancellationToken,
) -> Outcome {
    execute_asking(spec, input, env, steers, None, cancel).await
}

/// [`execute`], handing the turn's input requests to `asks` (None: the run cannot ask).
pub async fn execute_asking(
    spec: &RunnerSpec,
    input: Input,
    env: Vec<(String, String)>,
    steers: UnboundedReceiver<Steer>,
    asks: Option<UnboundedSender<InputRequest>>,
    cancel: CancellationToken,
) -> Outcome {
    let launch = Launch {
        run_id: "steered-run".into(),
        program: spec.command.clone(),
        args: spec.args.clone(),
        env,
        workdir: spec.workdir.clone(),
        uid_gid: None,
    };
    let hooks =
        Hooks { on_spawn: &|_| {}, on_delta: &|_| {}, on_input: asks.as_ref(), on_usage: None, on_waiting: None };
    let runner = Runner::at(super::bin().into());
    runner.execute(spec, &launch, &input, cancel, &hooks, Some(steers)).await
}

/// Sends `text` as a steer and waits for the answer: whether it went into the turn.
pub async fn steer(steers: &UnboundedSender<Steer>, text: &str) -> bool {
    let (taken, answer) = tokio::sync::oneshot::channel();
    if steers.send(Steer { text: text.into(), taken }).is_err() {
        return false;
    }
    answer.await.unwrap_or(false)
}
