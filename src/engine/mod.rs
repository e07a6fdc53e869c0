//! The engine: everything that makes runs happen. The scheduler owns the runtime of a state dir
//! (lock election, the run queue, waits, sweeps); a turn executes one claimed run; the steps after
//! a run (reply-back, announce, deliveries) are queued runs and ledger rows; send, spawn and inject
//! start runs.

pub mod attachments;
pub mod context;
mod deliver;
pub mod inject;
pub mod scheduler;
pub mod send;
pub mod spawn;
mod steps;
mod turn;

pub use deliver::deliver_due;
pub use steps::{catch_up, step_id, take_steps};
pub use turn::{TurnResult, channel_of_row, run_turn};
