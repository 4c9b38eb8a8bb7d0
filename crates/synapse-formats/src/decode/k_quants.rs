//! The k-quants: 256-element super-blocks with per-sub-block scales (Q2_K … Q6_K) and Q8_K.
//!
//! Scales are combined with the super-block scale first (`dl = d · sc`), then applied to the
//! code (`dl · q - ml`), in ggml's order, so results are bit-identical to `dequantize_row_*`.

use super::{f16_at, f32_at, i8_at};

/// Q2_K: 16 sub-blocks of 16; `d · (sc & 15) · q - dmin · (sc >> 4)`.
pub fn q2_k(b: &[u8; 84], y: &mut [f32; 256]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(b, 80);
    let min = f16_at(b, 82);
    let mut is = 0;
    let mut out = 0;
    for n in 0..2 {
        let q = &qs[32 * n..32 * n + 32];
        for j in 0..4 {
            let shift = 2 * j;
            for half in 0..2 {
                let sc = scales[is];
                is += 1;
                let dl = d * (sc & 0x0f) as f32;
                let ml = min * (sc >> 4) as f32;
                for &qb in &q[16 * half..16 * half + 16] {
                    y[out] = dl * ((qb >> shift) & 3) as f32 - ml;
                    out += 1;
                }
            }
        }
    }
}

/// The `i`-th (0..16) 6-bit scale of a Q3_K block, as stored (0..64).
#[inline(always)]
fn q3_k_scale(s: &[u8], i: usize) -> i32 {
    let low = if i < 8 { s[i] & 0x0f } else { s[i - 8] >> 4 };
    let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    (low | (high << 4)) as i32
}

/// Q3_K: 16 sub-blocks of 16; `d · (sc - 32) · (q - 4·!hbit)`.
pub fn q3_k(b: &[u8; 110], y: &mut [f32; 256]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let scales = &b[96..108];
    let d_all = f16_at(b, 108);
    let mut is = 0;
    let mut out = 0;
    for n in 0..2 {
        let q = &qs[32 * n..32 * n + 32];
        for j in 0..4 {
            let shift = 2 * j;
            let m = 1u8 << (4 * n + j);
            for half in 0..2 {
                let dl = d_all * (q3_k_scale(scales, is) - 32) as f32;
                is += 1;
                for l in 16 * half..16 * half + 16 {
                    let low = ((q[l] >> shift) & 3) as i32;
                    let sub = if hmask[l] & m != 0 { 0 } else { 4 };
                    y[out] = dl * (low - sub) as f32;
                    out += 1;
                }
            }
        }
    }
}

/// Scale and min `j` (0..8) of the packed 6-bit Q4_K/Q5_K scales.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K: 8 sub-blocks of 32; `d · sc · q - dmin · m`.
pub fn q4_k(b: &[u8; 144], y: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let min = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for j in 0..4 {
        let q = &qs[32 * j..32 * j + 32];
        let (sc1, m1) = scale_min_k4(2 * j, scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let lo = &mut y[64 * j..64 * j + 32];
        for (v, &qb) in lo.iter_mut().zip(q) {
            *v = d1 * (qb & 0x0f) as f32 - m1;
        }
        let hi = &mut y[64 * j + 32..64 * j + 64];
        for (v, &qb) in hi.iter_mut().zip(q) {
            *v = d2 * (qb >> 4) as f32 - m2;
        }
    }
}

/// Q5_K: 8 sub-blocks of 32; like Q4_K with a fifth bit from `qh`.
pub fn q5_k(b: &[u8; 176], y: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let min = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for j in 0..4 {
        let ql = &qs[32 * j..32 * j + 32];
        let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
        let (sc1, m1) = scale_min_k4(2 * j, scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[64 * j + l] = d1 * ((ql[l] & 0x0f) + h1) as f32 - m1;
            y[64 * j + 32 + l] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
        }
    }
}

/// Q6_K: 16 sub-blocks of 16; `d · sc · (q - 32)` with signed 8-bit scales.
pub fn q6_k(b: &[u8; 210], y: &mut [f32; 256]) {
    let d = f16_at(b, 208);
    for n in 0..2 {
        let ql = &b[64 * n..64 * n + 64];
        let qh = &b[128 + 32 * n..128 + 32 * n + 32];
        let sc = 192 + 8 * n;
        let yo = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            yo[l] = d * i8_at(b, sc + is) as f32 * q1 as f32;
            yo[l + 32] = d * i8_at(b, sc + is + 2) as f32 * q2 as f32;
            yo[l + 64] = d * i8_at(b, sc + is + 4) as f32 * q3 as f32;
            yo[l + 96] = d * i8_at(b, sc + is + 6) as f32 * q4 as f32;
        }
    }
}

/// Q8_K: `d · q` with an f32 scale (the `bsums` only serve dot products).
///
/// ggml defines `dequantize_row_q8_K` but does not register it as Q8_K's `to_float`;
/// this matches that function.
pub fn q8_k(b: &[u8; 292], y: &mut [f32; 256]) {
    let d = f32_at(b, 0);
    for (j, v) in y.iter_mut().enumerate() {
        *v = d * i8_at(b, 4 + j) as f32;
    }
}
