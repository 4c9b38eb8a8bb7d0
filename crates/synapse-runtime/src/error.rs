//! The one error enum of `synapse-runtime`.

/// Everything that can go wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    // ---- loading ----
    /// Reading the model file failed.
    #[error(transparent)]
    Format(#[from] synapse_formats::FormatError),
    /// Building the IR failed (unsupported architecture, tensor …).
    #[error(transparent)]
    Model(#[from] synapse_model::ModelError),
    /// A kernel rejected a weight or a shape.
    #[error(transparent)]
    Kernel(#[from] synapse_kernels::KernelError),
    /// Measuring importance failed (calibration shape, a codec).
    #[error(transparent)]
    Sensitivity(#[from] synapse_sensitivity::SensitivityError),
    /// No precision profile meets the request (budget too small, …).
    #[error(transparent)]
    Selector(#[from] synapse_selector::SelectorError),
    /// A Synapse package could not be opened as a model (missing, corrupt or inconsistent
    /// objects, a graph the family adapter refuses).
    #[error(transparent)]
    Package(#[from] synapse_import::ImportError),
    /// The object store holding cached precision variants failed.
    #[error("variant cache: {0}")]
    VariantCache(#[from] synapse_cas::CasError),
    /// The path is neither a GGUF file nor a safetensors checkpoint.
    #[error("{path}: {reason}")]
    NotAModel {
        /// The path given.
        path: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A weight's bytes are not where its descriptor says.
    #[error("weight {name:?}: {reason}")]
    WeightData {
        /// The weight.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The precision profile asks for an encoding the loader cannot produce from the source.
    #[error(
        "precision profile: tensor {name:?} is {source_encoding} in the source, profile asks {wanted}"
    )]
    UnsupportedConversion {
        /// The tensor.
        name: String,
        /// Its source encoding.
        source_encoding: String,
        /// The encoding the profile asks for.
        wanted: String,
    },

    // ---- execution ----
    /// A batch row names a session slot that does not exist.
    #[error("unknown session slot {0}")]
    UnknownSlot(u32),
    /// A batch row's position is not the next position of its session.
    #[error("session slot {slot}: row position {pos}, expected {expected}")]
    PositionGap {
        /// The slot.
        slot: u32,
        /// Position given.
        pos: u32,
        /// Position expected (the session's length so far).
        expected: u32,
    },
    /// A session would exceed its context capacity.
    #[error("session slot {slot}: context full ({capacity} positions)")]
    ContextFull {
        /// The slot.
        slot: u32,
        /// Its capacity.
        capacity: u32,
    },
    /// Too many rows of one session in one forward pass for its sliding-window ring.
    #[error(
        "session slot {slot}: {rows} rows in one pass, the cache allows {max} (chunk the prefill)"
    )]
    ChunkTooLarge {
        /// The slot.
        slot: u32,
        /// Rows given.
        rows: usize,
        /// Maximum rows per pass.
        max: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The id.
        token: u32,
        /// Vocabulary size.
        vocab: u32,
    },
    /// The KV cache was made for another model or precision profile.
    #[error("KV cache identity mismatch: cache {cache}, executor {executor}")]
    KvIdentity {
        /// The cache's identity.
        cache: String,
        /// The executor's identity.
        executor: String,
    },
    /// A pipeline's next stage failed or could not be reached (the pass fails; the
    /// stage's own error or the transport's).
    #[error("pipeline stage: {0}")]
    Stage(String),
    /// A memory budget (`--memory`) cannot hold what running needs: the part of the budget
    /// a component was given, and what it cannot fit.
    #[error("memory budget {budget} B: {reason}")]
    MemoryBudget {
        /// The budget (or the share of it the refusing component was given), bytes.
        budget: u64,
        /// What does not fit in it.
        reason: String,
    },
    /// Invalid sampling or generation parameters.
    #[error("invalid parameter {name}: {reason}")]
    InvalidParam {
        /// The parameter.
        name: &'static str,
        /// Why.
        reason: String,
    },
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, RuntimeError>;
