//! Source decoders: every ggml tensor type (and the safetensors FP8 dtypes) to the f32
//! reference, bit-identical to ggml's own `to_float`.
//!
//! [`dequantize`] takes whole blocks of one [`GgmlType`] and fills exactly
//! `n_blocks · block_size` floats; any other length is [`FormatError::DecodeLength`], never a
//! panic or a partial result. The per-family modules expose one scalar reference function per
//! block type (`fn(&[u8; TYPE_SIZE], &mut [f32; BLOCK_SIZE])`), reading multi-byte fields as
//! little-endian from unaligned bytes; [`crate::blocks`] has the matching `#[repr(C)]` structs.
//!
//! Exactness: each decoder evaluates ggml's expression with the same operands in the same
//! order (e.g. Q4_K is `(d·sc)·q − (dmin·m)`, IQ2_XXS is `((d·(½+s))·¼)·grid·±1`), so every
//! output is bit-identical to `ggml_get_type_traits(t)->to_float` on the same bytes — checked
//! against fixtures produced by ggml itself (`cargo xtask oracle-fixtures`). Types ggml cannot
//! decode (Q8_1 has no dequantizer; Q8_K's `dequantize_row_q8_K` is not registered as its
//! `to_float`; F64 and the integer types have none) are decoded by their definition.

pub mod float;
pub mod fp4;
pub mod iq;
pub mod iq_tables;
pub mod k_quants;
pub mod legacy;
pub mod ternary;

use crate::error::{FormatError, Result};
use crate::types::GgmlType;

// ---- little-endian field readers (offsets are constants inside fixed-size blocks) ----

#[inline(always)]
pub(crate) fn f16_at(b: &[u8], o: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[o], b[o + 1]])).to_f32()
}

#[inline(always)]
pub(crate) fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

#[inline(always)]
pub(crate) fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

#[inline(always)]
pub(crate) fn f32_at(b: &[u8], o: usize) -> f32 {
    f32::from_bits(u32_at(b, o))
}

#[inline(always)]
pub(crate) fn i8_at(b: &[u8], o: usize) -> i8 {
    b[o] as i8
}

/// Runs a block decoder over matching runs of source blocks and output blocks.
#[inline]
fn blocks<const TS: usize, const BS: usize>(
    src: &[u8],
    dst: &mut [f32],
    f: fn(&[u8; TS], &mut [f32; BS]),
) {
    let (s, _) = src.as_chunks::<TS>();
    let (d, _) = dst.as_chunks_mut::<BS>();
    for (b, y) in s.iter().zip(d) {
        f(b, y);
    }
}

/// Number of f32 outputs `src` decodes to, or the typed length error.
pub fn decoded_len(ty: GgmlType, src_bytes: usize) -> Result<usize> {
    let (bs, ts) = (ty.block_size(), ty.type_size());
    let err = || FormatError::DecodeLength {
        ty,
        src_bytes,
        dst_len: 0,
        block: bs,
        type_size: ts,
    };
    if !src_bytes.is_multiple_of(ts) {
        return Err(err());
    }
    (src_bytes / ts).checked_mul(bs).ok_or_else(err)
}

