//! The MCP service over HTTP: rmcp's streamable HTTP at `/mcp` behind a bearer-token middleware
//! that resolves the caller per request (static client tokens from config, run tokens). The owner
//! serves it on its Unix socket `<stateDir>/run/mcp.sock` (0600) for run callbacks; `serve --http`
//! reuses the same router. A missing, wrong or expired token is 401 with `WWW-Authenticate` and
//! nothing else.

use std::collections::HashMap;
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

/// What differs between the run socket and a TCP listener.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// `Host` values accepted (DNS-rebinding protection); None = no check (the Unix socket).
    pub allowed_hosts: Option<Vec<String>>,
    /// Browser `Origin`s accepted (requests without one pass).
    pub allowed_origins: Vec<String>,
    /// The largest request body accepted (413 above it).
    pub max_body_bytes: usize,
}

impl HttpOptions {
    /// The run socket: only local processes with a token reach it.
    pub fn socket(config: &crate::config::Config) -> Self {
        HttpOptions { allowed_hosts: None, allowed_origins: Vec::new(), max_body_bytes: max_body_bytes(config) }
    }

    /// A TCP listener: `server.allowedHosts` for Host, the same hosts as Origins.
    pub fn tcp(config: &crate::config::Config) -> Self {
        let hosts = config.server.allowed_hosts.clone();
        let origins = hosts.iter().flat_map(|h| {
            let h = if h.contains(':') && !h.starts_with('[') { format!("[{h}]") } else { h.clone() };
            [format!("http://{h}:*"), format!("https://{h}:*")]
        });
        HttpOptions {
            allowed_origins: origins.collect(),
            allowed_hosts: Some(hosts),
            max_body_bytes: max_body_bytes(config),
        }
    }
}

/// Room for the largest legal request: a spawn whose attachments fill `maxTotalBytes` in base64
/// (4/3 of it), `maxFiles` names and JSON punctuation, the largest task, and the JSON-RPC frame.
pub fn max_body_bytes(config: &crate::config::Config) -> usize {
    let a = &config.tools.sessions_spawn.attachments;
    let base64 = (a.max_total_bytes as usize).div_ceil(3) * 4;
    let per_file = 255 * 6 + 128; // a name escaped as \\uXXXX at worst, plus the object's keys
    base64 + a.max_files as usize * per_file + crate::tools::sessions_spawn::MAX_TASK_BYTES * 6 + 64 * 1024
}

/// The `/mcp` router with bearer authentication, plus `/health`.
pub fn router(
    access: Access,
    runtime: Option<Arc<Runtime>>,
    cancel: CancellationToken,
    options: &HttpOptions,
) -> axum::Router {
    let factory_access = access.clone();
    let mut config = StreamableHttpServerConfig::default().with_cancellation_token(cancel);
    config = match &options.allowed_hosts {
        Some(hosts) => config.with_allowed_hosts(hosts.clone()),
        None => config.disable_allowed_hosts(),
    };
    if !options.allowed_origins.is_empty() {
        config = config.with_allowed_origins(options.allowed_origins.clone());
    }
    config.max_request_body_bytes = options.max_body_bytes;
    let service = StreamableHttpService::new(
        move || Ok(SessionsServer::per_request(factory_access.clone(), runtime.clone())),
        LocalSessionManager::default().into(),
        config,
    );
    let auth = Auth { access, static_callers: Arc::new(std::sync::Mutex::new(HashMap::new())) };
    axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(auth, bearer))
        .route("/health", axum::routing::get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }))
}

fn unauthorized() -> Response {
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer realm=\"sessions-mcp\"")]).into_response()
}

/// The bearer middleware's state: static client tokens are resolved once (acting as their session
/// writes to the store the first time); run tokens are checked on every request (they expire).
#[derive(Clone)]
struct Auth {
    access: Access,
    static_callers: Arc<std::sync::Mutex<HashMap<String, crate::caller::Caller>>>,
}

/// Resolves `Authorization: Bearer <token>` to a caller, or answers 401.
async fn bearer(State(auth): State<Auth>, mut req: Request, next: Next) -> Response {
    let access = auth.access.clone();
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(String::from);
    let Some(token) = token else { return unauthorized() };
    let hash = caller::sha256_hex(&token);
    let cached = auth.static_callers.lock().expect("static callers").get(&hash).cloned();
    if let Some(c) = cached {
        req.extensions_mut().insert(c);
        return next.run(req).await;
    }
    let store = access.store.clone();
    let config = access.config.clone();
    let resolved = tokio::task::spawn_blocking(move || caller::by_token(&token, &config, &store)).await;
    match resolved {
        Ok(Ok(Some(caller))) => {
            if caller.run.is_none() {
                auth.static_callers.lock().expect("static callers").insert(hash, caller.clone());
            }
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

/// Limits of the TCP listener.
#[derive(Debug, Clone, Copy)]
pub struct TcpLimits {
    pub header_timeout: std::time::Duration,
    pub max_connections: usize,
}

/// Serves `router` on a TCP listener until `cancel` fires: HTTP/1.1 with a header-read timeout
/// (slow-header clients are dropped) and a cap on concurrent connections; on shutdown it stops
/// accepting and gives open connections a few seconds to finish.
pub async fn serve_tcp(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: TcpLimits,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let open = tokio_util::task::TaskTracker::new();
    loop {
        let permit = tokio::select! {
            _ = cancel.cancelled() => break,
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
        };
        let (stream, _) = tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
        };
        let service = TowerToHyperService::new(router.clone());
        let cancel = cancel.clone();
        open.spawn(async move {
            let _permit = permit;
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = cancel.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), conn).await;
                }
            }
        });
    }
    open.close();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), open.wait()).await;
    Ok(())
}
