//! `sessions-mcp token create|list|revoke` (docs/TOKENS.md): the operator mints the HTTP server's
//! bearer tokens instead of inventing a string and putting its sha256 in the config. A token is
//! 244 random bits from the OS (two uuid v4, as run tokens are made), printed once; the store
//! keeps only its sha256. Exits 0 on success, 1 when the store failed or nothing matched, 2 on a
//! usage problem.

use std::process::ExitCode;

use serde_json::{Value, json};

use crate::cli::Env;
use crate::cli::operator::failed;
use crate::config::key_scope;
use crate::keys::{SessionRef, parse_ref};
use crate::store::{AccessKind, AccessToken, MintRefused, Store, iso, sha256_hex};

/// The longest label.
const MAX_LABEL_CHARS: usize = 64;

/// `token create --operator|--client KEY [--label L]`.
pub fn create(env: &Env, store: &Store, client: Option<&str>, label: Option<&str>, as_json: bool) -> ExitCode {
    if let Some(why) = label.and_then(label_problem) {
        return super::fail(why);
    }
    let (kind, key) = match client.map(|raw| client_key(env, raw)) {
        None => (AccessKind::Operator, None),
        Some(Ok(key)) => (AccessKind::Client, Some(key)),
        Some(Err(why)) => return super::fail(why),
    };
    let token = format!("smcp_{}_{}{}", kind.as_str(), uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    let minted = match store.insert_access_token(&sha256_hex(&token), kind, key.as_deref(), label) {
        Ok(Ok(minted)) => minted,
        Ok(Err(MintRefused::LabelTaken(label))) => {
            return super::fail(format!(
                "--label {label:?} already names a live token; revoke it first (`sessions-mcp token revoke {label}`) or pick another label"
            ));
        }
        Err(e) => return failed(e),
    };
    if as_json {
        let mut out = row_json(&minted);
        out["token"] = token.into();
        println!("{}", serde_json::to_string_pretty(&out).expect("JSON serialises"));
        return ExitCode::SUCCESS;
    }
    let whom = match &minted.session_key {
        Some(key) => format!("a client token acting as {key}"),
        None => "an operator token".to_string(),
    };
    eprintln!("Minted {whom}, id {}. It is shown only now; only its sha256 is kept.", minted.id);
    eprintln!(
        "Use it as the header `Authorization: Bearer <token>`; revoke it with `sessions-mcp token revoke {}`.",
        minted.id
    );
    println!("{token}");
    ExitCode::SUCCESS
}

/// `token list [--json]`.
pub fn list(store: &Store, as_json: bool) -> ExitCode {
    let tokens = match store.access_tokens() {
        Ok(t) => t,
        Err(e) => return failed(e),
    };
    if as_json {
        let rows: Vec<Value> = tokens.iter().map(row_json).collect();
        println!("{}", serde_json::to_string_pretty(&json!({"tokens": rows})).expect("JSON serialises"));
        return ExitCode::SUCCESS;
    }
    println!("{:<16} {:<8} {:<24} {:<24} {:<24} {:<6} SESSION", "ID", "KIND", "LABEL", "CREATED", "REVOKED", "HASH");
    for t in &tokens {
        println!(
            "{:<16} {:<8} {:<24} {:<24} {:<24} …{:<5} {}",
            t.id,
            t.kind.as_str(),
            t.label.as_deref().unwrap_or("-"),
            iso(t.created_at),
            t.revoked_at.map_or("-".to_string(), iso),
            t.hash_tail,
            t.session_key.as_deref().unwrap_or("-")
        );
    }
    ExitCode::SUCCESS
}

/// `token revoke ID|LABEL`.
pub fn revoke(store: &Store, id_or_label: &str) -> ExitCode {
    match store.revoke_access_token(id_or_label) {
        Ok(Some(t)) => {
            let label = t.label.map(|l| format!(" ({l})")).unwrap_or_default();
            println!("revoked {}{label}: it no longer signs in", t.id);
            ExitCode::SUCCESS
        }
        Ok(None) => {
            failed(format!("no live token has the id or label {id_or_label:?} (`sessions-mcp token list` shows them)"))
        }
        Err(e) => failed(e),
    }
}

fn row_json(t: &AccessToken) -> Value {
    json!({
        "id": t.id, "kind": t.kind.as_str(), "sessionKey": t.session_key, "label": t.label,
        "createdAt": iso(t.created_at), "revokedAt": t.revoked_at.map(iso), "hashTail": t.hash_tail,
    })
}

/// A client's session KEY in its canonical form, as a `server.tokens` entry's `sessionKey` is read.
fn client_key(env: &Env, raw: &str) -> Result<String, String> {
    let config = &env.loaded.config;
    match parse_ref(raw, &key_scope(config, &config.default_agent())) {
        Ok(SessionRef::Key(key)) => Ok(key.as_str().to_string()),
        Ok(SessionRef::SessionId(_)) => {
            Err(format!("--client {raw:?} is a sessionId; a session key is needed (e.g. agent:main:desk)"))
        }
        Err(e) => Err(format!("--client {raw:?} is not a session key: {e}")),
    }
}

/// Why a label cannot be one: empty, too long, a control character, or the form of an id.
fn label_problem(label: &str) -> Option<String> {
    if label.trim().is_empty() {
        return Some("--label is empty; give a name, or leave --label out".into());
    }
    if label.chars().count() > MAX_LABEL_CHARS {
        return Some(format!("--label is longer than {MAX_LABEL_CHARS} characters"));
    }
    if label.chars().any(char::is_control) {
        return Some("--label has a control character; allowed: printable characters".into());
    }
    label.starts_with("tok_").then(|| "--label must not start with \"tok_\" (the form of a token's id)".into())
}

#[cfg(test)]
mod tests {
    use super::label_problem;

    #[test]
    fn a_label_is_a_short_printable_name_not_shaped_like_an_id() {
        assert_eq!(label_problem("ci runner @ laptop"), None);
        assert!(label_problem("  ").unwrap().contains("empty"));
        assert!(label_problem(&"x".repeat(65)).unwrap().contains("64"));
        assert!(label_problem("a\u{7}b").unwrap().contains("control"));
        assert!(label_problem("tok_1").unwrap().contains("tok_"));
    }
}
