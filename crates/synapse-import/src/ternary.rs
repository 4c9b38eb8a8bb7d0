//! BitNet b1.58 projections stored ternary in packages.
//!
//! A checkpoint whose IR declares a [`ProjectionQuant`] has every projection ternary at run
//! time; the package stores it that way, in `syn.ternary.absmean.tensor.v1` (a 4-byte f32 `γ`
//! and 2-bit codes: ~2 bits a weight), whichever form the source held it in:
//! - BF16/F16/F32 masters under W1.58A8 ([`ProjectionQuant::BitnetW158A8`]): ternarised by
//!   [`TernaryTensor::encode_bitnet_weight_quant`] — the function the runtime runs on a
//!   source's masters at load — so the package runs to the source's logits bit for bit;
//! - transformers' offline packed `uint8` with `weight_scale`
//!   ([`ProjectionQuant::BitnetW158A8Packed`]) and bitnet.cpp's I2_S
//!   ([`ProjectionQuant::BitnetI2S`]): the same codes repacked, lossless.
//!
//! Each transcoded tensor keeps its source form in the manifest
//! ([`synapse_cas::package::SourceForm`]), from which [`crate::PackageModel`] rebuilds the
//! source's description; every other tensor is stored as the source holds it. Everything is
//! transcoded (and so validated) before the first object is written.

use crate::error::{ImportError, Result};
use std::collections::BTreeMap;
use synapse_codecs::TernaryTensor;
use synapse_formats::GgmlType;
use synapse_model::{Linear, ModelIr, ProjectionQuant};

/// The encoding of BitNet projections in packages.
pub const TERNARY_ENCODING: &str = "syn.ternary.absmean.tensor.v1";

/// A projection in [`TERNARY_ENCODING`].
pub(crate) struct Ternary {
    /// The codec bytes.
    pub(crate) bytes: Vec<u8>,
    /// The logical matrix in ggml order: `[in, out]`.
    pub(crate) dims: [u64; 2],
}

/// Every projection of `ir` transcoded to [`TERNARY_ENCODING`], by tensor name (empty when
/// the IR declares no projection quantization). `bytes` gives a tensor's source bytes by name.
pub(crate) fn ternary_projections<'a>(
    ir: &ModelIr,
    bytes: impl Fn(&str) -> Option<&'a [u8]>,
) -> Result<BTreeMap<String, Ternary>> {
    let mut out = BTreeMap::new();
    if ir.projection_quant.is_none() {
        return Ok(out);
    }
    for l in ir.projections() {
        let name = &ir.weight(l.weight).name;
        let missing = |n: &str| ImportError::Transcode {
            tensor: name.clone(),
            encoding: TERNARY_ENCODING,
            reason: format!("no `{n}` in the source"),
        };
        let weight = bytes(name).ok_or_else(|| missing(name))?;
        let scale = match l.scale {
            Some(s) => {
                let n = &ir.weight(s).name;
                Some(bytes(n).ok_or_else(|| missing(n))?)
            }
            None => None,
        };
        out.insert(
            name.clone(),
            Ternary {
                bytes: ternary_projection(ir, l, weight, scale)?,
                dims: [u64::from(l.in_features), u64::from(l.out_features)],
            },
        );
    }
    Ok(out)
}

/// Projection `l` of `ir` (under its [`ProjectionQuant`]) in [`TERNARY_ENCODING`], from its
/// weight's source bytes and, in the packed form, its `weight_scale`'s: the one conversion a
/// package stores and the runtime runs on a source file.
pub fn ternary_projection(
    ir: &ModelIr,
    l: &Linear,
    weight: &[u8],
    scale: Option<&[u8]>,
) -> Result<Vec<u8>> {
    let w = ir.weight(l.weight);
    let fail = |reason: String| ImportError::Transcode {
        tensor: w.name.clone(),
        encoding: TERNARY_ENCODING,
        reason,
    };
    let codec = |e: synapse_codecs::CodecError| fail(e.to_string());
    let (rows, cols) = (l.out_features as usize, l.in_features as usize);
    match (ir.projection_quant, l.scale.zip(scale)) {
        (Some(ProjectionQuant::BitnetW158A8Packed), Some((s, sb))) => {
            let s = ir.weight(s);
            let scale = widen(s.encoding, sb).map_err(&fail)?;
            let [scale] = scale[..] else {
                return Err(fail(format!("`{}` has {} elements", s.name, scale.len())));
            };
            TernaryTensor::from_bitnet_packed(weight, scale, rows, cols).map_err(codec)
        }
        (Some(ProjectionQuant::BitnetI2S), None) => {
            TernaryTensor::from_i2s(weight, rows, cols).map_err(codec)
        }
        (Some(ProjectionQuant::BitnetW158A8), None) => {
            let v = widen(w.encoding, weight).map_err(&fail)?;
            if v.len() != rows * cols {
                return Err(fail(format!("{} elements for {rows}×{cols}", v.len())));
            }
            TernaryTensor::encode_bitnet_weight_quant(&v).map_err(codec)
        }
        (q, s) => Err(fail(format!(
            "{q:?} with{} a weight scale",
            if s.is_some() { "" } else { "out" }
        ))),
    }
}

/// A float tensor's values as f32 (exact for F32, F16 and BF16; F64 rounded).
fn widen(encoding: GgmlType, b: &[u8]) -> std::result::Result<Vec<f32>, String> {
    let bad = || format!("{} bytes of {}", b.len(), encoding.name());
    match encoding {
        GgmlType::F32 if b.len().is_multiple_of(4) => Ok(b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()),
        GgmlType::F16 if b.len().is_multiple_of(2) => Ok(b
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect()),
        GgmlType::BF16 if b.len().is_multiple_of(2) => Ok(b
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect()),
        GgmlType::F64 if b.len().is_multiple_of(8) => Ok(b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
            .collect()),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::F64 => Err(bad()),
        other => Err(format!(
            "stored as {}: a BitNet master is F64, F32, F16 or BF16",
            other.name()
        )),
    }
}

/// Stores tensor `name` (source encoding `encoding`, source `dims`, `size` bytes): transcoded
/// when `ternary` holds it, else its source `bytes`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn add_tensor(
    b: &mut synapse_cas::PackageBuilder,
    session: &synapse_cas::WriteSession<'_>,
    ternary: &BTreeMap<String, Ternary>,
    name: &str,
    encoding: &str,
    dims: &[u64],
    bytes: &[u8],
) -> Result<()> {
    match ternary.get(name) {
        Some(t) => b.add_transcoded_tensor(
            session,
            name,
            TERNARY_ENCODING,
            &t.dims,
            &t.bytes,
            synapse_cas::package::SourceForm {
                encoding: encoding.to_string(),
                dims: dims.to_vec(),
                size: bytes.len() as u64,
            },
        )?,
        None => b.add_tensor(session, name, encoding, dims, bytes)?,
    };
    Ok(())
}
