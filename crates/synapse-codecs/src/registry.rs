//! Resolving encoding ID strings to codecs.

use crate::asymmetric::Asymmetric;
use crate::codec::Codec;
use crate::error::Result;
use crate::ggml::GgmlLegacy;
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
        EncodingId::Ggml(b) => Box::new(GgmlLegacy::new(b)),
    }
}

/// Parses `id` and returns its codec; unknown or invalid IDs are typed errors.
pub fn resolve(id: &str) -> Result<Box<dyn Codec>> {
    Ok(codec_for(EncodingId::parse(id)?))
}

/// A default ladder of candidates, most precise (most bits per weight) first: symmetric 8…2
/// bits at group 64, asymmetric (a minimum beside each scale) 6…2 bits at group 64 — each
/// between the symmetric widths around it, and the better choice wherever a group's weights
/// are not centred on zero — ggml's block types with SIMD kernels (q8_0, q6_k, q5_1, q5_0,
/// q5_k, q4_1, q4_0, q4_k: blocks of 32, the K-quants of 256, what llama.cpp runs too; only
/// for rows of whole blocks), and BitNet ternary at group 64.
pub fn default_ladder() -> Vec<EncodingId> {
    let mut v: Vec<EncodingId> = (2..=8u32)
        .map(|bits| EncodingId::Symmetric { bits, group: 64 })
        .chain((2..=6u32).map(|bits| EncodingId::Asymmetric { bits, group: 64 }))
        .chain(crate::ggml::GgmlBlock::ALL.map(EncodingId::Ggml))
        .collect();
    v.push(EncodingId::TernaryGroup { group: 64 });
    v.sort_by(|a, b| b.bits_per_weight().total_cmp(&a.bits_per_weight()));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_ladder_runs_from_most_to_fewest_bits_per_weight() {
        let v = default_ladder();
        let names: Vec<String> = v.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            names,
            [
                "ggml.q8_0.v1",
                "syn.q8.symmetric.g64.v1",
                "syn.q7.symmetric.g64.v1",
                "ggml.q6_k.v1",
                "syn.q6.asymmetric.g64.v1",
                "syn.q6.symmetric.g64.v1",
                "ggml.q5_1.v1",
                "syn.q5.asymmetric.g64.v1",
                "ggml.q5_0.v1",
                "ggml.q5_k.v1",
                "syn.q5.symmetric.g64.v1",
                "ggml.q4_1.v1",
                "syn.q4.asymmetric.g64.v1",
                "ggml.q4_0.v1",
                "ggml.q4_k.v1",
                "syn.q4.symmetric.g64.v1",
                "syn.q3.asymmetric.g64.v1",
                "syn.q3.symmetric.g64.v1",
                "syn.q2.asymmetric.g64.v1",
                "syn.q2.symmetric.g64.v1",
                "syn.ternary.absmean.g64.v1",
            ]
        );
        // Each a codec this build runs, sizes falling along the ladder.
        let sizes: Vec<usize> = v
            .iter()
            .map(|&e| codec_for(e).matrix_size(4, 256).unwrap())
            .collect();
        assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
    }
}
