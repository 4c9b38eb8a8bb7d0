//! The engine's public types: configuration, requests, the events a session streams back,
//! submission errors and statistics.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc::UnboundedReceiver;

use crate::kv::KvDtype;
use crate::load::Model;
use crate::sampling::SamplingParams;

/// How an [`crate::engine::Engine`] runs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Sessions that run at once (KV slots; llama-server's `--parallel`).
    pub slots: usize,
    /// Positions one session may hold (prompt + generated tokens).
    pub ctx: usize,
    /// A prompt is run in batches of at most this many rows (llama.cpp's `n_ubatch`); a
    /// prompt row's float order is llama.cpp's for the batch of the prompt it falls in.
    pub ubatch: usize,
    /// Rows one step may run in all (decode rows first, then prompt chunks).
    pub step_tokens: usize,
    /// Requests that may wait for a slot; past this, submission fails with
    /// [`SubmitError::QueueFull`].
    pub queue: usize,
    /// KV element type.
    pub kv_dtype: KvDtype,
    /// Compute threads.
    pub threads: usize,
    /// Memory budget in bytes over resident weights and KV (`None`: no budget beyond
    /// `slots × ctx`).
    pub memory: Option<u64>,
    /// A draft profile of the model for exact escalation ([`Request::escalation`]): each
    /// opted-in session gets a draft slot beside its own, the draft proposes up to
    /// `draft_k` tokens per step and the session's own profile verifies them in the step's
    /// pass. `None`: no request can opt in.
    pub draft: Option<Arc<Model>>,
    /// A head-only draft for exact escalation (instead of `draft`): the model itself with
    /// its LM head cut to a shared vocabulary shortlist — these token ids, the model's
    /// end-of-generation tokens, the escalating sessions' prompt tokens and every token the
    /// source chooses off the list (see `engine::head`). Greedy escalating sessions draft
    /// with it; sampled ones decode plainly. `None`: no head-only draft.
    pub head_draft: Option<Vec<u32>>,
    /// Most draft tokens per session and step (1..=16).
    pub draft_k: usize,
    /// Choose each step's `k` (0: no drafting that step) by the cost model from measured
    /// acceptance and pass times; `false`: always `draft_k`.
    pub draft_adaptive: bool,
    /// Run [`Scheduler::warm_up`](super::Scheduler::warm_up) before the engine takes
    /// requests (`Engine::start` returns after it): the first request then does not pay
    /// for faulting in the weights. Off by default; `synapse-cli serve` turns it on.
    pub warmup: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            slots: 4,
            ctx: 4096,
            ubatch: 512,
            step_tokens: 512,
            queue: 64,
            kv_dtype: KvDtype::F32,
            threads: 2,
            memory: None,
            draft: None,
            head_draft: None,
            draft_k: 8,
            draft_adaptive: true,
            warmup: false,
        }
    }
}

/// Turns token ids into bytes (the tokenizer's port): the engine needs text for stop strings
/// and for streaming.
pub trait TokenPieces: Send + Sync {
    /// The bytes `token` stands for as shown to a user (control tokens: nothing).
    fn piece(&self, token: u32) -> Vec<u8>;

    /// Appends [`TokenPieces::piece`] to `out` (override to avoid the allocation).
    fn piece_into(&self, token: u32, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.piece(token));
    }
}

/// A token-level constraint (a grammar or JSON schema) applied to one session's logits.
pub trait Constraint: Send {
    /// Sets the logits of every token not allowed next to `-inf`.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String>;
    /// Commits the sampled token; returns `true` once the constrained output is complete.
    fn commit(&mut self, token: u32) -> Result<bool, String>;
    /// What this constraint was built from, such that the builder that made it can make it
    /// again elsewhere (a cluster worker serving the request); `None`: it cannot travel.
    fn spec(&self) -> Option<String> {
        None
    }
}

/// One generation request (token ids in, tokens and text out).
pub struct Request {
    /// Prompt token ids (BOS and template already applied).
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling parameters (seeded: the same request gives the same tokens).
    pub sampling: SamplingParams,
    /// Added to the logits of these tokens before sampling (`-inf`-like values ban them).
    pub logit_bias: Vec<(u32, f32)>,
    /// Stop strings: generation ends when one appears; it is never part of the text.
    pub stop: Vec<String>,
    /// End at the model's end-of-generation tokens (`false`: llama.cpp's `ignore_eos`).
    pub stop_at_eog: bool,
    /// Report each token's log-probability and this many most likely alternatives.
    pub logprobs: Option<usize>,
    /// A constraint on the output (structured outputs).
    pub constraint: Option<Box<dyn Constraint>>,
    /// Exact escalation: tokens drafted by the engine's draft profile and verified by this
    /// session's own (the output is the same as without; only speed differs). Needs
    /// [`EngineConfig::draft`]. Greedy sessions without a constraint draft; others run as
    /// plain decoding (their output is the same either way).
    pub escalation: bool,
    /// The first generated tokens, known already: an earlier run of this request that
    /// stopped (a pipeline or worker lost mid-generation) is resumed by running them as the
    /// decode steps they were — same rows, same float order, same sampler draws — and
    /// checking that each step chooses them again (a step that does not is an
    /// [`Event::Error`]). Their events are sent as for any token; a caller that already
    /// delivered them skips that many.
    pub forced: Vec<u32>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("prompt_tokens", &self.prompt.len())
            .field("max_tokens", &self.max_tokens)
            .field("sampling", &self.sampling)
            .field("stop", &self.stop)
            .field("logprobs", &self.logprobs)
            .field("constraint", &self.constraint.is_some())
            .field("forced", &self.forced.len())
            .finish()
    }
}

