//! Request ids, the API key, and OpenAI error objects for responses that layers below the
//! handlers produce in plain text (tower-http's 413 and 408, axum's 404/405).

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ServerError;
use crate::state::AppState;

/// The request-id header.
pub const REQUEST_ID: &str = "x-request-id";

fn valid_request_id(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_graphic())
}

/// Keeps a client's `x-request-id` (when sane) or makes one, and echoes it on the response.
pub async fn request_id(mut req: Request, next: Next) -> Response {
    let id = match req.headers().get(REQUEST_ID) {
        Some(v) if valid_request_id(v) => v.clone(),
        _ => {
            let v = format!("req-{:016x}", crate::params::random_u64());
            let v = HeaderValue::from_str(&v).unwrap_or(HeaderValue::from_static("req"));
            req.headers_mut().insert(REQUEST_ID, v.clone());
            v
        }
    };
    let mut resp = next.run(req).await;
    resp.headers_mut().insert(REQUEST_ID, id);
    resp
}

/// With an API key set, every route but `/health` needs `Authorization: Bearer <key>`.
pub async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(key) = state.config().api_key.as_deref() else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    if path == "/health" || path == "/v1/health" || req.method() == axum::http::Method::OPTIONS {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(g) if constant_time_eq(g.as_bytes(), key.as_bytes()) => next.run(req).await,
        _ => ServerError::Unauthorized.into_response(),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Rewrites error responses that are not JSON into OpenAI error objects.
pub async fn json_errors(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return resp;
    }
    let err = match status {
        StatusCode::PAYLOAD_TOO_LARGE => ServerError::PayloadTooLarge {
            limit: state.config().body_limit,
        },
        StatusCode::REQUEST_TIMEOUT => ServerError::Timeout,
        StatusCode::NOT_FOUND => ServerError::NotFound(path),
        StatusCode::METHOD_NOT_ALLOWED => ServerError::MethodNotAllowed,
        StatusCode::UNSUPPORTED_MEDIA_TYPE | StatusCode::UNPROCESSABLE_ENTITY => {
            ServerError::MalformedRequest {
                message: "the body is not a valid request".into(),
            }
        }
        s if s.is_client_error() => ServerError::MalformedRequest {
            message: format!("bad request ({s})"),
        },
        s => ServerError::Internal(format!("status {s}")),
    };
    let mut out = err.into_response();
    // Keep the layer's status (e.g. 413 stays 413) and its headers (CORS, request id).
    *out.status_mut() = status;
    for (k, v) in resp.headers() {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}
