//! The MCP surface: an rmcp [`ServerHandler`] that lists the caller's tools and routes calls to
//! `tools/`. The caller is bound to the transport — the stdio process's credentials, or per HTTP
//! request the bearer token (see [`http`]) — and never taken from tool arguments.

pub mod a2a;
mod apps;
mod bridge;
mod dashboard;
mod degraded;
mod elicit;
pub mod http;
mod http_sessions;
mod metrics;
mod owner_link;
mod resources;
mod roots;
mod sse;
mod stdio;
pub mod subscriptions;
mod tasks;

pub use degraded::DegradedServer;
pub use stdio::serve_lines;

use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CancelTaskParams, GetTaskParams, GetTaskResult,
    Implementation, InputRequiredResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ReadResourceRequestParams, ReadResourceResponse,
    ServerCapabilities, ServerConfig, SubscribeRequestParams, SubscriptionFilter, UnsubscribeRequestParams,
    UpdateTaskParams,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};

use std::sync::Arc;

use crate::access::Access;
use crate::access::caller::Caller;
use crate::engine::scheduler::Scheduler;
use crate::tools::{self, Ctx, Progress};
use elicit::{Pusher, Route, Shown};
use roots::ClientRoots;
use subscriptions::{Hub, Subscriptions};

/// One MCP server instance: for one caller (stdio), or resolving the caller per request (HTTP).
#[derive(Clone)]
pub struct SessionsServer {
    access: Access,
    /// The stdio process's caller; None when each request carries its own (HTTP).
    caller: Option<Caller>,
    runtime: Option<Arc<Scheduler>>,
    /// This MCP session's subscriptions; rmcp drops them with the session.
    subscriptions: Subscriptions,
    /// Pushes the asks put to an external caller to its host as elicitations (its watcher
    /// stops with the session).
    pusher: Arc<Pusher>,
    /// The asks shown by round trip, shared by the servers of one listener.
    shown: Shown,
    /// This MCP session's project, as its client's roots declare it.
    roots: ClientRoots,
}

impl SessionsServer {
    /// The server of one stdio process: its own subscription hub.
    pub fn new(access: Access, caller: Caller, runtime: Option<Arc<Scheduler>>) -> Self {
        let hub = Hub::new(access.clone(), access.config().server.max_subscriptions);
        Self::on_hub(access, caller, runtime, hub)
    }

    /// A server for one caller whose subscriptions count on a listener's `hub` (legacy SSE).
    pub fn on_hub(access: Access, caller: Caller, runtime: Option<Arc<Scheduler>>, hub: Hub) -> Self {
        SessionsServer::with(access, Some(caller), runtime, hub, Shown::default())
    }

    /// A server whose caller comes from each HTTP request (set by the bearer middleware).
    pub fn per_request(access: Access, runtime: Option<Arc<Scheduler>>, hub: Hub, shown: Shown) -> Self {
        SessionsServer::with(access, None, runtime, hub, shown)
    }

    fn with(access: Access, caller: Option<Caller>, runtime: Option<Arc<Scheduler>>, hub: Hub, shown: Shown) -> Self {
        let subscriptions = Subscriptions::new(hub);
        SessionsServer {
            access,
            caller,
            runtime,
            subscriptions,
            pusher: Arc::default(),
            shown,
            roots: ClientRoots::default(),
        }
    }

    /// Where the client shows elicitations, the route it takes for an external caller: the push
    /// watcher starts here (once per MCP session).
    /// None for a host known to answer elicitations by itself (`approvals.autoAnsweringClients`):
    /// it is not asked, and no person counts as reachable there.
    fn elicitation_route(&self, caller: &Caller, context: &RequestContext<RoleServer>) -> Option<Route> {
        let config = self.access.config();
        let auto = context.client_info().is_some_and(|i| crate::policy::auto_answering_client(&i.name, config));
        let route = elicit::route(context).filter(|_| caller.external && !auto)?;
        if route == Route::Push {
            let hub = self.subscriptions.hub();
            let client = context.client_info().map(|i| i.name);
            self.pusher.start(hub, &self.access, self.runtime.as_ref(), caller, context.peer.clone(), client);
        }
        Some(route)
    }

    /// A round trip's `input_required` for the asks put to the caller it was not shown yet.
    fn asks_to_show(&self, caller: &Caller) -> Option<CallToolResponse> {
        let new = self.shown.take_new(&self.access, caller);
        let requests = elicit::input_requests(&self.access, caller, &new);
        (!requests.is_empty())
            .then(|| CallToolResponse::InputRequired(InputRequiredResult::from_input_requests(requests)))
    }

    fn caller_for(&self, context: &RequestContext<RoleServer>) -> Result<Caller, McpError> {
        if let Some(c) = &self.caller {
            return Ok(c.clone());
        }
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>())
            .cloned()
            .ok_or_else(|| McpError::invalid_request("no caller bound to this request", None))
    }

    fn instructions(&self) -> String {
        let me = match &self.caller {
            Some(c) if c.external => self.access.scope(c).display(&c.key),
            Some(c) => c.key.to_string(),
            None => "<the session of your bearer token>".to_string(),
        };
        guide(&me)
    }
}

