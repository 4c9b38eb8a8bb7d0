//! Resolving encoding ID strings to codecs.

use crate::asymmetric::Asymmetric;
use crate::codec::Codec;
use crate::error::Result;
use crate::id::EncodingId;
use crate::symmetric::Symmetric;
use crate::ternary::{TernaryGroup, TernaryTensor};

/// The codec for a parsed ID (every parsed ID is valid, so this cannot fail).
pub fn codec_for(id: EncodingId) -> Box<dyn Codec> {
    match id {
        EncodingId::Symmetric { bits, group } => Box::new(Symmetric::from_parts(bits, group)),
        EncodingId::Asymmetric { bits, group } => Box::new(Asymmetric::from_parts(bits, group)),
        EncodingId::TernaryGroup { group } => Box::new(TernaryGroup::from_parts(group)),
        EncodingId::TernaryTensor => Box::new(TernaryTensor),
    }
}

/// Parses `id` and returns its codec; unknown or invalid IDs are typed errors.
pub fn resolve(id: &str) -> Result<Box<dyn Codec>> {
    Ok(codec_for(EncodingId::parse(id)?))
}

/// A default ladder of candidates, most precise first: symmetric 8…2 bits at group 64, then
/// BitNet ternary at group 64.
pub fn default_ladder() -> Vec<EncodingId> {
    let mut v: Vec<EncodingId> = (2..=8u32)
        .rev()
        .map(|bits| EncodingId::Symmetric { bits, group: 64 })
        .collect();
    v.push(EncodingId::TernaryGroup { group: 64 });
    v
}
