//! The small routes: models, health, metrics, tokenize, detokenize.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::{Result, ServerError};
use crate::extract::JsonBody;
use crate::openai::{DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse};
use crate::state::AppState;

/// `GET /v1/models`.
pub async fn models(State(state): State<AppState>) -> Json<serde_json::Value> {
    let info = state.engine().info();
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.config().model_id,
            "object": "model",
            "created": state.0.created,
            "owned_by": "synapse",
            "meta": {
                "n_ctx": info.ctx,
                "n_vocab": info.vocab,
                "slots": info.slots,
                "weight_bytes": info.weight_bytes,
                "kernel_path": info.kernel_path,
                "profile": info.profile,
            },
        }],
    }))
}

/// `GET /health`.
pub async fn health(State(state): State<AppState>) -> Json<serde_json::Value> {
    let s = state.engine().stats();
    Json(json!({
        "status": "ok",
        "slots": s.slots,
        "active": s.active,
        "queued": s.queued,
    }))
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let engine = state.engine();
    let text = crate::metrics::render(&engine.stats(), &engine.info());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// Most characters `/tokenize` takes (the body limit bounds it anyway).
const MAX_TOKENIZE_TOKENS: usize = 1 << 20;

/// `POST /tokenize`: `{"content", "add_special"}` → `{"tokens"}` (special tokens parsed).
pub async fn tokenize(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>> {
    let tok = state.tokenizer().clone();
    let tokens =
        tokio::task::spawn_blocking(move || tok.encode(&req.content, req.add_special, true))
            .await
            .map_err(|e| ServerError::Internal(e.to_string()))??;
    Ok(Json(TokenizeResponse { tokens }))
}

/// `POST /detokenize`: `{"tokens"}` → `{"content"}`.
pub async fn detokenize(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>> {
    let tok = state.tokenizer();
    if req.tokens.len() > MAX_TOKENIZE_TOKENS {
        return Err(ServerError::invalid("tokens", "too many tokens"));
    }
    let n = tok.vocab_size();
    if let Some(&bad) = req.tokens.iter().find(|&&t| t as usize >= n) {
        return Err(ServerError::invalid(
            "tokens",
            format!("token id {bad} is outside the vocabulary (0..{n})"),
        ));
    }
    let bytes = tok.detokenize(&req.tokens, false, true)?;
    Ok(Json(DetokenizeResponse {
        content: String::from_utf8_lossy(&bytes).into_owned(),
    }))
}
