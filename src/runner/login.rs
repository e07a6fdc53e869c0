//! Whether an agent CLI is logged in, asked the CLI's own way and without a model call
//! (docs/AGENTS.md, Login): Claude Code's `claude auth status` (JSON `loggedIn`), Codex's `codex
//! login status` (exit 0) or its key variables, Gemini CLI's key variables or its stored Google
//! sign-in. A person logs in after reading the answer, so it is kept one minute per program; a
//! tool call never waits for a CLI: it reads what is known and has a stale answer asked again in
//! the background.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::config::RunnerPreset;

/// How long a CLI may take to say whether it is logged in (Claude Code starts Node first).
const ASK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an answer is kept.
const FRESH_FOR: Duration = Duration::from_secs(60);

/// What a CLI says of its login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Login {
    /// Logged in, and how (`api_key via ANTHROPIC_API_KEY`, `codex login`, …).
    Yes(String),
    No,
    /// The CLI cannot tell, or could not be asked: why.
    Unknown(String),
}

impl Login {
    /// The line `agents_list` and `doctor` show.
    pub fn describe(&self, preset: RunnerPreset) -> String {
        match self {
            Login::Yes(how) => format!("logged in ({how})"),
            Login::No => format!("not logged in: {}", preset.login_hint().unwrap_or("log the CLI in")),
            Login::Unknown(why) => format!("unknown ({why})"),
        }
    }
}

/// Asks the CLI at `program` now (a `doctor`, a start's prefetch), and keeps the answer.
pub fn check(preset: RunnerPreset, program: &Path) -> Login {
    let login = ask_cli(preset, program, &|name| std::env::var(name).ok().filter(|v| !v.is_empty()));
    known().lock().unwrap_or_else(|e| e.into_inner()).insert(program.to_path_buf(), (Instant::now(), login.clone()));
    login
}

/// What is known of the CLI at `program` without waiting: None while it was never answered.
/// An answer older than a minute (or none) is asked again in the background.
pub fn known_or_ask(preset: RunnerPreset, program: &Path) -> Option<Login> {
    let entry = known().lock().unwrap_or_else(|e| e.into_inner()).get(program).cloned();
    if entry.as_ref().is_none_or(|(at, _)| at.elapsed() > FRESH_FOR) {
        let program = program.to_path_buf();
        std::thread::spawn(move || check(preset, &program));
    }
    entry.map(|(_, login)| login)
}

fn known() -> &'static Mutex<HashMap<PathBuf, (Instant, Login)>> {
    static KNOWN: OnceLock<Mutex<HashMap<PathBuf, (Instant, Login)>>> = OnceLock::new();
    KNOWN.get_or_init(Mutex::default)
}

/// The CLI's own answer, the variables in `var` standing for the run's environment.
fn ask_cli(preset: RunnerPreset, program: &Path, var: &dyn Fn(&str) -> Option<String>) -> Login {
    match preset {
        RunnerPreset::Claude => claude(program),
        RunnerPreset::Codex => codex(program, var),
        RunnerPreset::Gemini => gemini(var),
        RunnerPreset::Echo => Login::Yes("the built-in echo agent needs none".into()),
    }
}

/// `claude auth status --json`: `{"loggedIn": bool, "authMethod": …, "apiKeySource"?: …}`.
fn claude(program: &Path) -> Login {
    let Some(out) = super::discover::ask(program, &["auth", "status", "--json"], ASK_TIMEOUT) else {
        return Login::Unknown("`claude auth status` did not answer".into());
    };
    let Ok(status) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        return Login::Unknown("this Claude Code has no `claude auth status`".into());
    };
    match status["loggedIn"].as_bool() {
        Some(true) => {
            let method = status["authMethod"].as_str().unwrap_or("signed in");
            let how = status["apiKeySource"].as_str().map_or(method.to_string(), |var| format!("{method} via {var}"));
            Login::Yes(how)
        }
        Some(false) => Login::No,
        None => Login::Unknown("`claude auth status` gave no loggedIn".into()),
    }
}

