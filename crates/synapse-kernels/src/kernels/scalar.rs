//! The scalar reference kernels: the same integer arithmetic as the SIMD paths (quantized
//! activations, block sums, one float multiply-add per block), written plainly.
//!
//! Float order is ggml's x86 order, emulated: each block's integer dot is split into the 8
//! i32 lanes an AVX2 `maddubs`/`madd` (or VNNI `dpbusd`) produces (lane j = elements
//! 4j..4j+4), each lane accumulates `fma(d_w·d_a, lane, acc)` over the blocks, and the lanes
//! are summed as ggml's `hsum_float_8`. With ggml's activation quantizers this makes every
//! path's dot bit-identical to ggml's `vec_dot` / llamafile `tinyBLAS` on x86.

use super::{DotFn, Kernel};
use crate::act::{ActKind, BlockQ8K, BlockQ8x32};
use crate::blocks::*;
use synapse_formats::GgmlType;

/// # Safety
/// `w` must point to `nb * type_size` readable bytes and `a` to `nb` activation blocks (or
/// `nb` f32 values for float weights) of the matching format.
unsafe fn parts<'a, A>(
    w: *const u8,
    wlen: usize,
    a: *const u8,
    alen: usize,
) -> (&'a [u8], &'a [A]) {
    // SAFETY: the caller guarantees both extents; activation buffers are 4-byte aligned.
    unsafe {
        (
            std::slice::from_raw_parts(w, wlen),
            std::slice::from_raw_parts(a.cast::<A>(), alen),
        )
    }
}

/// ggml's x86 `hsum_float_8`: high half + low half, then pairwise.
#[inline]
pub(crate) fn hsum8(v: [f32; 8]) -> f32 {
    let t = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    (t[0] + t[2]) + (t[1] + t[3])
}

/// ggml's 4-lane horizontal sum (`movehl` then `movehdup`).
#[inline]
pub(crate) fn hsum4(v: [f32; 4]) -> f32 {
    (v[0] + v[2]) + (v[1] + v[3])
}

/// The 8 i32 lanes an x86 `maddubs`+`madd` (or `dpbusd`) dot of 32 bytes yields: lane `j`
/// holds elements `4j..4j+4`.
#[inline]
fn lanes32(w: &[i8; 32], a: &[i8; 32]) -> [i32; 8] {
    let mut l = [0i32; 8];
    for (j, l) in l.iter_mut().enumerate() {
        *l = (4 * j..4 * j + 4).map(|e| w[e] as i32 * a[e] as i32).sum();
    }
    l
}

/// One block's lanes folded into ggml's 8 f32 accumulators: `acc_j = fma(d, lane_j, acc_j)`.
#[inline]
fn fma_lanes(acc: &mut [f32; 8], d: f32, l: [i32; 8]) {
    for (a, l) in acc.iter_mut().zip(l) {
        *a = d.mul_add(l as f32, *a);
    }
}

#[inline]
fn signed(codes: [u8; 32], off: u8) -> [i8; 32] {
    codes.map(|c| c.wrapping_sub(off) as i8)
}

unsafe fn dot_q8_0(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8x32>(w, nb * 34, a, nb) };
    let mut acc = [0f32; 8];
    for (b, y) in w.chunks_exact(34).zip(a) {
        let q: [i8; 32] = std::array::from_fn(|i| b[2 + i] as i8);
        fma_lanes(&mut acc, f16_at(b, 0) * y.d, lanes32(&q, &y.qs));
    }
    hsum8(acc)
}

unsafe fn dot_q4_0(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8x32>(w, nb * 18, a, nb) };
    let mut acc = [0f32; 8];
    for (b, y) in w.chunks_exact(18).zip(a) {
        let q = signed(unpack_nibbles32(&b[2..18]), 8);
        fma_lanes(&mut acc, f16_at(b, 0) * y.d, lanes32(&q, &y.qs));
    }
    hsum8(acc)
}

/// Q4_1/Q5_1 (ggml's `_q8_1` dots): unsigned codes, `Σ m·s` (s = the activation block's
/// f16 `d·Σq`) summed separately and added last.
#[inline]
fn dot_x_1(acc: &mut [f32; 8], summs: &mut f32, b: &[u8], codes: [u8; 32], y: &BlockQ8x32) {
    *summs += f16_at(b, 2) * y.s;
    let q = codes.map(|c| c as i8);
    fma_lanes(acc, f16_at(b, 0) * y.d, lanes32(&q, &y.qs));
}

unsafe fn dot_q4_1(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8x32>(w, nb * 20, a, nb) };
    let (mut acc, mut summs) = ([0f32; 8], 0f32);
    for (b, y) in w.chunks_exact(20).zip(a) {
        dot_x_1(&mut acc, &mut summs, b, unpack_nibbles32(&b[4..20]), y);
    }
    hsum8(acc) + summs
}

unsafe fn dot_q5_0(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8x32>(w, nb * 22, a, nb) };
    let mut acc = [0f32; 8];
    for (b, y) in w.chunks_exact(22).zip(a) {
        let q = signed(unpack_q5(u32_at(b, 2), &b[6..22]), 16);
        fma_lanes(&mut acc, f16_at(b, 0) * y.d, lanes32(&q, &y.qs));
    }
    hsum8(acc)
}

unsafe fn dot_q5_1(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8x32>(w, nb * 24, a, nb) };
    let (mut acc, mut summs) = ([0f32; 8], 0f32);
    for (b, y) in w.chunks_exact(24).zip(a) {
        dot_x_1(
            &mut acc,
            &mut summs,
            b,
            unpack_q5(u32_at(b, 4), &b[8..24]),
            y,
        );
    }
    hsum8(acc) + summs
}

/// Q4_K and Q5_K share scales/mins. Lane `k` of a super-block is
/// `Σ_j sc_j·Σ_{e∈4k..4k+4} code·a` over its eight 32-element sub-blocks; the mins term is
/// ggml's: four lanes `m_2i·(bsum_4i + bsum_4i+1) + m_2i+1·(bsum_4i+2 + bsum_4i+3)` (Q4_K,
/// accumulated per lane) or their total (Q5_K, accumulated as one sum).
#[inline]
fn kq_lanes(b: &[u8], codes: &[u8; 256], y: &BlockQ8K) -> ([i32; 8], [i32; 4]) {
    let mut sc = [0i32; 8];
    let mut m = [0i32; 8];
    for j in 0..8 {
        let (s, mm) = scale_min_k4(j, &b[Q4K_SCALES..Q4K_SCALES + 12]);
        sc[j] = s as i32;
        m[j] = mm as i32;
    }
    let mut lanes = [0i32; 8];
    for (k, l) in lanes.iter_mut().enumerate() {
        for (j, sc) in sc.iter().enumerate() {
            let dot: i32 = (32 * j + 4 * k..32 * j + 4 * k + 4)
                .map(|e| codes[e] as i32 * y.qs[e] as i32)
                .sum();
            *l += sc * dot;
        }
    }
    let bs = |g: usize| y.bsums[g] as i32;
    let mins = std::array::from_fn(|i| {
        m[2 * i] * (bs(4 * i) + bs(4 * i + 1)) + m[2 * i + 1] * (bs(4 * i + 2) + bs(4 * i + 3))
    });
    (lanes, mins)
}

