//! ggml's K-quant super-blocks (256 elements) with a SIMD kernel in `synapse-kernels`: Q6_K,
//! Q5_K and Q4_K — encoded as ggml's reference quantizers (`quantize_row_q{4,5,6}_K_ref`, what
//! `ggml_quantize_chunk` runs without an importance matrix) encode, bit for bit, and decoded
//! as ggml dequantizes.
//!
//! The arithmetic follows ggml's, operation for operation, in `f32` without fused
//! multiply-adds (ggml-base, where these quantizers live, is built for baseline x86-64):
//! the scale search of each sub-block (`make_qkx2`: a weighted least-squares fit of scale and
//! minimum over a sweep of trial scales; `make_qx`: a symmetric fit over ±0.9 steps), then
//! 6-bit quantized sub-block scales against one FP16 super-scale, then every element rounded
//! against its sub-block's stored scale. Ties round half to even through ggml's
//! `nearest_int` (the `1.5·2²³` addition), reproduced bit for bit, including its wrap-around
//! outside ±2²² (which ggml only asserts against in debug builds).
//!
//! Super-block layouts (little-endian; `d`, `dmin` FP16):
//!
//! | type | bytes | layout |
//! |---|---:|---|
//! | Q4_K | 144 | `d`, `dmin`, 12 B of 6-bit scales and mins (8 each), 128 B of 4-bit codes |
//! | Q5_K | 176 | as Q4_K, then 32 B of fifth bits, then 128 B of low nibbles |
//! | Q6_K | 210 | 128 B of low nibbles, 64 B of high 2-bit pairs, 16 i8 scales, `d` |
//!
//! Q4_K/Q5_K element `j` of sub-block `s` (32 elements each) is `d·sc_s · q_j − dmin·m_s`;
//! Q6_K element `j` of sub-block `s` (16 each) is `d · sc_s · (q_j − 32)`.

use half::f16;

use crate::error::Result;
use crate::ggml::read_f16;

/// Elements per super-block.
pub(crate) const QK_K: usize = 256;

/// ggml's `GROUP_MAX_EPS`: a sub-block whose largest magnitude is below it is all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even by adding `1.5·2²³` and reading the mantissa.
#[inline]
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// The scale search of a Q4_K/Q5_K sub-block: codes `0..=nmax`, trial scales
/// `(rmin + rdelta·i + nmax)/(max − min)` for `i = 0..=nstep`.
#[derive(Clone, Copy)]
struct Search {
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
}

