//! The one error enum of `synapse-selector`.

/// Everything that can go wrong building or applying a selection.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectorError {
    /// The importance map does not belong to this model or codec set.
    #[error(transparent)]
    Map(#[from] synapse_sensitivity::SensitivityError),
    /// A constraint names a tensor the importance map does not have.
    #[error("tensor `{name}` is not in the importance map")]
    UnknownTensor {
        /// Tensor name.
        name: String,
    },
    /// A tensor appears in two fused groups.
    #[error("tensor `{name}` is in more than one fused group")]
    TensorInTwoGroups {
        /// Tensor name.
        name: String,
    },
    /// No encoding of this item is supported by the device (or allowed by the constraints).
    #[error("no supported encoding for `{item}`")]
    NoSupportedEncoding {
        /// Tensor or fused group.
        item: String,
    },
    /// The budget can only be met by going below the quality floor, which was not opted into.
    #[error(
        "budget of {budget} bytes needs approximation below the quality floor (smallest within the floor: {min_within_floor} bytes)"
    )]
    ApproximationNotAllowed {
        /// The budget asked for.
        budget: u64,
        /// The smallest total that stays within the floor.
        min_within_floor: u64,
    },
    /// Every supported option of this item is below the quality floor, and approximation was
    /// not opted into.
    #[error(
        "every supported encoding of `{item}` is below the quality floor (approximation not allowed)"
    )]
    FloorUnreachable {
        /// Tensor or fused group.
        item: String,
    },
    /// Even the smallest supported options exceed the budget.
    #[error("budget of {budget} bytes is below the smallest possible total of {minimum} bytes")]
    BudgetTooSmall {
        /// The budget asked for.
        budget: u64,
        /// The smallest achievable total.
        minimum: u64,
    },
}

/// Result alias for this crate.
pub type Result<T, E = SelectorError> = std::result::Result<T, E>;