unsafe fn dot_q4_k(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 144, a, nb) };
    let (mut acc, mut accm) = ([0f32; 8], [0f32; 4]);
    for (b, y) in w.chunks_exact(144).zip(a) {
        let (lanes, mins) = kq_lanes(b, &unpack_q4k(&b[Q4K_QS..Q4K_QS + 128]), y);
        fma_lanes(&mut acc, y.d * f16_at(b, 0), lanes);
        let dmin = -y.d * f16_at(b, 2);
        for (a, m) in accm.iter_mut().zip(mins) {
            *a = dmin.mul_add(m as f32, *a);
        }
    }
    hsum8(acc) + hsum4(accm)
}

unsafe fn dot_q5_k(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 176, a, nb) };
    let (mut acc, mut summs) = ([0f32; 8], 0f32);
    for (b, y) in w.chunks_exact(176).zip(a) {
        let codes = unpack_q5k(&b[Q5K_QH..Q5K_QH + 32], &b[Q5K_QS..Q5K_QS + 128]);
        let (lanes, mins) = kq_lanes(b, &codes, y);
        fma_lanes(&mut acc, y.d * f16_at(b, 0), lanes);
        let total = (mins[0] + mins[1]) + (mins[2] + mins[3]);
        // ggml's `summs += dmin * total`, contracted into an FMA by GCC (the kernel oracle,
        // `tests/ggml_oracle.rs`, sees the difference from the second super-block on).
        summs = (-y.d * f16_at(b, 2)).mul_add(total as f32, summs);
    }
    hsum8(acc) + summs
}

unsafe fn dot_q6_k(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 210, a, nb) };
    let mut acc = [0f32; 8];
    for (b, y) in w.chunks_exact(210).zip(a) {
        let codes = unpack_q6k(&b[..128], &b[Q6K_QH..Q6K_QH + 64]);
        let sc = |g: usize| (b[Q6K_SCALES + g] as i8) as i32;
        let mut lanes = [0i32; 8];
        for (k, l) in lanes.iter_mut().enumerate() {
            // Sub-blocks of 16: lane k of 32-chunk c reads sub-block 2c + k/4.
            for c in 0..8 {
                let dot: i32 = (32 * c + 4 * k..32 * c + 4 * k + 4)
                    .map(|e| codes[e] as i32 * y.qs[e] as i32)
                    .sum();
                *l += sc(2 * c + k / 4) * dot;
            }
            *l -= 32
                * (sc(2 * k) * y.bsums[2 * k] as i32 + sc(2 * k + 1) * y.bsums[2 * k + 1] as i32);
        }
        fma_lanes(&mut acc, y.d * f16_at(b, Q6K_D), lanes);
    }
    hsum8(acc)
}

/// ggml's tiled K-quant matmul order (llama.cpp runs it for batches of 8 or more activation
/// rows): per super-block the integer sums `s1 = Σ sc·dot` and `s2 = Σ m·bsum` in full,
/// `r = fma(−dmin, s2, s1·d)` (or `s1·d` without mins), then `acc = acc + r·d_a`, rounded
/// at each step.
#[inline]
fn tiled_step(acc: f32, s1: i32, s2: Option<(f32, i32)>, d: f32, da: f32) -> f32 {
    let mut r = s1 as f32 * d;
    if let Some((dmin, s2)) = s2 {
        r = (-dmin).mul_add(s2 as f32, r);
    }
    r.mul_add(da, acc)
}

unsafe fn dot_q4_k_tiled(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 144, a, nb) };
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(144).zip(a) {
        let (lanes, mins) = kq_lanes(b, &unpack_q4k(&b[Q4K_QS..Q4K_QS + 128]), y);
        let s2 = mins.iter().sum();
        acc = tiled_step(
            acc,
            lanes.iter().sum(),
            Some((f16_at(b, 2), s2)),
            f16_at(b, 0),
            y.d,
        );
    }
    acc
}

unsafe fn dot_q5_k_tiled(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 176, a, nb) };
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(176).zip(a) {
        let codes = unpack_q5k(&b[Q5K_QH..Q5K_QH + 32], &b[Q5K_QS..Q5K_QS + 128]);
        let (lanes, mins) = kq_lanes(b, &codes, y);
        let s2 = mins.iter().sum();
        acc = tiled_step(
            acc,
            lanes.iter().sum(),
            Some((f16_at(b, 2), s2)),
            f16_at(b, 0),
            y.d,
        );
    }
    acc
}

unsafe fn dot_q6_k_tiled(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 210, a, nb) };
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(210).zip(a) {
        let codes = unpack_q6k(&b[..128], &b[Q6K_QH..Q6K_QH + 64]);
        let mut s1 = 0i32;
        for g in 0..16 {
            let dot: i32 = (16 * g..16 * g + 16)
                .map(|e| codes[e] as i32 * y.qs[e] as i32)
                .sum();
            s1 += (b[Q6K_SCALES + g] as i8) as i32 * (dot - 32 * y.bsums[g] as i32);
        }
        acc = tiled_step(acc, s1, None, f16_at(b, Q6K_D), y.d);
    }
    acc
}

// --- Q2_K, Q3_K, IQ4_NL, IQ4_XS: ggml's x86 orders (its AVX2 `vec_dot`, which the AVX-512
// build runs for these types, and its tiled matmul from 8 rows). No SIMD path of Synapse's own
// yet: every CPU runs these.

/// Q2_K's codes (0..3) in element order: element `e` is bits `2·((e & 127) >> 5)` of byte
/// `32·(e >> 7) + (e & 31)`.
#[inline]
fn q2k_codes(qs: &[u8]) -> [i8; 256] {
    std::array::from_fn(|e| ((qs[32 * (e >> 7) + (e & 31)] >> (2 * ((e & 127) >> 5))) & 3) as i8)
}

/// Q3_K's signed values (−4..3) in element order: two low bits as Q2_K, minus 4 where the
/// element's `hmask` bit (`hmask[e & 31]`, bit `e >> 5`) is clear.
#[inline]
fn q3k_values(hmask: &[u8], qs: &[u8]) -> [i8; 256] {
    std::array::from_fn(|e| {
        let lo = ((qs[32 * (e >> 7) + (e & 31)] >> (2 * ((e & 127) >> 5))) & 3) as i8;
        let hi = (hmask[e & 31] >> (e >> 5)) & 1;
        lo - if hi == 0 { 4 } else { 0 }
    })
}

/// Q3_K's 16 six-bit scales (the block decoder's unpacking), minus 32.
#[inline]
fn q3k_scales(s: &[u8]) -> [i32; 16] {
    super::decode::q3k_scales(s).map(|v| v as i32 - 32)
}

/// IQ4_NL / IQ4_XS values of 16 packed bytes (32 elements, low nibbles first).
#[inline]
fn iq4_values(qs: &[u8]) -> [i8; 32] {
    unpack_nibbles32(qs).map(|c| super::decode::KVALUES_IQ4NL[c as usize])
}

