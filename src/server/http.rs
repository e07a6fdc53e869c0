//! The MCP service over HTTP: rmcp's streamable HTTP at `/mcp` behind a bearer-token middleware
//! that resolves the caller per request (static client tokens from config, run tokens). The owner
//! serves it on its Unix socket `<stateDir>/run/mcp.sock` (0600) for run callbacks; `serve --http`
//! reuses the same router. A missing, wrong or expired token is 401 with `WWW-Authenticate` and
//! nothing else.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use tokio_util::sync::CancellationToken;

use super::SessionsServer;
use crate::access::Access;
use crate::caller;
use crate::runtime::Runtime;

/// The `/mcp` router with bearer authentication.
pub fn router(access: Access, runtime: Option<Arc<Runtime>>, cancel: CancellationToken) -> axum::Router {
    let factory_access = access.clone();
    let service = StreamableHttpService::new(
        move || Ok(SessionsServer::per_request(factory_access.clone(), runtime.clone())),
        LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default().with_cancellation_token(cancel),
    );
    axum::Router::new().nest_service("/mcp", service).layer(axum::middleware::from_fn_with_state(access, bearer))
}

fn unauthorized() -> Response {
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer realm=\"sessions-mcp\"")]).into_response()
}

/// Resolves `Authorization: Bearer <token>` to a caller, or answers 401.
async fn bearer(State(access): State<Access>, mut req: Request, next: Next) -> Response {
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(String::from);
    let Some(token) = token else { return unauthorized() };
    let store = access.store.clone();
    let config = access.config.clone();
    let resolved = tokio::task::spawn_blocking(move || caller::by_token(&token, &config, &store)).await;
    match resolved {
        Ok(Ok(Some(caller))) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        _ => unauthorized(),
    }
}

/// Serves `router` on a Unix socket (0600, in a 0700 directory) until `cancel` fires.
pub async fn serve_socket(path: &Path, router: axum::Router, cancel: CancellationToken) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    axum::serve(listener, router).with_graceful_shutdown(async move { cancel.cancelled().await }).await
}