/// Cancels the request when its HTTP client went away before the answer was sent
/// ([`http::ClientGone`]); a transport that ends its requests itself (stdio) carries none.
fn stop_when_client_gone(context: &RequestContext<RoleServer>) {
    let parts = context.extensions.get::<axum::http::request::Parts>();
    let Some(http::ClientGone(gone)) = parts.and_then(|p| p.extensions.get::<http::ClientGone>()).cloned() else {
        return;
    };
    let request = context.ct.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = gone.cancelled() => request.cancel(),
            _ = request.cancelled() => {}
        }
    });
}

/// The server instructions for a caller acting as session `me`: one line per tool (what for, its
/// key arguments) and the inbox pattern. They are the model's first guide to the tools: Claude
/// Code defers MCP tools behind its ToolSearch, so until the model loads a schema it sees only the
/// tool names and these lines.
fn guide(me: &str) -> String {
    format!(
        "sessions-mcp: session tools. You act as session {me:?}.\n\
         - sessions_list: sessions you may see, newest first {{kinds?, activeMinutes?, messageLimit?, cursor?}}\n\
         - sessions_history: a session's messages, oldest first, each with its seq {{sessionKey, afterSeq?, \
         beforeSeq?}}; page with nextAfterSeq / nextBeforeSeq\n\
         - sessions_send: message another session and wait for its reply {{sessionKey or label, message, \
         timeoutSeconds? (0 = do not wait)}}\n\
         - sessions_spawn: run a sub-agent in a child session; never blocks {{task, label?, agentId?}}\n\
         - subagents: your sub-agents {{action: list | wait | cancel | steer | respond}}; wait {{childSessionKeys?, until?: any | all}} \
         returns when they finish, with their results: use it, do not poll\n\
         - agents_list: the agentIds sessions_spawn may target\n\
         Inbox: spawn results and late send replies land in your own session: \
         sessions_history {{sessionKey: \"{me}\", afterSeq: N}}, N the last seq you saw (the call's inbox.afterSeq)."
    )
}

impl SessionsServer {
    /// A tool context for a request (also used to read resources through the tools' path).
    fn ctx<'a>(&'a self, caller: &'a Caller, context: &RequestContext<RoleServer>) -> Ctx<'a> {
        let host = context.client_info().map(|i| i.name);
        Ctx {
            access: &self.access,
            caller,
            runtime: self.runtime.as_ref(),
            cancel: context.ct.clone(),
            progress: None,
            host,
            project: None,
            elicits: self.elicitation_route(caller, context).is_some(),
        }
    }
}

impl ServerHandler for SessionsServer {
    async fn on_roots_list_changed(&self, _context: rmcp::service::NotificationContext<RoleServer>) {
        self.roots.forget().await;
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(resources::templates())
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let caller = self.caller_for(&context)?;
        let cursor = request.and_then(|r| r.cursor);
        let first_page = cursor.is_none();
        let mut result = resources::list(&self.access, &caller, cursor)?;
        if first_page && apps::declared(&context) {
            result.resources.splice(0..0, apps::resources());
        }
        Ok(result)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let caller = self.caller_for(&context)?;
        if let Some(view) = apps::read(&request.uri).filter(|_| apps::declared(&context)) {
            return Ok(view.into());
        }
        resources::read(&self.ctx(&caller, &context), &request.uri).await.map(Into::into)
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller_for(&context)?;
        let peer = context.peer.clone();
        resources::subscribe(&self.ctx(&caller, &context), &self.subscriptions, &request.uri, peer).await
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller_for(&context)?;
        resources::unsubscribe(&self.ctx(&caller, &context), &self.subscriptions, &request.uri);
        Ok(())
    }