/// The 8 i32 lanes of a 256-element super-block dot: lane `k` sums, over the eight 32-element
/// groups `g`, `scale(g, k) · Σ_{e ∈ 4k..4k+4} v·a`.
#[inline]
fn lanes_k(v: &[i8; 256], a: &[i8; 256], scale: impl Fn(usize, usize) -> i32) -> [i32; 8] {
    let mut l = [0i32; 8];
    for g in 0..8 {
        let (vg, ag) = (&v[32 * g..32 * g + 32], &a[32 * g..32 * g + 32]);
        for (k, l) in l.iter_mut().enumerate() {
            let dot: i32 = (4 * k..4 * k + 4)
                .map(|e| vg[e] as i32 * ag[e] as i32)
                .sum();
            *l += scale(g, k) * dot;
        }
    }
    l
}

/// [`lanes_k`] with one scale per 16 elements, as ggml's AVX2 Q2_K/Q3_K kernels build the
/// lanes: the scale shuffle puts sub-block `2g` on a group's low 16 elements (lanes 0..4),
/// `2g + 1` on its high 16.
#[inline]
fn lanes_k16(v: &[i8; 256], sc: &[i32; 16], a: &[i8; 256]) -> [i32; 8] {
    lanes_k(v, a, |g, k| sc[2 * g + (k >= 4) as usize])
}

/// [`lanes_k`] with one scale per 32 elements (IQ4_XS).
#[inline]
fn lanes_k32(v: &[i8; 256], sc: &[i32; 8], a: &[i8; 256]) -> [i32; 8] {
    lanes_k(v, a, |g, _| sc[g])
}

/// Q2_K's scales (low nibbles) and mins (high nibbles) of its 16 sub-blocks.
#[inline]
fn q2k_scales_mins(s: &[u8]) -> ([i32; 16], [i32; 16]) {
    (
        std::array::from_fn(|j| (s[j] & 0xF) as i32),
        std::array::from_fn(|j| (s[j] >> 4) as i32),
    )
}

fn iq4xs_block_values(b: &[u8]) -> [i8; 256] {
    let mut v = [0i8; 256];
    for ib in 0..8 {
        v[32 * ib..32 * ib + 32].copy_from_slice(&iq4_values(&b[8 + 16 * ib..8 + 16 * ib + 16]));
    }
    v
}

/// `ggml_vec_dot_q2_K_q8_K` (AVX2): per super-block, first the mins term into each lane
/// (`fma(−d_a·dmin, m_2k·bsum_2k + m_2k+1·bsum_2k+1, acc_k)`), then `fma(d_a·d, lane_k, acc_k)`.
unsafe fn dot_q2_k(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 84, a, nb) };
    let mut acc = [0f32; 8];
    for (b, y) in w.chunks_exact(84).zip(a) {
        let d = y.d * f16_at(b, 80);
        let dmin = -y.d * f16_at(b, 82);
        let (sc, m) = q2k_scales_mins(&b[..16]);
        for (k, acc) in acc.iter_mut().enumerate() {
            let prod = m[2 * k] * y.bsums[2 * k] as i32 + m[2 * k + 1] * y.bsums[2 * k + 1] as i32;
            *acc = dmin.mul_add(prod as f32, *acc);
        }
        fma_lanes(&mut acc, d, lanes_k16(&q2k_codes(&b[16..80]), &sc, &y.qs));
    }
    hsum8(acc)
}

/// `ggml_vec_dot_q3_K_q8_K` (AVX2): `fma(d_a·d, lane_k, acc_k)` per super-block.
unsafe fn dot_q3_k(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 110, a, nb) };
    let mut acc = [0f32; 8];
    for (b, y) in w.chunks_exact(110).zip(a) {
        let v = q3k_values(&b[..32], &b[32..96]);
        let l = lanes_k16(&v, &q3k_scales(&b[96..108]), &y.qs);
        fma_lanes(&mut acc, y.d * f16_at(b, 108), l);
    }
    hsum8(acc)
}

/// `ggml_vec_dot_iq4_xs_q8_K` (AVX2): `fma(d·d_a, lane_k, acc_k)` per super-block.
unsafe fn dot_iq4_xs(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 136, a, nb) };
    let mut acc = [0f32; 8];
    for (b, y) in w.chunks_exact(136).zip(a) {
        let l = lanes_k32(
            &iq4xs_block_values(b),
            &super::decode::iq4xs_scales(b),
            &y.qs,
        );
        fma_lanes(&mut acc, f16_at(b, 0) * y.d, l);
    }
    hsum8(acc)
}

/// A lattice-code group's 32 grid values (as `i8`), which of them are negated, and the scales
/// of its two 16-element halves (equal for the codes with one scale per group).
type LatticeGroup = ([i8; 32], [bool; 32], [i32; 2]);

/// `ggml_vec_dot_iq{2,3}_xxs_q8_K` (AVX2): per 32-element group, each element's grid byte times
/// its activation signed by the group's sign pattern (`sign_epi8`: a negated −128 stays
/// −128), pairs summed (`maddubs`), the group's lanes of four times its scale `2·ls + 1`
/// (`madd`); a block's 8 groups' lanes added as integers (exact), then `fma(d·d_a, lane, acc)`
/// per lane (IQ2_XS, IQ2_S: a scale per 16, lanes 0–3 and 4–7 of a group); `k ·
/// hsum_float_8` (`k` 0.125 for IQ2_XXS, IQ2_XS and IQ2_S, 0.25 for IQ3_XXS, 1 for IQ3_S;
/// IQ3_S's and IQ2_S's `xor`/`sub` signs are the same wrap). Blocks of `bs`
/// bytes, group `g` of block `b` from `group(b, g)`.
///
/// # Safety
/// As [`DotFn`] for blocks of `bs` bytes and Q8_K activations.
#[inline(always)]
unsafe fn lattice_dot(
    w: *const u8,
    a: *const u8,
    nb: usize,
    bs: usize,
    k: f32,
    group: impl Fn(&[u8], usize) -> LatticeGroup,
) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * bs, a, nb) };
    let mut acc = [0f32; 8];
    for (b, y) in w.chunks_exact(bs).zip(a) {
        let mut lanes = [0i32; 8];
        for ib32 in 0..8 {
            let (grid, neg, ls) = group(b, ib32);
            let q8: &[i8; 32] = y.qs[32 * ib32..32 * ib32 + 32].try_into().unwrap();
            let q8s: [i8; 32] =
                std::array::from_fn(|e| if neg[e] { q8[e].wrapping_neg() } else { q8[e] });
            for (j, (l, v)) in lanes.iter_mut().zip(lanes32(&grid, &q8s)).enumerate() {
                *l += ls[j / 4] * v;
            }
        }
        fma_lanes(&mut acc, f16_at(b, 0) * y.d, lanes);
    }
    k * hsum8(acc)
}

