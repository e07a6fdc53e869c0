//! The send policy: may a run start in, or a delivery go to, a session?

use crate::config::{PolicyAction, SendPolicyConfig};
use crate::keys::{ChatType, SessionKey};

/// The target as the policy sees it: its key, and channel and chat type from the one channel rule.
#[derive(Debug, Clone)]
pub struct SendTarget<'a> {
    pub key: &'a SessionKey,
    pub channel: &'a str,
    pub chat_type: Option<ChatType>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SendPolicySource {
    Override,
    Rule,
    Default,
}

/// The decision and where it came from (`rule` is the 0-based index of the deciding rule).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SendDecision {
    pub action: PolicyAction,
    pub rule: Option<usize>,
    pub source: SendPolicySource,
}

impl SendDecision {
    pub fn allowed(&self) -> bool {
        self.action == PolicyAction::Allow
    }

    /// The refusal text of a blocked send.
    pub fn refusal(&self, config: Option<&SendPolicyConfig>) -> String {
        match (self.source, self.rule) {
            (SendPolicySource::Override, _) => {
                "send blocked by session policy (per-session override: deny; the operator can run `sessions-mcp policy <key> inherit`)".to_string()
            }
            (SendPolicySource::Rule, Some(i)) => {
                let rule = config.and_then(|c| c.rules.get(i)).map(|r| serde_json::to_string(&r.r#match).unwrap_or_default());
                format!(
                    "send blocked by session policy (rule {i}: deny {}; see session.sendPolicy.rules[{i}])",
                    rule.unwrap_or_default()
                )
            }
            _ => "send blocked by session policy (session.sendPolicy.default = deny; add an allow rule to permit this target)".to_string(),
        }
    }
}

/// Per-session override wins; else rules in order (first matching deny wins, any matching allow
/// beats the default); else the default; no config at all = allow.
pub fn resolve_send_policy(
    override_action: Option<PolicyAction>,
    config: Option<&SendPolicyConfig>,
    target: &SendTarget,
) -> SendDecision {
    if let Some(action) = override_action {
        return SendDecision { action, rule: None, source: SendPolicySource::Override };
    }
    let Some(config) = config else {
        return SendDecision { action: PolicyAction::Allow, rule: None, source: SendPolicySource::Default };
    };
    let raw_key = target.key.as_str();
    let stripped = target.key.rest();
    let mut first_allow = None;
    for (i, rule) in config.rules.iter().enumerate() {
        let m = &rule.r#match;
        let lower = |s: &Option<String>| s.as_ref().map(|v| v.trim().to_ascii_lowercase());
        if lower(&m.channel).is_some_and(|c| c != target.channel) {
            continue;
        }
        if m.chat_type.is_some_and(|ct| Some(ct.chat_type()) != target.chat_type) {
            continue;
        }
        if lower(&m.raw_key_prefix).is_some_and(|p| !raw_key.starts_with(&p)) {
            continue;
        }
        if lower(&m.key_prefix).is_some_and(|p| !raw_key.starts_with(&p) && !stripped.starts_with(&p)) {
            continue;
        }
        match rule.action {
            PolicyAction::Deny => {
                return SendDecision { action: PolicyAction::Deny, rule: Some(i), source: SendPolicySource::Rule };
            }
            PolicyAction::Allow => {
                first_allow.get_or_insert(i);
            }
        }
    }
    match first_allow {
        Some(i) => SendDecision { action: PolicyAction::Allow, rule: Some(i), source: SendPolicySource::Rule },
        None => SendDecision {
            action: config.default.unwrap_or(PolicyAction::Allow),
            rule: None,
            source: SendPolicySource::Default,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    fn decide(cfg: &str, over: Option<PolicyAction>, key: &str, channel: &str, ct: Option<ChatType>) -> SendDecision {
        let (c, _) = parse(cfg).unwrap();
        let k = SessionKey::from_canonical(key);
        resolve_send_policy(over, c.session.send_policy.as_ref(), &SendTarget { key: &k, channel, chat_type: ct })
    }

    #[test]
    fn table_of_send_policy_decisions() {
        use PolicyAction::*;
        let discord_deny =
            "{session:{sendPolicy:{rules:[{action:'deny',match:{channel:'discord',chatType:'group'}}]}}}";
        let cron_deny = "{session:{sendPolicy:{rules:[{action:'deny',match:{keyPrefix:'cron:'}}]}}}";
        let deny_default_allow_rule =
            "{session:{sendPolicy:{default:'deny',rules:[{action:'allow',match:{chatType:'dm'}}]}}}";
        let dev = "agent:main:discord:group:dev";
        let cases = [
            ("{}", None, dev, "discord", Some(ChatType::Group), Allow, None, SendPolicySource::Default),
            (discord_deny, None, dev, "discord", Some(ChatType::Group), Deny, Some(0), SendPolicySource::Rule),
            (discord_deny, None, dev, "slack", Some(ChatType::Group), Allow, None, SendPolicySource::Default),
            (discord_deny, Some(Allow), dev, "discord", Some(ChatType::Group), Allow, None, SendPolicySource::Override),
            (cron_deny, None, "agent:main:cron:j", "internal", None, Deny, Some(0), SendPolicySource::Rule),
            (cron_deny, None, "agent:main:main", "webchat", None, Allow, None, SendPolicySource::Default),
            ("{}", Some(Deny), "agent:main:main", "webchat", None, Deny, None, SendPolicySource::Override),
            (
                deny_default_allow_rule,
                None,
                "agent:main:t:direct:1",
                "t",
                Some(ChatType::Direct),
                Allow,
                Some(0),
                SendPolicySource::Rule,
            ),
            (
                deny_default_allow_rule,
                None,
                dev,
                "discord",
                Some(ChatType::Group),
                Deny,
                None,
                SendPolicySource::Default,
            ),
        ];
        for (i, (cfg, over, key, ch, ct, action, rule, source)) in cases.into_iter().enumerate() {
            let d = decide(cfg, over, key, ch, ct);
            assert_eq!((d.action, d.rule, d.source), (action, rule, source), "case {i}");
        }
    }

    #[test]
    fn first_matching_deny_wins_over_an_earlier_allow() {
        let cfg = "{session:{sendPolicy:{rules:[{action:'allow',match:{channel:'discord'}},{action:'deny',match:{chatType:'group'}}]}}}";
        let d = decide(cfg, None, "agent:main:discord:group:dev", "discord", Some(ChatType::Group));
        assert_eq!((d.action, d.rule), (PolicyAction::Deny, Some(1)));
        assert!(d.refusal(None).contains("rule 1"));
    }
}
