//! The MCP service over HTTP: rmcp's streamable HTTP at `/mcp` behind a bearer-token middleware
//! that resolves the caller per request (static client tokens from config, run tokens). The owner
//! serves it on its Unix socket `<stateDir>/run/mcp.sock` (0600) for run callbacks; `serve --http`
//! reuses the same router. A missing, wrong or expired token is 401 with `WWW-Authenticate` and
//! nothing else. Each request's credential counts against `server.maxStreamsPerCredential` while
//! its response is open (a dashboard live stream too); the TCP listener also caps connections per peer address
//! (`server.maxConnectionsPerPeer`), so no one token or address fills `maxConnections`.

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
use super::subscriptions::Hub;
use crate::access::Access;
use crate::engine::scheduler::Scheduler;

/// What differs between the run socket and a TCP listener.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// `Host` values accepted (DNS-rebinding protection); None = no check (the Unix socket).
    pub allowed_hosts: Option<Vec<String>>,
    /// Browser `Origin`s accepted (requests without one pass).
    pub allowed_origins: Vec<String>,
    /// The largest request body accepted (413 above it).
    pub max_body_bytes: usize,
    /// Also serve the legacy HTTP+SSE transport (`/sse`, `/message`).
    pub legacy_sse: bool,
    /// `serve --http --as KEY` on loopback: requests without any Authorization header act as
    /// this operator session (like stdio's `--as`); a present but bad token is still 401.
    pub anonymous: Option<crate::access::caller::Caller>,
    /// Requests (SSE streams included) open at once per credential (429 above it).
    pub max_streams_per_credential: usize,
    /// Serve what processes outside the runs use — the channel bridges'
    /// `/channels/<name>/messages`, `/metrics` and the dashboard `/ui` — on TCP listeners, never on the run socket,
    /// which only a run's own processes reach.
    pub outside_endpoints: bool,
}

impl HttpOptions {
    /// The run socket: only local processes with a token reach it.
    pub fn socket(config: &crate::config::Config) -> Self {
        HttpOptions {
            allowed_hosts: None,
            allowed_origins: Vec::new(),
            max_body_bytes: max_body_bytes(config),
            legacy_sse: false,
            anonymous: None,
            max_streams_per_credential: config.server.max_streams_per_credential as usize,
            outside_endpoints: false,
        }
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
            legacy_sse: true,
            anonymous: None,
            max_streams_per_credential: config.server.max_streams_per_credential as usize,
            outside_endpoints: true,
        }
    }
}

/// Reads a request body of at most `max` bytes (`/mcp`'s limit, [`max_body_bytes`]); past it, the
/// 413 rmcp answers on `/mcp`, in its words.
pub(super) async fn bounded_body(body: axum::body::Body, max: usize) -> Result<axum::body::Bytes, Response> {
    axum::body::to_bytes(body, max).await.map_err(|e| {
        let over = std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        match over {
            true => (StatusCode::PAYLOAD_TOO_LARGE, format!("Payload Too Large: request body exceeds {max} bytes")),
            false => (StatusCode::BAD_REQUEST, format!("cannot read the request body: {e}")),
        }
        .into_response()
    })
}

/// Room for the largest legal request: a spawn whose attachments fill `maxTotalBytes` in base64
/// (4/3 of it), `maxFiles` names and JSON punctuation, the largest task, and the JSON-RPC frame.
pub fn max_body_bytes(config: &crate::config::Config) -> usize {
    let a = &config.tools.sessions_spawn.attachments;
    let base64 = (a.max_total_bytes as usize).div_ceil(3) * 4;
    let per_file = 255 * 6 + 128; // a name escaped as \\uXXXX at worst, plus the object's keys
    base64 + a.max_files as usize * per_file + crate::tools::sessions_spawn::MAX_TASK_BYTES * 6 + 64 * 1024
}

