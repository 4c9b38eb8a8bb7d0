//! The i-quants: lattice codes (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and the
//! non-linear 4-bit code books (IQ4_NL, IQ4_XS).
//!
//! The grids and sign tables are ggml's data, generated into [`super::iq_tables`]. Arithmetic
//! follows ggml's order (`(d · s) · 0.25`, then `(db · grid) · ±1`), so results are
//! bit-identical to `dequantize_row_iq*`.

use super::iq_tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KMASK_IQ2XS,
    KSIGNS_IQ2XS, KVALUES_IQ4NL,
};
use super::{f16_at, u16_at, u32_at};

/// ggml's `IQ1S_DELTA` (also `IQ1M_DELTA`).
const IQ1S_DELTA: f32 = 0.125;

/// Byte `j` of a little-endian packed grid entry.
#[inline(always)]
fn byte(g: u64, j: usize) -> f32 {
    ((g >> (8 * j)) & 0xff) as u8 as f32
}

/// ±1 for element `j` of a sign byte.
#[inline(always)]
fn sign(signs: u8, j: usize) -> f32 {
    if signs & KMASK_IQ2XS[j] != 0 {
        -1.0
    } else {
        1.0
    }
}

/// Writes 8 values `db · grid[j] · sign[j]`.
#[inline(always)]
fn put8(y: &mut [f32], db: f32, g: u64, signs: u8) {
    for (j, v) in y.iter_mut().take(8).enumerate() {
        *v = db * byte(g, j) * sign(signs, j);
    }
}

/// IQ2_XXS: 8 groups of 32; 4 grid indices + 4×7 sign bits + a 4-bit scale per group.
pub fn iq2_xxs(b: &[u8; 66], y: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    for ib32 in 0..8 {
        let o = 2 + 8 * ib32;
        let aux1 = u32_at(b, o + 4);
        let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
        for l in 0..4 {
            let g = IQ2XXS_GRID[b[o + l] as usize];
            let signs = KSIGNS_IQ2XS[((aux1 >> (7 * l)) & 127) as usize];
            put8(&mut y[32 * ib32 + 8 * l..], db, g, signs);
        }
    }
}

/// IQ2_XS: 9-bit grid index + 7-bit sign index per 8 values, 4-bit scale per 16.
pub fn iq2_xs(b: &[u8; 74], y: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    for ib32 in 0..8 {
        let sc = b[66 + ib32];
        let db = [
            d * (0.5 + (sc & 0x0f) as f32) * 0.25,
            d * (0.5 + (sc >> 4) as f32) * 0.25,
        ];
        for l in 0..4 {
            let q = u16_at(b, 2 + 2 * (4 * ib32 + l));
            let g = IQ2XS_GRID[(q & 511) as usize];
            let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
            put8(&mut y[32 * ib32 + 8 * l..], db[l / 2], g, signs);
        }
    }
}

/// IQ2_S: 10-bit grid index (8 low bits in `qs`, 2 in `qh`), explicit sign bytes.
pub fn iq2_s(b: &[u8; 82], y: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let qs = &b[2..34];
    let signs = &b[34..66];
    let qh = &b[66..74];
    let scales = &b[74..82];
    for ib32 in 0..8 {
        let sc = scales[ib32];
        let db = [
            d * (0.5 + (sc & 0x0f) as f32) * 0.25,
            d * (0.5 + (sc >> 4) as f32) * 0.25,
        ];
        for l in 0..4 {
            let idx = qs[4 * ib32 + l] as usize | (((qh[ib32] as usize) << (8 - 2 * l)) & 0x300);
            put8(
                &mut y[32 * ib32 + 8 * l..],
                db[l / 2],
                IQ2S_GRID[idx],
                signs[4 * ib32 + l],
            );
        }
    }
}

/// IQ3_XXS: two 4-value grid entries per 8 values; scales and signs packed in 32-bit words.
pub fn iq3_xxs(b: &[u8; 98], y: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let qs = &b[2..66];
    for ib32 in 0..8 {
        let aux = u32_at(b, 66 + 4 * ib32);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for l in 0..4 {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let g1 = IQ3XXS_GRID[qs[8 * ib32 + 2 * l] as usize] as u64;
            let g2 = IQ3XXS_GRID[qs[8 * ib32 + 2 * l + 1] as usize] as u64;
            put8(&mut y[32 * ib32 + 8 * l..], db, g1 | (g2 << 32), signs);
        }
    }
}

