//! Discovery (docs/AGENTS.md, Discovery): which of the presets' agent CLIs are on PATH, with the
//! version each says it is. Found CLIs become agents (`Config::add_discovered`), so that a server
//! with no config runs the agent the user already has. A version is asked once per install of a
//! CLI (`--version`, 5 s at most) and kept in `<stateDir>/discovered.json` by path, size and
//! modification time, so a start costs a PATH lookup.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::{Config, Discovered, Discovery, RunnerPreset};

/// `SESSIONS_MCP_DISCOVERY` (`path` or `off`) overrides `agents.discovery`.
pub const DISCOVERY_ENV: &str = "SESSIONS_MCP_DISCOVERY";

const VERSION_TIMEOUT: Duration = Duration::from_secs(5);

/// Adds the agents whose CLIs are on PATH to `config`, unless discovery is off.
pub fn apply(config: &mut Config, state_dir: &Path) {
    if setting(config) == Discovery::Path {
        config.add_discovered(&on_path(state_dir));
    }
}

/// Whether discovery runs: `SESSIONS_MCP_DISCOVERY`, else `agents.discovery`.
pub fn setting(config: &Config) -> Discovery {
    match std::env::var(DISCOVERY_ENV).ok().as_deref().map(str::trim) {
        Some("off") => Discovery::Off,
        Some("path") => Discovery::Path,
        Some(other) => {
            tracing::warn!("{DISCOVERY_ENV}={other:?} is neither \"path\" nor \"off\"; using agents.discovery");
            config.agents.discovery
        }
        None => config.agents.discovery,
    }
}

/// The discoverable presets whose program is on PATH, in [`RunnerPreset::DISCOVERABLE`] order,
/// each with where it is and its version line.
pub fn on_path(state_dir: &Path) -> Vec<Discovered> {
    let cache_path = state_dir.join("discovered.json");
    let mut cache = read_cache(&cache_path);
    let before = cache.clone();
    let found = RunnerPreset::DISCOVERABLE
        .into_iter()
        .filter_map(|preset| {
            let path = which::which(preset.program()?).ok()?;
            let version = version_of(&path, &mut cache);
            Some(Discovered { preset, path, version })
        })
        .collect();
    if cache != before {
        keep_cache(&cache_path, &cache);
    }
    found
}

/// The version line of the program at `path`, asked once per install (kept with discovery's).
pub fn version(path: &Path, state_dir: &Path) -> String {
    let cache_path = state_dir.join("discovered.json");
    let mut cache = read_cache(&cache_path);
    let before = cache.clone();
    let version = version_of(path, &mut cache);
    if cache != before {
        keep_cache(&cache_path, &cache);
    }
    version
}

fn keep_cache(path: &Path, cache: &Cache) {
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(path, serde_json::to_vec(cache).unwrap_or_default()));
    if let Err(e) = written {
        tracing::debug!(path = %path.display(), error = %e, "keeping the discovered versions failed");
    }
}

/// What identifies one install of a program: a changed binary is asked again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Known {
    len: u64,
    modified_ms: u128,
    version: String,
}

type Cache = BTreeMap<PathBuf, Known>;

fn read_cache(path: &Path) -> Cache {
    std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
}

fn version_of(program: &Path, cache: &mut Cache) -> String {
    let real = std::fs::canonicalize(program).unwrap_or_else(|_| program.to_path_buf());
    let Ok(meta) = std::fs::metadata(&real) else { return String::new() };
    let modified_ms = meta.modified().ok().and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok());
    let (len, modified_ms) = (meta.len(), modified_ms.map_or(0, |d| d.as_millis()));
    if let Some(k) = cache.get(&real).filter(|k| k.len == len && k.modified_ms == modified_ms) {
        return k.version.clone();
    }
    let version = ask_version(program);
    cache.insert(real, Known { len, modified_ms, version: version.clone() });
    version
}

/// The first line `program --version` prints (at most 100 characters), or "" when it prints
/// nothing, fails or takes longer than [`VERSION_TIMEOUT`].
fn ask_version(program: &Path) -> String {
    let Some(out) = ask(program, &["--version"], VERSION_TIMEOUT) else { return String::new() };
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next().unwrap_or_default().trim().chars().take(100).collect()
}

/// Runs `program args…` with no input and its stderr dropped; None when it cannot start or takes
/// longer than `timeout` (it is killed then). A CLI's self-checks are short: a hung one must not
/// hold a start or a `doctor`.
pub(crate) fn ask(program: &Path, args: &[&str], timeout: Duration) -> Option<std::process::Output> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    child.wait_with_output().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn program(dir: &Path, name: &str, body: &str) {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn a_version_is_asked_once_per_install_and_a_silent_or_failing_cli_has_none() {
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("asked");
        program(dir.path(), "claude", &format!("echo x >> {}; echo '2.1.328 (Claude Code)'", count.display()));
        program(dir.path(), "codex", "exit 3");
        let mut cache = Cache::new();
        let claude = dir.path().join("claude");
        assert_eq!(version_of(&claude, &mut cache), "2.1.328 (Claude Code)");
        assert_eq!(version_of(&claude, &mut cache), "2.1.328 (Claude Code)");
        assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 1, "asked once");
        assert_eq!(version_of(&dir.path().join("codex"), &mut cache), "");
    }
}
