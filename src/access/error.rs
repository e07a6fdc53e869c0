//! The errors a tool call can end with, below the tools so that access and the engine can say
//! them too: a status (what kind of failure) and a message (which field, what was wrong, what is
//! allowed).

use schemars::JsonSchema;
use serde::Serialize;

use crate::store::StoreError;

/// The error statuses of every tool: `isError: true`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorStatus {
    Error,
    Forbidden,
    NotFound,
    Invalid,
}

/// A tool-level failure: what went wrong, which field, what is allowed.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ToolError {
    pub status: ErrorStatus,
    #[serde(rename = "error")]
    pub message: String,
}

impl ToolError {
    fn new(status: ErrorStatus, message: impl Into<String>) -> Self {
        ToolError { status, message: message.into() }
    }
    pub fn invalid(m: impl Into<String>) -> Self {
        Self::new(ErrorStatus::Invalid, m)
    }
    pub fn forbidden(m: impl Into<String>) -> Self {
        Self::new(ErrorStatus::Forbidden, m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(ErrorStatus::NotFound, m)
    }
    pub fn error(m: impl Into<String>) -> Self {
        Self::new(ErrorStatus::Error, m)
    }
}

impl From<StoreError> for ToolError {
    fn from(e: StoreError) -> Self {
        tracing::error!(error = %e, "store failure during a tool call");
        ToolError::error(e.to_string())
    }
}