/// The `/mcp` router with bearer authentication, plus `/health`, and on TCP the channel bridges'
/// `/channels/<name>/messages` and `/metrics`.
pub fn router(
    access: Access,
    runtime: Option<Arc<Scheduler>>,
    cancel: CancellationToken,
    options: &HttpOptions,
) -> axum::Router {
    let factory_access = access.clone();
    // One hub per listener: a caller's subscriptions count over all its MCP sessions here.
    let hub = Hub::new(access.clone(), access.config().server.max_subscriptions);
    // One count per listener: a credential's dashboard streams and MCP requests share its cap.
    let open = Open::new(options.max_streams_per_credential, "server.maxStreamsPerCredential");
    let outside = options.outside_endpoints.then(|| {
        let dashboard = super::dashboard::Shared { hub: hub.clone(), open: open.clone(), cancel: cancel.clone() };
        super::bridge::router(access.clone(), runtime.clone())
            .merge(super::a2a::router(access.clone(), runtime.clone(), open.clone(), options.max_body_bytes))
            .merge(super::metrics::router(access.clone()))
            .merge(super::dashboard::router(access.clone(), runtime.clone(), options.clone(), dashboard))
            .layer(axum::middleware::from_fn_with_state(options.clone(), same_host_only))
    });
    let sse = options
        .legacy_sse
        .then(|| super::sse::router(access.clone(), runtime.clone(), options.clone(), cancel.clone(), hub.clone()));
    let mut config = StreamableHttpServerConfig::default().with_cancellation_token(cancel);
    config = match &options.allowed_hosts {
        Some(hosts) => config.with_allowed_hosts(hosts.clone()),
        None => config.disable_allowed_hosts(),
    };
    if !options.allowed_origins.is_empty() {
        config = config.with_allowed_origins(options.allowed_origins.clone());
    }
    config.max_request_body_bytes = options.max_body_bytes;
    // The asks shown by round trip: one set per listener, since a 2026-07-28 client's requests
    // each get a server of their own.
    let shown = super::elicit::Shown::default();
    let sessions = Arc::new(LocalSessionManager::default());
    let guard = super::http_sessions::SessionGuard::new(sessions.clone(), options.max_body_bytes);
    let service = StreamableHttpService::new(
        move || Ok(SessionsServer::per_request(factory_access.clone(), runtime.clone(), hub.clone(), shown.clone())),
        sessions,
        config,
    );
    let auth = Auth {
        access,
        static_callers: Arc::new(std::sync::Mutex::new(HashMap::new())),
        anonymous: options.anonymous.clone(),
        open,
    };
    let mut app = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(guard, super::http_sessions::guard));
    if let Some(sse) = sse {
        app = app.merge(sse);
    }
    // Bridges authenticate with their own channel-bound tokens, never with the MCP bearer.
    let app =
        app.layer(axum::middleware::from_fn_with_state(auth, bearer)).route("/health", axum::routing::get(health));
    match outside {
        Some(outside) => app.merge(outside),
        None => app,
    }
}

async fn health() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({"status": "ok"}))
}

/// Who is asking: the sha256 of the bearer token, or None for the anonymous `--as` operator. The
/// bearer middleware puts it in every request's extensions once; the stream cap counts it, and an
/// MCP session (streamable or legacy SSE) belongs to the credential that opened it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Credential(Option<String>);

impl Credential {
    /// The credential a request's `Authorization` header stands for (None: no bearer token).
    pub(super) fn of(headers: &axum::http::HeaderMap) -> Credential {
        Credential(bearer_token(headers).map(crate::store::sha256_hex))
    }
}

/// Keeps `guard` alive until the response body has been sent (or dropped): an SSE stream holds
/// it for as long as it is open.
pub fn hold_until_sent<G: Send + Sync + 'static>(response: Response, guard: G) -> Response {
    response.map(|body| {
        axum::body::Body::new(http_body_util::BodyExt::map_frame(body, move |frame| {
            let _held = &guard;
            frame
        }))
    })
}

/// A 429 naming the limit, with `Connection: close` so the refused connection is freed too.
fn too_many(limit: &'static str, max: usize, what: String) -> Response {
    let body = serde_json::json!({"error": format!("{what}; {limit} is {max}: close one or retry later"), "limit": limit, "max": max});
    (StatusCode::TOO_MANY_REQUESTS, [(header::CONNECTION, "close")], axum::Json(body)).into_response()
}

/// How many things each key (a credential, a peer address) holds open, capped at `max`.
#[derive(Clone)]
pub(super) struct Open<K> {
    held: Arc<std::sync::Mutex<HashMap<K, usize>>>,
    max: usize,
    limit: &'static str,
}

/// One held place; dropping it gives the place back.
pub(super) struct Held<K: Eq + std::hash::Hash> {
    open: Open<K>,
    key: K,
}

impl<K: Eq + std::hash::Hash + Clone> Open<K> {
    pub(super) fn new(max: usize, limit: &'static str) -> Self {
        Open { held: Default::default(), max, limit }
    }

