//! The scalar reference kernels: the same integer arithmetic as the SIMD paths (quantized
//! activations, block sums, one float multiply-add per block), written plainly.

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

#[inline]
fn idot(w: &[u8; 32], a: &[i8; 32]) -> i32 {
    w.iter().zip(a).map(|(&w, &a)| w as i32 * a as i32).sum()
}

unsafe fn dot_q8_0(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8x32>(w, nb * 34, a, nb) };
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(34).zip(a) {
        let s: i32 = b[2..34]
            .iter()
            .zip(&y.qs)
            .map(|(&w, &a)| (w as i8) as i32 * a as i32)
            .sum();
        acc += f16_at(b, 0) * y.d * s as f32;
    }
    acc
}

unsafe fn dot_q4_0(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8x32>(w, nb * 18, a, nb) };
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(18).zip(a) {
        let s = idot(&unpack_nibbles32(&b[2..18]), &y.qs) - 8 * y.sum;
        acc += f16_at(b, 0) * y.d * s as f32;
    }
    acc
}

unsafe fn dot_q4_1(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8x32>(w, nb * 20, a, nb) };
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(20).zip(a) {
        let s = idot(&unpack_nibbles32(&b[4..20]), &y.qs);
        acc += f16_at(b, 0) * y.d * s as f32 + f16_at(b, 2) * y.d * y.sum as f32;
    }
    acc
}

unsafe fn dot_q5_0(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8x32>(w, nb * 22, a, nb) };
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(22).zip(a) {
        let s = idot(&unpack_q5(u32_at(b, 2), &b[6..22]), &y.qs) - 16 * y.sum;
        acc += f16_at(b, 0) * y.d * s as f32;
    }
    acc
}

unsafe fn dot_q5_1(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8x32>(w, nb * 24, a, nb) };
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(24).zip(a) {
        let s = idot(&unpack_q5(u32_at(b, 4), &b[8..24]), &y.qs);
        acc += f16_at(b, 0) * y.d * s as f32 + f16_at(b, 2) * y.d * y.sum as f32;
    }
    acc
}

/// Q4_K and Q5_K share scales/mins: Σ_j sc_j·Σ(code·a) and Σ_j m_j·(bsum_2j + bsum_2j+1).
#[inline]
fn kq_scaled(b: &[u8], codes: &[u8; 256], y: &BlockQ8K) -> f32 {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (mut sumi, mut summ) = (0i32, 0i32);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &b[Q4K_SCALES..Q4K_SCALES + 12]);
        let dot: i32 = codes[j * 32..j * 32 + 32]
            .iter()
            .zip(&y.qs[j * 32..j * 32 + 32])
            .map(|(&c, &a)| c as i32 * a as i32)
            .sum();
        sumi += sc as i32 * dot;
        summ += m as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
    }
    y.d * (d * sumi as f32 - dmin * summ as f32)
}

unsafe fn dot_q4_k(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 144, a, nb) };
    w.chunks_exact(144)
        .zip(a)
        .map(|(b, y)| kq_scaled(b, &unpack_q4k(&b[Q4K_QS..Q4K_QS + 128]), y))
        .sum()
}

unsafe fn dot_q5_k(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 176, a, nb) };
    w.chunks_exact(176)
        .zip(a)
        .map(|(b, y)| {
            let codes = unpack_q5k(&b[Q5K_QH..Q5K_QH + 32], &b[Q5K_QS..Q5K_QS + 128]);
            kq_scaled(b, &codes, y)
        })
        .sum()
}

unsafe fn dot_q6_k(w: *const u8, a: *const u8, nb: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe { parts::<BlockQ8K>(w, nb * 210, a, nb) };
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(210).zip(a) {
        let codes = unpack_q6k(&b[..128], &b[Q6K_QH..Q6K_QH + 64]);
        let mut sumi = 0i32;
        for g in 0..16 {
            let dot: i32 = codes[g * 16..g * 16 + 16]
                .iter()
                .zip(&y.qs[g * 16..g * 16 + 16])
                .map(|(&c, &a)| c as i32 * a as i32)
                .sum();
            sumi += (b[Q6K_SCALES + g] as i8) as i32 * (dot - 32 * y.bsums[g] as i32);
        }
        acc += f16_at(b, Q6K_D) * y.d * sumi as f32;
    }
    acc
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
    })
}
