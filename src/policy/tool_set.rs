//! Which session tools a caller is offered (and may call).

use crate::config::Config;
use crate::keys::AgentId;

/// The six tools, as a closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ToolName {
    AgentsList,
    SessionsHistory,
    SessionsList,
    SessionsSend,
    SessionsSpawn,
    Subagents,
}

impl ToolName {
    pub const ALL: [ToolName; 6] = [
        Self::AgentsList,
        Self::SessionsHistory,
        Self::SessionsList,
        Self::SessionsSend,
        Self::SessionsSpawn,
        Self::Subagents,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::AgentsList => "agents_list",
            Self::SessionsHistory => "sessions_history",
            Self::SessionsList => "sessions_list",
            Self::SessionsSend => "sessions_send",
            Self::SessionsSpawn => "sessions_spawn",
            Self::Subagents => "subagents",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// What kind of caller asks: a top-level session (external or driven) or a sub-agent at a depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerRole {
    TopLevel,
    /// A spawned session at `depth` (1 = child of a top-level session).
    Subagent {
        depth: u32,
    },
}

/// The tools a caller gets. A leaf sub-agent gets the two that read, `sessions_list` and
/// `sessions_history` (its visibility is its own tree: it reads itself, and proves its wiring
/// back to us); orchestrators (depth below `maxSpawnDepth`) also keep spawn and `subagents` for
/// their own children; `tools.subagents.tools.{allow, alsoAllow, deny}` adjust that; a child never gets a tool its parent lacks; `agents_list` is never offered to a
/// sub-agent.
pub fn tools_for(role: CallerRole, config: &Config) -> Vec<ToolName> {
    match role {
        CallerRole::TopLevel => ToolName::ALL.to_vec(),
        CallerRole::Subagent { depth } => {
            let parent = if depth <= 1 {
                tools_for(CallerRole::TopLevel, config)
            } else {
                tools_for(CallerRole::Subagent { depth: depth - 1 }, config)
            };
            let filter = &config.tools.subagents.tools;
            let named = |list: &[String]| list.iter().filter_map(|s| ToolName::parse(s.trim())).collect::<Vec<_>>();
            let orchestrator = depth < config.agents.defaults.subagents.max_spawn_depth;
            let mut set: Vec<ToolName> = if !filter.allow.is_empty() {
                named(&filter.allow)
            } else if orchestrator {
                vec![ToolName::SessionsSpawn, ToolName::SessionsList, ToolName::SessionsHistory, ToolName::Subagents]
            } else {
                vec![ToolName::SessionsList, ToolName::SessionsHistory]
            };
            set.extend(named(&filter.also_allow));
            let deny = named(&filter.deny);
            set.retain(|t| *t != ToolName::AgentsList && !deny.contains(t) && parent.contains(t));
            set.sort();
            set.dedup();
            set
        }
    }
}

/// The agent ids `requester` may spawn, itself included: `agents.list[].subagents.allowAgents`;
/// without one, the agents discovery found (the CLIs the user has are there to be used; an
/// explicit allowlist keeps its meaning).
pub fn spawnable(config: &Config, requester: &AgentId) -> (bool, Vec<AgentId>) {
    let allow = config.agent(requester).and_then(|a| a.subagents.as_ref()).and_then(|s| s.allow_agents.clone());
    let allow = allow.unwrap_or_else(|| config.agents.discovered.iter().map(|a| a.id.clone()).collect());
    let allow_any = allow.iter().any(|a| a.trim() == "*");
    let mut ids: Vec<AgentId> = if allow_any {
        config.configured_agents()
    } else {
        allow.iter().filter_map(|a| AgentId::parse(a).ok()).collect()
    };
    ids.retain(|a| a != requester);
    ids.sort();
    ids.dedup();
    ids.insert(0, requester.clone());
    (allow_any, ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    fn tools(cfg: &str, depth: u32) -> Vec<&'static str> {
        let (c, _) = parse(cfg).unwrap();
        tools_for(CallerRole::Subagent { depth }, &c).into_iter().map(ToolName::as_str).collect()
    }

    #[test]
    fn leaf_subagents_get_the_reading_tools_by_default() {
        assert_eq!(tools("{}", 1), ["sessions_history", "sessions_list"]);
        assert_eq!(tools_for(CallerRole::TopLevel, &Config::default()).len(), 6);
    }

    #[test]
    fn allow_alsoallow_and_deny_adjust_the_set() {
        assert_eq!(tools("{tools:{subagents:{tools:{allow:['sessions_list']}}}}", 1), ["sessions_list"]);
        assert_eq!(
            tools("{tools:{subagents:{tools:{alsoAllow:['subagents','agents_list']}}}}", 1),
            ["sessions_history", "sessions_list", "subagents"]
        );
        assert!(tools("{tools:{subagents:{tools:{deny:['sessions_list','sessions_history']}}}}", 1).is_empty());
        let cfg =
            "{agents:{defaults:{subagents:{maxSpawnDepth:2}}},tools:{subagents:{tools:{deny:['sessions_spawn']}}}}";
        assert_eq!(tools(cfg, 1), ["sessions_history", "sessions_list", "subagents"]);
    }

    #[test]
    fn orchestrators_keep_spawn_list_history_and_leaves_only_read() {
        let cfg = "{agents:{defaults:{subagents:{maxSpawnDepth:2}}}}";
        assert_eq!(tools(cfg, 1), ["sessions_history", "sessions_list", "sessions_spawn", "subagents"]);
        assert_eq!(tools(cfg, 2), ["sessions_history", "sessions_list"]);
    }

    #[test]
    fn a_child_never_gets_what_its_parent_lacks() {
        let cfg =
            "{agents:{defaults:{subagents:{maxSpawnDepth:3}}},tools:{subagents:{tools:{deny:['sessions_history']}}}}";
        assert!(!tools(cfg, 2).contains(&"sessions_history"));
    }
}
