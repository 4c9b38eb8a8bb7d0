//! `synapse-server`: the OpenAI-compatible HTTP server over the Synapse engine.
//!
//! - [`router`]: the routes (each also without the `/v1` prefix): `POST /v1/completions`,
//!   `POST /v1/chat/completions` (JSON or SSE), `GET /v1/models`, `GET /health`,
//!   `GET /metrics` (Prometheus), `POST /tokenize`, `POST /detokenize` (llama-server's shapes).
//! - [`AppState`]: the engine, the tokenizer, the compiled chat template, the settings.
//! - [`serve`]: binds, serves until a shutdown signal, lets running streams finish, then shuts
//!   the engine down.
//!
//! Design: requests are parsed leniently into the server's own OpenAI types ([`openai`]),
//! checked ([`params`]), turned into engine `Request`s (chat through the model's template,
//! [`prompt`]; structured outputs through llguidance, [`constraint`]) and submitted; each
//! choice is one engine session. Every error is an OpenAI error object ([`ServerError`]).
//!
//! Architecture invariant: this is the only crate that knows HTTP. The engine knows
//! nothing of requests' wire shapes, the server nothing of scheduling: it submits, streams
//! the session's events, and cancels by dropping the session.
#![deny(missing_docs)]

pub mod constraint;
pub mod error;
pub mod extract;
pub mod generate;
pub mod metrics;
pub mod middleware;
pub mod openai;
pub mod params;
pub mod prompt;
pub mod response;
pub mod routes;
pub mod state;

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use tower_http::cors::CorsLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

pub use error::{ErrorBody, ErrorObject, Result, ServerError};
pub use state::{AppState, ServerConfig, TokenizerPieces};

/// The request id the request-id middleware put on a request.
pub(crate) fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(middleware::REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string()
}

/// The server's routes and layers over `state`.
pub fn router(state: AppState) -> Router {
    let cfg = state.config().clone();
    let api = Router::new()
        .route("/v1/completions", post(generate::completions))
        .route("/completions", post(generate::completions))
        .route("/v1/chat/completions", post(generate::chat_completions))
        .route("/chat/completions", post(generate::chat_completions))
        .route("/v1/models", get(routes::models))
        .route("/models", get(routes::models))
        .route("/health", get(routes::health))
        .route("/v1/health", get(routes::health))
        .route("/metrics", get(routes::metrics))
        .route("/v1/precision", post(routes::precision))
        .route("/precision", post(routes::precision))
        .route("/tokenize", post(routes::tokenize))
        .route("/v1/tokenize", post(routes::tokenize))
        .route("/detokenize", post(routes::detokenize))
        .route("/v1/detokenize", post(routes::detokenize));
    let trace = TraceLayer::new_for_http().make_span_with(|req: &axum::http::Request<_>| {
        tracing::info_span!(
            "http",
            method = %req.method(),
            path = %req.uri().path(),
            request_id = %request_id(req.headers()),
        )
    });
    // Router::layer wraps what is already there: the last layer added runs first.
    let mut app = api
        .layer(DefaultBodyLimit::max(cfg.body_limit))
        .layer(RequestBodyLimitLayer::new(cfg.body_limit))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            cfg.request_timeout,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::auth,
        ));
    if cfg.cors {
        app = app.layer(CorsLayer::very_permissive());
    }
    app.layer(axum::middleware::from_fn_with_state(
        state.clone(),
        middleware::json_errors,
    ))
    .layer(trace)
    .layer(axum::middleware::from_fn(middleware::request_id))
    .with_state(state)
}

/// Serves `state` on `listener` until `shutdown` resolves; running requests and streams
/// finish first, then the engine is shut down.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let engine = state.engine().clone();
    let app = router(state);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await?;
    tracing::info!("no connections left; shutting the engine down");
    tokio::task::spawn_blocking(move || engine.shutdown())
        .await
        .map_err(|e| ServerError::Internal(format!("engine shutdown: {e}")))?;
    Ok(())
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C). The handlers are installed when this is called
/// (inside a Tokio runtime), not when the future is first polled, so a signal that arrives
/// while the server starts is not lost to the default action.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let (mut term, mut int) = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::interrupt()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let term = async {
                match term.as_mut() {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let int = async {
                match int.as_mut() {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = term => {},
                _ = int => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutdown signal: no new connections; running requests finish");
    }
}