/// `codex login status` exits 0 when Codex holds a login; `codex exec` also takes a key from
/// CODEX_API_KEY or OPENAI_API_KEY, and a `model_provider` of the user's own names its own key.
fn codex(program: &Path, var: &dyn Fn(&str) -> Option<String>) -> Login {
    if let Some(key) = ["CODEX_API_KEY", "OPENAI_API_KEY"].into_iter().find(|k| var(k).is_some()) {
        return Login::Yes(format!("api key via {key}"));
    }
    match super::discover::ask(program, &["login", "status"], ASK_TIMEOUT) {
        Some(out) if out.status.success() => Login::Yes("codex login".into()),
        Some(_) if own_provider(var) => Login::Unknown("config.toml names a model_provider of its own".into()),
        Some(_) => Login::No,
        None => Login::Unknown("`codex login status` did not answer".into()),
    }
}

/// Whether Codex's config.toml (in CODEX_HOME, else ~/.codex) chooses a `model_provider` (a
/// top-level key: a provider with its own endpoint and key, which `login status` does not know).
fn own_provider(var: &dyn Fn(&str) -> Option<String>) -> bool {
    let home = var("CODEX_HOME").map(PathBuf::from).or_else(|| var("HOME").map(|h| Path::new(&h).join(".codex")));
    let Some(text) = home.and_then(|h| std::fs::read_to_string(h.join("config.toml")).ok()) else { return false };
    text.lines()
        .map(str::trim_start)
        .take_while(|l| !l.starts_with('['))
        .any(|l| l.split('=').next().is_some_and(|k| k.trim() == "model_provider"))
}

