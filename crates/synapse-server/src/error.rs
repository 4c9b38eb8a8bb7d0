//! The server's one error type, and how each variant becomes an OpenAI error object.
//!
//! Every error a client sees is `{"error": {"message", "type", "param", "code"}}` with the HTTP
//! status OpenAI uses for it; nothing answers in plain text (axum's own rejections and
//! tower-http's 413/408 are rewritten by [`crate::middleware`]).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use synapse_runtime::engine::SubmitError;

/// Everything that can go wrong in the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The body is not JSON, or not the request's shape.
    #[error("{message}")]
    MalformedRequest {
        /// What is wrong.
        message: String,
    },
    /// A parameter is out of its domain or unsupported.
    #[error("{message}")]
    InvalidParam {
        /// The parameter (OpenAI's `param`).
        param: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A feature the server does not implement (tools, image parts, …).
    #[error("{message}")]
    Unsupported {
        /// The parameter that asked for it.
        param: &'static str,
        /// What is not supported.
        message: String,
    },
    /// The prompt does not fit a session's context.
    #[error("the prompt has {tokens} tokens; the context holds {limit}")]
    PromptTooLong {
        /// `prompt` or `messages`.
        param: &'static str,
        /// Prompt tokens.
        tokens: usize,
        /// Positions a session holds.
        limit: usize,
    },
    /// The `model` field names no model this server serves.
    #[error("the model `{0}` does not exist")]
    ModelNotFound(String),
    /// Missing or wrong API key.
    #[error("invalid API key: pass it as `Authorization: Bearer <key>`")]
    Unauthorized,
    /// The body is larger than the limit.
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge {
        /// Bytes allowed.
        limit: usize,
    },
    /// No route.
    #[error("no route {0}")]
    NotFound(String),
    /// The route exists, the method does not.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The request took longer than the server's timeout.
    #[error("the request timed out")]
    Timeout,
    /// Every slot is busy and the wait queue is full.
    #[error("the server is busy ({queued} requests waiting); retry in {retry_after_s} s")]
    Busy {
        /// Requests waiting.
        queued: usize,
        /// Suggested wait in seconds.
        retry_after_s: u32,
    },
    /// The engine is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// Tokenizing or detokenizing failed.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] synapse_tokenizer::TokenizerError),
    /// The engine failed a session.
    #[error("generation failed: {0}")]
    Engine(String),
    /// A bug or an unexpected state.
    #[error("internal error: {0}")]
    Internal(String),
    /// Binding or serving the socket failed.
    #[error("server I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// Result with [`ServerError`].
pub type Result<T> = std::result::Result<T, ServerError>;

impl ServerError {
    /// A 400 for a parameter out of its domain.
    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        ServerError::InvalidParam {
            param,
            message: message.into(),
        }
    }

    /// The HTTP status OpenAI answers this error with.
    pub fn status(&self) -> StatusCode {
        use ServerError::*;
        match self {
            MalformedRequest { .. }
            | InvalidParam { .. }
            | Unsupported { .. }
            | PromptTooLong { .. }
            | Tokenizer(_) => StatusCode::BAD_REQUEST,
            ModelNotFound(_) | NotFound(_) => StatusCode::NOT_FOUND,
            Unauthorized => StatusCode::UNAUTHORIZED,
            PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Timeout => StatusCode::REQUEST_TIMEOUT,
            Busy { .. } | ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            Engine(_) | Internal(_) | Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The OpenAI error object (`{"error": {...}}`).
    pub fn body(&self) -> ErrorBody {
        use ServerError::*;
        let (kind, param, code): (&str, Option<&str>, Option<&str>) = match self {
            MalformedRequest { .. } => ("invalid_request_error", None, Some("invalid_json")),
            InvalidParam { param, .. } => ("invalid_request_error", Some(param), None),
            Unsupported { param, .. } => {
                ("invalid_request_error", Some(param), Some("unsupported"))
            }
            PromptTooLong { param, .. } => (
                "invalid_request_error",
                Some(param),
                Some("context_length_exceeded"),
            ),
            Tokenizer(_) => ("invalid_request_error", None, None),
            ModelNotFound(_) => (
                "invalid_request_error",
                Some("model"),
                Some("model_not_found"),
            ),
            NotFound(_) => ("invalid_request_error", None, Some("not_found")),
            Unauthorized => ("invalid_request_error", None, Some("invalid_api_key")),
            PayloadTooLarge { .. } => ("invalid_request_error", None, Some("payload_too_large")),
            MethodNotAllowed => ("invalid_request_error", None, Some("method_not_allowed")),
            Timeout => ("timeout_error", None, Some("timeout")),
            Busy { .. } => ("server_busy", None, Some("queue_full")),
            ShuttingDown => ("server_busy", None, Some("shutting_down")),
            Engine(_) | Internal(_) | Io(_) => ("server_error", None, None),
        };
        ErrorBody {
            error: ErrorObject {
                message: self.to_string(),
                kind: kind.to_string(),
                param: param.map(str::to_string),
                code: code.map(str::to_string),
            },
        }
    }
}

impl From<SubmitError> for ServerError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::QueueFull {
                queued,
                retry_after_s,
            } => ServerError::Busy {
                queued,
                retry_after_s,
            },
            SubmitError::PromptTooLong { tokens, limit } => ServerError::PromptTooLong {
                param: "prompt",
                tokens,
                limit,
            },
            SubmitError::Invalid { param, reason } => ServerError::InvalidParam {
                param,
                message: format!("invalid {param}: {reason}"),
            },
            SubmitError::Stopped => ServerError::ShuttingDown,
        }
    }
}

/// `{"error": ...}`.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorObject,
}

/// OpenAI's error object.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct ErrorObject {
    /// Human-readable message.
    pub message: String,
    /// Category (`invalid_request_error`, `server_error`, …).
    #[serde(rename = "type")]
    pub kind: String,
    /// The offending parameter, if one.
    pub param: Option<String>,
    /// Machine-readable code, if one.
    pub code: Option<String>,
}

impl IntoResponse for ServerError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
            tracing::error!(error = %self, "request failed");
        } else {
            tracing::debug!(error = %self, status = status.as_u16(), "request refused");
        }
        let mut resp = (status, axum::Json(self.body())).into_response();
        if let ServerError::Busy { retry_after_s, .. } = &self {
            if let Ok(v) = HeaderValue::from_str(&retry_after_s.max(&1).to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
        } else if let ServerError::PayloadTooLarge { .. } = &self {
            // The rest of the body is never read: the connection cannot be reused.
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        } else if let ServerError::ShuttingDown = &self {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submit_errors_map_to_openai_statuses() {
        let busy: ServerError = SubmitError::QueueFull {
            queued: 64,
            retry_after_s: 2,
        }
        .into();
        assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
        let resp = busy.into_response();
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");

        let long: ServerError = SubmitError::PromptTooLong {
            tokens: 5000,
            limit: 4096,
        }
        .into();
        assert_eq!(long.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            long.body().error.code.as_deref(),
            Some("context_length_exceeded")
        );
        assert_eq!(
            ServerError::from(SubmitError::Stopped).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[test]
    fn error_body_has_openai_fields() {
        let e = ServerError::invalid("temperature", "must be in [0, 2]");
        let v = serde_json::to_value(e.body()).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "temperature");
        assert!(v["error"]["code"].is_null());
        assert_eq!(v["error"]["message"], "must be in [0, 2]");
        assert_eq!(ServerError::Unauthorized.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            ServerError::ModelNotFound("x".into()).status(),
            StatusCode::NOT_FOUND
        );
    }
}
