//! `GET /metrics` (docs/OPERATING.md, Metrics): the Prometheus exposition of [`crate::metrics`], for
//! operator tokens (minted by `sessions-mcp token create --operator`, or `server.operatorTokens`),
//! or for anyone on a loopback bind with
//! `server.metricsPublic` (serve refuses that flag on any other bind). An `agent` label is a
//! configured agent's id, or `_other` for all the rest.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::access::Access;

pub fn router(access: Access) -> axum::Router {
    axum::Router::new().route("/metrics", axum::routing::get(scrape)).with_state(access)
}

async fn scrape(State(access): State<Access>, headers: HeaderMap) -> Response {
    let server = &access.config().server;
    let operator = super::http::bearer_token(&headers).is_some_and(|token| access.is_operator_token(token));
    if !server.metrics_public && !operator {
        let why = "an operator token is required: Authorization: Bearer <token>, made by `sessions-mcp token create --operator` or whose sha256 is in server.operatorTokens";
        return (StatusCode::UNAUTHORIZED, axum::Json(serde_json::json!({"error": why}))).into_response();
    }
    match access.metric_counts() {
        Ok(counts) => {
            let counts = counts.by_known_agents(|agent| access.config().names_agent(agent));
            let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
            ([(header::CONTENT_TYPE, content_type)], crate::metrics::render(&counts)).into_response()
        }
        Err(e) => {
            (StatusCode::SERVICE_UNAVAILABLE, axum::Json(serde_json::json!({"error": e.to_string()}))).into_response()
        }
    }
}