impl Request {
    /// A greedy request for `max_tokens` tokens that stops at end-of-generation.
    pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Self {
        Request {
            prompt,
            max_tokens,
            sampling: SamplingParams::default(),
            logit_bias: Vec::new(),
            stop: Vec::new(),
            stop_at_eog: true,
            logprobs: None,
            constraint: None,
            escalation: false,
            forced: Vec::new(),
        }
    }
}

/// A token's log-probability (natural log, of the distribution the model gave, before
/// sampling transforms) and its most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct Logprob {
    /// Log-probability of the chosen token.
    pub logprob: f32,
    /// The most likely tokens with theirs, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    /// Token id.
    pub id: u32,
    /// Text that became safe to show with this token (may be empty: bytes of a character
    /// split over tokens, or text that could still be the start of a stop string).
    pub text: String,
    /// Its log-probability, when the request asked for them.
    pub logprob: Option<Logprob>,
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token, a stop string or a completed constraint.
    Stop,
    /// `max_tokens` reached, or the session's context is full.
    Length,
    /// Cancelled by the client.
    Cancelled,
}

impl FinishReason {
    /// OpenAI's name (`stop`, `length`; `cancelled` is never sent to a client).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// The end of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// Why it ended.
    pub reason: FinishReason,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache (not run).
    pub cached_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Text still held back when it ended (emit it after the last token's text).
    pub tail: String,
}

/// What a session streams back, in order: `Admitted`, then `Token`s, then one `Done` or
/// one `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The session got a slot; its prompt starts running.
    Admitted {
        /// Prompt tokens served from the prefix cache.
        cached_tokens: usize,
    },
    /// A generated token.
    Token(TokenEvent),
    /// The session ended normally.
    Done(Finished),
    /// The session failed (its slot is freed; other sessions are unaffected).
    Error(String),
}

/// Why a request was not accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    /// Every slot is busy and the wait queue is full: retry later.
    #[error("the server is busy: {queued} requests are waiting; retry in {retry_after_s} s")]
    QueueFull {
        /// Requests waiting.
        queued: usize,
        /// Suggested wait in seconds.
        retry_after_s: u32,
    },
    /// The prompt plus at least one generated token does not fit a session's context.
    #[error("the prompt has {tokens} tokens; the context holds {limit}")]
    PromptTooLong {
        /// Prompt tokens.
        tokens: usize,
        /// Positions a session holds.
        limit: usize,
    },
    /// A parameter is out of its domain.
    #[error("invalid {param}: {reason}")]
    Invalid {
        /// The parameter.
        param: &'static str,
        /// Why.
        reason: String,
    },
    /// The engine is shutting down or has stopped.
    #[error("the engine is shutting down")]
    Stopped,
}

/// A submitted session: its events, and cancellation. Dropping it cancels the session
/// (a client that went away frees its slot at the next step).
#[derive(Debug)]
pub struct Session {
    pub(crate) id: u64,
    pub(crate) events: UnboundedReceiver<Event>,
    pub(crate) cancel: Arc<AtomicBool>,
}

