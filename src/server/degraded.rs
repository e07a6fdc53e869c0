//! Degraded mode: what `serve` answers over stdio when it cannot start (a config it refuses, a
//! store it cannot open, a runtime that fails). Hosts hide a server that exits at start — Claude
//! Code reports `failed` and goes on, Codex shows nothing — so the user never sees why. Instead the
//! server stays up with no store and no caller, and says the problem wherever the model or the user
//! looks: the `instructions`, every `tools/call` (a normal tool error, so the model reads it and
//! tells the user), and `resources/read`. `tools/list` offers the usual six tools with their
//! usual schemas, so the model calls one instead of concluding the server has none.

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};

use crate::policy::ToolName;
use crate::tools::{self, ToolError};

/// A server that answers every request with why sessions-mcp could not start.
#[derive(Clone)]
pub struct DegradedServer {
    message: String,
}

impl DegradedServer {
    /// `problem`: the one line `serve` would have exited with (what is wrong, and its fix).
    pub fn new(problem: &str) -> Self {
        DegradedServer {
            message: format!(
                "sessions-mcp could not start: {problem}. No session tool works until that is fixed and this MCP \
                 server is restarted; tell the user."
            ),
        }
    }

    /// What every answer says (also logged once at start).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl ServerHandler for DegradedServer {
    #[allow(deprecated)] // logging: clients of the 2025-11-25 era set a level whatever we declare
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_resources().enable_logging().build())
            .with_server_info(Implementation::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")))
            .with_instructions(self.message.clone())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools::specs().iter().map(|s| s.to_tool()).collect()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        match ToolName::parse(&request.name) {
            Some(_) => Ok(CallToolResponse::Complete(tools::error_result(ToolError::error(self.message.clone())))),
            None => Err(super::unknown_tool(&request.name)),
        }
    }

    /// `resources/list` is empty (rmcp's default); a read names the problem.
    async fn read_resource(
        &self,
        _request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        Err(McpError::internal_error(self.message.clone(), None))
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        _request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        Ok(())
    }
}
