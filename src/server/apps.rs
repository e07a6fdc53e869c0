//! MCP Apps (the `io.modelcontextprotocol/ui` extension, npm `@modelcontextprotocol/ext-apps`):
//! two `ui://` views a host renders inline in a sandboxed iframe — the caller's sub-agent tree
//! (linked from `subagents`) and one child (linked from `sessions_spawn`).
//!
//! Only a client that declared the extension sees any of it: the tools' `_meta.ui.resourceUri`
//! link in `tools/list`, the two resources on the first page of `resources/list`, and their
//! `resources/read`. Every other client gets exactly what it got before (a `ui://` read is
//! "resource not found", like any unknown URI). The HTML is static and the same for everyone; its
//! data comes only from the tool results the host hands it and the tools it calls back through
//! the host, as the same caller, under the same access rules as any other call.

use rmcp::RoleServer;
use rmcp::model::{MetaObject, ReadResourceResult, Resource, ResourceContents, Tool};
use rmcp::service::RequestContext;
use serde_json::{Map, Value, json};

/// The extension's identifier in `capabilities.extensions`.
pub const EXTENSION_ID: &str = "io.modelcontextprotocol/ui";
/// The MIME type of an MCP App's HTML (`RESOURCE_MIME_TYPE` in the SDK).
pub const MIME_TYPE: &str = "text/html;profile=mcp-app";
/// The caller's sub-agent tree, rendered from a `subagents` result.
pub const TREE_URI: &str = "ui://sessions-mcp/tree.html";
/// One child, rendered from a `sessions_spawn` result.
pub const CHILD_URI: &str = "ui://sessions-mcp/child.html";

struct View {
    uri: &'static str,
    name: &'static str,
    title: &'static str,
    description: &'static str,
    html: &'static str,
    /// The tool whose results it renders.
    tool: &'static str,
}

const VIEWS: [View; 2] = [
    View {
        uri: TREE_URI,
        name: "subagents-tree",
        title: "Sub-agent tree",
        description: "Your sub-agents as a tree: state, runtime, tokens, cost, budget, open questions \
                      (an MCP App: shown inline by hosts that render them)",
        html: concat!(
            "<!doctype html>\n<html lang=\"en\" data-view=\"tree\">\n<head>\n",
            include_str!("apps/view.html")
        ),
        tool: "subagents",
    },
    View {
        uri: CHILD_URI,
        name: "subagent-child",
        title: "Sub-agent",
        description: "One spawned sub-agent: its state and last outcome \
                      (an MCP App: shown inline by hosts that render them)",
        html: concat!(
            "<!doctype html>\n<html lang=\"en\" data-view=\"child\">\n<head>\n",
            include_str!("apps/view.html")
        ),
        tool: "sessions_spawn",
    },
];

/// Whether the client declared MCP Apps (in `initialize`, or per request in `_meta`): the
/// extension's key, and our MIME type among its `mimeTypes` when it lists any.
pub fn declared(context: &RequestContext<RoleServer>) -> bool {
    let Some(caps) = context.client_capabilities() else { return false };
    let Some(settings) = caps.extensions.as_ref().and_then(|e| e.get(EXTENSION_ID)) else { return false };
    match settings.get("mimeTypes") {
        None => true,
        Some(Value::Array(types)) => types.iter().any(|t| t.as_str() == Some(MIME_TYPE)),
        Some(_) => false,
    }
}

/// The view's `_meta`: `ui` (no network at all: no CSP domains; a border) on the listing and on
/// the read content alike.
fn resource_meta() -> MetaObject {
    let mut meta = Map::new();
    meta.insert("ui".into(), json!({"prefersBorder": true}));
    MetaObject(meta)
}

/// Links a tool to its view: `_meta.ui.resourceUri`, and the legacy flat key
/// `_meta["ui/resourceUri"]` older hosts read (the SDK's `registerAppTool` sets both).
pub fn link(tool: &mut Tool) {
    let Some(view) = VIEWS.iter().find(|v| v.tool == tool.name) else { return };
    let mut meta = tool.meta.take().unwrap_or_default();
    meta.0.insert("ui".into(), json!({"resourceUri": view.uri}));
    meta.0.insert("ui/resourceUri".into(), json!(view.uri));
    tool.meta = Some(meta);
}

/// The views as `resources/list` entries.
pub fn resources() -> Vec<Resource> {
    VIEWS
        .iter()
        .map(|v| {
            Resource::new(v.uri, v.name)
                .with_title(v.title)
                .with_description(v.description)
                .with_mime_type(MIME_TYPE)
                .with_meta(resource_meta())
        })
        .collect()
}

/// A view's HTML; None for any other URI.
pub fn read(uri: &str) -> Option<ReadResourceResult> {
    let view = VIEWS.iter().find(|v| v.uri == uri)?;
    Some(ReadResourceResult::new(vec![ResourceContents::TextResourceContents {
        uri: view.uri.to_string(),
        mime_type: Some(MIME_TYPE.into()),
        text: view.html.to_string(),
        meta: Some(resource_meta()),
    }]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_view_is_self_contained_html_that_loads_nothing_from_outside() {
        for v in &VIEWS {
            let html = v.html;
            assert!(html.starts_with("<!doctype html>"), "{}", v.uri);
            for outside in ["http://", "https://", "src=\"//", "@import", "<link"] {
                assert!(!html.contains(outside), "{} contains {outside}", v.uri);
            }
            assert!(html.contains("ui/initialize") && html.contains("ui/notifications/tool-result"), "{}", v.uri);
        }
    }

    #[test]
    fn the_link_sets_both_keys_and_only_on_the_two_tools() {
        for spec in crate::tools::specs() {
            let mut tool = spec.to_tool();
            link(&mut tool);
            let uri = tool.meta.as_ref().and_then(|m| m.0.get("ui")).and_then(|u| u.get("resourceUri")).cloned();
            match spec.name.as_str() {
                "subagents" => assert_eq!(uri, Some(json!(TREE_URI))),
                "sessions_spawn" => assert_eq!(uri, Some(json!(CHILD_URI))),
                _ => assert!(tool.meta.is_none(), "{}", spec.name.as_str()),
            }
            if let Some(m) = &tool.meta {
                assert_eq!(m.0.get("ui/resourceUri"), uri.as_ref());
            }
        }
    }
}