/// Gemini CLI has no status command: its own start-up check, mirrored. The sign-in type is the
/// user settings' `security.auth.selectedType` (`~/.gemini/settings.json`, GEMINI_CLI_HOME in
/// place of HOME), else what the variables choose; then that type's credentials: the API key
/// (GEMINI_API_KEY, or the key Gemini saved in `gemini-credentials.json`), the Google sign-in
/// (`oauth_creds.json`, or GOOGLE_APPLICATION_CREDENTIALS). Vertex AI and Cloud credentials are
/// Google Cloud's to check, and `.env` files are not read: unknown.
fn gemini(var: &dyn Fn(&str) -> Option<String>) -> Login {
    let dir = var("GEMINI_CLI_HOME").or_else(|| var("HOME")).map(|h| Path::new(&h).join(".gemini"));
    let is = |name: &str| var(name).is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let selected = dir.as_ref().and_then(|d| std::fs::read(d.join("settings.json")).ok()).and_then(|b| {
        let settings: serde_json::Value = serde_json::from_slice(&b).ok()?;
        settings.pointer("/security/auth/selectedType")?.as_str().map(String::from)
    });
    let chosen = selected.or_else(|| {
        let by_env = [
            (is("GOOGLE_GENAI_USE_GCA"), "oauth-personal"),
            (is("GOOGLE_GENAI_USE_VERTEXAI"), "vertex-ai"),
            (var("GEMINI_API_KEY").is_some(), "gemini-api-key"),
        ];
        by_env.into_iter().find(|(set, _)| *set).map(|(_, t)| t.to_string())
    });
    let has = |file: &str| dir.as_ref().is_some_and(|d| d.join(file).is_file());
    match chosen.as_deref() {
        Some("gemini-api-key") if var("GEMINI_API_KEY").is_some() => Login::Yes("api key via GEMINI_API_KEY".into()),
        Some("gemini-api-key") if has("gemini-credentials.json") => Login::Yes("its saved API key".into()),
        Some("oauth-personal") if has("oauth_creds.json") => Login::Yes("Google sign-in".into()),
        Some("oauth-personal") if var("GOOGLE_APPLICATION_CREDENTIALS").is_some() => {
            Login::Yes("Google credentials via GOOGLE_APPLICATION_CREDENTIALS".into())
        }
        Some("gemini-api-key" | "oauth-personal") | None => Login::No,
        Some(other) => Login::Unknown(format!("sign-in type {other} is checked by Google Cloud")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn program(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn claude_is_asked_for_its_auth_status() {
        let dir = tempfile::tempdir().unwrap();
        let yes = program(
            dir.path(),
            "yes",
            r#"echo '{"loggedIn": true, "authMethod": "api_key", "apiKeySource": "ANTHROPIC_API_KEY"}'"#,
        );
        let no = program(dir.path(), "no", r#"echo '{"loggedIn": false, "authMethod": "none"}'; exit 1"#);
        let old = program(dir.path(), "old", "echo 'error: unknown command auth'; exit 1");
        assert_eq!(claude(&yes), Login::Yes("api_key via ANTHROPIC_API_KEY".into()));
        assert_eq!(claude(&no), Login::No);
        assert!(matches!(claude(&old), Login::Unknown(_)));
        assert_eq!(
            Login::No.describe(RunnerPreset::Claude),
            "not logged in: run `claude` once and log in with /login, or pass ANTHROPIC_API_KEY"
        );
    }

    #[test]
    fn codex_counts_its_login_its_key_variables_and_a_provider_of_the_users_own() {
        let dir = tempfile::tempdir().unwrap();
        let logged_out = program(dir.path(), "codex", "echo 'Not logged in'; exit 1");
        let logged_in = program(dir.path(), "codex-in", "echo 'Logged in using ChatGPT'");
        let home = dir.path().to_str().unwrap();
        assert_eq!(codex(&logged_out, &vars(&[("HOME", home)])), Login::No);
        assert_eq!(codex(&logged_in, &vars(&[("HOME", home)])), Login::Yes("codex login".into()));
        assert_eq!(
            codex(&logged_out, &vars(&[("CODEX_API_KEY", "k")])),
            Login::Yes("api key via CODEX_API_KEY".into())
        );
        std::fs::create_dir(dir.path().join(".codex")).unwrap();
        std::fs::write(dir.path().join(".codex/config.toml"), "model = \"m\"\nmodel_provider = \"mine\"\n[x]\n")
            .unwrap();
        assert!(matches!(codex(&logged_out, &vars(&[("HOME", home)])), Login::Unknown(_)));
        std::fs::write(dir.path().join(".codex/config.toml"), "[profiles.a]\nmodel_provider = \"mine\"\n").unwrap();
        assert_eq!(codex(&logged_out, &vars(&[("HOME", home)])), Login::No, "a profile's provider is not chosen");
    }

    #[test]
    fn gemini_checks_the_credentials_of_the_sign_in_type_it_would_use() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().to_str().unwrap();
        let gemini_dir = dir.path().join(".gemini");
        assert_eq!(gemini(&vars(&[("HOME", home)])), Login::No, "no sign-in chosen");
        assert_eq!(gemini(&vars(&[("GEMINI_API_KEY", "k")])), Login::Yes("api key via GEMINI_API_KEY".into()));
        std::fs::create_dir(&gemini_dir).unwrap();
        std::fs::write(gemini_dir.join("oauth_creds.json"), "{}").unwrap();
        assert_eq!(gemini(&vars(&[("HOME", home)])), Login::No, "credentials, but no sign-in type chosen");
        let chosen = |t: &str| {
            std::fs::write(
                gemini_dir.join("settings.json"),
                format!(r#"{{"security":{{"auth":{{"selectedType":"{t}"}}}}}}"#),
            )
            .unwrap()
        };
        chosen("oauth-personal");
        assert_eq!(gemini(&vars(&[("HOME", home)])), Login::Yes("Google sign-in".into()));
        chosen("gemini-api-key");
        assert_eq!(gemini(&vars(&[("HOME", home)])), Login::No, "the API key type without a key");
        chosen("vertex-ai");
        assert!(matches!(gemini(&vars(&[("HOME", home)])), Login::Unknown(_)));
    }
}