/// The lattice codes in ggml's tiled order (8 or more rows): the signs on the grid values (so
/// a −128 activation meets `±g` exactly, unlike `sign_epi8`), the super-block's integer sum over
/// its groups times their scales, then `fma((s · (d · k)), d_a, acc)`.
///
/// # Safety
/// As [`lattice_dot`].
#[inline(always)]
unsafe fn lattice_tiled(
    w: *const u8,
    a: *const u8,
    nb: usize,
    bs: usize,
    k: f32,
    group: impl Fn(&[u8], usize) -> LatticeGroup,
) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * bs, a, nb) };
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(bs).zip(a) {
        let mut s1 = 0i32;
        for ib32 in 0..8 {
            let (grid, neg, ls) = group(b, ib32);
            let v: [i8; 32] = std::array::from_fn(|e| if neg[e] { -grid[e] } else { grid[e] });
            let q8: &[i8; 32] = y.qs[32 * ib32..32 * ib32 + 32].try_into().unwrap();
            let l = lanes32(&v, q8);
            s1 += ls[0] * l[..4].iter().sum::<i32>() + ls[1] * l[4..].iter().sum::<i32>();
        }
        acc = tiled_step(acc, s1, None, f16_at(b, 0) * k, y.d);
    }
    acc
}

/// A group's 32 values from four 8-value grid rows and four sign bytes (bit `j` of byte `l`:
/// element `8l + j` negated), with its halves' scales.
#[inline(always)]
fn lattice_group(rows: [[u8; 8]; 4], signs: [u8; 4], ls: [i32; 2]) -> LatticeGroup {
    let (mut grid, mut neg) = ([0i8; 32], [false; 32]);
    for (l, g) in rows.iter().enumerate() {
        for j in 0..8 {
            grid[8 * l + j] = g[j] as i8;
            neg[8 * l + j] = (signs[l] >> j) & 1 != 0;
        }
    }
    (grid, neg, ls)
}

/// The sign bytes and scale `2·ls + 1` of an IQ2_XXS/IQ3_XXS group's word: four 7-bit indices
/// into `KSIGNS_IQ2XS`, the scale in the top four bits.
#[inline(always)]
fn xxs_signs(aux: u32) -> ([u8; 4], [i32; 2]) {
    use synapse_formats::decode::iq_tables::KSIGNS_IQ2XS;
    let ls = 2 * (aux >> 28) as i32 + 1;
    (
        std::array::from_fn(|l| KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize]),
        [ls, ls],
    )
}

/// IQ2_XXS group `ib32` of block `b` (grid values ≤ 43).
#[inline(always)]
fn iq2xxs_group(b: &[u8], ib32: usize) -> LatticeGroup {
    use synapse_formats::decode::iq_tables::IQ2XXS_GRID;
    let o = 2 + 8 * ib32;
    let aux = u32::from_le_bytes([b[o + 4], b[o + 5], b[o + 6], b[o + 7]]);
    let (signs, ls) = xxs_signs(aux);
    lattice_group(
        std::array::from_fn(|l| IQ2XXS_GRID[b[o + l] as usize].to_le_bytes()),
        signs,
        ls,
    )
}

/// IQ3_XXS group `ib32` of block `b` (two 4-value grid entries per 8 values, ≤ 62).
#[inline(always)]
fn iq3xxs_group(b: &[u8], ib32: usize) -> LatticeGroup {
    use synapse_formats::decode::iq_tables::IQ3XXS_GRID;
    let o = 66 + 4 * ib32;
    let aux = u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let qs = &b[2 + 8 * ib32..2 + 8 * ib32 + 8];
    let (signs, ls) = xxs_signs(aux);
    lattice_group(
        std::array::from_fn(|l| {
            let g = IQ3XXS_GRID[qs[2 * l] as usize] as u64
                | (IQ3XXS_GRID[qs[2 * l + 1] as usize] as u64) << 32;
            g.to_le_bytes()
        }),
        signs,
        ls,
    )
}

/// IQ3_S group `ib32` of block `b`: 9-bit grid indices (the high bit from `qh`), explicit sign
/// bytes, the scale `2·s + 1` from a nibble (values ≤ 15).
#[inline(always)]
fn iq3s_group(b: &[u8], ib32: usize) -> LatticeGroup {
    use synapse_formats::decode::iq_tables::IQ3S_GRID;
    let qs = &b[2 + 8 * ib32..2 + 8 * ib32 + 8];
    let h = b[66 + ib32] as usize;
    let sc = b[106 + ib32 / 2];
    let s = if ib32.is_multiple_of(2) {
        sc & 0x0f
    } else {
        sc >> 4
    };
    lattice_group(
        std::array::from_fn(|l| {
            let i1 = qs[2 * l] as usize | ((h << (8 - 2 * l)) & 256);
            let i2 = qs[2 * l + 1] as usize | ((h << (7 - 2 * l)) & 256);
            (IQ3S_GRID[i1] as u64 | (IQ3S_GRID[i2] as u64) << 32).to_le_bytes()
        }),
        std::array::from_fn(|l| b[74 + 4 * ib32 + l]),
        [1 + 2 * s as i32; 2],
    )
}

/// IQ2_XS group `ib32` of block `b`: per 8 values a 9-bit grid index and a 7-bit sign index
/// (`KSIGNS_IQ2XS`), a 4-bit scale per 16 (values ≤ 43).
#[inline(always)]
fn iq2xs_group(b: &[u8], ib32: usize) -> LatticeGroup {
    use synapse_formats::decode::iq_tables::{IQ2XS_GRID, KSIGNS_IQ2XS};
    let q = |l: usize| u16::from_le_bytes([b[2 + 8 * ib32 + 2 * l], b[3 + 8 * ib32 + 2 * l]]);
    let sc = b[66 + ib32];
    lattice_group(
        std::array::from_fn(|l| IQ2XS_GRID[(q(l) & 511) as usize].to_le_bytes()),
        std::array::from_fn(|l| KSIGNS_IQ2XS[(q(l) >> 9) as usize]),
        [2 * (sc & 0x0f) as i32 + 1, 2 * (sc >> 4) as i32 + 1],
    )
}

/// IQ2_S group `ib32` of block `b`: 10-bit grid indices (two high bits per 8 values from
/// `qh`), explicit sign bytes, a 4-bit scale per 16 (values ≤ 43).
#[inline(always)]
fn iq2s_group(b: &[u8], ib32: usize) -> LatticeGroup {
    use synapse_formats::decode::iq_tables::IQ2S_GRID;
    let qh = b[66 + ib32] as usize;
    let sc = b[74 + ib32];
    lattice_group(
        std::array::from_fn(|l| {
            let idx = b[2 + 4 * ib32 + l] as usize | ((qh << (8 - 2 * l)) & 0x300);
            IQ2S_GRID[idx].to_le_bytes()
        }),
        std::array::from_fn(|l| b[34 + 4 * ib32 + l]),
        [2 * (sc & 0x0f) as i32 + 1, 2 * (sc >> 4) as i32 + 1],
    )
}

/// One product of x86 `mul_add_epi8(x, q)` (`maddubs(|x|, sign(q, x))`): `x·q`, except that a
/// negated −128 stays −128 (`sign_epi8`'s wrap).
#[inline(always)]
fn mul_add_epi8(x: i8, q: i8) -> i32 {
    x.unsigned_abs() as i32 * (if x < 0 { q.wrapping_neg() } else { q }) as i32
}

