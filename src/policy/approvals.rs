//! Approvals decided without asking: `agents.defaults.subagents.approvals.rules`, first match
//! wins (pure; the engine asks before it puts a request to anyone).

use crate::config::{ApprovalDecision, Config};
use crate::keys::AgentId;

use super::visibility::glob_match;

/// The rule's verdict for an approval of `tool` (when the request names one) asked by an agent
/// of `agent`; None when no rule matches and someone must be asked.
pub fn approval_by_rule(config: &Config, agent: &AgentId, tool: Option<&str>) -> Option<ApprovalDecision> {
    config.agents.defaults.subagents.approvals.rules.iter().find_map(|rule| {
        let agent_ok = rule.agent.as_deref().is_none_or(|g| glob_match(g, agent.as_str()));
        let tool_ok = match (rule.tool.as_deref(), tool) {
            (None, _) => true,
            (Some(g), Some(t)) => glob_match(g, t),
            (Some(_), None) => false,
        };
        (agent_ok && tool_ok).then_some(rule.decision)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    #[test]
    fn the_first_matching_rule_decides_and_none_matching_asks() {
        let (c, _) = parse(
            "{agents:{defaults:{subagents:{approvals:{rules:[
                {decision:'deny', tool:'Bash', agent:'worker'},
                {decision:'allow', tool:'Read*'},
                {decision:'allow', agent:'trusted'}]}}}}}",
        )
        .unwrap();
        let (worker, trusted) = (AgentId::parse("worker").unwrap(), AgentId::parse("trusted").unwrap());
        assert_eq!(approval_by_rule(&c, &worker, Some("Bash")), Some(ApprovalDecision::Deny));
        assert_eq!(approval_by_rule(&c, &worker, Some("ReadFile")), Some(ApprovalDecision::Allow));
        assert_eq!(approval_by_rule(&c, &worker, Some("Write")), None);
        assert_eq!(approval_by_rule(&c, &worker, None), None, "a tool rule needs a tool name");
        assert_eq!(approval_by_rule(&c, &trusted, Some("Bash")), Some(ApprovalDecision::Allow));
    }
}
