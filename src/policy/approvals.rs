//! Who answers an ask (docs/APPROVALS.md): approvals decided without asking
//! (`agents.defaults.subagents.approvals.rules`, first match wins), and for the rest whether the
//! requester's model may answer or a person must (`modelMayAnswer`, per rule or for all). Pure:
//! the engine gathers where the person's routes stand and asks here.

use crate::config::{ApprovalDecision, ApprovalRule, Config, ModelMayAnswer};
use crate::keys::AgentId;

use super::visibility::glob_match;

/// The first rule matching an approval of `tool` (when the request names one) asked by an agent
/// of `agent`.
fn matching_rule<'c>(config: &'c Config, agent: &AgentId, tool: Option<&str>) -> Option<&'c ApprovalRule> {
    config.agents.defaults.subagents.approvals.rules.iter().find(|rule| {
        let agent_ok = rule.agent.as_deref().is_none_or(|g| glob_match(g, agent.as_str()));
        let tool_ok = match (rule.tool.as_deref(), tool) {
            (None, _) => true,
            (Some(g), Some(t)) => glob_match(g, t),
            (Some(_), None) => false,
        };
        agent_ok && tool_ok
    })
}

/// The rule's verdict for such an approval; None when no rule decides and someone must be asked.
pub fn approval_by_rule(config: &Config, agent: &AgentId, tool: Option<&str>) -> Option<ApprovalDecision> {
    matching_rule(config, agent, tool)?.decision
}

/// Whether the model may answer such an approval: the first matching rule's `modelMayAnswer`,
/// else `approvals.modelMayAnswer`.
pub fn model_may_answer(config: &Config, agent: &AgentId, tool: Option<&str>) -> ModelMayAnswer {
    matching_rule(config, agent, tool)
        .and_then(|r| r.model_may_answer)
        .unwrap_or(config.agents.defaults.subagents.approvals.model_may_answer)
}

/// Where the answerer's host stands as a way to a person, for one ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostRoute {
    /// No host shows it to a person: no elicitation, a driven answerer, or a host known to
    /// answer elicitations by itself (`approvals.autoAnsweringClients`).
    None,
    /// Shown (or about to be) to a person at the host.
    Asked,
    /// Tried and ended without a person's answer: declined or cancelled faster than a person
    /// reads, or dismissed.
    Ended,
}

/// Where the ways to a person stand for one ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PersonRoutes {
    pub host: HostRoute,
    /// `approvals.operatorWatches`.
    pub operator: bool,
    /// Posted to the chat the asking tree is bound to (a channel with a bridge), and still
    /// there to answer: the channel's people may answer it.
    pub channel: bool,
    /// `approvals.personTimeoutSeconds` passed since the ask opened.
    pub timed_out: bool,
}

impl PersonRoutes {
    /// Whether some person may still answer.
    pub fn reachable(&self) -> bool {
        !self.timed_out && (self.host == HostRoute::Asked || self.operator || self.channel)
    }
}

/// Who an ask waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answerer {
    /// The requester's model may answer it.
    Model,
    /// Only a person (or a rule, or the timeout): the model is told to wait.
    Person,
}

/// Who may answer an ask: questions may go to the model first; an approval goes to a person while
/// one is reachable, unless the policy lets the model answer (`always`), or never lets it (`never`).
pub fn who_answers(is_approval: bool, may: ModelMayAnswer, routes: PersonRoutes) -> Answerer {
    if !is_approval {
        return Answerer::Model;
    }
    match may {
        ModelMayAnswer::Always => Answerer::Model,
        ModelMayAnswer::Never => Answerer::Person,
        ModelMayAnswer::AfterPerson if routes.reachable() => Answerer::Person,
        ModelMayAnswer::AfterPerson => Answerer::Model,
    }
}

/// Whether a host's decline or cancel of an elicitation, `elapsed_ms` after it was shown, came
/// from the host itself rather than a person who read it.
pub fn answered_unseen(elapsed_ms: u64, config: &Config) -> bool {
    elapsed_ms < config.agents.defaults.subagents.approvals.auto_answer_ms
}

