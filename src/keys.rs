//! Session keys: parsing what a caller typed, the canonical stored form, the display form, and the
//! facts derived from a key (kind, chat type, channel).
//!
//! Canonical keys are `agent:<agentId>:<rest>` in lower case, or the bare `global` (the one main
//! session under `session.scope = "global"`). Everything a caller types goes through
//! [`parse_ref`], which either yields a canonical [`SessionKey`] or a sessionId candidate; the
//! latter is only ever looked up among sessions the caller may see (see `access/`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest `<rest>` of a canonical key, in bytes.
pub const MAX_REST_BYTES: usize = 512;
/// The bare key of the main session under global scope.
pub const GLOBAL_KEY: &str = "global";
/// The agent id used when nothing else names one.
pub const DEFAULT_AGENT: &str = "main";
/// The default `session.mainKey`.
pub const DEFAULT_MAIN_KEY: &str = "main";

/// Why a string is not a usable session reference. Messages say what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("is empty")]
    Empty,
    #[error("contains a NUL or control character; keys are printable ASCII without whitespace")]
    ControlChar,
    #[error("contains whitespace or non-ASCII characters; keys are printable ASCII without whitespace")]
    NotPrintable,
    #[error("\"{0}\" is reserved and never names a session")]
    Reserved(String),
    #[error("is too long: the part after agent:<id>: may be at most {MAX_REST_BYTES} bytes")]
    TooLong,
    #[error(
        "agent id {0:?} is not valid: use 1-64 characters of a-z, 0-9, '_' or '-', starting with a letter or digit"
    )]
    BadAgentId(String),
    #[error("{0:?} needs a non-empty id after the prefix")]
    MissingId(String),
    #[error("subagent:<uuid> needs a UUID, got {0:?}")]
    BadSubagentId(String),
    #[error(
        "{0:?} is neither a session key nor a sessionId; keys look like main, agent:<id>:<rest>, <channel>:group:<id>, <channel>:channel:<id>, <channel>:direct:<id>, cron:<id>, hook:<id>, node-<id>, subagent:<uuid>, direct:<peer>; a sessionId matches ^[a-z0-9][a-z0-9._-]{{0,127}}$"
    )]
    BadForm(String),
}

/// A validated agent id (lower case).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AgentId(String);

impl AgentId {
    pub fn parse(raw: &str) -> Result<Self, KeyError> {
        let lower = raw.trim().to_ascii_lowercase();
        let valid = !lower.is_empty()
            && lower.len() <= 64
            && lower
                .bytes()
                .enumerate()
                .all(|(i, b)| b.is_ascii_lowercase() || b.is_ascii_digit() || (i > 0 && (b == b'_' || b == b'-')));
        if valid { Ok(Self(lower)) } else { Err(KeyError::BadAgentId(raw.to_string())) }
    }

