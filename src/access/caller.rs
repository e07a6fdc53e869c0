//! Who is calling. A [`Caller`] comes from the transport credential — a token, or the local
//! operator's `--as` on stdio — and never from tool arguments.

use std::sync::OnceLock;

use crate::config::{Config, configured_sandbox, key_scope};
use crate::keys::{AgentId, KeyScope, SessionKey, SessionRef, parse_ref};
use crate::policy::CallerRole;
use crate::store::{AccessKind, NewSession, Store, StoreError, now_ms, sha256_hex};

/// The run a run-token caller is inside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunBinding {
    pub run_id: String,
    pub chain_id: Option<String>,
    pub hop: i64,
}

/// The identity of one MCP client (stdio process or HTTP bearer).
#[derive(Debug, Clone)]
pub struct Caller {
    pub key: SessionKey,
    pub agent: AgentId,
    pub sandboxed: bool,
    /// An external session: an MCP client we do not run produces its turns.
    pub external: bool,
    pub role: CallerRole,
    /// Set for run tokens.
    pub run: Option<RunBinding>,
    /// `--as` on an existing driven (non-main) session: read tools only.
    pub read_only: bool,
    /// How `main` and bare keys resolve for it: computed once, at its first call.
    scope: OnceLock<KeyScope>,
}

impl Caller {
    /// A top-level caller outside any run.
    pub fn top_level(key: SessionKey, agent: AgentId, sandboxed: bool, external: bool) -> Caller {
        Caller {
            key,
            agent,
            sandboxed,
            external,
            role: CallerRole::TopLevel,
            run: None,
            read_only: false,
            scope: OnceLock::new(),
        }
    }

    /// The operator as `agent:main:main`, an external session: the caller of in-process
    /// measurements and fuzzing, where no transport establishes one.
    pub fn external_main() -> Caller {
        Caller::top_level(SessionKey::from_canonical("agent:main:main"), AgentId::main(), false, true)
    }

    /// The caller's key scope under `config`, computed at the first call and kept (a caller
    /// lives under one config: its connection's).
    pub(super) fn scope(&self, config: &Config) -> &KeyScope {
        self.scope.get_or_init(|| key_scope(config, &self.agent))
    }
}

/// Why no caller could be established. `serve` exits with code 2 on any of these.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("SESSIONS_MCP_TOKEN is not a valid token (unknown, or its run has ended)")]
    BadToken,
    #[error(
        "inside a run (SESSIONS_MCP_RUN_ID is set) only SESSIONS_MCP_TOKEN is accepted; the operator identity (--as / SESSIONS_MCP_SESSION) is refused"
    )]
    OperatorInsideRun,
    #[error("security.requireToken is true: set SESSIONS_MCP_TOKEN (the local operator shortcut is disabled)")]
    TokenRequired,
    #[error("--as / SESSIONS_MCP_SESSION {0:?}: {1}")]
    BadSessionKey(String, String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What the process was started with.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    pub token: Option<String>,
    pub as_session: Option<String>,
    pub inside_run: bool,
}

/// Resolves the stdio caller: a token wins; otherwise the operator's `--as` (default `main`).
pub fn resolve(creds: &Credentials, config: &Config, store: &Store) -> Result<Caller, IdentityError> {
    if let Some(token) = creds.token.as_deref().filter(|t| !t.is_empty()) {
        return by_token(token, config, store)?.ok_or(IdentityError::BadToken);
    }
    if creds.inside_run {
        return Err(IdentityError::OperatorInsideRun);
    }
    if config.security.require_token {
        return Err(IdentityError::TokenRequired);
    }
    let raw = creds.as_session.as_deref().unwrap_or("main");
    external_caller(raw, config, store)
}