impl Session {
    /// A session whose events come from elsewhere (another process, through a
    /// [`super::Backend`] other than the engine): the [`SessionSink`] sends them and sees
    /// cancellation.
    pub fn remote(id: u64) -> (Session, SessionSink) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        (
            Session {
                id,
                events: rx,
                cancel: cancel.clone(),
            },
            SessionSink { tx, cancel },
        )
    }

    /// The session's id (unique per engine).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next event (`None` after the last).
    pub async fn next(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// The next event, blocking the thread (not for async contexts).
    pub fn blocking_next(&mut self) -> Option<Event> {
        self.events.blocking_recv()
    }

    /// The next event if one is ready.
    pub fn try_next(&mut self) -> Option<Event> {
        self.events.try_recv().ok()
    }

    /// Asks the engine to stop this session at its next step.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// A handle that cancels this session from elsewhere.
    pub fn canceller(&self) -> Canceller {
        Canceller(self.cancel.clone())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// The sending end of a [`Session::remote`].
#[derive(Debug, Clone)]
pub struct SessionSink {
    tx: tokio::sync::mpsc::UnboundedSender<Event>,
    cancel: Arc<AtomicBool>,
}

impl SessionSink {
    /// Sends an event; `false` when the session is gone.
    pub fn send(&self, e: Event) -> bool {
        self.tx.send(e).is_ok()
    }

    /// Whether the session was cancelled or dropped.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.tx.is_closed()
    }

    /// Resolves when the session is dropped (its receiver closed).
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// Cancels one session.
#[derive(Debug, Clone)]
pub struct Canceller(Arc<AtomicBool>);

impl Canceller {
    /// Asks the engine to stop the session at its next step.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A snapshot of the engine's counters and gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Requests waiting for a slot.
    pub queued: usize,
    /// Sessions holding a slot.
    pub active: usize,
    /// Slots in all.
    pub slots: usize,
    /// Requests accepted.
    pub requests: u64,
    /// Requests refused (queue full).
    pub rejected: u64,
    /// Sessions cancelled.
    pub cancelled: u64,
    /// Prompt tokens of admitted sessions.
    pub prompt_tokens: u64,
    /// Prompt tokens served from the prefix cache.
    pub prefix_hit_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Forward passes run.
    pub steps: u64,
    /// KV bytes held by slots (active sessions and cached prefixes).
    pub kv_bytes: u64,
    /// KV bytes the ledger allows.
    pub kv_budget_bytes: u64,
    /// Precision profiles installed since the start (promotions and demotions).
    pub profile_changes: u64,
    /// Precision profiles the engine has left that sessions still run on (their weights
    /// stay resident until those sessions end).
    pub retired_profiles: u64,
    /// Draft tokens proposed (exact escalation).
    pub drafted: u64,
    /// Draft tokens the verifying profile accepted.
    pub draft_accepted: u64,
    /// The draft's per-token acceptance as the cost model estimates it now (decayed over
    /// recent rounds), in parts per million; 0 before any drafted round. An online signal of
    /// how much what the draft demotes matters to this traffic.
    pub draft_acceptance_ppm: u64,
    /// Tokens on a head-only draft's shortlist (0 without one).
    pub draft_shortlist: u64,
    /// Routed-expert uses that found the expert resident (under `EngineConfig::memory`).
    pub expert_hits: u64,
    /// Routed-expert uses that paged the expert in.
    pub expert_misses: u64,
    /// Experts paged out to make room.
    pub expert_evictions: u64,
    /// Bytes of experts paged in.
    pub expert_bytes_in: u64,
    /// Experts whose reads were advised ahead of use (the router lookahead's predictions and
    /// each layer's routed misses).
    pub expert_prefetches: u64,
    /// Experts the router lookahead predicted for a later layer.
    pub expert_predicted: u64,
    /// Of those, the ones the layer then routed rows to.
    pub expert_predicted_used: u64,
    /// Expert misses the pager's frequency filter did not admit (run from its scratch slot,
    /// nothing paged out).
    pub expert_bypassed: u64,
    /// A dense model's block uses (one per block per pass) that found it resident, under
    /// a memory budget its blocks do not fit whole.
    pub block_hits: u64,
    /// Block uses that paged the block in.
    pub block_misses: u64,
    /// Blocks paged out to make room.
    pub block_evictions: u64,
    /// Bytes of blocks paged in.
    pub block_bytes_in: u64,
}

/// How an engine divided its memory budget (`EngineConfig::memory`), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLedger {
    /// The budget.
    pub budget: u64,
    /// Weights counted once (a draft's whole), routed experts included.
    pub weights: u64,
    /// Of which routed experts.
    pub experts: u64,
    /// The KV cache of every slot.
    pub kv: u64,
    /// An upper bound of one pass's compute scratch.
    pub scratch: u64,
    /// When the whole does not fit: what the routed experts page within (the rest of the
    /// budget); `None` when everything fits.
    pub experts_budget: Option<u64>,
    /// Of the weights, a dense model's block projections (0 for a mixture of experts).
    pub layers: u64,
    /// When the whole of a dense model does not fit: what its blocks page within (the rest
    /// of the budget, after the embedding and head's mapped folios); `None` when everything
    /// fits.
    pub layers_budget: Option<u64>,
}

/// Fixed facts about a running engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineInfo {
    /// Slots.
    pub slots: usize,
    /// Positions per session.
    pub ctx: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// The model's IR fingerprint.
    pub fingerprint: String,
    /// Bytes of resident weights (counted once).
    pub weight_bytes: u64,
    /// Kernel path in use.
    pub kernel_path: String,
    /// The hash of the precision profile new sessions run on (the source's, or a budget's /
    /// uniform profile's; it changes when a new profile is installed).
    pub profile: String,
    /// The draft profile's hash when requests may opt in to exact escalation (`head:N` for
    /// a head-only draft whose shortlist starts with `N` tokens).
    pub draft_profile: Option<String>,
    /// The hash of the model's source profile (every weight in its source encoding): while
    /// `profile` equals it, plain decoding is already the exact output, so a request for
    /// exact escalation is served without a draft.
    pub source_profile: String,
    /// How the memory budget was divided (`None` without one).
    pub memory: Option<MemoryLedger>,
}

impl EngineInfo {
    /// Whether a request may ask for exact escalation: the engine drafts, or it runs at the
    /// source precision (plain decoding is then the exact output).
    pub fn exact_available(&self) -> bool {
        self.draft_profile.is_some() || self.profile == self.source_profile
    }
}