    /// A place for `key`, or None when it already holds `max`.
    pub(super) fn take(&self, key: &K) -> Option<Held<K>> {
        let mut held = self.held.lock().expect("open counts");
        let n = held.entry(key.clone()).or_default();
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Held { open: self.clone(), key: key.clone() })
    }
}

impl Open<Credential> {
    /// The 429 for a credential that holds `max` places already.
    pub(super) fn refused(&self) -> Response {
        let what = "this credential already has that many requests and streams open".to_string();
        too_many(self.limit, self.max, what)
    }
}

impl<K: Eq + std::hash::Hash> Drop for Held<K> {
    fn drop(&mut self) {
        let mut held = self.open.held.lock().expect("open counts");
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

/// Runs the request if its credential has a free place; the place is held until the response
/// body ends (an SSE stream holds it for as long as it is open).
async fn within_stream_cap(open: &Open<Credential>, credential: Credential, mut req: Request, next: Next) -> Response {
    let Some(held) = open.take(&credential) else { return open.refused() };
    req.extensions_mut().insert(credential);
    let gone = CancellationToken::new();
    req.extensions_mut().insert(ClientGone(gone.clone()));
    hold_until_sent(next.run(req).await, (held, gone.drop_guard()))
}

/// [`within_stream_cap`] for routes that resolve their caller themselves (the A2A bindings): the
/// credential is the request's bearer token, whatever it turns out to be.
pub(super) async fn within_cap_of_bearer(State(open): State<Open<Credential>>, req: Request, next: Next) -> Response {
    let credential = Credential::of(req.headers());
    within_stream_cap(&open, credential, req, next).await
}

/// Fires when the HTTP response of a request has been sent or dropped — its client went away.
/// A tool call whose answer can no longer reach anyone stops (a `subagents` wait then consumes
/// nothing); an MCP session outlives its requests, so rmcp alone would run it to its end.
#[derive(Debug, Clone)]
pub struct ClientGone(pub CancellationToken);

/// Why a request is answered 401 (the body says which, and nothing more).
#[derive(Debug, Clone, Copy)]
pub(super) enum Unauthorized {
    /// No `Authorization: Bearer <token>` header.
    Missing,
    /// A token that is neither a configured client token nor a live run token.
    Unknown,
}

/// A 401 with a short JSON reason: clients show `error_description` (an empty body left the
/// TypeScript SDK's error with an empty reason).
pub(super) fn unauthorized(why: Unauthorized) -> Response {
    let description = match why {
        Unauthorized::Missing => "missing bearer token",
        Unauthorized::Unknown => "token not recognised or expired",
    };
    let body = serde_json::json!({"error": "unauthorized", "error_description": description});
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer realm=\"sessions-mcp\"")], axum::Json(body))
        .into_response()
}

/// The bearer middleware's state: static client tokens are resolved once (acting as their session
/// writes to the store the first time); run tokens are checked on every request (they expire).
#[derive(Clone)]
struct Auth {
    access: Access,
    static_callers: Arc<std::sync::Mutex<HashMap<String, crate::access::caller::Caller>>>,
    anonymous: Option<crate::access::caller::Caller>,
    open: Open<Credential>,
}

/// The token of an `Authorization: Bearer <token>` header, if there is a non-empty one.
pub(super) fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    Some(value.strip_prefix("Bearer ")?.trim()).filter(|t| !t.is_empty())
}

/// The same DNS-rebinding protection as `/mcp`, for the routes rmcp does not serve (legacy SSE,
/// and the routes outside `/mcp`, see [`same_host_only`]): Host must be allowed; an Origin, if
/// sent, too.
pub(super) fn host_and_origin_ok(options: &HttpOptions, headers: &axum::http::HeaderMap) -> bool {
    let Some(hosts) = &options.allowed_hosts else { return true };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    let name = if host.starts_with('[') {
        host.split(']').next().unwrap_or("").trim_start_matches('[')
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    if !hosts.iter().any(|h| h.eq_ignore_ascii_case(name)) {
        return false;
    }
    match headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        None => true,
        Some(origin) => {
            let origin_host = origin.split("://").nth(1).unwrap_or("");
            let origin_name = if origin_host.starts_with('[') {
                origin_host.split(']').next().unwrap_or("").trim_start_matches('[')
            } else {
                origin_host.rsplit_once(':').map_or(origin_host, |(h, _)| h)
            };
            hosts.iter().any(|h| h.eq_ignore_ascii_case(origin_name))
        }
    }
}