/// Whether the MCP client `name` is a host known to answer elicitations by itself.
pub fn auto_answering_client(name: &str, config: &Config) -> bool {
    config.agents.defaults.subagents.approvals.auto_answering_clients.iter().any(|g| glob_match(g, name))
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
                {modelMayAnswer:'always', tool:'Glob'},
                {decision:'allow', agent:'trusted'}]}}}}}",
        )
        .unwrap();
        let (worker, trusted) = (AgentId::parse("worker").unwrap(), AgentId::parse("trusted").unwrap());
        assert_eq!(approval_by_rule(&c, &worker, Some("Bash")), Some(ApprovalDecision::Deny));
        assert_eq!(approval_by_rule(&c, &worker, Some("ReadFile")), Some(ApprovalDecision::Allow));
        assert_eq!(approval_by_rule(&c, &worker, Some("Write")), None);
        assert_eq!(approval_by_rule(&c, &worker, None), None, "a tool rule needs a tool name");
        assert_eq!(approval_by_rule(&c, &trusted, Some("Bash")), Some(ApprovalDecision::Allow));
        assert_eq!(approval_by_rule(&c, &trusted, Some("Glob")), None, "the first match asks");
        assert_eq!(model_may_answer(&c, &trusted, Some("Glob")), ModelMayAnswer::Always);
        assert_eq!(model_may_answer(&c, &worker, Some("Write")), ModelMayAnswer::AfterPerson, "the default");
    }

    #[test]
    fn a_rule_gives_exactly_one_of_decision_and_model_may_answer() {
        for bad in ["{tool:'X'}", "{decision:'allow', modelMayAnswer:'never'}"] {
            let text = format!("{{agents:{{defaults:{{subagents:{{approvals:{{rules:[{bad}]}}}}}}}}}}");
            let err = parse(&text).err().map(|e| format!("{e:?}")).unwrap_or_default();
            assert!(err.contains("rules[0] must give exactly one of decision"), "{bad}: {err}");
        }
    }

    #[test]
    fn an_approval_waits_for_a_reachable_person_unless_the_policy_says_otherwise() {
        let routes = |host, operator, timed_out| PersonRoutes { host, operator, channel: false, timed_out };
        let asked = routes(HostRoute::Asked, false, false);
        let nobody = routes(HostRoute::None, false, false);
        let ended = routes(HostRoute::Ended, false, false);
        let operator = routes(HostRoute::Ended, true, false);
        let late = routes(HostRoute::Asked, true, true);
        use Answerer::{Model, Person};
        use ModelMayAnswer::{AfterPerson, Always, Never};
        assert_eq!(who_answers(true, AfterPerson, asked), Person);
        assert_eq!(who_answers(true, AfterPerson, nobody), Model);
        assert_eq!(who_answers(true, AfterPerson, ended), Model, "an unseen decline is no person's");
        assert_eq!(who_answers(true, AfterPerson, operator), Person, "the operator is the next route");
        assert_eq!(who_answers(true, AfterPerson, late), Model, "after personTimeoutSeconds");
        assert_eq!(who_answers(true, Always, asked), Model);
        assert_eq!(who_answers(true, Never, nobody), Person);
        assert_eq!(who_answers(false, Never, asked), Model, "questions may go to the model");
        let chat = PersonRoutes { channel: true, ..nobody };
        assert_eq!(who_answers(true, AfterPerson, chat), Person, "a chat's people are a route");
        assert_eq!(who_answers(true, AfterPerson, PersonRoutes { timed_out: true, ..chat }), Model);
    }

    #[test]
    fn a_host_answers_by_itself_when_it_is_fast_or_known_by_name() {
        let (c, _) = parse("{agents:{defaults:{subagents:{approvals:{autoAnsweringClients:['codex-*']}}}}}").unwrap();
        assert!(auto_answering_client("codex-mcp-client", &c));
        assert!(!auto_answering_client("claude-code", &c));
        let defaults = Config::default();
        assert!(auto_answering_client("codex-mcp-client", &defaults), "known by default");
        assert!(answered_unseen(999, &defaults) && !answered_unseen(1000, &defaults), "1 s by default");
    }
}
