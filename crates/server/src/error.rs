//! Errors as each API reports them: OpenAI's `{"error": {"message", "type", "param", "code"}}`
//! and Ollama's `{"error": "message"}`, with the HTTP status that says what went wrong.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Which API a response speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Ollama,
}

/// A request's failure: its status, OpenAI's error type and code, and a message for people.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's `type` (`invalid_request_error`, `authentication_error`, ...).
    pub kind: &'static str,
    pub code: &'static str,
    pub message: String,
    pub dialect: Dialect,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, code: &'static str, message: String) -> Self {
        Self {
            status,
            kind,
            code,
            message,
            dialect: Dialect::OpenAi,
        }
    }

    /// Malformed JSON, a missing or wrongly typed field, a value out of range.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "bad_request",
            message.into(),
        )
    }

    /// A feature of the API this server does not offer.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "unsupported",
            message.into(),
        )
    }

    pub fn model_not_found(name: &str, why: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("model `{name}` not found: {why}"),
        )
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid_api_key",
            "a valid API key is needed: `Authorization: Bearer KEY`".into(),
        )
    }

    /// The model's queue is full: try again shortly.
    pub fn busy(queue: usize) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "queue_full",
            format!("the server is busy: {queue} requests are already waiting for this model"),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal",
            message.into(),
        )
    }

    /// A body that could not be read: too large (413) or cut off.
    pub fn body(status: StatusCode, message: impl Into<String>) -> Self {
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "body_too_large"
        } else {
            "bad_body"
        };
        Self::new(status, "invalid_request_error", code, message.into())
    }

    /// What the runtime refused: the request's fault (400) where its code says so, else the
    /// server's (500).
    pub fn runtime(e: &wgemma::Error) -> Self {
        let code = e.code();
        let ours = matches!(
            code,
            "bad_request"
                | "empty_prompt"
                | "bad_token"
                | "context_overflow"
                | "bad_image"
                | "bad_audio"
                | "no_vision"
                | "no_audio"
                | "chat"
        );
        if ours {
            Self::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                code,
                e.to_string(),
            )
        } else {
            Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                code,
                e.to_string(),
            )
        }
    }

    /// The same error in `dialect`'s shape.
    pub fn speaking(mut self, dialect: Dialect) -> Self {
        self.dialect = dialect;
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = match self.dialect {
            Dialect::OpenAi => json!({
                "error": {
                    "message": self.message,
                    "type": self.kind,
                    "param": null,
                    "code": self.code,
                }
            }),
            Dialect::Ollama => json!({ "error": self.message }),
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