/// [`host_and_origin_ok`] before every route outside `/mcp` that a browser could be pointed at
/// (the dashboard, `/metrics`, the bridges' posts): a DNS-rebinding page reaches none of them,
/// not even `/metrics` with `server.metricsPublic`.
async fn same_host_only(State(options): State<HttpOptions>, request: Request, next: Next) -> Response {
    if !host_and_origin_ok(&options, request.headers()) {
        let why = "Host or Origin not allowed (server.allowedHosts)";
        return (StatusCode::FORBIDDEN, axum::Json(serde_json::json!({"status": "error", "error": why})))
            .into_response();
    }
    next.run(request).await
}

/// Whether the request's bearer token is one of these (by their hex sha256s).
pub(super) fn bears_one_of(headers: &axum::http::HeaderMap, hashes: &[crate::config::TokenHash]) -> bool {
    bearer_token(headers).is_some_and(|token| {
        let hash = crate::store::sha256_hex(token);
        hashes.iter().any(|t| t.sha256.eq_ignore_ascii_case(&hash))
    })
}

/// Resolves `Authorization: Bearer <token>` to a caller, or answers 401.
async fn bearer(State(auth): State<Auth>, mut req: Request, next: Next) -> Response {
    let access = auth.access.clone();
    let token = bearer_token(req.headers()).map(String::from);
    let Some(token) = token else {
        if req.headers().get(header::AUTHORIZATION).is_none()
            && let Some(op) = auth.anonymous.clone()
        {
            req.extensions_mut().insert(op);
            return within_stream_cap(&auth.open, Credential(None), req, next).await;
        }
        return unauthorized(Unauthorized::Missing);
    };
    let hash = crate::store::sha256_hex(&token);
    let cached = auth.static_callers.lock().expect("static callers").get(&hash).cloned();
    if let Some(c) = cached {
        req.extensions_mut().insert(c);
        return within_stream_cap(&auth.open, Credential(Some(hash)), req, next).await;
    }
    let resolved = tokio::task::spawn_blocking(move || access.caller_by_token(&token)).await;
    match resolved {
        Ok(Ok(Some(caller))) => {
            // Only the config's tokens are kept: a minted one is looked up again at every
            // request, so that its revoke takes effect at once.
            if caller.run.is_none()
                && auth.access.config().server.tokens.iter().any(|t| t.sha256.eq_ignore_ascii_case(&hash))
            {
                auth.static_callers.lock().expect("static callers").insert(hash.clone(), caller.clone());
            }
            req.extensions_mut().insert(caller);
            within_stream_cap(&auth.open, Credential(Some(hash)), req, next).await
        }
        _ => unauthorized(Unauthorized::Unknown),
    }
}

/// The owner's run socket as the engine starts it: the MCP router over a Unix socket, with the
/// socket's own caps, and the owner's endpoints for the other processes, until ownership ends.
pub fn owner_socket() -> crate::engine::scheduler::OwnerSocket {
    Box::new(|runtime: Arc<Scheduler>, path: std::path::PathBuf, key, cancel: CancellationToken| {
        let options = HttpOptions::socket(runtime.access().config());
        let router = router(runtime.access().clone(), Some(runtime.clone()), cancel.clone(), &options)
            .merge(super::owner_link::router(runtime.clone(), key, cancel.clone()));
        // Bound before this returns, so that the socket accepts once the process says it owns
        // the runtime (a follower or a run token may connect at once).
        let listener = match bind_socket(&path) {
            Ok(l) => l,
            Err(e) => return tracing::error!(error = %e, socket = %path.display(), "the run socket failed"),
        };
        tokio::spawn(async move {
            let shutdown = async move { cancel.cancelled().await };
            if let Err(e) = axum::serve(listener, router).with_graceful_shutdown(shutdown).await {
                tracing::error!(error = %e, socket = %path.display(), "the run socket failed");
            }
        });
    })
}