    /// Accepted so that clients which always set a level work; we send no log notifications (the
    /// server's logs go to stderr, and 2026-07-28 drops `logging/setLevel` altogether).
    #[allow(deprecated)]
    async fn set_level(
        &self,
        _request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        Ok(())
    }

    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        Some(resources::accepted_filter(requested))
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let caller = self.caller_for(context.request_context())?;
        let request = context.request_context().clone();
        resources::listen(&self.ctx(&caller, &request), self.subscriptions.fresh(), context).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let caller = self.caller_for(&context)?;
        let elicits = elicit::route(&context).is_some();
        tasks::get(&self.access, &caller, &request.task_id, elicits)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller_for(&context)?;
        tasks::cancel(self.runtime.as_ref(), &self.access, &caller, &request.task_id)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller_for(&context)?;
        let client = context.client_info().map(|i| i.name);
        let responses = &request.input_responses;
        tasks::update(self.runtime.as_ref(), &self.access, &caller, &request.task_id, responses, client.as_deref())
    }

    #[allow(deprecated)] // logging: still part of the 2025-11-25 era we serve
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_logging()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")))
        .with_instructions(self.instructions())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let caller = self.caller_for(&context)?;
        self.elicitation_route(&caller, &context);
        let offered = self.access.tools_for(&caller);
        let apps = apps::declared(&context);
        let tools = tools::specs()
            .iter()
            .filter(|s| offered.contains(&s.name))
            .map(|s| {
                let mut tool = s.to_tool();
                if apps {
                    apps::link(&mut tool);
                }
                tool
            })
            .collect();
        let mut result = ListToolsResult::with_all_items(tools);
        // The list depends on the caller: never cache it for anyone else.
        result.cache_scope = Some(CacheScope::Private);
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        // One forwarder per call keeps progress notifications in order.
        let progress: Option<Progress> = context.meta.get_progress_token().map(|token| {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(f64, String)>();
            let peer = context.peer.clone();
            tokio::spawn(async move {
                while let Some((n, text)) = rx.recv().await {
                    let _ =
                        peer.notify_progress(ProgressNotificationParam::new(token.clone(), n).with_message(text)).await;
                }
            });
            let p: Progress = Arc::new(move |n: f64, text: String| {
                let _ = tx.send((n, text));
            });
            p
        });
        let caller = self.caller_for(&context)?;
        stop_when_client_gone(&context);
        let route = self.elicitation_route(&caller, &context);
        let round_trip = route == Some(Route::RoundTrip);
        if round_trip {
            if let Some(responses) = &request.input_responses {
                let client = context.client_info().map(|i| i.name);
                let (runtime, shown) = (self.runtime.as_ref(), Some(&self.shown));
                elicit::apply_responses(&self.access, runtime, &caller, responses, client.as_deref(), shown)?;
            }
            if let Some(show) = self.asks_to_show(&caller) {
                return Ok(show);
            }
        }
        let ctx = Ctx {
            access: &self.access,
            caller: &caller,
            runtime: self.runtime.as_ref(),
            cancel: context.ct.clone(),
            progress,
            host: context.client_info().map(|i| i.name),
            // Only a spawn needs the project, and asking the client costs it a round trip.
            project: match request.name.as_ref() {
                "sessions_spawn" => self.roots.project(&context).await,
                _ => None,
            },
            elicits: route.is_some(),
        };
        let wants_task = context.client_capabilities().is_some_and(|c| c.supports_tasks());
        if let Some(tool) = tasks::runs_as_task(&request.name, request.arguments.as_ref()).filter(|_| wants_task) {
            let result = tools::run(&ctx, tool, tasks::without_wait(tool, request.arguments)).await;
            return Ok(tasks::answer(&self.access, result));
        }
        let started = std::time::Instant::now();
        let Some(result) = tools::call(&ctx, &request.name, request.arguments).await else {
            return Err(unknown_tool(&request.name));
        };
        let status = if result.is_error == Some(true) { "error" } else { "ok" };
        crate::metrics::observe_tool(&request.name, status, started.elapsed().as_secs_f64());
        // A wait that stopped only because a sub-agent asks: the person sees the ask at once, and
        // the client's retry waits on.
        if round_trip
            && elicit::only_attention(&result)
            && let Some(show) = self.asks_to_show(&caller)
        {
            return Ok(show);
        }
        Ok(CallToolResponse::Complete(result))
    }
}

/// The protocol error for a `tools/call` naming no tool of ours.
fn unknown_tool(name: &str) -> McpError {
    McpError::invalid_params(
        format!(
            "unknown tool {name:?}; tools: agents_list, sessions_history, sessions_list, sessions_send, sessions_spawn, subagents"
        ),
        None,
    )
}

/// Serves one caller (or the degraded server) over stdin/stdout until the client closes stdin.
pub async fn serve_stdio(server: impl ServerHandler) -> anyhow::Result<()> {
    serve_lines(server, tokio::io::stdin(), tokio::io::stdout()).await
}

#[cfg(test)]
mod tests {
    use super::guide;

    /// The guide stays under this many bytes (with a session key of up to 64 characters): about
    /// 150 per tool line, six tools, and the inbox line.
    const GUIDE_MAX_BYTES: usize = 1100;

    #[test]
    fn the_guide_names_every_tool_and_the_inbox_pattern_within_its_size() {
        for me in ["main", "<the session of your bearer token>", &format!("agent:main:{}", "x".repeat(53))] {
            let text = guide(me);
            for tool in crate::tools::specs() {
                let line = format!("\n- {}: ", tool.name.as_str());
                assert!(text.contains(&line), "a line for {}: {text}", tool.name.as_str());
            }
            assert!(text.contains(&format!("sessions_history {{sessionKey: \"{me}\", afterSeq: N}}")), "{text}");
            assert!(text.len() < GUIDE_MAX_BYTES, "{} bytes for {me:?}: {text}", text.len());
        }
    }
}
