//! Who may see which session.

use crate::config::{Config, SessionToolsVisibility, Visibility};
use crate::keys::{AgentId, SessionKey};

/// What the caller is trying to do; it only changes the wording of a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    List,
    History,
    Send,
}

impl Action {
    fn prefix(self) -> &'static str {
        match self {
            Action::List => "Session list",
            Action::History => "Session history",
            Action::Send => "Session send",
        }
    }
}

/// The visibility rules in force for one caller.
#[derive(Debug, Clone)]
pub struct VisibilityRules {
    pub configured: Visibility,
    pub effective: Visibility,
    pub sandboxed: bool,
    pub a2a_enabled: bool,
    pub a2a_allow: Vec<String>,
}

impl VisibilityRules {
    pub fn for_caller(config: &Config, sandboxed: bool) -> Self {
        let configured = config.tools.sessions.visibility;
        VisibilityRules {
            configured,
            effective: effective_visibility(
                configured,
                sandboxed,
                config.agents.defaults.sandbox.session_tools_visibility,
            ),
            sandboxed,
            a2a_enabled: config.tools.agent_to_agent.enabled,
            a2a_allow: config.tools.agent_to_agent.allow.clone(),
        }
    }

    /// May sessions of `target` be seen at all by a caller of agent `caller`?
    pub fn agent_visible(&self, caller: &AgentId, target: &AgentId) -> bool {
        caller == target || (self.effective == Visibility::All && self.a2a_enabled && self.a2a_allows(caller, target))
    }

    fn a2a_allows(&self, a: &AgentId, b: &AgentId) -> bool {
        let matches =
            |id: &AgentId| self.a2a_allow.is_empty() || self.a2a_allow.iter().any(|p| glob_match(p, id.as_str()));
        matches(a) && matches(b)
    }
}

/// The narrower of the configured visibility and `tree`, for a sandboxed caller under
/// `sessionToolsVisibility = "spawned"`. **Fix**: the reference widened `self` to `tree`; a
/// clamp only ever narrows.
pub fn effective_visibility(configured: Visibility, sandboxed: bool, stv: SessionToolsVisibility) -> Visibility {
    if sandboxed && stv == SessionToolsVisibility::Spawned { configured.min(Visibility::Tree) } else { configured }
}

/// The facts one visibility decision needs. `target_in_tree` (the caller itself or a session it
/// spawned, transitively, of any agent) comes from the stored spawn lineage (false for a key that
/// does not exist), so it never reveals existence on its own: a missing key and an existing key
/// outside the tree get the same answer.
#[derive(Debug, Clone)]
pub struct VisibilityFacts<'a> {
    pub caller_key: &'a SessionKey,
    pub caller_agent: &'a AgentId,
    pub target_key: &'a SessionKey,
    pub target_agent: &'a AgentId,
    pub target_in_tree: bool,
}

/// Why a target is not visible: the refusing rule and the switch that would allow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial(pub String);

pub fn check_visibility(action: Action, f: &VisibilityFacts, rules: &VisibilityRules) -> Result<(), Denial> {
    // What the caller spawned is its tree whatever agent runs it (spawning under another agent
    // takes that agent's `subagents.allowAgents`, and `subagents` already lists, steers and
    // cancels it): visible from `tree` up, without agent-to-agent access, which is about the
    // sessions of another agent that the caller did not create.
    if f.target_in_tree && rules.effective >= Visibility::Tree {
        return Ok(());
    }
    if f.target_agent != f.caller_agent {
        if rules.effective != Visibility::All {
            return Err(Denial(cross_agent_message(action, rules)));
        }
        if !rules.a2a_enabled {
            return Err(Denial(a2a_disabled_message(action)));
        }
        if !rules.a2a_allows(f.caller_agent, f.target_agent) {
            return Err(Denial(a2a_denied_message(action)));
        }
        return Ok(());
    }
    if f.target_key == f.caller_key {
        return Ok(());
    }
    match rules.effective {
        Visibility::OwnSession => Err(Denial(format!(
            "{} visibility is restricted to the current session (tools.sessions.visibility=self).",
            action.prefix()
        ))),
        Visibility::Tree if !f.target_in_tree => Err(Denial(tree_message(action, rules))),
        _ => Ok(()),
    }
}

fn clamp_note(rules: &VisibilityRules) -> &'static str {
    if rules.effective < rules.configured {
        " (clamped for a sandboxed session by agents.defaults.sandbox.sessionToolsVisibility=spawned; set it to all to lift the clamp)"
    } else {
        ""
    }
}

fn tree_message(action: Action, rules: &VisibilityRules) -> String {
    format!(
        "{} visibility is restricted to the current session tree (tools.sessions.visibility=tree){}. Set tools.sessions.visibility=agent to see every session of this agent.",
        action.prefix(),
        clamp_note(rules)
    )
}