/// Binds the run socket (0600, in a 0700 directory), replacing a stale one.
fn bind_socket(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Limits of the TCP listener.
#[derive(Debug, Clone, Copy)]
pub struct TcpLimits {
    pub header_timeout: std::time::Duration,
    /// A connection with no bytes either way for this long is closed (SSE keep-alives count).
    pub idle_timeout: std::time::Duration,
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
}

/// Connections past `server.maxConnectionsPerPeer` being answered 429 at once; more are closed
/// unanswered. They take no `maxConnections` slot, so refusals cannot fill the listener either.
const MAX_REFUSALS: usize = 16;

/// A TLS acceptor from `server.tls {cert, key}` (PEM files).
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, String> {
    let certs = crate::pem::certificates("server.tls.cert", cert)?;
    let key = crate::pem::private_key("server.tls.key", key)?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("server.tls: the certificate and key do not fit: {e}"))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Serves `router` on a TCP listener until `cancel` fires: HTTP/1.1 (over TLS when given) with a
/// header-read timeout (slow-header clients are dropped), an idle timeout, and a cap on concurrent
/// connections; on shutdown it stops accepting and gives open connections a few seconds to finish.
pub async fn serve_tcp(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: TcpLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let refusals = Arc::new(tokio::sync::Semaphore::new(MAX_REFUSALS));
    let peers = Open::new(limits.max_connections_per_peer, "server.maxConnectionsPerPeer");
    let refuse = peer_cap_router(&peers);
    let open = tokio_util::task::TaskTracker::new();
    loop {
        let permit = tokio::select! {
            _ = cancel.cancelled() => break,
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
        };
        let (stream, peer) = tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
        };
        let (place, router) = match peers.take(&peer.ip()) {
            Some(place) => (Some(place), router.clone()),
            None => (None, refuse.clone()),
        };
        // A refused connection gives its listener slot back and holds a refusal permit instead.
        let permit = match place {
            Some(_) => permit,
            None => match refusals.clone().try_acquire_owned() {
                Ok(refusal) => refusal,
                Err(_) => continue,
            },
        };
        let (cancel, tls) = (cancel.clone(), tls.clone());
        open.spawn(async move {
            let _held = (permit, place);
            serve_accepted(stream, router, limits, tls, cancel).await;
        });
    }
    open.close();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), open.wait()).await;
    Ok(())
}

/// What a connection past `server.maxConnectionsPerPeer` is served: `/health`, and 429 for the
/// rest; every answer closes the connection.
fn peer_cap_router(peers: &Open<std::net::IpAddr>) -> axum::Router {
    let (limit, max) = (peers.limit, peers.max);
    let refuse =
        move || async move { too_many(limit, max, "this address already has that many connections open".into()) };
    axum::Router::new().route("/health", axum::routing::get(health)).fallback(refuse).layer(
        axum::middleware::map_response(|mut r: Response| async move {
            r.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
            r
        }),
    )
}

async fn serve_accepted(
    stream: tokio::net::TcpStream,
    router: axum::Router,
    limits: TcpLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    cancel: CancellationToken,
) {
    match tls {
        None => serve_connection(Idle::new(stream, limits.idle_timeout), router, limits, cancel).await,
        Some(acceptor) => {
            // The handshake is part of the header budget.
            if let Ok(Ok(s)) = tokio::time::timeout(limits.header_timeout, acceptor.accept(stream)).await {
                serve_connection(Idle::new(s, limits.idle_timeout), router, limits, cancel).await;
            }
        }
    }
}

async fn serve_connection<I>(io: I, router: axum::Router, limits: TcpLimits, cancel: CancellationToken)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(router));
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = cancel.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), conn).await;
        }
    }
}

/// A stream that fails with `TimedOut` when no byte moved either way for `idle`.
struct Idle<T> {
    inner: T,
    idle: std::time::Duration,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl<T> Idle<T> {
    fn new(inner: T, idle: std::time::Duration) -> Self {
        Idle { inner, idle, timer: Box::pin(tokio::time::sleep(idle)) }
    }

    fn touch(&mut self) {
        let deadline = tokio::time::Instant::now() + self.idle;
        self.timer.as_mut().reset(deadline);
    }

    fn expired(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        std::future::Future::poll(self.timer.as_mut(), cx).is_ready()
    }
}

fn idle_error() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "idle connection closed (server.idleTimeoutSeconds)")
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Idle<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match std::pin::Pin::new(&mut this.inner).poll_read(cx, buf) {
            std::task::Poll::Ready(r) => {
                this.touch();
                std::task::Poll::Ready(r)
            }
            std::task::Poll::Pending if this.expired(cx) => std::task::Poll::Ready(Err(idle_error())),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Idle<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut this.inner).poll_write(cx, buf);
        if r.is_ready() {
            this.touch();
        }
        r
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
