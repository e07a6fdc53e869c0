//! The MCP config a Claude Code child gets with `--mcp-config FILE` (docs/RUNNER-PROTOCOL.md,
//! Adapters): one stdio server `sessions` that runs `sessions-mcp connect`, the proxy to the
//! owner's run socket. Claude Code cannot speak HTTP over a Unix socket, hence the proxy. The run
//! token is in the file's `env` (never in argv: `/proc/<pid>/cmdline` is world-readable), so the
//! file is created 0600 in the run's TMPDIR and removed when the run ends. The token identifies the
//! child's session, so the server applies the sub-agent rules to whatever Claude calls.
//!
//! Codex has no config-file flag, so it gets the same server as `-c` overrides instead
//! ([`codex_overrides`]); they name only the variables `connect` needs (`env_vars`, which Codex
//! copies from its own environment into the server's), so the token stays out of argv there too.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

/// The MCP server name the CLIs see (Claude Code's tools become `mcp__sessions__<tool>`).
pub const SERVER_NAME: &str = "sessions";

/// The variables `connect` needs, copied from the run's environment.
const CONNECT_ENV: [&str; 4] =
    ["SESSIONS_MCP_TOKEN", "SESSIONS_MCP_SOCKET", "SESSIONS_MCP_RUN_ID", "SESSIONS_MCP_SESSION_KEY"];

/// Codex's `-c` overrides that add the `sessions` MCP server running `<exe> connect`. The values
/// are TOML; a JSON string is also a valid TOML basic string, hence `serde_json` for the quoting.
/// They are global options of `codex`, so they go before the agent's arguments and hold for
/// `exec` and `exec resume` alike.
pub fn codex_overrides(exe: &str) -> Vec<String> {
    let key = |field: &str| format!("mcp_servers.{SERVER_NAME}.{field}");
    [
        format!("{}={}", key("command"), Value::from(exe)),
        format!("{}={}", key("args"), json!(["connect"])),
        format!("{}={}", key("env_vars"), json!(CONNECT_ENV)),
    ]
    .into_iter()
    .flat_map(|o| ["-c".to_string(), o])
    .collect()
}

/// The written file; removed on drop.
#[derive(Debug)]
pub struct McpConfigFile {
    path: PathBuf,
}

impl McpConfigFile {
    /// Writes `<dir>/sessions-mcp-<runId>.json`: `exe` is this binary as the run sees it.
    pub fn write(dir: &Path, run_id: &str, exe: &str, env: &[(String, String)]) -> std::io::Result<Self> {
        let vars: Map<String, Value> = env
            .iter()
            .filter(|(k, _)| CONNECT_ENV.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        let config =
            json!({"mcpServers": {SERVER_NAME: {"type": "stdio", "command": exe, "args": ["connect"], "env": vars}}});
        let path = dir.join(format!("sessions-mcp-{run_id}.json"));
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
        file.write_all(config.to_string().as_bytes())?;
        Ok(McpConfigFile { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for McpConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_file_is_private_names_connect_carries_only_the_run_variables_and_goes_away() {
        let dir = tempfile::tempdir().unwrap();
        let env = [
            ("SESSIONS_MCP_TOKEN".to_string(), "smcp_run_secret".to_string()),
            ("SESSIONS_MCP_SOCKET".into(), "/s/mcp.sock".into()),
            ("ANTHROPIC_API_KEY".into(), "not-for-the-proxy".into()),
        ];
        let file = McpConfigFile::write(dir.path(), "r1", "/bin/sessions-mcp", &env).unwrap();
        let path = file.path().to_path_buf();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let server = &v["mcpServers"]["sessions"];
        assert_eq!(
            (server["command"].as_str(), server["args"][0].as_str()),
            (Some("/bin/sessions-mcp"), Some("connect"))
        );
        assert_eq!(server["env"]["SESSIONS_MCP_TOKEN"], "smcp_run_secret");
        assert!(server["env"].get("ANTHROPIC_API_KEY").is_none());
        drop(file);
        assert!(!path.exists());
    }

    #[test]
    fn codex_gets_connect_as_toml_overrides_that_name_the_variables_but_hold_no_values() {
        let args = codex_overrides("/opt/my \"odd\" dir/sessions-mcp");
        assert_eq!(
            args,
            [
                "-c",
                r#"mcp_servers.sessions.command="/opt/my \"odd\" dir/sessions-mcp""#,
                "-c",
                r#"mcp_servers.sessions.args=["connect"]"#,
                "-c",
                r#"mcp_servers.sessions.env_vars=["SESSIONS_MCP_TOKEN","SESSIONS_MCP_SOCKET","SESSIONS_MCP_RUN_ID","SESSIONS_MCP_SESSION_KEY"]"#,
            ]
        );
    }
}