/// IQ1_S group `ib` of block `b`: its 32 grid values (−1, 0, 1), its scale `2·s + 1` and the
/// sign of its delta (bit 15 of its `qh` word).
#[inline(always)]
fn iq1s_group(b: &[u8], ib: usize) -> ([i8; 32], i32, i32) {
    use synapse_formats::decode::iq_tables::IQ1S_GRID;
    let hw = u16::from_le_bytes([b[34 + 2 * ib], b[35 + 2 * ib]]) as usize;
    let mut v = [0i8; 32];
    for l in 0..4 {
        let g = IQ1S_GRID[b[2 + 4 * ib + l] as usize | (((hw >> (3 * l)) & 7) << 8)].to_le_bytes();
        for j in 0..8 {
            v[8 * l + j] = g[j] as i8;
        }
    }
    let delta = if hw & 0x8000 != 0 { -1 } else { 1 };
    (v, 2 * ((hw >> 12) & 7) as i32 + 1, delta)
}

/// `ggml_vec_dot_iq1_s_q8_K` (AVX2): per 32-element group the grid values (−1, 0, 1) times the
/// activations as `mul_add_epi8` forms them (`maddubs(|g|, sign(q8, g))`: a negated −128 stays
/// −128), lanes of four times the scale, a block's lanes into one integer accumulator; the
/// delta's term `Σ (bsum pair)·(±1)·ls` apart, in an integer; per block `d = d_a·d_w`,
/// `acc = fma(d, lane, acc)` per lane and `acc₁ = fma(d, delta term, acc₁)`; the result
/// `hsum_float_8(acc) + 0.125·acc₁`, a multiply and an add (the oracle's build: `vmulss`,
/// `vaddss`; the fixtures do not tell the fused form apart, the disassembly does).
unsafe fn dot_iq1_s(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 50, a, nb) };
    let (mut acc, mut acc1) = ([0f32; 8], 0f32);
    for (b, y) in w.chunks_exact(50).zip(a) {
        let (mut lanes, mut sumi1) = ([0i32; 8], 0i32);
        for ib in 0..8 {
            let (g, ls, delta) = iq1s_group(b, ib);
            let q8 = &y.qs[32 * ib..32 * ib + 32];
            for (e, (&g, &q)) in g.iter().zip(q8).enumerate() {
                let p = mul_add_epi8(g, q);
                lanes[e / 4] += ls * p;
            }
            sumi1 += (y.bsums[2 * ib] as i32 + y.bsums[2 * ib + 1] as i32) * delta * ls;
        }
        let d = y.d * f16_at(b, 0);
        fma_lanes(&mut acc, d, lanes);
        acc1 = d.mul_add(sumi1 as f32, acc1);
    }
    hsum8(acc) + 0.125 * acc1
}

/// IQ1_S in ggml's tiled order (8 or more rows): the codes `8·g + delta` (exact integers), the
/// block's sum over its groups times their scales, then `fma(s·(d·0.125), d_a, acc)`.
unsafe fn dot_iq1_s_tiled(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 50, a, nb) };
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(50).zip(a) {
        let mut s1 = 0i32;
        for ib in 0..8 {
            let (g, ls, delta) = iq1s_group(b, ib);
            let q8 = &y.qs[32 * ib..32 * ib + 32];
            let sum: i32 = g
                .iter()
                .zip(q8)
                .map(|(&g, &q)| (8 * g as i32 + delta) * q as i32)
                .sum();
            s1 += ls * sum;
        }
        acc = tiled_step(acc, s1, None, f16_at(b, 0) * 0.125, y.d);
    }
    acc
}

/// The `DotFn` pair (one-row order, tiled order) of each lattice code: `(one-row, tiled,
/// block bytes, final factor k, group decoder)`.
macro_rules! lattice_fns {
    ($($dot:ident, $tiled:ident, $bs:literal, $k:literal, $group:ident;)*) => {$(
        unsafe fn $dot(w: *const u8, a: *const u8, nb: usize) -> f32 {
            // SAFETY: forwarded contract of `DotFn`.
            unsafe { lattice_dot(w, a, nb, $bs, $k, $group) }
        }

        unsafe fn $tiled(w: *const u8, a: *const u8, nb: usize) -> f32 {
            // SAFETY: forwarded contract of `DotFn`.
            unsafe { lattice_tiled(w, a, nb, $bs, $k, $group) }
        }
    )*};
}

lattice_fns! {
    dot_iq2_xxs, dot_iq2_xxs_tiled, 66, 0.125, iq2xxs_group;
    dot_iq2_xs, dot_iq2_xs_tiled, 74, 0.125, iq2xs_group;
    dot_iq2_s, dot_iq2_s_tiled, 82, 0.125, iq2s_group;
    dot_iq3_xxs, dot_iq3_xxs_tiled, 98, 0.25, iq3xxs_group;
    dot_iq3_s, dot_iq3_s_tiled, 110, 1.0, iq3s_group;
}

/// IQ1_M block `b`'s scale (an f16 spread over the four scale words' top nibbles) and group
/// `g`'s grid values (−1, 0, 1), per-8 delta signs and per-16 scales `2·s + 1`.
#[inline(always)]
fn iq1m_group(b: &[u8], g: usize) -> ([i8; 32], [i32; 4], [i32; 2]) {
    use synapse_formats::decode::iq_tables::IQ1S_GRID;
    let (qh0, qh1) = (b[32 + 2 * g] as usize, b[33 + 2 * g] as usize);
    let idx = [
        b[4 * g] as usize | ((qh0 << 8) & 0x700),
        b[4 * g + 1] as usize | ((qh0 << 4) & 0x700),
        b[4 * g + 2] as usize | ((qh1 << 8) & 0x700),
        b[4 * g + 3] as usize | ((qh1 << 4) & 0x700),
    ];
    let mut v = [0i8; 32];
    for (l, &i) in idx.iter().enumerate() {
        for (j, &x) in IQ1S_GRID[i].to_le_bytes().iter().enumerate() {
            v[8 * l + j] = x as i8;
        }
    }
    let sign = |bit: bool| if bit { -1 } else { 1 };
    let delta = [
        sign(qh0 & 0x08 != 0),
        sign(qh0 & 0x80 != 0),
        sign(qh1 & 0x08 != 0),
        sign(qh1 & 0x80 != 0),
    ];
    let sc = u16::from_le_bytes([b[48 + 2 * (g / 2)], b[49 + 2 * (g / 2)]]) as i32;
    let sh = 6 * (g % 2);
    (
        v,
        delta,
        [2 * ((sc >> sh) & 7) + 1, 2 * ((sc >> (sh + 3)) & 7) + 1],
    )
}

/// IQ1_M's block scale: the f16 whose nibbles are the four scale words' top nibbles.
#[inline(always)]
pub(crate) fn iq1m_scale(b: &[u8]) -> f32 {
    let sc = |k: usize| u16::from_le_bytes([b[48 + 2 * k], b[49 + 2 * k]]);
    let u = (sc(0) >> 12) | ((sc(1) >> 8) & 0x00f0) | ((sc(2) >> 4) & 0x0f00) | (sc(3) & 0xf000);
    half::f16::from_bits(u).to_f32()
}

