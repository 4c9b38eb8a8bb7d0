//! What every handler shares: the engine, the tokenizer and chat template, the served model's
//! names and the server's settings.

use std::sync::Arc;
use std::time::Duration;

use synapse_runtime::engine::{Backend, TokenPieces};
use synapse_tokenizer::{ChatTemplate, Tokenizer};

use crate::constraint::Grammars;
use crate::error::{Result, ServerError};

/// The server's settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The id the model is served under (`/v1/models`, responses' `model`): the alias, else
    /// the model file's name.
    pub model_id: String,
    /// Other names a request's `model` may use (the file name, its stem, the path).
    pub model_aliases: Vec<String>,
    /// The model family (`gemma3`, …): a Gemma model without a chat template gets
    /// llama.cpp's built-in `gemma` format.
    pub family: String,
    /// Require `Authorization: Bearer <key>` (everything but `/health`).
    pub api_key: Option<String>,
    /// `max_tokens` when a request gives none (`None`: until the context is full).
    pub default_max_tokens: Option<usize>,
    /// Answer CORS preflights and allow any origin.
    pub cors: bool,
    /// Largest request body, bytes.
    pub body_limit: usize,
    /// Longest time to the response head (a stream's body is not limited).
    pub request_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            model_id: "default".into(),
            model_aliases: Vec::new(),
            family: String::new(),
            api_key: None,
            default_max_tokens: None,
            cors: false,
            body_limit: 4 << 20,
            request_timeout: Duration::from_secs(600),
        }
    }
}

pub(crate) struct Inner {
    pub(crate) engine: Arc<dyn Backend>,
    pub(crate) tok: Arc<Tokenizer>,
    pub(crate) template: Option<ChatTemplate>,
    pub(crate) cfg: ServerConfig,
    pub(crate) grammars: tokio::sync::OnceCell<Arc<Grammars>>,
    pub(crate) created: u64,
    pub(crate) precision: Option<Arc<synapse_runtime::promotion::BudgetDriver>>,
}

/// The state handlers share (cheap to clone).
#[derive(Clone)]
pub struct AppState(pub(crate) Arc<Inner>);

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("model_id", &self.0.cfg.model_id)
            .field("template", &self.0.template.is_some())
            .finish()
    }
}

impl AppState {
    /// The state for `engine` (an in-process [`synapse_runtime::engine::Engine`] or a
    /// cluster's router) serving a model whose tokenizer is `tok`. Compiles the model's
    /// chat template (a template that does not compile is an error here, not per request).
    pub fn new(engine: Arc<dyn Backend>, tok: Arc<Tokenizer>, cfg: ServerConfig) -> Result<Self> {
        let template = match tok.chat_template() {
            Some(_) => Some(ChatTemplate::from_tokenizer(&tok)?),
            None => None,
        };
        crate::metrics::handle();
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Ok(AppState(Arc::new(Inner {
            engine,
            tok,
            template,
            cfg,
            grammars: tokio::sync::OnceCell::new(),
            created,
            precision: None,
        })))
    }

    /// This state with `driver` behind `POST /v1/precision` (a server started with a budget
    /// and an importance map); an error once the state has been shared.
    pub fn with_precision(
        mut self,
        driver: Arc<synapse_runtime::promotion::BudgetDriver>,
    ) -> Result<Self> {
        let inner = Arc::get_mut(&mut self.0).ok_or_else(|| {
            ServerError::Internal("with_precision on a state already shared".into())
        })?;
        inner.precision = Some(driver);
        Ok(self)
    }

    /// The budget driver, when the server has one.
    pub(crate) fn precision(&self) -> Option<&Arc<synapse_runtime::promotion::BudgetDriver>> {
        self.0.precision.as_ref()
    }

    /// What serves the sessions.
    pub fn engine(&self) -> &Arc<dyn Backend> {
        &self.0.engine
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.0.tok
    }

    /// The settings.
    pub fn config(&self) -> &ServerConfig {
        &self.0.cfg
    }

    /// Whether `name` (a request's `model`) names the served model.
    pub(crate) fn serves(&self, name: &str) -> bool {
        let c = &self.0.cfg;
        name.is_empty() || name == c.model_id || c.model_aliases.iter().any(|a| a == name)
    }

    /// The grammar machinery, built on first use (off the async threads).
    pub(crate) async fn grammars(&self) -> Result<Arc<Grammars>> {
        let tok = self.0.tok.clone();
        self.0
            .grammars
            .get_or_try_init(|| async move {
                tokio::task::spawn_blocking(move || Grammars::new(tok).map(Arc::new))
                    .await
                    .map_err(|e| ServerError::Internal(format!("grammar setup: {e}")))?
            })
            .await
            .cloned()
    }
}

/// The tokenizer as the engine's [`TokenPieces`] port: a token's bytes as a user sees them
/// (control tokens: nothing).
#[derive(Debug, Clone)]
pub struct TokenizerPieces(pub Arc<Tokenizer>);

impl TokenPieces for TokenizerPieces {
    fn piece(&self, token: u32) -> Vec<u8> {
        self.0
            .token_to_piece(token, false)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }
}
