//! `GET /metrics` (README, Metrics): the Prometheus exposition of [`crate::metrics`], for operator
//! tokens (`server.operatorTokens`), or for anyone on a loopback bind with
//! `server.metricsPublic` (serve refuses that flag on any other bind).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::access::Access;

pub fn router(access: Access) -> axum::Router {
    axum::Router::new().route("/metrics", axum::routing::get(scrape)).with_state(access)
}

/// Whether the request carries one of the operator tokens.
fn is_operator(access: &Access, headers: &HeaderMap) -> bool {
    let bearer =
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    bearer.is_some_and(|token| {
        let hash = crate::store::sha256_hex(token.trim());
        access.config().server.operator_tokens.iter().any(|t| t.sha256.eq_ignore_ascii_case(&hash))
    })
}

async fn scrape(State(access): State<Access>, headers: HeaderMap) -> Response {
    if !access.config().server.metrics_public && !is_operator(&access, &headers) {
        let why =
            "an operator token is required: Authorization: Bearer <token>, whose sha256 is in server.operatorTokens";
        return (StatusCode::UNAUTHORIZED, axum::Json(serde_json::json!({"error": why}))).into_response();
    }
    match access.metric_counts() {
        Ok(counts) => {
            let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
            ([(header::CONTENT_TYPE, content_type)], crate::metrics::render(&counts)).into_response()
        }
        Err(e) => {
            (StatusCode::SERVICE_UNAVAILABLE, axum::Json(serde_json::json!({"error": e.to_string()}))).into_response()
        }
    }
}
