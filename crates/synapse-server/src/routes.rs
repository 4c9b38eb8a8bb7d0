//! The small routes: models, health, metrics, tokenize, detokenize.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::{Result, ServerError};
use crate::extract::JsonBody;
use crate::openai::{
    DetokenizeRequest, DetokenizeResponse, PrecisionRequest, TokenizeRequest, TokenizeResponse,
};
use crate::state::AppState;

/// `GET /v1/models`.
pub async fn models(State(state): State<AppState>) -> Json<serde_json::Value> {
    let info = state.engine().info();
    let follow = state
        .precision()
        .and_then(|d| d.following())
        .map(|f| json!({"free_bytes": f.free, "budget_bytes": f.budget, "pressed": f.pressed, "readings": f.readings, "changes": f.changes, "error": f.error}));
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
                "draft_profile": info.draft_profile,
                "budget_follows_free_memory": follow,
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
    let follow = state.precision().and_then(|d| d.following());
    let text = crate::metrics::render(&engine.stats(), &engine.info(), follow.as_ref());
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

/// `POST /v1/precision` (Synapse's extension): `{"budget": "75%" | "180MB" | bytes}` — the
/// weight budget the engine runs at from now on. A larger budget promotes (after the
/// server's hysteresis and cooldown), a smaller one demotes at once; sessions admitted
/// afterwards run on the new profile, running ones finish on theirs. Answers the profile
/// in effect and, when it changed, the tensors that changed (most important first for a
/// promotion).
pub async fn precision(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<PrecisionRequest>,
) -> Result<Json<serde_json::Value>> {
    let Some(driver) = state.precision().cloned() else {
        return Err(ServerError::invalid(
            "budget",
            "this server runs a fixed precision: start it with --budget to change budgets",
        ));
    };
    if driver.following().is_some() {
        return Err(ServerError::invalid(
            "budget",
            "this server's budget follows free memory (--budget free): it takes no other",
        ));
    }
    let budget: synapse_runtime::precision::Budget = match &req.budget {
        serde_json::Value::String(s) => s.parse(),
        serde_json::Value::Number(n) => n.to_string().parse(),
        _ => {
            return Err(ServerError::invalid(
                "budget",
                "a number of bytes or a string",
            ));
        }
    }
    .map_err(|e: synapse_runtime::RuntimeError| ServerError::invalid("budget", e.to_string()))?;
    let t = tokio::task::spawn_blocking(move || driver.set_budget(budget))
        .await
        .map_err(|e| ServerError::Internal(e.to_string()))?
        .map_err(|e| ServerError::invalid("budget", e.to_string()))?;
    let info = state.engine().info();
    let changes = t.as_ref().map(|t| {
        t.changes
            .iter()
            .map(|c| json!({"tensor": c.tensor, "from": c.from, "to": c.to}))
            .collect::<Vec<_>>()
    });
    Ok(Json(json!({
        "changed": t.is_some(),
        "direction": t.as_ref().map(|t| match t.direction {
            synapse_runtime::promotion::Direction::Promote => "promote",
            synapse_runtime::promotion::Direction::Demote => "demote",
        }),
        "profile": info.profile,
        "weight_bytes": info.weight_bytes,
        "changes": changes,
    })))
}
