//! The owner's internal endpoints on its run socket, for the other processes of the state dir
//! (`engine::scheduler::link` says what they carry): `POST /owner/wake` and `GET /owner/events`.
//! They are not MCP and take no caller: only the owner's key is admitted; anything else is the
//! socket's usual 401.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::http::{Unauthorized, unauthorized};
use crate::engine::scheduler::Scheduler;
use crate::engine::scheduler::link::{self, OwnerKey};

/// What the endpoints share: the owner, its key, and the end of its ownership.
#[derive(Clone)]
struct Owner {
    runtime: Arc<Scheduler>,
    key: OwnerKey,
    ended: CancellationToken,
}

/// The two endpoints, for the socket's router to merge (outside its bearer middleware).
pub fn router(runtime: Arc<Scheduler>, key: OwnerKey, ended: CancellationToken) -> axum::Router {
    let owner = Owner { runtime, key, ended };
    axum::Router::new()
        .route(link::WAKE_PATH, axum::routing::post(wake))
        .route(link::EVENTS_PATH, axum::routing::get(events))
        .layer(axum::middleware::from_fn_with_state(owner.clone(), admit))
        .with_state(owner)
}

async fn admit(State(owner): State<Owner>, req: Request, next: Next) -> Response {
    match req.headers().get(header::AUTHORIZATION) {
        None => unauthorized(Unauthorized::Missing),
        Some(offered) if owner.key.admits(Some(offered)) => next.run(req).await,
        Some(_) => unauthorized(Unauthorized::Unknown),
    }
}

async fn wake(State(owner): State<Owner>) -> StatusCode {
    owner.runtime.woken_by_follower();
    StatusCode::NO_CONTENT
}

/// One JSON line per event, until ownership ends (which also lets the socket shut down).
async fn events(State(owner): State<Owner>) -> Response {
    let lines = link::events(&owner.runtime, owner.ended).map(|event| Ok::<_, std::convert::Infallible>(event.line()));
    ([(header::CONTENT_TYPE, "application/x-ndjson")], axum::body::Body::from_stream(lines)).into_response()
}
