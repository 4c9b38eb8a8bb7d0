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
        summs += -y.d * f16_at(b, 2) * total as f32;
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

/// The many-row (≥ [`super::MANY_ROWS`]) kernel for `ty`, where ggml's order differs.
pub(crate) fn many(ty: GgmlType) -> Option<(usize, DotFn)> {
    let f: DotFn = match ty {
        GgmlType::Q4_K => dot_q4_k_tiled,
        GgmlType::Q5_K => dot_q5_k_tiled,
        GgmlType::Q6_K => dot_q6_k_tiled,
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

unsafe fn dot_f32(w: *const u8, a: *const u8, n: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<f32>(w, n * 4, a, n) };
    dot_f32_lanes(
        w.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        a,
    )
}

unsafe fn dot_f16(w: *const u8, a: *const u8, n: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<f32>(w, n * 2, a, n) };
    dot_f32_lanes(w.chunks_exact(2).map(|b| f16_at(b, 0)), a)
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
        acc += dot_f32_lanes(buf[..bs].iter().copied(), x);
    }
    acc
}

/// The scalar kernel for `ty`, if any.
pub(crate) fn select(ty: GgmlType) -> Option<Kernel> {
    use GgmlType as T;
    let (act, dot): (ActKind, DotFn) = match ty {
        T::F32 => (ActKind::F32, dot_f32),
        T::F16 => (ActKind::F32, dot_f16),
        T::BF16 => (ActKind::F32, dot_bf16),
        T::Q8_0 => (ActKind::Q8x32, dot_q8_0),
        T::Q4_0 => (ActKind::Q8x32, dot_q4_0),
        T::Q4_1 => (ActKind::Q8x32, dot_q4_1),
        T::Q5_0 => (ActKind::Q8x32, dot_q5_0),
        T::Q5_1 => (ActKind::Q8x32, dot_q5_1),
        T::Q4_K => (ActKind::Q8K, dot_q4_k),
        T::Q5_K => (ActKind::Q8K, dot_q5_k),
        T::Q6_K => (ActKind::Q8K, dot_q6_k),
        _ => return decode_kernel(ty),
    };
    Some(Kernel {
        act,
        dot,
        dot4: None,
        many: many(ty),
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
        many: None,
    })
}
