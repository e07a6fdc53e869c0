//! The engine: everything that makes runs happen. The scheduler owns the runtime of a state dir
//! (lock election, the run queue, waits, sweeps); a turn executes one claimed run; the steps after
//! a run (reply-back, announce, deliveries) are queued runs and ledger rows; send, spawn and inject
//! start runs.

pub mod a2a;
pub mod ask;
pub mod ask_chat;
pub mod attachments;
pub mod budget;
pub mod chain;
pub mod context;
mod deliver;
mod flow;
pub mod inject;
pub mod scheduler;
pub mod send;
pub mod spawn;
pub mod steer;
mod steps;
pub mod subagents;
mod threads;
mod turn;

/// What an answer showing the built-in echo agent's work says (the tools name it through the engine).
pub use crate::runner::{AgentRunner, ECHO_WARNING, LoginCheck, agent_runner, host_agent, is_echo};
pub use deliver::{deliver_due, settle_run};
pub use steps::{catch_up, step_id, take_steps};
pub use turn::{TurnResult, channel_of_row, run_turn};

use std::sync::Arc;

use crate::access::{Access, ToolError};
use scheduler::Scheduler;

/// Streams a run's text to the MCP client while a caller waits (progress count, message).
pub type Progress = Arc<dyn Fn(f64, String) + Send + Sync>;

/// The engine as a tool call sees it: start a send or a spawn (admission included) and wait for
/// a reply. Built per call from the server's façade and runtime. Without a runtime (benchmarks,
/// property tests) every refusal is still the same; only what starts or waits for a run says
/// that it needs one.
#[derive(Clone, Copy)]
pub struct Engine<'a> {
    access: &'a Access,
    runtime: Option<&'a Arc<Scheduler>>,
}

impl<'a> Engine<'a> {
    pub fn new(access: &'a Access, runtime: Option<&'a Arc<Scheduler>>) -> Self {
        Engine { access, runtime }
    }

    /// The runtime, needed only from the first step that starts or waits for a run.
    fn runtime(&self, tool: &str) -> Result<&'a Arc<Scheduler>, ToolError> {
        self.runtime
            .ok_or_else(|| ToolError::error(format!("{tool} needs the runtime, which this server was started without")))
    }
}
