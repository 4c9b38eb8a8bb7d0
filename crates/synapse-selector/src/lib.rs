//! `synapse-selector`: which encoding each tensor gets under a memory budget.
//!
//! Design: the selector computes, once and independent of any budget, the full *demotion order*
//! — every step from a tensor's more precise option to its next cheaper one, ordered by the
//! distortion it adds per byte it saves (ascending). A budget then takes the shortest prefix of
//! that order that fits. Because the order never depends on the budget, the choice is monotone:
//! a larger budget takes a shorter prefix, so it only ever promotes, and the demotions it undoes
//! first are the last ones taken — the most important tensors come back first.
//!
//! Constraints: per-device kernel support (unsupported encodings are never assigned), pinned
//! tensors (kept at their most precise supported option), a per-tensor quality floor that may
//! only be crossed with an explicit approximation opt-in (else
//! [`SelectorError::ApproximationNotAllowed`]), and fused groups (q/k/v, gate/up) assigned one
//! joint encoding.
//!
//! A [`Profile`] (tensor → encoding) has a stable [`ProfileHash`] over a canonical sorted
//! serialization of the assignment alone, so equal assignments reached from different budgets
//! share a hash; [`diff`] lists promotions and demotions between two profiles.
//!
//! Pure library: no files, no executor, no network.
#![deny(missing_docs)]

pub mod error;
pub mod profile;
pub mod select;

pub use error::{Result, SelectorError};
pub use profile::{Assignment, Change, ChangeKind, Profile, ProfileHash, diff};
pub use select::{Constraints, DemotionStep, Selector};
