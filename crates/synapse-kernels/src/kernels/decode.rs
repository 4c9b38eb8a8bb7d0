//! Scalar decoders of one block to f32, for the encodings that have native kernels. They are
//! the f32 side of "decode-then-dot", used for embedding-row lookups and as the generic path.

use crate::blocks::*;
use synapse_formats::GgmlType;

/// Decodes one block of `ty` (`ty.type_size()` bytes) into `out` (`ty.block_size()` values).
/// Returns false for encodings this module does not know.
pub(crate) fn decode_block(ty: GgmlType, b: &[u8], out: &mut [f32]) -> bool {
    use GgmlType as T;
    match ty {
        T::F32 => out[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        T::F16 => out[0] = f16_at(b, 0),
        T::BF16 => out[0] = bf16_at(b, 0),
        T::Q8_0 => {
            let d = f16_at(b, 0);
            for (o, &q) in out.iter_mut().zip(&b[2..34]) {
                *o = d * (q as i8) as f32;
            }
        }
        T::Q4_0 => {
            let d = f16_at(b, 0);
            for (o, q) in out.iter_mut().zip(unpack_nibbles32(&b[2..18])) {
                *o = d * (q as i32 - 8) as f32;
            }
        }
        T::Q4_1 => {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            for (o, q) in out.iter_mut().zip(unpack_nibbles32(&b[4..20])) {
                *o = d * q as f32 + m;
            }
        }
        T::Q5_0 => {
            let d = f16_at(b, 0);
            for (o, q) in out.iter_mut().zip(unpack_q5(u32_at(b, 2), &b[6..22])) {
                *o = d * (q as i32 - 16) as f32;
            }
        }
        T::Q5_1 => {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            for (o, q) in out.iter_mut().zip(unpack_q5(u32_at(b, 4), &b[8..24])) {
                *o = d * q as f32 + m;
            }
        }
        T::Q4_K | T::Q5_K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let codes = if ty == T::Q4_K {
                unpack_q4k(&b[Q4K_QS..Q4K_QS + 128])
            } else {
                unpack_q5k(&b[Q5K_QH..Q5K_QH + 32], &b[Q5K_QS..Q5K_QS + 128])
            };
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, &b[Q4K_SCALES..Q4K_SCALES + 12]);
                let (d1, m1) = (d * sc as f32, dmin * m as f32);
                for l in 0..32 {
                    out[j * 32 + l] = d1 * codes[j * 32 + l] as f32 - m1;
                }
            }
        }
        T::Q6_K => {
            let d = f16_at(b, Q6K_D);
            let codes = unpack_q6k(&b[..128], &b[Q6K_QH..Q6K_QH + 64]);
            for g in 0..16 {
                let sc = b[Q6K_SCALES + g] as i8 as f32;
                for l in 0..16 {
                    out[g * 16 + l] = d * sc * (codes[g * 16 + l] as i32 - 32) as f32;
                }
            }
        }
        _ => return false,
    }
    true
}

/// Whether [`decode_block`] knows `ty`.
pub(crate) fn can_decode(ty: GgmlType) -> bool {
    let mut out = [0f32; 256];
    let b = vec![0u8; ty.type_size()];
    decode_block(ty, &b, &mut out[..ty.block_size().min(256)])
}

/// Decodes a whole row (a whole number of blocks) into `out`.
pub(crate) fn decode_row(ty: GgmlType, row: &[u8], out: &mut [f32]) -> bool {
    let (ts, bs) = (ty.type_size(), ty.block_size());
    for (b, o) in row.chunks_exact(ts).zip(out.chunks_exact_mut(bs)) {
        if !decode_block(ty, b, o) {
            return false;
        }
    }
    true
}
