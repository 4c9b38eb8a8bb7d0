//! The ternary types TQ1_0 (base-3 packed, 1.69 bpw) and TQ2_0 (2-bit codes, 2.06 bpw).
//!
//! Each value is `(t - 1) · d` with `t ∈ {0, 1, 2}` (any byte is decoded by ggml's
//! wrapping arithmetic, so out-of-range bytes decode exactly as ggml decodes them).

use super::f16_at;

const POW3: [u8; 6] = [1, 3, 9, 27, 81, 243];

/// Ternary digit `n` of a base-3 packed byte, ggml's way: `((q · 3ⁿ mod 256) · 3) >> 8`.
#[inline(always)]
fn trit(q: u8, n: usize) -> i32 {
    let q = q.wrapping_mul(POW3[n]);
    ((q as u16 * 3) >> 8) as i32
}

/// TQ1_0: 48 bytes of 5 trits (32 then 16 bytes, digit-major), then 4 bytes of 4 trits.
pub fn tq1_0(b: &[u8; 54], y: &mut [f32; 256]) {
    let d = f16_at(b, 52);
    let mut out = 0;
    for (start, len) in [(0usize, 32usize), (32, 16)] {
        for n in 0..5 {
            for &q in &b[start..start + len] {
                y[out] = (trit(q, n) - 1) as f32 * d;
                out += 1;
            }
        }
    }
    for n in 0..4 {
        for &q in &b[48..52] {
            y[out] = (trit(q, n) - 1) as f32 * d;
            out += 1;
        }
    }
}

/// TQ2_0: 2-bit codes, 32 bytes at a time, lowest bit pair first; `(q - 1) · d`.
pub fn tq2_0(b: &[u8; 66], y: &mut [f32; 256]) {
    let d = f16_at(b, 64);
    let mut out = 0;
    for j in [0usize, 32] {
        for l in 0..4 {
            for &q in &b[j..j + 32] {
                y[out] = (((q >> (2 * l)) & 3) as i32 - 1) as f32 * d;
                out += 1;
            }
        }
    }
}
