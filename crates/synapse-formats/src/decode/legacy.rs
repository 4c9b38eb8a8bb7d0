//! The legacy 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1) and the 1-/2-bit
//! types Q1_0 (128 elements) and Q2_0 (64 elements).
//!
//! Every value is one f32 operation (or two for the `d·q + m` types) on exactly converted
//! inputs, in ggml's order, so results are bit-identical to `dequantize_row_*`.

use super::{f16_at, i8_at};

/// Q4_0: `(q - 8) · d`, low nibbles first, then high nibbles.
pub fn q4_0(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for (j, &q) in qs.iter().enumerate() {
        y[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
        y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

/// Q4_1: `q · d + m`.
pub fn q4_1(b: &[u8; 20], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for (j, &q) in qs.iter().enumerate() {
        y[j] = (q & 0x0f) as f32 * d + m;
        y[j + 16] = (q >> 4) as f32 * d + m;
    }
}

/// The 5-bit code `j` (0..32) of a Q5 block: nibble plus bit `j` of `qh`.
#[inline(always)]
fn q5_code(qs: &[u8], qh: u32, j: usize) -> i32 {
    let nib = if j < 16 {
        qs[j] & 0x0f
    } else {
        qs[j - 16] >> 4
    };
    (nib as i32) | ((((qh >> j) & 1) as i32) << 4)
}

/// Q5_0: `(q - 16) · d`.
pub fn q5_0(b: &[u8; 22], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for (j, v) in y.iter_mut().enumerate() {
        *v = (q5_code(qs, qh, j) - 16) as f32 * d;
    }
}

/// Q5_1: `q · d + m`.
pub fn q5_1(b: &[u8; 24], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for (j, v) in y.iter_mut().enumerate() {
        *v = q5_code(qs, qh, j) as f32 * d + m;
    }
}

/// Q8_0: `q · d`.
pub fn q8_0(b: &[u8; 34], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (j, v) in y.iter_mut().enumerate() {
        *v = i8_at(b, 2 + j) as f32 * d;
    }
}

/// Q8_1: `q · d` (the second f16, `s = d · Σq`, only serves dot products).
///
/// ggml has no `to_float` for Q8_1 (it is an activation format); this is its definition.
pub fn q8_1(b: &[u8; 36], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (j, v) in y.iter_mut().enumerate() {
        *v = i8_at(b, 4 + j) as f32 * d;
    }
}

/// Q1_0: bit `j` (LSB first) set gives `d`, clear gives `-d`.
pub fn q1_0(b: &[u8; 18], y: &mut [f32; 128]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for (j, v) in y.iter_mut().enumerate() {
        *v = if (qs[j / 8] >> (j % 8)) & 1 != 0 {
            d
        } else {
            -d
        };
    }
}

/// Q2_0: 2-bit codes (LSB pairs first), `(q - 1) · d`.
pub fn q2_0(b: &[u8; 18], y: &mut [f32; 64]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for (j, v) in y.iter_mut().enumerate() {
        let q = (qs[j / 4] >> ((j % 4) * 2)) & 3;
        *v = (q as i32 - 1) as f32 * d;
    }
}