/// `ggml_vec_dot_iq1_m_q8_K` (AVX2): the grid part as IQ1_S's (`mul_add_epi8` lanes) and the
/// delta part as pair sums of the activations signed per 8 (`sign_epi8`: a negated −128 stays
/// −128), both times the per-16 scales into two integer lane sets; per block `d = d_a·d_w`,
/// `fma(d, lane, acc)` into two accumulators; `fma(hsum(acc₂), 0.125, hsum(acc₁))` (fused in
/// the oracle's build).
unsafe fn dot_iq1_m(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 56, a, nb) };
    let (mut acc1, mut acc2) = ([0f32; 8], [0f32; 8]);
    for (b, y) in w.chunks_exact(56).zip(a) {
        let (mut l1, mut l2) = ([0i32; 8], [0i32; 8]);
        for g in 0..8 {
            let (v, delta, ls) = iq1m_group(b, g);
            for (e, &x) in v.iter().enumerate() {
                let q = y.qs[32 * g + e];
                let p = mul_add_epi8(x, q);
                let pd = if delta[e / 8] < 0 {
                    q.wrapping_neg()
                } else {
                    q
                } as i32;
                l1[e / 4] += ls[e / 16] * p;
                l2[e / 4] += ls[e / 16] * pd;
            }
        }
        let d = y.d * iq1m_scale(b);
        fma_lanes(&mut acc1, d, l1);
        fma_lanes(&mut acc2, d, l2);
    }
    hsum8(acc2).mul_add(0.125, hsum8(acc1))
}

/// IQ1_M in ggml's tiled order (8 or more rows): the codes `8·g + δ` (exact integers), the
/// block's sum over its 16-element halves times their scales, then `fma(s·(d·0.125), d_a,
/// acc)`.
unsafe fn dot_iq1_m_tiled(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 56, a, nb) };
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(56).zip(a) {
        let mut s1 = 0i32;
        for g in 0..8 {
            let (v, delta, ls) = iq1m_group(b, g);
            for (h, &l) in ls.iter().enumerate() {
                let sum: i32 = (16 * h..16 * h + 16)
                    .map(|e| (8 * v[e] as i32 + delta[e / 8]) * y.qs[32 * g + e] as i32)
                    .sum();
                s1 += l * sum;
            }
        }
        acc = tiled_step(acc, s1, None, iq1m_scale(b) * 0.125, y.d);
    }
    acc
}

/// `ggml_vec_dot_iq4_nl_q8_0` (AVX2): even blocks into one 8-lane accumulator, odd blocks
/// into another, `hsum_float_8` of their lane sums; an odd last block added after, in
/// scalar (`fma(d, Σ, sum)`, as GCC contracts ggml's `sumf += d*(sumi1 + sumi2)`).
unsafe fn dot_iq4_nl(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    unsafe { nl_pairs(w, a, nb, 18, |b| iq4_values(&b[2..18]), |b| f16_at(b, 0)) }
}

/// `ggml_vec_dot_mxfp4_q8_0` (AVX2): IQ4_NL's order (see [`dot_iq4_nl`]) over E2M1 values
/// doubled and the block's E8M0 scale halved (`d_a · e8m0_half(e)`).
unsafe fn dot_mxfp4(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    unsafe {
        nl_pairs(
            w,
            a,
            nb,
            17,
            |b| unpack_nibbles32(&b[1..17]).map(|c| super::decode::KVALUES_FP4[c as usize]),
            |b| super::decode::e8m0_half(b[0]),
        )
    }
}

/// `ggml_vec_dot_nvfp4_q8_0` (AVX2): per 64-element block (four UE4M3 scales of 16, E2M1
/// values doubled) and its two Q8_0 activation blocks, the 32-element halves' lanes of four
/// against their activation block, each lane times its 16's scale `ue4m3_half(d_s)·d_a`
/// (`fma` into one 8-lane accumulator, the first half then the second), `hsum_float_8`.
unsafe fn dot_nvfp4(w: *const u8, a: *const u8, nb: usize) -> f32 {
    use synapse_formats::decode::fp4::ue4m3_to_f32_half;
    // SAFETY: forwarded contract of `DotFn` (`nb` blocks of 64: twice as many activation
    // blocks of 32).
    let (w, a) = unsafe { parts::<BlockQ8x32>(w, nb * 36, a, 2 * nb) };
    let mut acc = [0f32; 8];
    for (b, y) in w.chunks_exact(36).zip(a.chunks_exact(2)) {
        for (h, yh) in y.iter().enumerate() {
            let v: [i8; 32] = std::array::from_fn(|e| {
                let (s, j) = (2 * h + e / 16, e % 16);
                let q = b[4 + 8 * s + j % 8];
                let c = if j < 8 { q & 0x0f } else { q >> 4 };
                super::decode::KVALUES_FP4[c as usize]
            });
            let sc = [
                ue4m3_to_f32_half(b[2 * h]) * yh.d,
                ue4m3_to_f32_half(b[2 * h + 1]) * yh.d,
            ];
            for (k, (a, l)) in acc.iter_mut().zip(lanes32(&v, &yh.qs)).enumerate() {
                *a = sc[k / 4].mul_add(l as f32, *a);
            }
        }
    }
    hsum8(acc)
}

/// `ggml_vec_dot_q1_0_q8_0` (AVX2): per 128-element block its four Q8_0 activation blocks, each
/// element `+a` where its bit is set and `−a` where not (`xor`/`sub`: a negated −128 stays
/// −128), lanes of four; `acc_b = d_{a,0}·lanes₀`, then `fma(d_{a,k}, lanes_k, acc_b)` for the
/// other three, then `acc = fma(d_w, acc_b, acc)`; `hsum_float_8`.
unsafe fn dot_q1_0(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn` (`nb` blocks of 128: four activation blocks each).
    let (w, a) = unsafe { parts::<BlockQ8x32>(w, nb * 18, a, 4 * nb) };
    let mut acc = [0f32; 8];
    for (b, y) in w.chunks_exact(18).zip(a.chunks_exact(4)) {
        let mut blk = [0f32; 8];
        for (k, yk) in y.iter().enumerate() {
            let mut l = [0i32; 8];
            for (e, &q) in yk.qs.iter().enumerate() {
                let set = (b[2 + 4 * k + e / 8] >> (e % 8)) & 1 != 0;
                l[e / 4] += if set { q } else { q.wrapping_neg() } as i32;
            }
            for (x, l) in blk.iter_mut().zip(l) {
                *x = if k == 0 {
                    yk.d * l as f32
                } else {
                    yk.d.mul_add(l as f32, *x)
                };
            }
        }
        let d = f16_at(b, 0);
        for (x, v) in acc.iter_mut().zip(blk) {
            *x = d.mul_add(v, *x);
        }
    }
    hsum8(acc)
}

/// `ggml_vec_dot_q2_0_q8_0` (its generic C on x86): per 64-element block its two Q8_0 blocks'
/// integer sums of `(c − 1)·a`, `s += d_a·Σ` over the two, `sum += d_w·s` — each a multiply and
/// an add (the oracle's build does not fuse them: `vmulss`, `vaddss`).
unsafe fn dot_q2_0(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn` (`nb` blocks of 64: two activation blocks each).
    let (w, a) = unsafe { parts::<BlockQ8x32>(w, nb * 18, a, 2 * nb) };
    let mut sum = 0f32;
    for (b, y) in w.chunks_exact(18).zip(a.chunks_exact(2)) {
        let mut s = 0f32;
        for (k, yk) in y.iter().enumerate() {
            let si: i32 = yk
                .qs
                .iter()
                .enumerate()
                .map(|(e, &q)| {
                    let c = (b[2 + 8 * k + e / 4] >> (2 * (e % 4))) & 3;
                    (c as i32 - 1) * q as i32
                })
                .sum();
            s += yk.d * si as f32;
        }
        sum += f16_at(b, 0) * s;
    }
    sum
}

