//! Scalar decoders of one block to f32 (the kernels' own for the common encodings, the formats
//! ring's `decode::dequantize` for the rest). They are the f32 side of "decode-then-dot", used
//! for embedding-row lookups and as the generic path.

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
        T::Q2_K => {
            // scales[16] (low nibble scale, high nibble min), qs[64], d, dmin.
            let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
            let mut y = 0;
            for n in 0..2 {
                let q = &b[16 + 32 * n..16 + 32 * n + 32];
                for j in 0..4 {
                    for half in 0..2 {
                        let sc = b[n * 8 + 2 * j + half];
                        let (dl, ml) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
                        for l in 0..16 {
                            out[y] = dl * ((q[16 * half + l] >> (2 * j)) & 3) as f32 - ml;
                            y += 1;
                        }
                    }
                }
            }
        }
        T::Q3_K => {
            // hmask[32], qs[64], scales[12] (6-bit, offset 32), d.
            let d = f16_at(b, 108);
            let sc = q3k_scales(&b[96..108]);
            let (hm, mut y) = (&b[..32], 0);
            for n in 0..2 {
                let q = &b[32 + 32 * n..64 + 32 * n];
                for j in 0..4 {
                    let m = 1u8 << (4 * n + j);
                    for half in 0..2 {
                        let dl = d * (sc[n * 8 + 2 * j + half] as i32 - 32) as f32;
                        for l in 0..16 {
                            let i = 16 * half + l;
                            let lo = ((q[i] >> (2 * j)) & 3) as i32;
                            let hi = if hm[i] & m != 0 { 0 } else { 4 };
                            out[y] = dl * (lo - hi) as f32;
                            y += 1;
                        }
                    }
                }
            }
        }
        T::IQ4_NL => {
            let d = f16_at(b, 0);
            for (o, q) in out.iter_mut().zip(unpack_nibbles32(&b[2..18])) {
                *o = d * KVALUES_IQ4NL[q as usize] as f32;
            }
        }
        T::IQ4_XS => {
            // d, scales_h (u16), scales_l[4], qs[128]
            let d = f16_at(b, 0);
            for (ib, ls) in iq4xs_scales(b).into_iter().enumerate() {
                let dl = d * ls as f32;
                let codes = unpack_nibbles32(&b[8 + 16 * ib..8 + 16 * ib + 16]);
                for (o, q) in out[32 * ib..32 * ib + 32].iter_mut().zip(codes) {
                    *o = dl * KVALUES_IQ4NL[q as usize] as f32;
                }
            }
        }
        T::MXFP4 => {
            let d = e8m0_half(b[0]);
            for (o, q) in out.iter_mut().zip(unpack_nibbles32(&b[1..17])) {
                *o = d * KVALUES_FP4[q as usize] as f32;
            }
        }
        T::TQ1_0 => {
            let d = f16_at(b, 52);
            for (o, c) in out.iter_mut().zip(tq1_codes(b)) {
                *o = d * (c as i32 - 1) as f32;
            }
        }
        T::TQ2_0 => {
            let d = f16_at(b, 64);
            for (o, c) in out.iter_mut().zip(tq2_codes(b)) {
                *o = d * (c as i32 - 1) as f32;
            }
        }
        // Everything else (the IQ1–IQ3 grid types, NVFP4, Q1_0/Q2_0, Q8_1/Q8_K): the formats
        // ring's decoders, which are checked against ggml's `to_float`.
        _ => return ty.is_quantized() && synapse_formats::decode::dequantize(ty, b, out).is_ok(),
    }
    true
}

/// TQ1_0's codes `t + 1 ∈ {0, 1, 2}` in element order (ggml's `dequantize_row_tq1_0`):
/// `qs[48]` five base-3 digits a byte (the first 32 bytes, then 16), `qh[4]` four, each digit
/// `(byte·3ⁿ mod 256)·3 >> 8`.
pub(crate) fn tq1_codes(b: &[u8]) -> [u8; 256] {
    let trit = |byte: u8, n: usize| (((byte.wrapping_mul(POW3[n]) as u16) * 3) >> 8) as u8;
    let mut c = [0u8; 256];
    let mut y = 0;
    for (start, width) in [(0usize, 32usize), (32, 16)] {
        for n in 0..5 {
            for m in 0..width {
                c[y] = trit(b[start + m], n);
                y += 1;
            }
        }
    }
    for n in 0..4 {
        for j in 0..4 {
            c[y] = trit(b[48 + j], n);
            y += 1;
        }
    }
    c
}

/// TQ2_0's codes `t + 1 ∈ {0, 1, 2}` in element order (ggml's `dequantize_row_tq2_0`).
pub(crate) fn tq2_codes(b: &[u8]) -> [u8; 256] {
    let mut c = [0u8; 256];
    let mut y = 0;
    for j in [0usize, 32] {
        for l in 0..4 {
            for m in 0..32 {
                c[y] = (b[j + m] >> (2 * l)) & 3;
                y += 1;
            }
        }
    }
    c
}

/// ggml's `kvalues_iq4nl`: the IQ4_NL / IQ4_XS non-linear 4-bit grid.
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
/// [`KVALUES_IQ4NL`] + 128, unsigned: IQ4_NL/IQ4_XS values as the integer kernels enter them
/// (biased, as `vpdpbusd` wants; the bias comes off through the activation sums).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const KVALUES_IQ4NL_BIASED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (KVALUES_IQ4NL[i] as i32 + 128) as u8;
        i += 1;
    }
    t
};
/// E2M1 values doubled (ggml's `kvalues_mxfp4`); the E8M0 scale is halved to match.
pub(crate) const KVALUES_FP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
const POW3: [u8; 6] = [1, 3, 9, 27, 81, 243];

/// `0.5 · 2^(e − 127)` as ggml's `ggml_e8m0_to_fp32_half` computes it.
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        ((e as u32) - 1) << 23
    };
    f32::from_bits(bits)
}

/// Q3_K's 16 six-bit scales (before the −32 offset) from their 12 packed bytes: low nibbles
/// from bytes 0..8, high two bits from bytes 8..12.
/// IQ4_XS's eight six-bit sub-block scales (block `b`: d, scales_h, scales_l[4], qs), minus 32.
pub(crate) fn iq4xs_scales(b: &[u8]) -> [i32; 8] {
    let sh = u16::from_le_bytes([b[2], b[3]]);
    std::array::from_fn(|ib| {
        let lo = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) as i32;
        (lo | ((((sh >> (2 * ib)) & 3) as i32) << 4)) - 32
    })
}

pub(crate) fn q3k_scales(s: &[u8]) -> [u8; 16] {
    let mut o = [0u8; 16];
    for (j, v) in o.iter_mut().enumerate() {
        let lo = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *v = lo | (hi << 4);
    }
    o
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