/// A scale and minimum for `x` (codes into `l`), fitted as ggml's `make_qkx2_quants` under
/// `s` (weights `w`, squared errors). Returns `(scale, −min)`.
fn make_qkx2(x: &[f32], w: &[f32], s: &Search, l: &mut [u8], laux: &mut [u8]) -> (f32, f32) {
    let Search {
        nmax,
        rmin,
        rdelta,
        nstep,
    } = *s;
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let fmax = nmax as f32;
    let mut iscale = fmax / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * q as f32 + min - x[i];
        best += w[i] * (diff * diff);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + fmax) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let qf = q as f32;
            sum_l += w[i] * qf;
            sum_l2 += w[i] * qf * qf;
            sum_xl += w[i] * qf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut err = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                err += w[i] * (diff * diff);
            }
            if err < best {
                l[..n].copy_from_slice(&laux[..n]);
                best = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// A signed scale for `x` (codes `0..2·nmax`, offset by `nmax`, into `l`), fitted as ggml's
/// `make_qx_quants` with `rmse_type = 1` and no importance (weights `x²`, trial scales
/// `−(nmax + 0.1·i)/max` for `i = ±1…±9`).
fn make_qx(x: &[f32], nmax: i32, l: &mut [u8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l[..x.len()].fill(0);
        return 0.0;
    }
    let fmax = nmax as f32;
    let code = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let q = code(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * q;
            suml2 += w * q * q;
        }
        (sumlx, suml2)
    };
    let mut iscale = -fmax / max;
    for (o, &v) in l.iter_mut().zip(x) {
        *o = (code(iscale, v) + nmax) as u8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&i| i != 0) {
        iscale = -(fmax + 0.1f32 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (o, &v) in l.iter_mut().zip(x) {
                *o = (code(iscale, v) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Sub-block `j`'s 6-bit scale and minimum from a Q4_K/Q5_K block's 12 packed bytes
/// (ggml's `get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Appends one Q4_K (`five == false`) or Q5_K super-block of `x` (256 values).
pub(crate) fn encode_q45k(x: &[f32], five: bool, out: &mut Vec<u8>) {
    let search = if five {
        Search {
            nmax: 31,
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
        }
    } else {
        Search {
            nmax: 15,
            rmin: -1.0,
            rdelta: 0.1,
            nstep: 20,
        }
    };
    let mut l = [0u8; QK_K];
    let mut laux = [0u8; 32];
    let mut w = [0f32; 32];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (wi, &v) in w.iter_mut().zip(xs) {
            *wi = av_x + v.abs();
        }
        let (s, m) = make_qkx2(xs, &w, &search, &mut l[32 * j..32 * j + 32], &mut laux);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut sc = [0u8; 12];
    for j in 0..8 {
        // C's `uint8_t ls = nearest_int(…)`: the low byte, then at most 63.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    let d16 = f16::from_f32(max_scale / 63.0);
    let dmin16 = f16::from_f32(max_min / 63.0);
    let top = search.nmax;
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, &sc);
        let d = d16.to_f32() * s as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin16.to_f32() * m as f32;
        for i in 0..32 {
            l[32 * j + i] = nearest_int((x[32 * j + i] + dm) / d).clamp(0, top) as u8;
        }
    }
    out.extend_from_slice(&d16.to_le_bytes());
    out.extend_from_slice(&dmin16.to_le_bytes());
    out.extend_from_slice(&sc);
    if five {
        let mut qh = [0u8; 32];
        let mut ql = [0u8; 128];
        for (c, n) in (0..QK_K).step_by(64).enumerate() {
            for j in 0..32 {
                let (mut a, mut b) = (l[n + j], l[n + j + 32]);
                if a > 15 {
                    a -= 16;
                    qh[j] |= 1 << (2 * c);
                }
                if b > 15 {
                    b -= 16;
                    qh[j] |= 2 << (2 * c);
                }
                ql[32 * c + j] = a | (b << 4);
            }
        }
        out.extend_from_slice(&qh);
        out.extend_from_slice(&ql);
    } else {
        for n in (0..QK_K).step_by(64) {
            out.extend((0..32).map(|i| l[n + i] | (l[n + i + 32] << 4)));
        }
    }
}

/// Appends one Q6_K super-block of `x` (256 values).
pub(crate) fn encode_q6k(x: &[f32], out: &mut Vec<u8>) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs) = (0.0f32, 0.0f32);
    for (ib, s) in scales.iter_mut().enumerate() {
        *s = make_qx(&x[16 * ib..16 * ib + 16], 32, &mut l[16 * ib..16 * ib + 16]);
        if s.abs() > max_abs {
            max_abs = s.abs();
            max_scale = *s;
        }
    }
    if max_abs < GROUP_MAX_EPS {
        out.extend_from_slice(&[0u8; 210]);
        return;
    }
    let iscale = -128.0f32 / max_scale;
    let d16 = f16::from_f32(1.0 / iscale);
    let mut sc = [0i8; 16];
    for (o, &s) in sc.iter_mut().zip(&scales) {
        // C's `int8_t = MIN(127, nearest_int(…))`: the low byte.
        *o = nearest_int(iscale * s).min(127) as i8;
    }
    for j in 0..16 {
        let d = d16.to_f32() * sc[j] as f32;
        if d == 0.0 {
            continue;
        }
        for i in 0..16 {
            l[16 * j + i] = (nearest_int(x[16 * j + i] / d).clamp(-32, 31) + 32) as u8;
        }
    }
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for (h, j) in (0..QK_K).step_by(128).enumerate() {
        for i in 0..32 {
            let q = |k: usize| l[j + i + 32 * k];
            ql[64 * h + i] = (q(0) & 0xF) | ((q(2) & 0xF) << 4);
            ql[64 * h + i + 32] = (q(1) & 0xF) | ((q(3) & 0xF) << 4);
            qh[32 * h + i] =
                (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
        }
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend(sc.iter().map(|&s| s as u8));
    out.extend_from_slice(&d16.to_le_bytes());
}

/// Decodes the first `out.len()` values of a Q4_K/Q5_K super-block as ggml does.
pub(crate) fn decode_q45k(b: &[u8], five: bool, out: &mut [f32], gi: usize) -> Result<()> {
    let d = read_f16(b, 0, gi)?;
    let dmin = read_f16(b, 2, gi)?;
    let sc = &b[4..16];
    let (qh, ql) = if five {
        (&b[16..48], &b[48..176])
    } else {
        (&b[0..0], &b[16..144])
    };
    for (e, o) in out.iter_mut().enumerate() {
        let (c, k) = (e / 64, e % 64);
        let (s, m) = scale_min_k4(e / 32, sc);
        let byte = ql[32 * c + k % 32];
        let lo = if k < 32 { byte & 0xF } else { byte >> 4 };
        let hi = if five && qh[k % 32] & (1 << (2 * c + k / 32)) != 0 {
            16
        } else {
            0
        };
        let (d1, m1) = (d * s as f32, dmin * m as f32);
        *o = d1 * f32::from(lo + hi) - m1;
    }
    Ok(())
}

/// Decodes the first `out.len()` values of a Q6_K super-block as ggml does.
pub(crate) fn decode_q6k(b: &[u8], out: &mut [f32], gi: usize) -> Result<()> {
    let d = read_f16(b, 208, gi)?;
    let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
    for (e, o) in out.iter_mut().enumerate() {
        let (h, r) = (e / 128, e % 128);
        let (k, i) = (r / 32, r % 32);
        let lo = ql[64 * h + i + 32 * (k & 1)] >> (4 * (k >> 1)) & 0xF;
        let hi = (qh[32 * h + i] >> (2 * k)) & 3;
        let q = i32::from(lo | (hi << 4)) - 32;
        let s = sc[8 * h + i / 16 + 2 * k] as i8;
        *o = d * f32::from(s) * q as f32;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even_as_ggml() {
        for (v, want) in [
            (0.5f32, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (3.49, 3),
            (-7.6, -8),
            (63.0, 63),
        ] {
            assert_eq!(nearest_int(v), want, "{v}");
        }
    }

    #[test]
    fn scale_min_packing_round_trips() {
        // Packed as the encoder packs them, unpacked by `scale_min_k4`.
        let ls: [u8; 8] = [0, 63, 17, 32, 45, 1, 62, 31];
        let lm: [u8; 8] = [63, 0, 5, 48, 33, 60, 2, 16];
        let mut sc = [0u8; 12];
        for j in 0..8 {
            if j < 4 {
                sc[j] = ls[j];
                sc[j + 4] = lm[j];
            } else {
                sc[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
                sc[j - 4] |= (ls[j] >> 4) << 6;
                sc[j] |= (lm[j] >> 4) << 6;
            }
        }
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &sc), (ls[j], lm[j]), "{j}");
        }
    }
}
