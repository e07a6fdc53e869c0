//! MCP Apps (the `io.modelcontextprotocol/ui` extension), black-box over stdio: a client that
//! declares it gets `_meta.ui.resourceUri` on `subagents` (the tree view) and `sessions_spawn` (the
//! child view) in `tools/list`, the two `ui://` resources on the first page of `resources/list`,
//! and their HTML from `resources/read`; a client that does not sees exactly what it saw before.
//!
//! Against the extension's own contract (`tests/clients/ext_apps.mjs`, the npm package
//! `@modelcontextprotocol/ext-apps` that `.ci/run` installs into `.ci/ext-apps`): the metadata is
//! validated against its generated JSON Schema, and both views are rendered in headless Chromium
//! by a host built on its `AppBridge`. Without node or the package the test says so and passes
//! locally; under CI (`CI` set) a missing piece is a failure.

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::{Client, TestEnv, agents_config, scripted_agent};
use serde_json::{Value, json};

const MIME: &str = "text/html;profile=mcp-app";
const TREE: &str = "ui://sessions-mcp/tree.html";
const CHILD: &str = "ui://sessions-mcp/child.html";

fn apps_capabilities() -> Value {
    json!({"extensions": {"io.modelcontextprotocol/ui": {"mimeTypes": [MIME]}}})
}

/// Agent `main` (scripted: a child answers `child: <task>` at once) and a few sessions.
fn env() -> TestEnv {
    let mut env = TestEnv::new();
    let main = scripted_agent(&env, "main", &json!({"default": {"reply": "child: {input}"}}), json!({}));
    env.set_config(&agents_config(vec![main], json!({})));
    env.seed(json!({"sessions": [{"key": "agent:main:other"}]}));
    env
}

fn serve(env: &TestEnv, capabilities: Value) -> Client {
    Client::start_declaring(env.command(&["serve"]), capabilities)
}

fn result(c: &mut Client, method: &str, params: Value) -> Value {
    let resp = c.request(method, params);
    assert!(resp.get("error").is_none(), "{method} → {resp}");
    resp["result"].clone()
}

fn tool<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["tools"].as_array().unwrap().iter().find(|t| t["name"] == name).unwrap_or_else(|| panic!("no {name}"))
}

#[test]
fn with_the_declaration_the_tools_link_their_views_and_the_resources_serve_them() {
    let env = env();
    let mut c = serve(&env, apps_capabilities());
    let tools = result(&mut c, "tools/list", json!({}));
    for (name, uri) in [("subagents", TREE), ("sessions_spawn", CHILD)] {
        let meta = &tool(&tools, name)["_meta"];
        assert_eq!(meta["ui"], json!({"resourceUri": uri}), "{name}: {meta}");
        assert_eq!(meta["ui/resourceUri"], uri, "{name}: the legacy key too");
    }
    for t in tools["tools"].as_array().unwrap() {
        if !["subagents", "sessions_spawn"].contains(&t["name"].as_str().unwrap()) {
            assert!(t.get("_meta").is_none(), "{t}");
        }
    }

    let list = result(&mut c, "resources/list", json!({}));
    let resources = list["resources"].as_array().unwrap();
    for uri in [TREE, CHILD] {
        let r = resources.iter().find(|r| r["uri"] == uri).unwrap_or_else(|| panic!("{uri} in {list}"));
        assert_eq!(r["mimeType"], MIME, "{r}");
        assert_eq!(r["_meta"]["ui"], json!({"prefersBorder": true}), "{r}");
        let read = result(&mut c, "resources/read", json!({"uri": uri}));
        let content = &read["contents"][0];
        assert_eq!(content["uri"], uri);
        assert_eq!(content["mimeType"], MIME);
        assert_eq!(content["_meta"]["ui"], json!({"prefersBorder": true}));
        let html = content["text"].as_str().unwrap();
        let view = if uri == TREE { "tree" } else { "child" };
        assert!(html.starts_with(&format!("<!doctype html>\n<html lang=\"en\" data-view=\"{view}\">")), "{uri}");
    }
    // The sessions follow as before; a later page carries no views again.
    assert!(resources.iter().any(|r| r["uri"] == "sessions://history/agent:main:other"), "{list}");
    // An unknown ui:// URI is not found, like any unknown resource.
    let unknown = c.request("resources/read", json!({"uri": "ui://sessions-mcp/nope.html"}));
    assert!(unknown.get("error").is_some(), "{unknown}");
    c.close();
}