    pub fn main() -> Self {
        Self(DEFAULT_AGENT.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A canonical session key: `agent:<agentId>:<rest>` (lower case) or `global`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionKey(String);

impl SessionKey {
    /// Wraps a string already known to be canonical (read back from the store).
    pub fn from_canonical(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    pub fn for_agent(agent: &AgentId, rest: &str) -> Self {
        Self(format!("agent:{}:{}", agent.as_str(), rest))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_global(&self) -> bool {
        self.0 == GLOBAL_KEY
    }

    /// The agent id inside the key; `global` belongs to the default agent, which the caller
    /// supplies.
    pub fn agent_id(&self, default_agent: &AgentId) -> AgentId {
        match self.0.strip_prefix("agent:").and_then(|r| r.split_once(':')) {
            Some((id, _)) => AgentId(id.to_string()),
            None => default_agent.clone(),
        }
    }

    /// The part after `agent:<id>:` (`global` for the global key).
    pub fn rest(&self) -> &str {
        match self.0.strip_prefix("agent:").and_then(|r| r.split_once(':')) {
            Some((_, rest)) => rest,
            None => &self.0,
        }
    }

    /// Cron run keys (`cron:<job>:run:<id>`) are never listed.
    pub fn is_cron_run(&self) -> bool {
        let rest = self.rest();
        rest.starts_with("cron:") && rest.contains(":run:")
    }

    pub fn is_subagent(&self) -> bool {
        self.rest().starts_with("subagent:") || self.rest().contains(":subagent:")
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How `main`, bare keys and the main-session alias resolve for one caller.
#[derive(Debug, Clone)]
pub struct KeyScope {
    pub caller_agent: AgentId,
    pub default_agent: AgentId,
    pub main_key: String,
    pub global: bool,
}

impl KeyScope {
    /// The caller's main session: `agent:<callerAgent>:<mainKey>`, or `global` under global scope.
    pub fn caller_main(&self) -> SessionKey {
        self.main_of(&self.caller_agent)
    }

    pub fn main_of(&self, agent: &AgentId) -> SessionKey {
        if self.global { SessionKey(GLOBAL_KEY.to_string()) } else { SessionKey::for_agent(agent, &self.main_key) }
    }

    /// `main` for the caller's own main session, the canonical key otherwise.
    pub fn display(&self, key: &SessionKey) -> String {
        if *key == self.caller_main() { "main".to_string() } else { key.0.clone() }
    }

    /// Whether `key` is the main session of some agent (or the global one).
    pub fn is_main(&self, key: &SessionKey) -> bool {
        key.is_global() || (!self.global && key.rest() == self.main_key)
    }
}

/// What a caller's string refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionRef {
    Key(SessionKey),
    /// Not key-shaped; looked up as a sessionId among visible sessions only.
    SessionId(String),
}

/// Parses a caller's session reference (a key in any accepted form, or a sessionId candidate).
pub fn parse_ref(input: &str, scope: &KeyScope) -> Result<SessionRef, KeyError> {
    if input.chars().any(|c| c.is_control()) {
        return Err(KeyError::ControlChar);
    }
    let trimmed = input.trim();
    if trimmed.is_empty() {
        return Err(KeyError::Empty);
    }
    if !trimmed.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(KeyError::NotPrintable);
    }
    let lower = trimmed.to_ascii_lowercase();
    if lower == "unknown" {
        return Err(KeyError::Reserved(lower));
    }
    if lower == "main" || lower == scope.main_key {
        return Ok(SessionRef::Key(scope.caller_main()));
    }
    if lower == GLOBAL_KEY {
        return if scope.global { Ok(SessionRef::Key(scope.caller_main())) } else { Err(KeyError::Reserved(lower)) };
    }
    if let Some(after) = lower.strip_prefix("agent:") {
        return parse_agent_key(after, scope).map(SessionRef::Key);
    }
    if is_bare_key_form(&lower)? {
        check_rest_len(&lower)?;
        return Ok(SessionRef::Key(SessionKey::for_agent(&scope.caller_agent, &lower)));
    }
    if is_session_id(&lower) {
        return Ok(SessionRef::SessionId(trimmed.to_string()));
    }
    Err(KeyError::BadForm(trimmed.to_string()))
}

fn parse_agent_key(after: &str, scope: &KeyScope) -> Result<SessionKey, KeyError> {
    let (id, rest) = after.split_once(':').unwrap_or((after, ""));
    let agent = AgentId::parse(id)?;
    if rest.is_empty() {
        return Err(KeyError::MissingId(format!("agent:{id}:")));
    }
    check_rest_len(rest)?;
    // `agent:x:main` is the main-session alias whatever `session.mainKey` says.
    if rest == DEFAULT_MAIN_KEY || rest == scope.main_key {
        return Ok(scope.main_of(&agent));
    }
    Ok(SessionKey::for_agent(&agent, rest))
}

fn check_rest_len(rest: &str) -> Result<(), KeyError> {
    if rest.len() > MAX_REST_BYTES { Err(KeyError::TooLong) } else { Ok(()) }
}

/// True when `s` (lower case, printable) is one of the bare key forms that get the caller's
/// `agent:<id>:` prefix; an error when it starts like one but is malformed.
fn is_bare_key_form(s: &str) -> Result<bool, KeyError> {
    let parts: Vec<&str> = s.splitn(3, ':').collect();
    let id_after = |prefix: &str| {
        let id = &s[prefix.len()..];
        if id.is_empty() { Err(KeyError::MissingId(prefix.to_string())) } else { Ok(true) }
    };
    if let Some(id) = s.strip_prefix("subagent:") {
        return if uuid::Uuid::parse_str(id).is_ok() { Ok(true) } else { Err(KeyError::BadSubagentId(id.to_string())) };
    }
    for prefix in ["cron:", "hook:", "node:", "node-", "direct:"] {
        if s.starts_with(prefix) {
            return id_after(prefix);
        }
    }
    if parts.len() >= 2 && matches!(parts[1], "group" | "channel" | "direct") && is_channel_name(parts[0]) {
        return match parts.get(2) {
            Some(id) if !id.is_empty() => Ok(true),
            _ => Err(KeyError::MissingId(format!("{}:{}:", parts[0], parts[1]))),
        };
    }
    Ok(false)
}

fn is_channel_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// `^[a-z0-9][a-z0-9._-]{0,127}$` (case-insensitive).
pub fn is_session_id(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// The closed set of session kinds a caller can filter on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionKind {
    Main,
    Group,
    Cron,
    Hook,
    Node,
    Other,
}

impl SessionKind {
    pub const ALL: [SessionKind; 6] = [Self::Main, Self::Group, Self::Cron, Self::Hook, Self::Node, Self::Other];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Main => "main",
            Self::Group => "group",
            Self::Cron => "cron",
            Self::Hook => "hook",
            Self::Node => "node",
            Self::Other => "other",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// Chat types as the send policy matches them (`dm` is `direct`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChatType {
    Direct,
    Group,
    Channel,
}

impl ChatType {
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "direct" | "dm" => Some(Self::Direct),
            "group" => Some(Self::Group),
            "channel" => Some(Self::Channel),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Group => "group",
            Self::Channel => "channel",
        }
    }
}

/// The session's kind, from its key and stored chat type. **Fix**: the reference classified every
/// canonical key as `other`; we look at the part after `agent:<id>:`.
pub fn kind_of(key: &SessionKey, scope: &KeyScope, stored_chat_type: Option<ChatType>) -> SessionKind {
    let rest = key.rest();
    if scope.is_main(key) {
        SessionKind::Main
    } else if rest.starts_with("cron:") {
        SessionKind::Cron
    } else if rest.starts_with("hook:") {
        SessionKind::Hook
    } else if rest.starts_with("node-") || rest.starts_with("node:") {
        SessionKind::Node
    } else if matches!(stored_chat_type, Some(ChatType::Group | ChatType::Channel))
        || segments_name(rest, &["group", "channel"])
    {
        SessionKind::Group
    } else {
        SessionKind::Other
    }
}

fn segments_name(rest: &str, words: &[&str]) -> bool {
    rest.split(':').skip(1).any(|seg| words.contains(&seg))
}

/// The stored chat type, else the one the key implies.
pub fn chat_type_of(key: &SessionKey, stored: Option<ChatType>) -> Option<ChatType> {
    stored.or_else(|| {
        let rest = key.rest();
        if segments_name(rest, &["group"]) {
            Some(ChatType::Group)
        } else if segments_name(rest, &["channel"]) {
            Some(ChatType::Channel)
        } else if rest.starts_with("direct:") || segments_name(rest, &["direct", "dm"]) {
            Some(ChatType::Direct)
        } else {
            None
        }
    })
}

/// The channel a key names itself: `<ch>:(group|channel|direct):…` or `<ch>:<account>:direct:…`.
pub fn channel_in_key(key: &SessionKey) -> Option<&str> {
    let parts: Vec<&str> = key.rest().split(':').collect();
    let named = (parts.len() >= 3 && matches!(parts[1], "group" | "channel" | "direct"))
        || (parts.len() >= 4 && parts[2] == "direct");
    (named && is_channel_name(parts[0]) && !matches!(parts[0], "cron" | "hook" | "node" | "subagent"))
        .then_some(parts[0])
}

/// Internal transports never hide the channel a key names.
pub const INTERNAL_CHANNELS: [&str; 2] = ["webchat", "internal"];

/// The one channel rule (display, policy matching, delivery). **Fix**: a stored internal
/// transport (`webchat`) no longer hides the channel that the key itself names.
pub fn channel_of(
    key: &SessionKey,
    kind: SessionKind,
    chat_type: Option<ChatType>,
    stored_channel: Option<&str>,
    last_channel: Option<&str>,
) -> String {
    if let Some(ch) = channel_in_key(key) {
        return ch.to_string();
    }
    let nonempty = |s: Option<&str>| s.map(str::trim).filter(|s| !s.is_empty()).map(str::to_ascii_lowercase);
    if let Some(ch) = nonempty(stored_channel).filter(|c| !INTERNAL_CHANNELS.contains(&c.as_str())) {
        return ch;
    }
    if (kind == SessionKind::Main || chat_type == Some(ChatType::Direct))
        && let Some(ch) = nonempty(last_channel)
    {
        return ch;
    }
    if matches!(kind, SessionKind::Cron | SessionKind::Hook | SessionKind::Node) || key.is_subagent() {
        return "internal".to_string();
    }
    "unknown".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(agent: &str) -> KeyScope {
        KeyScope {
            caller_agent: AgentId::parse(agent).unwrap(),
            default_agent: AgentId::main(),
            main_key: "main".into(),
            global: false,
        }
    }

    fn key(input: &str, s: &KeyScope) -> String {
        match parse_ref(input, s).unwrap() {
            SessionRef::Key(k) => k.0,
            SessionRef::SessionId(id) => panic!("{input} parsed as sessionId {id}"),
        }
    }

    #[test]
    fn main_resolves_to_the_callers_agent() {
        // Differs: the reference resolves `main` to the default agent.
        assert_eq!(key("main", &scope("ops")), "agent:ops:main");
        assert_eq!(key("MAIN", &scope("main")), "agent:main:main");
        assert_eq!(key("agent:ops:main", &scope("main")), "agent:ops:main");
    }

    #[test]
    fn custom_main_key_is_an_alias() {
        let mut s = scope("main");
        s.main_key = "work".into();
        assert_eq!(key("main", &s), "agent:main:work");
        assert_eq!(key("work", &s), "agent:main:work");
        assert_eq!(key("agent:main:main", &s), "agent:main:work");
    }

    #[test]
    fn global_scope_has_one_main_shown_as_main() {
        let mut s = scope("main");
        s.global = true;
        assert_eq!(key("main", &s), "global");
        assert_eq!(key("global", &s), "global");
        assert_eq!(key("agent:main:main", &s), "global");
        assert_eq!(s.display(&SessionKey::from_canonical("global")), "main");
        assert_eq!(kind_of(&SessionKey::from_canonical("global"), &s, None), SessionKind::Main);
    }

    #[test]
    fn reserved_keys_are_refused() {
        let s = scope("main");
        assert_eq!(parse_ref("unknown", &s), Err(KeyError::Reserved("unknown".into())));
        assert_eq!(parse_ref("global", &s), Err(KeyError::Reserved("global".into())));
    }

    #[test]
    fn bare_forms_get_the_callers_agent_prefix() {
        // Differs: the reference prefixes the default agent.
        let s = scope("ops");
        assert_eq!(key("discord:group:dev", &s), "agent:ops:discord:group:dev");
        assert_eq!(key("Slack:Channel:C1:thread:9", &s), "agent:ops:slack:channel:c1:thread:9");
        assert_eq!(key("telegram:direct:42", &s), "agent:ops:telegram:direct:42");
        assert_eq!(key("cron:nightly", &s), "agent:ops:cron:nightly");
        assert_eq!(key("cron:nightly:run:1", &s), "agent:ops:cron:nightly:run:1");
        assert_eq!(key("hook:abc", &s), "agent:ops:hook:abc");
        assert_eq!(key("node-n1", &s), "agent:ops:node-n1");
        assert_eq!(key("node:n1", &s), "agent:ops:node:n1");
        assert_eq!(key("direct:bob", &s), "agent:ops:direct:bob");
        let u = "5f0c7c1e-1111-4222-8333-444455556666";
        assert_eq!(key(&format!("subagent:{u}"), &s), format!("agent:ops:subagent:{u}"));
    }

    #[test]
    fn session_ids_are_candidates_not_keys() {
        let s = scope("main");
        let u = "4EB536F7-9b23-476f-b627-95ff73014ada";
        assert_eq!(parse_ref(u, &s), Ok(SessionRef::SessionId(u.into())));
        assert_eq!(parse_ref("abc.def_1", &s), Ok(SessionRef::SessionId("abc.def_1".into())));
    }

    #[test]
    fn malformed_inputs_say_what_is_wrong() {
        let s = scope("main");
        assert_eq!(parse_ref("", &s), Err(KeyError::Empty));
        assert_eq!(parse_ref("  ", &s), Err(KeyError::Empty));
        assert_eq!(parse_ref("a\0b", &s), Err(KeyError::ControlChar));
        assert_eq!(parse_ref("a b", &s), Err(KeyError::NotPrintable));
        assert_eq!(parse_ref("häh", &s), Err(KeyError::NotPrintable));
        assert!(matches!(parse_ref("agent:Bad!:x", &s), Err(KeyError::BadAgentId(_))));
        assert!(matches!(parse_ref("agent:ops", &s), Err(KeyError::MissingId(_))));
        assert!(matches!(parse_ref("agent:ops:", &s), Err(KeyError::MissingId(_))));
        assert!(matches!(parse_ref("cron:", &s), Err(KeyError::MissingId(_))));
        assert!(matches!(parse_ref("discord:group:", &s), Err(KeyError::MissingId(_))));
        assert!(matches!(parse_ref("subagent:nope", &s), Err(KeyError::BadSubagentId(_))));
        assert!(matches!(parse_ref("weird:thing", &s), Err(KeyError::BadForm(_))));
        let long = format!("agent:main:{}", "x".repeat(MAX_REST_BYTES + 1));
        assert_eq!(parse_ref(&long, &s), Err(KeyError::TooLong));
        let ok = format!("agent:main:{}", "x".repeat(MAX_REST_BYTES));
        assert!(parse_ref(&ok, &s).is_ok());
    }

    #[test]
    fn kinds_follow_the_part_after_the_agent_prefix() {
        // Fix: the reference classified every canonical key as `other`.
        let s = scope("main");
        let k = |x: &str| kind_of(&SessionKey::from_canonical(x), &s, None);
        assert_eq!(k("agent:main:main"), SessionKind::Main);
        assert_eq!(k("agent:ops:main"), SessionKind::Main);
        assert_eq!(k("agent:main:cron:x"), SessionKind::Cron);
        assert_eq!(k("agent:main:hook:x"), SessionKind::Hook);
        assert_eq!(k("agent:main:node-x"), SessionKind::Node);
        assert_eq!(k("agent:main:node:x"), SessionKind::Node);
        assert_eq!(k("agent:main:discord:group:dev"), SessionKind::Group);
        assert_eq!(k("agent:main:slack:channel:c1"), SessionKind::Group);
        assert_eq!(k("agent:main:telegram:direct:1"), SessionKind::Other);
        assert_eq!(k("agent:main:subagent:x"), SessionKind::Other);
        let stored = kind_of(&SessionKey::from_canonical("agent:main:x"), &s, Some(ChatType::Group));
        assert_eq!(stored, SessionKind::Group);
    }

    #[test]
    fn cron_run_keys_are_recognised() {
        assert!(SessionKey::from_canonical("agent:main:cron:j:run:r").is_cron_run());
        assert!(!SessionKey::from_canonical("agent:main:cron:j").is_cron_run());
    }

    #[test]
    fn display_is_main_only_for_the_callers_main() {
        let s = scope("ops");
        assert_eq!(s.display(&SessionKey::from_canonical("agent:ops:main")), "main");
        assert_eq!(s.display(&SessionKey::from_canonical("agent:main:main")), "agent:main:main");
    }

    #[test]
    fn channel_rule_prefers_the_key_over_an_internal_stamp() {
        // Fix: a stored `webchat` stamp hid the key's channel in the reference.
        let key = SessionKey::from_canonical("agent:main:discord:group:dev");
        let ch = channel_of(&key, SessionKind::Group, Some(ChatType::Group), Some("webchat"), Some("webchat"));
        assert_eq!(ch, "discord");
        let main = SessionKey::from_canonical("agent:main:main");
        assert_eq!(channel_of(&main, SessionKind::Main, None, Some("webchat"), Some("webchat")), "webchat");
        assert_eq!(channel_of(&main, SessionKind::Main, None, Some("telegram"), None), "telegram");
        assert_eq!(channel_of(&main, SessionKind::Main, None, None, None), "unknown");
        let cron = SessionKey::from_canonical("agent:main:cron:x");
        assert_eq!(channel_of(&cron, SessionKind::Cron, None, None, None), "internal");
        let sub = SessionKey::from_canonical("agent:main:subagent:x");
        assert_eq!(channel_of(&sub, SessionKind::Other, None, None, Some("slack")), "internal");
        let acct = SessionKey::from_canonical("agent:main:slack:acme:direct:u1");
        assert_eq!(channel_of(&acct, SessionKind::Other, None, None, None), "slack");
    }

    #[test]
    fn chat_type_is_stored_else_derived() {
        let k = SessionKey::from_canonical("agent:main:discord:group:dev");
        assert_eq!(chat_type_of(&k, None), Some(ChatType::Group));
        assert_eq!(chat_type_of(&k, Some(ChatType::Channel)), Some(ChatType::Channel));
        let d = SessionKey::from_canonical("agent:main:telegram:dm:1");
        assert_eq!(chat_type_of(&d, None), Some(ChatType::Direct));
        assert_eq!(ChatType::parse("dm"), Some(ChatType::Direct));
    }

    #[test]
    fn agent_ids_are_validated_and_lowercased() {
        assert_eq!(AgentId::parse("Ops").unwrap().as_str(), "ops");
        assert!(AgentId::parse("-x").is_err());
        assert!(AgentId::parse(&"a".repeat(65)).is_err());
        assert!(AgentId::parse("a_b-1").is_ok());
    }
}
