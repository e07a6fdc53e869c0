//! One turn through the library's runner, without a server: `Runner::execute` with a steer
//! channel, for what only the runner's caller can do (the tools do not steer yet).

use std::path::Path;

use serde_json::Value;
use sessions_mcp::keys::AgentId;
use sessions_mcp::runner::{Hooks, Input, Launch, Outcome, Runner, RunnerSpec, Steer, resolve_runner};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;

/// The runner settings of agent `id` in `config` (an `agents` config; its workspace must exist).
pub fn spec(config: &Value, id: &str) -> RunnerSpec {
    let (config, _) = sessions_mcp::config::parse(&config.to_string()).expect("the config parses");
    let agent = AgentId::parse(id).expect("an agent id");
    resolve_runner(&config, &agent, Path::new("/nonexistent"), Path::new(super::bin())).expect("the runner resolves")
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
    let launch = Launch {
        run_id: "steered-run".into(),
        program: spec.command.clone(),
        args: spec.args.clone(),
        env,
        workdir: spec.workdir.clone(),
        uid_gid: None,
    };
    let hooks = Hooks { on_spawn: &|_| {}, on_delta: &|_| {} };
    let runner = Runner { exe: super::bin().into() };
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