/// Decodes whole blocks of type `ty` from `src` into `dst`.
///
/// `src.len()` must be a multiple of `ty.type_size()` and `dst.len()` must equal
/// `src.len() / type_size · block_size`; otherwise [`FormatError::DecodeLength`].
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let n = decoded_len(ty, src.len()).map_err(|e| match e {
        FormatError::DecodeLength {
            ty,
            src_bytes,
            block,
            type_size,
            ..
        } => FormatError::DecodeLength {
            ty,
            src_bytes,
            dst_len: dst.len(),
            block,
            type_size,
        },
        other => other,
    })?;
    if n != dst.len() {
        return Err(FormatError::DecodeLength {
            ty,
            src_bytes: src.len(),
            dst_len: dst.len(),
            block: ty.block_size(),
            type_size: ty.type_size(),
        });
    }
    use GgmlType::*;
    match ty {
        F32 => float::f32_le(src, dst),
        F16 => float::f16_le(src, dst),
        BF16 => float::bf16_le(src, dst),
        F64 => float::f64_le(src, dst),
        I8 => float::i8_le(src, dst),
        I16 => float::i16_le(src, dst),
        I32 => float::i32_le(src, dst),
        I64 => float::i64_le(src, dst),
        Q4_0 => blocks(src, dst, legacy::q4_0),
        Q4_1 => blocks(src, dst, legacy::q4_1),
        Q5_0 => blocks(src, dst, legacy::q5_0),
        Q5_1 => blocks(src, dst, legacy::q5_1),
        Q8_0 => blocks(src, dst, legacy::q8_0),
        Q8_1 => blocks(src, dst, legacy::q8_1),
        Q1_0 => blocks(src, dst, legacy::q1_0),
        Q2_0 => blocks(src, dst, legacy::q2_0),
        Q2_K => blocks(src, dst, k_quants::q2_k),
        Q3_K => blocks(src, dst, k_quants::q3_k),
        Q4_K => blocks(src, dst, k_quants::q4_k),
        Q5_K => blocks(src, dst, k_quants::q5_k),
        Q6_K => blocks(src, dst, k_quants::q6_k),
        Q8_K => blocks(src, dst, k_quants::q8_k),
        IQ2_XXS => blocks(src, dst, iq::iq2_xxs),
        IQ2_XS => blocks(src, dst, iq::iq2_xs),
        IQ2_S => blocks(src, dst, iq::iq2_s),
        IQ3_XXS => blocks(src, dst, iq::iq3_xxs),
        IQ3_S => blocks(src, dst, iq::iq3_s),
        IQ1_S => blocks(src, dst, iq::iq1_s),
        IQ1_M => blocks(src, dst, iq::iq1_m),
        IQ4_NL => blocks(src, dst, iq::iq4_nl),
        IQ4_XS => blocks(src, dst, iq::iq4_xs),
        TQ1_0 => blocks(src, dst, ternary::tq1_0),
        TQ2_0 => blocks(src, dst, ternary::tq2_0),
        MXFP4 => blocks(src, dst, fp4::mxfp4),
        NVFP4 => blocks(src, dst, fp4::nvfp4),
    }
    Ok(())
}

/// Decodes whole blocks of type `ty` into a new vector (sized from `src.len()`, which the
/// caller already holds, never from a header field).
pub fn dequantize_to_vec(ty: GgmlType, src: &[u8]) -> Result<Vec<f32>> {
    let n = decoded_len(ty, src.len())?;
    let mut out = vec![0.0f32; n];
    dequantize(ty, src, &mut out)?;
    Ok(out)
}

fn fp8_len(dtype: &'static str, src: &[u8], dst: &[f32]) -> Result<()> {
    if src.len() != dst.len() {
        return Err(FormatError::DtypeLength {
            dtype,
            src_bytes: src.len(),
            dst_len: dst.len(),
            elem_bytes: 1,
        });
    }
    Ok(())
}

/// Decodes safetensors `F8_E4M3` (E4M3FN: no infinities, `0x7F`/`0xFF` are NaN).
pub fn decode_f8_e4m3fn(src: &[u8], dst: &mut [f32]) -> Result<()> {
    fp8_len("F8_E4M3", src, dst)?;
    for (v, &x) in dst.iter_mut().zip(src) {
        *v = float::f8_e4m3fn_to_f32(x);
    }
    Ok(())
}

/// Decodes safetensors `F8_E5M2` (IEEE-style: infinities and NaNs).
pub fn decode_f8_e5m2(src: &[u8], dst: &mut [f32]) -> Result<()> {
    fp8_len("F8_E5M2", src, dst)?;
    for (v, &x) in dst.iter_mut().zip(src) {
        *v = float::f8_e5m2_to_f32(x);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ALL_TYPES;

    #[test]
    fn every_type_decodes_zero_blocks_and_rejects_bad_lengths() {
        for &t in ALL_TYPES {
            let src = vec![0u8; 3 * t.type_size()];
            let out = dequantize_to_vec(t, &src).unwrap();
            assert_eq!(out.len(), 3 * t.block_size(), "{t}");
            let mut dst = vec![0.0; 3 * t.block_size() + 1];
            assert!(matches!(
                dequantize(t, &src, &mut dst),
                Err(FormatError::DecodeLength { .. })
            ));
            if t.type_size() > 1 {
                assert!(matches!(
                    dequantize_to_vec(t, &src[1..]),
                    Err(FormatError::DecodeLength { .. })
                ));
            }
        }
    }

    #[test]
    fn fp8_lengths_checked() {
        let mut dst = [0.0f32; 2];
        assert!(decode_f8_e4m3fn(&[0, 1, 2], &mut dst).is_err());
        assert!(decode_f8_e5m2(&[0], &mut dst).is_err());
        decode_f8_e4m3fn(&[0x38, 0x7f], &mut dst).unwrap();
        assert_eq!(dst[0], 1.0);
        assert!(dst[1].is_nan());
    }
}