/// IQ3_S: 9-bit grid indices (high bit in `qh`), explicit signs, odd 4-bit scales.
pub fn iq3_s(b: &[u8; 110], y: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let qs = &b[2..66];
    let qh = &b[66..74];
    let signs = &b[74..106];
    let scales = &b[106..110];
    for ib32 in 0..8 {
        let sc = scales[ib32 / 2];
        let s = if ib32 % 2 == 0 { sc & 0x0f } else { sc >> 4 };
        let db = d * (1 + 2 * s as i32) as f32;
        let h = qh[ib32] as usize;
        for l in 0..4 {
            let i1 = qs[8 * ib32 + 2 * l] as usize | ((h << (8 - 2 * l)) & 256);
            let i2 = qs[8 * ib32 + 2 * l + 1] as usize | ((h << (7 - 2 * l)) & 256);
            let g = IQ3S_GRID[i1] as u64 | ((IQ3S_GRID[i2] as u64) << 32);
            put8(&mut y[32 * ib32 + 8 * l..], db, g, signs[4 * ib32 + l]);
        }
    }
}

/// Writes 8 values `dl · (grid[j] + delta)` from a signed IQ1 grid entry.
#[inline(always)]
fn put8_iq1(y: &mut [f32], dl: f32, g: u64, delta: f32) {
    for (j, v) in y.iter_mut().take(8).enumerate() {
        let gj = ((g >> (8 * j)) & 0xff) as u8 as i8;
        *v = dl * (gj as f32 + delta);
    }
}

/// IQ1_S: 11-bit indices into a {-1, 0, 1} lattice, a shift of ±1/8 and a 3-bit scale per 32.
pub fn iq1_s(b: &[u8; 50], y: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let qs = &b[2..34];
    for ib in 0..8 {
        let qh = u16_at(b, 34 + 2 * ib);
        let dl = d * (2 * ((qh >> 12) & 7) as i32 + 1) as f32;
        let delta = if qh & 0x8000 != 0 {
            -IQ1S_DELTA
        } else {
            IQ1S_DELTA
        };
        for l in 0..4 {
            let idx = qs[4 * ib + l] as usize | ((((qh >> (3 * l)) & 7) as usize) << 8);
            put8_iq1(&mut y[32 * ib + 8 * l..], dl, IQ1S_GRID[idx], delta);
        }
    }
}

/// IQ1_M: like IQ1_S with per-16 scales and shifts; the f16 super scale is spread over the
/// top nibbles of the four 16-bit scale words.
pub fn iq1_m(b: &[u8; 56], y: &mut [f32; 256]) {
    let qs = &b[0..32];
    let qh = &b[32..48];
    let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
    let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
    let d = half::f16::from_bits(bits).to_f32();
    for ib in 0..8 {
        let s = sc[ib / 2] >> (6 * (ib % 2));
        let dl1 = d * (2 * (s & 7) as i32 + 1) as f32;
        let dl2 = d * (2 * ((s >> 3) & 7) as i32 + 1) as f32;
        let (h0, h1) = (qh[2 * ib] as usize, qh[2 * ib + 1] as usize);
        let q = &qs[4 * ib..4 * ib + 4];
        let idx = [
            q[0] as usize | ((h0 << 8) & 0x700),
            q[1] as usize | ((h0 << 4) & 0x700),
            q[2] as usize | ((h1 << 8) & 0x700),
            q[3] as usize | ((h1 << 4) & 0x700),
        ];
        let delta = |h: usize, m: usize| if h & m != 0 { -IQ1S_DELTA } else { IQ1S_DELTA };
        let deltas = [
            delta(h0, 0x08),
            delta(h0, 0x80),
            delta(h1, 0x08),
            delta(h1, 0x80),
        ];
        for l in 0..4 {
            let dl = if l < 2 { dl1 } else { dl2 };
            put8_iq1(&mut y[32 * ib + 8 * l..], dl, IQ1S_GRID[idx[l]], deltas[l]);
        }
    }
}

/// IQ4_NL: `d · kvalues[q]`, low nibbles first.
pub fn iq4_nl(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = d * KVALUES_IQ4NL[(q & 0x0f) as usize] as f32;
        y[j + 16] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
    }
}

/// IQ4_XS: 8 sub-blocks of 32 with 6-bit scales (`ls - 32`), IQ4_NL code book.
pub fn iq4_xs(b: &[u8; 136], y: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let scales_h = u16_at(b, 2);
    let scales_l = &b[4..8];
    for ib in 0..8 {
        let ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) as i32
            | ((((scales_h >> (2 * ib)) & 3) as i32) << 4);
        let dl = d * (ls - 32) as f32;
        let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
        for (j, &q) in qs.iter().enumerate() {
            y[32 * ib + j] = dl * KVALUES_IQ4NL[(q & 0x0f) as usize] as f32;
            y[32 * ib + j + 16] = dl * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
        }
    }
}
