//! Pure decisions from facts: visibility, agent-to-agent, send policy, which tools a caller
//! gets, approvals decided by rule, and budgets (what a spawn is granted, when spending crosses). No I/O here: `access/` loads the facts from the store and config and asks these
//! functions, so every tool gets the same answer for the same facts.

mod approvals;
pub mod budget;
mod send_policy;
mod tool_set;
pub mod usage;
mod visibility;

pub use approvals::{
    Answerer, HostRoute, PersonRoutes, answered_unseen, approval_by_rule, auto_answering_client, model_may_answer,
    who_answers,
};
pub use send_policy::{SendDecision, SendPolicySource, SendTarget, resolve_send_policy};
pub use tool_set::{CallerRole, ToolName, spawnable, tools_for};
pub use visibility::{
    Action, Denial, VisibilityFacts, VisibilityRules, check_visibility, effective_visibility, glob_match,
};
