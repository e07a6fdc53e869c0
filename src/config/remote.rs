//! The remote agents of `runner.kind: "a2a"`: which card URL the server may call, and with which
//! credential. Checked when the config loads, so that no outbound call ever goes to a URL that is
//! not configured, nor in plain text to another host.

use super::{RunnerConfig, RunnerKind};

/// A remote agent as configured and checked: what the A2A runner calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteAgent {
    /// The agent card's URL (https, or http to a loopback host).
    pub card_url: url::Url,
    /// The environment variable whose value is sent as the bearer token, read at each run so a
    /// rotated token needs no restart.
    pub token_env: Option<String>,
    /// The card's skill the messages ask for.
    pub skill: Option<String>,
}

impl RemoteAgent {
    /// The remote agent of effective runner settings `r` (None: not `kind: "a2a"`); `path` names
    /// the block in the error.
    pub fn of(path: &str, r: &RunnerConfig) -> Result<Option<RemoteAgent>, String> {
        if r.kind != Some(RunnerKind::A2a) {
            if let Some(key) = a2a_key_set(r) {
                return Err(format!(
                    "{path}.{key} is only for runner.kind \"a2a\" (a remote agent), not {}",
                    kind_name(r)
                ));
            }
            return Ok(None);
        }
        let Some(raw) = r.card_url.as_deref() else {
            return Err(format!(
                "{path}.cardUrl is required with kind \"a2a\": the URL of the remote agent's card, e.g. \"https://agents.example.com/.well-known/agent-card.json\""
            ));
        };
        let card_url = card_url(raw).map_err(|why| format!("{path}.cardUrl {raw:?}: {why}"))?;
        if let Some(name) = r.token_env.as_deref().filter(|n| !is_env_name(n)) {
            return Err(format!(
                "{path}.tokenEnv {name:?} is not an environment variable name (letters, digits and _, not starting with a digit): name the variable that holds the token, never the token itself"
            ));
        }
        if r.skill.as_deref().is_some_and(|s| s.trim().is_empty()) {
            return Err(format!(
                "{path}.skill must not be empty: a skill id of the remote agent's card, or leave it out"
            ));
        }
        Ok(Some(RemoteAgent { card_url, token_env: r.token_env.clone(), skill: r.skill.clone() }))
    }
}

/// Checks one runner block at config load.
pub fn validate(path: &str, r: &RunnerConfig) -> Result<(), String> {
    RemoteAgent::of(path, r).map(|_| ())
}

/// The first A2A-only key set on `r`.
fn a2a_key_set(r: &RunnerConfig) -> Option<&'static str> {
    [("cardUrl", r.card_url.is_some()), ("tokenEnv", r.token_env.is_some()), ("skill", r.skill.is_some())]
        .into_iter()
        .find_map(|(key, set)| set.then_some(key))
}

fn kind_name(r: &RunnerConfig) -> String {
    match r.kind {
        Some(kind) => serde_json::to_value(kind).map(|v| format!("kind {v}")).unwrap_or_default(),
        None => "the default kind \"jsonl\"".into(),
    }
}

/// Parses a card URL we may call: absolute http(s), no credentials inside, and plain http only
/// to a loopback host (a token or a task must never cross a network in clear).
fn card_url(raw: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("is not an absolute URL ({e})"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not carry a user or password: give the token through tokenEnv".into());
    }
    match url.scheme() {
        "https" => Ok(url),
        "http" if is_loopback(&url) => Ok(url),
        "http" => Err(format!(
            "plain http is allowed only to a loopback host (localhost, 127.0.0.0/8, ::1), not {:?}: use https",
            url.host_str().unwrap_or_default()
        )),
        other => Err(format!("must be https (or http to a loopback host), not {other}:")),
    }
}

/// Whether `url` names this machine: `localhost` or a loopback address.
pub fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a2a(card: Option<&str>) -> RunnerConfig {
        RunnerConfig { kind: Some(RunnerKind::A2a), card_url: card.map(String::from), ..Default::default() }
    }

    fn error(r: &RunnerConfig) -> String {
        RemoteAgent::of("agents.list[0].runner", r).expect_err("refused")
    }

    #[test]
    fn https_and_loopback_http_card_urls_are_taken() {
        for ok in [
            "https://agents.example.com/.well-known/agent-card.json",
            "http://127.0.0.1:8080/.well-known/agent-card.json",
            "http://localhost:9/card",
            "http://[::1]:9/card",
            "http://127.3.4.5/card",
        ] {
            let agent = RemoteAgent::of("p", &a2a(Some(ok))).expect(ok).expect("remote");
            assert_eq!(agent.card_url.as_str(), url::Url::parse(ok).unwrap().as_str());
        }
    }

    #[test]
    fn plain_http_to_another_host_is_refused_naming_the_key_and_the_host() {
        for host in ["http://agents.example.com/card", "http://10.0.0.2:80/card", "http://localhost.evil.com/card"] {
            let e = error(&a2a(Some(host)));
            assert!(e.starts_with("agents.list[0].runner.cardUrl"), "{e}");
            assert!(e.contains("plain http is allowed only to a loopback host"), "{e}");
        }
    }

    #[test]
    fn a_bad_card_url_is_refused_with_what_is_wrong() {
        assert!(error(&a2a(None)).contains("cardUrl is required with kind \"a2a\""));
        assert!(error(&a2a(Some("agents/card.json"))).contains("is not an absolute URL"));
        assert!(error(&a2a(Some("ftp://h/card"))).contains("must be https (or http to a loopback host), not ftp:"));
        assert!(error(&a2a(Some("https://me:secret@h/card"))).contains("must not carry a user or password"));
    }

    #[test]
    fn token_env_is_a_variable_name_and_skill_not_blank() {
        let mut r = a2a(Some("https://h/card"));
        r.token_env = Some("sk-live-123".into());
        assert!(error(&r).contains("tokenEnv \"sk-live-123\" is not an environment variable name"));
        r.token_env = Some("REMOTE_TOKEN".into());
        r.skill = Some(" ".into());
        assert!(error(&r).contains("skill must not be empty"));
        r.skill = Some("review".into());
        let agent = RemoteAgent::of("p", &r).unwrap().unwrap();
        assert_eq!((agent.token_env.as_deref(), agent.skill.as_deref()), (Some("REMOTE_TOKEN"), Some("review")));
    }

    #[test]
    fn a2a_keys_on_another_kind_are_refused() {
        let r = RunnerConfig { card_url: Some("https://h/card".into()), ..Default::default() };
        assert!(error(&r).contains("cardUrl is only for runner.kind \"a2a\""), "{}", error(&r));
        let r = RunnerConfig { kind: Some(RunnerKind::Text), token_env: Some("T".into()), ..Default::default() };
        assert!(error(&r).contains("tokenEnv is only for runner.kind \"a2a\" (a remote agent), not kind \"text\""));
    }
}
