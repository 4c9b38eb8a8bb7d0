//! The one error enum of `synapse-planner`.

/// Everything that can make a plan impossible.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The request is malformed (no devices, no layers, non-finite or non-positive rates …).
    #[error("invalid plan request: {reason}")]
    InvalidRequest {
        /// What is wrong.
        reason: String,
    },
    /// No device has a kernel for any encoding of this tensor.
    #[error("no device supports any encoding of tensor `{tensor}`")]
    UnsupportedEverywhere {
        /// Tensor name.
        tensor: String,
    },
    /// The model does not fit the cluster even at its smallest supported encodings.
    #[error(
        "insufficient memory: the model needs at least {needed_bytes} bytes (weights at their smallest supported encodings plus KV), the cluster has {cluster_bytes}"
    )]
    InsufficientMemory {
        /// Smallest weights + KV reservation.
        needed_bytes: u64,
        /// Σ device memory.
        cluster_bytes: u64,
    },
    /// The model fits only by going below the quality floor, which was not opted into.
    #[error(
        "the model fits only with encodings below the quality floor {floor} (approximation not allowed)"
    )]
    ApproximationNotAllowed {
        /// The per-tensor distortion floor.
        floor: f64,
    },
}

/// Result alias for this crate.
pub type Result<T, E = PlanError> = std::result::Result<T, E>;