fn cross_agent_message(action: Action, rules: &VisibilityRules) -> String {
    format!(
        "{} visibility is restricted{}. Set tools.sessions.visibility=all and tools.agentToAgent.enabled=true to allow cross-agent access.",
        action.prefix(),
        clamp_note(rules)
    )
}

fn a2a_disabled_message(action: Action) -> String {
    match action {
        Action::List => {
            "Agent-to-agent listing is disabled. Set tools.agentToAgent.enabled=true to allow cross-agent visibility."
        }
        Action::History => {
            "Agent-to-agent history is disabled. Set tools.agentToAgent.enabled=true to allow cross-agent access."
        }
        Action::Send => {
            "Agent-to-agent messaging is disabled. Set tools.agentToAgent.enabled=true to allow cross-agent sends."
        }
    }
    .to_string()
}

fn a2a_denied_message(action: Action) -> String {
    let what = match action {
        Action::List => "listing",
        Action::History => "history",
        Action::Send => "messaging",
    };
    format!("Agent-to-agent {what} denied by tools.agentToAgent.allow (both agent ids must match a pattern there).")
}

/// Case-insensitive glob with `*` (any run of characters).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.trim().to_ascii_lowercase().chars().collect();
    let t: Vec<char> = text.to_ascii_lowercase().chars().collect();
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && p[pi] != '*' && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(v: Visibility, a2a: bool, allow: &[&str]) -> VisibilityRules {
        VisibilityRules {
            configured: v,
            effective: v,
            sandboxed: false,
            a2a_enabled: a2a,
            a2a_allow: allow.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn check(r: &VisibilityRules, caller: &str, target: &str, in_tree: bool) -> Result<(), Denial> {
        let ck = SessionKey::from_canonical(caller);
        let tk = SessionKey::from_canonical(target);
        let main = AgentId::main();
        let (ca, ta) = (ck.agent_id(&main), tk.agent_id(&main));
        let f = VisibilityFacts {
            caller_key: &ck,
            caller_agent: &ca,
            target_key: &tk,
            target_agent: &ta,
            target_in_tree: in_tree,
        };
        check_visibility(Action::History, &f, r)
    }

    #[test]
    fn table_of_visibility_decisions() {
        use Visibility::*;
        let me = "agent:main:main";
        let child = "agent:main:subagent:c";
        let other = "agent:main:discord:group:x";
        let foreign = "agent:ops:main";
        // (rules, target, in_tree, allowed)
        let cases: Vec<(VisibilityRules, &str, bool, bool)> = vec![
            (rules(OwnSession, false, &[]), me, false, true),
            (rules(OwnSession, false, &[]), child, true, false),
            (rules(Tree, false, &[]), child, true, true),
            (rules(Tree, false, &[]), other, false, false),
            (rules(Agent, false, &[]), other, false, true),
            (rules(Agent, true, &[]), foreign, false, false),
            (rules(All, false, &[]), foreign, false, false),
            (rules(All, true, &[]), foreign, false, true),
            (rules(All, true, &["main", "op*"]), foreign, false, true),
            (rules(All, true, &["main"]), foreign, false, false),
            (rules(All, true, &["ops"]), foreign, false, false),
            (rules(All, true, &["*"]), foreign, false, true),
            (rules(All, false, &[]), other, false, true),
        ];
        for (i, (r, target, in_tree, allowed)) in cases.iter().enumerate() {
            assert_eq!(check(r, me, target, *in_tree).is_ok(), *allowed, "case {i}: {target} under {:?}", r.effective);
        }
    }

    #[test]
    fn refusals_name_the_rule_and_the_switch() {
        let r = rules(Visibility::Tree, false, &[]);
        let e = check(&r, "agent:main:main", "agent:main:x", false).unwrap_err();
        assert!(e.0.contains("tools.sessions.visibility=tree"), "{}", e.0);
        let r = rules(Visibility::All, false, &[]);
        let e = check(&r, "agent:main:main", "agent:ops:main", false).unwrap_err();
        assert!(e.0.contains("tools.agentToAgent.enabled=true"), "{}", e.0);
    }

    #[test]
    fn sandbox_clamp_only_narrows() {
        use SessionToolsVisibility::*;
        assert_eq!(effective_visibility(Visibility::All, true, Spawned), Visibility::Tree);
        assert_eq!(effective_visibility(Visibility::Agent, true, Spawned), Visibility::Tree);
        assert_eq!(effective_visibility(Visibility::OwnSession, true, Spawned), Visibility::OwnSession);
        assert_eq!(effective_visibility(Visibility::All, true, SessionToolsVisibility::All), Visibility::All);
        assert_eq!(effective_visibility(Visibility::All, false, Spawned), Visibility::All);
    }

    #[test]
    fn globs() {
        assert!(glob_match("*", "x"));
        assert!(glob_match("op*", "ops"));
        assert!(glob_match("OPS", "ops"));
        assert!(glob_match("a*c", "abbbc"));
        assert!(!glob_match("a*c", "abbb"));
        assert!(!glob_match("agent:foo", "foo"));
    }
}