/// What a client that does not declare MCP Apps sees: the same lists as a declaring client's
/// minus the views and links, and a `ui://` read answered exactly like any unknown resource.
fn strip_apps(mut tools: Value, mut resources: Value) -> (Value, Value) {
    for t in tools["tools"].as_array_mut().unwrap() {
        t.as_object_mut().unwrap().remove("_meta");
    }
    resources["resources"].as_array_mut().unwrap().retain(|r| !r["uri"].as_str().unwrap().starts_with("ui://"));
    (tools, resources)
}

#[test]
fn without_the_declaration_nothing_changes() {
    let env = env();
    let mut apps = serve(&env, apps_capabilities());
    let declared =
        strip_apps(result(&mut apps, "tools/list", json!({})), result(&mut apps, "resources/list", json!({})));
    apps.close();
    for capabilities in [
        json!({}),
        json!({"elicitation": {"form": {}}, "extensions": {"io.modelcontextprotocol/tasks": {}}}),
        // Declared, but for other MIME types only.
        json!({"extensions": {"io.modelcontextprotocol/ui": {"mimeTypes": ["text/html+skybridge"]}}}),
    ] {
        let mut c = serve(&env, capabilities.clone());
        let tools = result(&mut c, "tools/list", json!({}));
        let resources = result(&mut c, "resources/list", json!({}));
        assert!(!tools.to_string().contains("ui://"), "{capabilities}: {tools}");
        assert!(!resources.to_string().contains("ui://"), "{capabilities}: {resources}");
        assert_eq!((tools, resources), declared, "{capabilities}");
        let view = c.request("resources/read", json!({"uri": TREE}));
        let other = c.request("resources/read", json!({"uri": "sessions://history/agent:main:nobody"}));
        assert_eq!(view["error"]["code"], other["error"]["code"], "{view} / {other}");
        assert_eq!(view["error"]["message"], other["error"]["message"], "{view} / {other}");
        assert_eq!(view["error"]["data"], json!({"uri": TREE}), "{view}");
        c.close();
    }
}

/// The directory holding node_modules with the ext-apps package, or None (and a message) when
/// node or the package is missing; under CI a missing one is a failure.
pub(crate) fn ext_apps(needs_browser: bool) -> Option<PathBuf> {
    let dir = std::env::var_os("SESSIONS_MCP_EXT_APPS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".ci/ext-apps"));
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    let package = dir.join("node_modules/@modelcontextprotocol/ext-apps/package.json").is_file();
    let browser =
        std::env::var_os("SESSIONS_MCP_CHROMIUM").map(PathBuf::from).unwrap_or_else(|| "/usr/bin/chromium".into());
    let missing = if !node {
        Some("node".to_string())
    } else if !package {
        Some(format!("{}/node_modules/@modelcontextprotocol/ext-apps (.ci/run installs it)", dir.display()))
    } else if needs_browser && !browser.is_file() {
        Some(format!("a Chromium at {} (set SESSIONS_MCP_CHROMIUM)", browser.display()))
    } else {
        None
    };
    let Some(missing) = missing else { return Some(dir) };
    assert!(std::env::var_os("CI").is_none(), "CI needs {missing} for the MCP Apps checks");
    eprintln!("skipped: no {missing}");
    None
}

fn run_script(mode: &str, dir: &PathBuf, env: &TestEnv) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/ext_apps.mjs");
    let serve = env.command(&["serve"]);
    let mut cmd = Command::new("node");
    cmd.arg(script).arg(mode).arg(dir).arg("--").arg(serve.get_program()).args(serve.get_args());
    for (k, v) in serve.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let out = cmd.stdin(Stdio::null()).output().expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("ok {mode}")),
        "ext_apps.mjs {mode} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", stdout.trim());
}

#[test]
fn the_views_and_links_validate_against_the_extensions_schema() {
    let Some(dir) = ext_apps(false) else { return };
    run_script("validate", &dir, &env());
}

#[test]
fn both_views_render_in_a_host_built_on_the_extensions_app_bridge() {
    let Some(dir) = ext_apps(true) else { return };
    run_script("render", &dir, &env());
}