/// The 32-element non-linear 4-bit codes' `vec_dot` (IQ4_NL, MXFP4): even blocks into one
/// 8-lane accumulator, odd blocks into another, `hsum_float_8` of their lane sums; an odd last
/// block added after, in scalar (`fma(d, Σ, sum)`, as GCC contracts ggml's
/// `sumf += d*(sumi1 + sumi2)`). Blocks of `bs` bytes, their values and scale from `values` and
/// `dw`.
///
/// # Safety
/// As [`DotFn`] for blocks of `bs` bytes and Q8_0 activations.
#[inline(always)]
unsafe fn nl_pairs(
    w: *const u8,
    a: *const u8,
    nb: usize,
    bs: usize,
    values: impl Fn(&[u8]) -> [i8; 32],
    dw: impl Fn(&[u8]) -> f32,
) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8x32>(w, nb * bs, a, nb) };
    let (mut acc1, mut acc2) = ([0f32; 8], [0f32; 8]);
    let pairs = nb / 2;
    for p in 0..pairs {
        for (acc, ib) in [(&mut acc1, 2 * p), (&mut acc2, 2 * p + 1)] {
            let b = &w[bs * ib..bs * ib + bs];
            let y = &a[ib];
            fma_lanes(acc, y.d * dw(b), lanes32(&values(b), &y.qs));
        }
    }
    let mut sum = hsum8(std::array::from_fn(|k| acc1[k] + acc2[k]));
    if nb % 2 == 1 {
        let ib = nb - 1;
        let (b, y) = (&w[bs * ib..bs * ib + bs], &a[ib]);
        let s: i32 = values(b)
            .iter()
            .zip(&y.qs)
            .map(|(&v, &q)| v as i32 * q as i32)
            .sum();
        sum = (y.d * dw(b)).mul_add(s as f32, sum);
    }
    sum
}

/// IQ4_NL with two or more activation rows: llamafile's `tinyBLAS_Q0_AVX` (one 8-lane
/// accumulator, `fma(d·d_a, lanes, acc)` per block, `hsum`), which ggml runs instead of its
/// `vec_dot` once a call has more than one row.
unsafe fn dot_iq4_nl_gemm(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8x32>(w, nb * 18, a, nb) };
    let mut acc = [0f32; 8];
    for (b, y) in w.chunks_exact(18).zip(a) {
        fma_lanes(
            &mut acc,
            f16_at(b, 0) * y.d,
            lanes32(&iq4_values(&b[2..18]), &y.qs),
        );
    }
    hsum8(acc)
}

unsafe fn dot_q2_k_tiled(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 84, a, nb) };
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(84).zip(a) {
        let (sc, m) = q2k_scales_mins(&b[..16]);
        let s1: i32 = lanes_k16(&q2k_codes(&b[16..80]), &sc, &y.qs).iter().sum();
        let s2: i32 = (0..16).map(|g| m[g] * y.bsums[g] as i32).sum();
        acc = tiled_step(acc, s1, Some((f16_at(b, 82), s2)), f16_at(b, 80), y.d);
    }
    acc
}

unsafe fn dot_q3_k_tiled(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 110, a, nb) };
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(110).zip(a) {
        let v = q3k_values(&b[..32], &b[32..96]);
        let s1: i32 = lanes_k16(&v, &q3k_scales(&b[96..108]), &y.qs).iter().sum();
        acc = tiled_step(acc, s1, None, f16_at(b, 108), y.d);
    }
    acc
}

unsafe fn dot_iq4_xs_tiled(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 136, a, nb) };
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(136).zip(a) {
        let s1: i32 = lanes_k32(
            &iq4xs_block_values(b),
            &super::decode::iq4xs_scales(b),
            &y.qs,
        )
        .iter()
        .sum();
        acc = tiled_step(acc, s1, None, f16_at(b, 0), y.d);
    }
    acc
}

/// The 8 i32 lanes of ggml's AVX2 ternary dots (`ggml_vec_dot_tq{1,2}_0_q8_K`): the codes
/// `t + 1` times the activations in 16-bit lanes (`maddubs`: lane `k` of each 32-element
/// vector holds its elements `4k..4k+4`), minus the Q8_K block sums 16-bit lane by 16-bit
/// lane (`bsums[2k]`, `bsums[2k+1]`: elements `32k..32k+32`, not lane `k`'s), then pairs
/// folded (`madd` by 1). Integer-exact, so only the lane split matters for the float order.
#[inline]
fn tq_lanes(codes: &[u8; 256], y: &BlockQ8K) -> [i32; 8] {
    std::array::from_fn(|k| {
        let l: i32 = (0..8)
            .flat_map(|v| 32 * v + 4 * k..32 * v + 4 * k + 4)
            .map(|e| codes[e] as i32 * y.qs[e] as i32)
            .sum();
        l - y.bsums[2 * k] as i32 - y.bsums[2 * k + 1] as i32
    })
}

/// `ggml_vec_dot_tq{1,2}_0_q8_K` (AVX2) over `nb` blocks of `ts` bytes with the f16 scale at
/// `doff`: `acc_k = fma(lane_k, d_a · d, acc_k)` per block (ggml writes a multiply and an add;
/// GCC contracts them, and the oracle fixtures agree only with the FMA), `hsum_float_8` at
/// the end.
///
/// # Safety
/// As [`DotFn`].
unsafe fn dot_tq(
    w: *const u8,
    a: *const u8,
    nb: usize,
    ts: usize,
    doff: usize,
    codes: fn(&[u8]) -> [u8; 256],
) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * ts, a, nb) };
    let mut acc = [0f32; 8];
    for (b, y) in w.chunks_exact(ts).zip(a) {
        let d = y.d * f16_at(b, doff);
        for (acc, l) in acc.iter_mut().zip(tq_lanes(&codes(b), y)) {
            *acc = (l as f32).mul_add(d, *acc);
        }
    }
    hsum8(acc)
}

unsafe fn dot_tq1_0(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    unsafe { dot_tq(w, a, nb, 54, 52, super::decode::tq1_codes) }
}

unsafe fn dot_tq2_0(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    unsafe { dot_tq(w, a, nb, 66, 64, super::decode::tq2_codes) }
}

/// The many-row (≥ [`super::MANY_ROWS`]) kernel for `ty`, where ggml's order differs.
pub(crate) fn many(ty: GgmlType) -> Option<(usize, DotFn)> {
    let f: DotFn = match ty {
        GgmlType::Q4_K => dot_q4_k_tiled,
        GgmlType::Q5_K => dot_q5_k_tiled,
        GgmlType::Q6_K => dot_q6_k_tiled,
        GgmlType::Q2_K => dot_q2_k_tiled,
        GgmlType::Q3_K => dot_q3_k_tiled,
        GgmlType::IQ4_XS => dot_iq4_xs_tiled,
        GgmlType::IQ2_XXS => dot_iq2_xxs_tiled,
        GgmlType::IQ3_XXS => dot_iq3_xxs_tiled,
        GgmlType::IQ3_S => dot_iq3_s_tiled,
        GgmlType::IQ2_XS => dot_iq2_xs_tiled,
        GgmlType::IQ2_S => dot_iq2_s_tiled,
        GgmlType::IQ1_S => dot_iq1_s_tiled,
        GgmlType::IQ1_M => dot_iq1_m_tiled,
        _ => return None,
    };
    Some((super::MANY_ROWS, f))
}