/// A caller from a bearer token: a static `server.tokens[]` entry, a live client token minted by
/// `sessions-mcp token create --client` (looked up at every call: a revoke takes effect at once),
/// or a live run token.
pub fn by_token(token: &str, config: &Config, store: &Store) -> Result<Option<Caller>, IdentityError> {
    let hash = sha256_hex(token);
    if let Some(t) = config.server.tokens.iter().find(|t| t.sha256.eq_ignore_ascii_case(&hash)) {
        let mut caller = external_caller(&t.session_key, config, store)?;
        caller.sandboxed |= t.sandboxed;
        return Ok(Some(caller));
    }
    if let Some(minted) = store.live_access_token(&hash)? {
        return match (minted.kind, minted.session_key) {
            (AccessKind::Client, Some(key)) => external_caller(&key, config, store).map(Some),
            // An operator's token signs in to the operator's views, not to `/mcp` as a session.
            _ => Ok(None),
        };
    }
    let Some(row) = store.run_token(&hash, now_ms())? else { return Ok(None) };
    let key = SessionKey::from_canonical(row.session_key);
    let agent = key.agent_id(&config.default_agent());
    let depth = store.session_by_key(&key)?.map_or(0, |s| s.spawn_depth);
    Ok(Some(Caller {
        agent,
        sandboxed: row.sandboxed,
        external: false,
        role: if depth > 0 { CallerRole::Subagent { depth: depth as u32 } } else { CallerRole::TopLevel },
        run: Some(RunBinding { run_id: row.run_id.unwrap_or_default(), chain_id: row.chain_id, hop: row.hop }),
        read_only: false,
        key,
        scope: OnceLock::new(),
    }))
}

/// An external caller acting as `raw`: the session becomes external if it is a main session or
/// does not exist yet; an existing driven session is read-only for it.
fn external_caller(raw: &str, config: &Config, store: &Store) -> Result<Caller, IdentityError> {
    let default_agent = config.default_agent();
    let scope = key_scope(config, &default_agent);
    let key = match parse_ref(raw, &scope) {
        Ok(SessionRef::Key(k)) => k,
        Ok(SessionRef::SessionId(_)) => {
            return Err(IdentityError::BadSessionKey(raw.into(), "a session key is needed, not a sessionId".into()));
        }
        Err(e) => return Err(IdentityError::BadSessionKey(raw.into(), e.to_string())),
    };
    let agent = key.agent_id(&default_agent);
    let scope = key_scope(config, &agent);
    let is_main = scope.is_main(&key);
    let mut new = NewSession::new(key.clone(), agent.clone(), crate::keys::kind_of(&key, &scope, None), true);
    new.last_channel = Some("webchat".into());
    new.sandboxed = configured_sandbox(config, &key);
    let row = match store.session_by_key(&key)? {
        Some(row) if !row.external && !is_main => row,
        _ => store.ensure_external(&new, is_main)?,
    };
    Ok(Caller {
        key,
        agent,
        sandboxed: row.sandboxed,
        external: row.external,
        // The operator (or a static token) is never a sub-agent, even when it reads one's session.
        role: CallerRole::TopLevel,
        run: None,
        read_only: !row.external,
        scope: OnceLock::new(),
    })
}

impl super::Access {
    /// The caller a bearer token stands for (HTTP and the run socket).
    pub fn caller_by_token(&self, token: &str) -> Result<Option<Caller>, IdentityError> {
        by_token(token, &self.config, &self.store)
    }

    /// Whether a bearer token is an operator's: its sha256 in `server.operatorTokens`, or a live
    /// operator token minted by `sessions-mcp token create --operator`.
    pub fn is_operator_token(&self, token: &str) -> bool {
        let hash = sha256_hex(token);
        if self.config.server.operator_tokens.iter().any(|t| t.sha256.eq_ignore_ascii_case(&hash)) {
            return true;
        }
        match self.store.live_access_token(&hash) {
            Ok(minted) => minted.is_some_and(|t| t.kind == AccessKind::Operator),
            Err(e) => {
                tracing::error!(error = %e, "reading the minted tokens failed");
                false
            }
        }
    }
}