/// f32 dot with 8 independent partial sums (the order the SIMD paths use, per 8-lane chunk).
#[inline]
fn dot_f32_lanes(w: impl Iterator<Item = f32>, a: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for (i, (w, a)) in w.zip(a).enumerate() {
        acc[i % 8] += w * a;
    }
    acc.iter().sum()
}

/// [`dot_f32_lanes`] over slices, eight elements a step (each lane's additions in the same
/// order, so the same bits; written so that the eight partial sums stay in one register —
/// the iterator form kept them in memory, a store-to-load chain per element).
#[inline]
fn dot_f32_lanes_slices(w: &[f32], a: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (wc, ac) = (w.chunks_exact(8), a.chunks_exact(8));
    let (wr, ar) = (wc.remainder(), ac.remainder());
    for (wc, ac) in wc.zip(ac) {
        for k in 0..8 {
            acc[k] += wc[k] * ac[k];
        }
    }
    for (k, (w, a)) in wr.iter().zip(ar).enumerate() {
        acc[k] += w * a;
    }
    acc.iter().sum()
}

unsafe fn dot_f32(w: *const u8, a: *const u8, n: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<f32>(w, n * 4, a, n) };
    dot_f32_lanes(
        w.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        a,
    )
}

unsafe fn dot_bf16(w: *const u8, a: *const u8, n: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<f32>(w, n * 2, a, n) };
    dot_f32_lanes(w.chunks_exact(2).map(|b| bf16_at(b, 0)), a)
}

/// Decode-then-dot for encodings without an integer kernel: each block is decoded to f32 on
/// the stack and dotted with the f32 activations.
unsafe fn dot_decode<const TY: u32>(w: *const u8, a: *const u8, nb: usize) -> f32 {
    let Some(ty) = GgmlType::from_id(TY) else {
        return f32::NAN;
    };
    let (ts, bs) = (ty.type_size(), ty.block_size());
    // SAFETY: forwarded contract of `DotFn` (activations are f32 for this kernel).
    let (w, a) = unsafe { parts::<f32>(w, nb * ts, a, nb * bs) };
    let mut buf = [0f32; 256];
    let mut acc = 0f32;
    for (b, x) in w.chunks_exact(ts).zip(a.chunks_exact(bs)) {
        if !super::decode::decode_block(ty, b, &mut buf[..bs]) {
            return f32::NAN;
        }
        acc += dot_f32_lanes_slices(&buf[..bs], x);
    }
    acc
}

/// The scalar kernel for `ty`, if any.
pub(crate) fn select(ty: GgmlType) -> Option<Kernel> {
    use GgmlType as T;
    let (act, dot): (ActKind, DotFn) = match ty {
        T::F32 => (ActKind::F32, dot_f32),
        // f16: ggml's orders over f16-rounded activations, the same on every path.
        T::F16 => return Some(super::f16_kernel()),
        T::BF16 => (ActKind::F32, dot_bf16),
        T::Q8_0 => (ActKind::Q8x32, dot_q8_0),
        T::Q4_0 => (ActKind::Q8x32, dot_q4_0),
        T::Q4_1 => (ActKind::Q8x32, dot_q4_1),
        T::Q5_0 => (ActKind::Q8x32, dot_q5_0),
        T::Q5_1 => (ActKind::Q8x32, dot_q5_1),
        T::Q4_K => (ActKind::Q8K, dot_q4_k),
        T::Q5_K => (ActKind::Q8K, dot_q5_k),
        T::Q6_K => (ActKind::Q8K, dot_q6_k),
        T::Q2_K => (ActKind::Q8K, dot_q2_k),
        T::Q3_K => (ActKind::Q8K, dot_q3_k),
        T::IQ4_XS => (ActKind::Q8K, dot_iq4_xs),
        T::IQ4_NL => (ActKind::Q8x32, dot_iq4_nl),
        T::TQ1_0 => (ActKind::Q8K, dot_tq1_0),
        T::TQ2_0 => (ActKind::Q8K, dot_tq2_0),
        T::IQ2_XXS => (ActKind::Q8K, dot_iq2_xxs),
        T::IQ3_XXS => (ActKind::Q8K, dot_iq3_xxs),
        T::IQ3_S => (ActKind::Q8K, dot_iq3_s),
        T::IQ2_XS => (ActKind::Q8K, dot_iq2_xs),
        T::IQ2_S => (ActKind::Q8K, dot_iq2_s),
        T::IQ1_S => (ActKind::Q8K, dot_iq1_s),
        T::IQ1_M => (ActKind::Q8K, dot_iq1_m),
        T::MXFP4 => (ActKind::Q8x32, dot_mxfp4),
        T::NVFP4 => (ActKind::Q8x32, dot_nvfp4),
        T::Q1_0 => (ActKind::Q8x32, dot_q1_0),
        T::Q2_0 => (ActKind::Q8x32, dot_q2_0),
        _ => return decode_kernel(ty),
    };
    let many = match ty {
        T::IQ4_NL => Some((2, dot_iq4_nl_gemm as DotFn)),
        _ => many(ty),
    };
    Some(Kernel {
        act,
        dot,
        dot4: None,
        dot2: None,
        many,
        many4: None,
    })
}

/// A decode-then-dot kernel for `ty` when a block decoder exists.
pub(crate) fn decode_kernel(ty: GgmlType) -> Option<Kernel> {
    if !super::decode::can_decode(ty) || ty.block_size() > 256 {
        return None;
    }
    macro_rules! pick {
        ($($t:ident),*) => {
            match ty {
                $(GgmlType::$t => dot_decode::<{ GgmlType::$t as u32 }> as DotFn,)*
                _ => return None,
            }
        };
    }
    let dot = pick!(
        Q2_K, Q3_K, IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS, IQ1_M, TQ1_0,
        TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0, Q8_1, Q8_K
    );
    Some(Kernel {
        act: ActKind::F32,
        dot,
        dot4: None,
        dot2: None,
        many: None,
        many4: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slice form of the eight-lane f32 dot gives the iterator form's bits, at lengths
    /// with and without a remainder.
    #[test]
    fn slice_dot_equals_the_iterator_dot() {
        let mut seed = 0x9e37_79b9u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32 - 0.5) * 3.0
        };
        for n in [1usize, 7, 8, 9, 31, 32, 256, 261] {
            let w: Vec<f32> = (0..n).map(|_| next()).collect();
            let a: Vec<f32> = (0..n).map(|_| next()).collect();
            let want = dot_f32_lanes(w.iter().copied(), &a);
            assert_eq!(
                dot_f32_lanes_slices(&w, &a).to_bits(),
                want.to_bits(),
                "n = {n}"
            );
        }
    }
}
