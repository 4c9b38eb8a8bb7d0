//! BitNet's W1.58A8 GEMV/GEMM (`QuantMatrix::from_ternary_a8`): ternary weights with one scale
//! for the tensor against 8-bit activations with one scale per row, summed as exact integers.
//!
//! Weights: per row, per 256 elements 64 bytes in TQ2_0's code layout without its scale
//! (element `128h + 32l + m` in bits `2l` of byte `32h + m`, as the code `t + 1`).
//! Activations: [`ActKind::Q8KRow`](crate::act::ActKind) blocks re-laid out by
//! [`super::prepare_tq2`] (each block's quarters interleaved so 64 bytes serve code
//! vector `l` of both halves; the bsums as negated pair sums). Paths: scalar, AVX2, AVX-512 VNNI,
//! NEON. Each output is
//! `Σ code·q − Σ q` (an exact integer: |Σ| ≤ 256·K) times `d_a · γ` — one product after one
//! exact integer sum, so every path (scalar, AVX2, AVX-512) gives the same bits.

/// Bytes of one 256-element weight block.
pub(crate) const WB: usize = 64;
/// Bytes of one prepared activation block ([`super::PAK`]: `qs` at 0, the negated pair
/// bsums at [`super::PAK_BSUMS`], `d` at [`super::PAK_D`]).
const AK: usize = super::PAK;
use super::{PAK_BSUMS, PAK_D};

/// `Σ q` of one prepared activation row (`nb` blocks): minus the sum of its bsum lanes.
fn row_sum(a: &[u8], nb: usize) -> i32 {
    let mut s = 0i32;
    for b in a[..nb * AK].chunks_exact(AK) {
        for j in 0..8 {
            let o = PAK_BSUMS + 4 * j;
            s -= i32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        }
    }
    s
}

/// `Σ code·q` of weight row `w` (`nb` blocks) against prepared activation row `a`, scalar.
fn dot_scalar(w: &[u8], a: &[u8], nb: usize) -> i32 {
    let mut s = 0i32;
    for i in 0..nb {
        let (wb, ab) = (&w[i * WB..(i + 1) * WB], &a[i * AK..i * AK + 256]);
        // Chunk l of the prepared block: [v_l | v_{4+l}] = codes l of bytes 0..32, then of
        // bytes 32..64.
        for l in 0..4 {
            for (j, &byte) in wb.iter().enumerate() {
                let code = ((byte >> (2 * l)) & 3) as i32;
                s += code * ab[64 * l + j] as i8 as i32;
            }
        }
    }
    s
}

/// Outputs `y[t·ystride + r] = (Σ t·q) · (d_a · γ)` for weight rows `r0..r1` and `n` prepared
/// activation rows (`d_a` read from each row's first block).
///
/// # Safety
/// `w` holds the rows (`nb · 64` bytes each), `a` holds `n · nb` prepared blocks, `y` is valid
/// for the writes, and the CPU supports `path`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows(
    path: crate::dispatch::KernelPath,
    w: &[u8],
    nb: usize,
    a: &[u8],
    n: usize,
    gamma: f32,
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    let rb = nb * WB;
    let mut sums = [0i32; 8];
    for t0 in (0..n).step_by(8) {
        let k = (n - t0).min(8);
        let bias: [i32; 8] = std::array::from_fn(|t| {
            if t < k {
                row_sum(&a[(t0 + t) * nb * AK..], nb)
            } else {
                0
            }
        });
        let scale: [f32; 8] = std::array::from_fn(|t| {
            if t < k {
                let b = (t0 + t) * nb * AK + PAK_D;
                f32::from_le_bytes([a[b], a[b + 1], a[b + 2], a[b + 3]]) * gamma
            } else {
                0.0
            }
        });
        // Output rows r and activation rows t0..t0 + k from their exact sums.
        let store = |r: usize, sums: &[i32; 8]| {
            for t in 0..k {
                let v = (sums[t] - bias[t]) as f32 * scale[t];
                // SAFETY: the caller's contract.
                unsafe { *y.add((t0 + t) * ystride + r) = v };
            }
        };
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut r = r0;
        #[cfg(target_arch = "x86_64")]
        if path == crate::dispatch::KernelPath::Avx512Vnni && k >= 2 {
            // Two weight rows and up to four activation rows a pass: each block's codes
            // unpacked once for all of them, each activation chunk loaded once for two.
            while r + 2 <= r1 {
                let mut s2 = [[0i32; 8]; 2];
                let mut t = 0;
                while t < k {
                    let m = (k - t).min(4);
                    let (wp, ar) = (w[r * rb..].as_ptr(), a[(t0 + t) * nb * AK..].as_ptr());
                    // SAFETY: AVX-512 VNNI (the path); rows r, r + 1 of `w` and activation rows
                    // t0 + t .. + m hold nb blocks each.
                    unsafe {
                        macro_rules! go {
                            ($m:literal) => {{
                                let o = x86::dot512_2xt::<$m>(wp, rb, ar, nb * AK, nb);
                                s2[0][t..t + $m].copy_from_slice(&o[0]);
                                s2[1][t..t + $m].copy_from_slice(&o[1]);
                            }};
                        }
                        match m {
                            1 => go!(1),
                            2 => go!(2),
                            3 => go!(3),
                            _ => go!(4),
                        }
                    }
                    t += m;
                }
                store(r, &s2[0]);
                store(r + 1, &s2[1]);
                r += 2;
            }
        }
        for r in r..r1 {
            let wr = &w[r * rb..(r + 1) * rb];
            for (t, s) in sums.iter_mut().enumerate().take(k) {
                let ar = &a[(t0 + t) * nb * AK..(t0 + t + 1) * nb * AK];
                // SAFETY: the caller's contract (CPU features for `path`; whole blocks).
                *s = unsafe { dot(path, wr, ar, nb) };
            }
            store(r, &sums);
        }
    }
}

/// `Σ code·q` on the best code `path` has.
///
/// # Safety
/// The CPU supports `path`; `w` and `a` hold `nb` blocks.
#[inline]
unsafe fn dot(path: crate::dispatch::KernelPath, w: &[u8], a: &[u8], nb: usize) -> i32 {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::dispatch::KernelPath as P;
        match path {
            // SAFETY: the path is supported (caller).
            P::Avx512Vnni => return unsafe { x86::dot512(w.as_ptr(), a.as_ptr(), nb) },
            P::Avx2 | P::AvxVnni => return unsafe { x86::dot256(w.as_ptr(), a.as_ptr(), nb) },
            _ => {}
        }
    }
    #[cfg(target_arch = "aarch64")]
    if path == crate::dispatch::KernelPath::Neon {
        // SAFETY: the path is supported (caller); whole blocks.
        return unsafe { neon::dot(w.as_ptr(), a.as_ptr(), nb) };
    }
    let _ = path;
    dot_scalar(w, a, nb)
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::{AK, WB};
    use std::arch::aarch64::*;

    /// Baseline NEON: 16 code bytes at a time, the four code vectors by shift and mask, signed
    /// widening products (codes ≤ 2 read as signed bytes) pairwise-added into i32 lanes.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn dot(w: *const u8, a: *const u8, nb: usize) -> i32 {
        let m3 = vdupq_n_u8(3);
        let mut acc = [vdupq_n_s32(0); 4];
        for i in 0..nb {
            // SAFETY: whole blocks (caller).
            unsafe {
                let ab = a.add(i * AK);
                for p in 0..4 {
                    let q = vld1q_u8(w.add(i * WB + 16 * p));
                    let codes = [
                        vandq_u8(q, m3),
                        vandq_u8(vshrq_n_u8::<2>(q), m3),
                        vandq_u8(vshrq_n_u8::<4>(q), m3),
                        vshrq_n_u8::<6>(q),
                    ];
                    for (l, c) in codes.into_iter().enumerate() {
                        let c = vreinterpretq_s8_u8(c);
                        let x = vld1q_s8(ab.add(64 * l + 16 * p).cast());
                        let lo = vmull_s8(vget_low_s8(c), vget_low_s8(x));
                        let hi = vmull_high_s8(c, x);
                        acc[l] = vpadalq_s16(vpadalq_s16(acc[l], lo), hi);
                    }
                }
            }
        }
        vaddvq_s32(vaddq_s32(
            vaddq_s32(acc[0], acc[1]),
            vaddq_s32(acc[2], acc[3]),
        ))
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{AK, WB};
    use std::arch::x86_64::*;

    /// Bytes ahead of the current block prefetched into L2 (kbench_a8 2560×6912 from DRAM, one
    /// thread: no prefetch or 1.5 KB into L1 11–12 GB/s, 4 KB into L2 17.7, 6–16 KB 20–21; two
    /// threads 6 KB 28 GB/s — the one-row GEMVs' distance, `gemv32::PREFETCH`).
    const PREFETCH: usize = 6144;

    /// The four code vectors of 64 bytes of 2-bit codes (vector `l`: bits `2l` of every byte,
    /// as bytes 0..=3) by shift and mask — TQ2_0's layout, shared with `gemvk`'s TQ2_0 kernel.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(crate) fn unpack2(q: __m512i) -> [__m512i; 4] {
        let m3 = _mm512_set1_epi8(3);
        [
            _mm512_and_si512(q, m3),
            _mm512_and_si512(_mm512_srli_epi16(q, 2), m3),
            _mm512_and_si512(_mm512_srli_epi16(q, 4), m3),
            _mm512_and_si512(_mm512_srli_epi16(q, 6), m3),
        ]
    }

    /// AVX-512 VNNI: one 64-byte block of codes per register, four `vpdpbusd` against the
    /// prepared chunks; eight accumulators (two blocks × four code vectors), so no chain of
    /// dependent `vpdpbusd` limits the loop.
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn dot512(w: *const u8, a: *const u8, nb: usize) -> i32 {
        let mut acc = [_mm512_setzero_si512(); 8];
        // SAFETY (both loops): whole blocks (caller).
        let block = |acc: &mut [__m512i], i: usize| unsafe {
            let q = _mm512_loadu_si512(w.add(i * WB).cast());
            _mm_prefetch::<_MM_HINT_T1>(w.wrapping_add(i * WB + PREFETCH).cast());
            let ab = a.add(i * AK);
            let codes = unpack2(q);
            for (l, c) in codes.into_iter().enumerate() {
                acc[l] = _mm512_dpbusd_epi32(acc[l], c, _mm512_loadu_si512(ab.add(64 * l).cast()));
            }
        };
        let mut i = 0;
        while i + 2 <= nb {
            let (lo, hi) = acc.split_at_mut(4);
            block(lo, i);
            block(hi, i + 1);
            i += 2;
        }
        if i < nb {
            block(&mut acc[..4], i);
        }
        let s = |x: usize, y: usize| _mm512_add_epi32(acc[x], acc[y]);
        let t = _mm512_add_epi32(
            _mm512_add_epi32(s(0, 4), s(1, 5)),
            _mm512_add_epi32(s(2, 6), s(3, 7)),
        );
        _mm512_reduce_add_epi32(t)
    }

    /// [`dot512`] of two weight rows (`w`, `w + ws`) against `T` (1..=4) activation rows
    /// (`a + t·s`):
    /// each block's codes extracted once and each activation chunk loaded once for both weight
    /// rows (exact integers: the same sums as `2·T` [`dot512`] calls). `out[h][t]` is weight
    /// row `h` against activation row `t`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn dot512_2xt<const T: usize>(
        w: *const u8,
        ws: usize,
        a: *const u8,
        s: usize,
        nb: usize,
    ) -> [[i32; T]; 2] {
        let mut acc = [[_mm512_setzero_si512(); T]; 2];
        for i in 0..nb {
            // SAFETY: whole blocks of both weight rows and of the T activation rows (caller).
            unsafe {
                let codes = |wr: *const u8| {
                    _mm_prefetch::<_MM_HINT_T1>(wr.wrapping_add(i * WB + PREFETCH).cast());
                    unpack2(_mm512_loadu_si512(wr.add(i * WB).cast()))
                };
                let c = [codes(w), codes(w.add(ws))];
                for t in 0..T {
                    let ab = a.add(t * s + i * AK);
                    for l in 0..4 {
                        let av = _mm512_loadu_si512(ab.add(64 * l).cast());
                        acc[0][t] = _mm512_dpbusd_epi32(acc[0][t], c[0][l], av);
                        acc[1][t] = _mm512_dpbusd_epi32(acc[1][t], c[1][l], av);
                    }
                }
            }
        }
        acc.map(|r| r.map(|v| _mm512_reduce_add_epi32(v)))
    }

    /// AVX2: each block as two 32-byte halves, `maddubs` (codes ≤ 2, so the i16 pair sums
    /// never saturate) then `madd` to i32 lanes.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot256(w: *const u8, a: *const u8, nb: usize) -> i32 {
        let m3 = _mm256_set1_epi8(3);
        let one = _mm256_set1_epi16(1);
        let mut acc = _mm256_setzero_si256();
        for i in 0..nb {
            // SAFETY: whole blocks (caller).
            unsafe {
                let ab = a.add(i * AK);
                let mut s16 = _mm256_setzero_si256();
                for h in 0..2 {
                    let q = _mm256_loadu_si256(w.add(i * WB + 32 * h).cast());
                    let codes = [
                        _mm256_and_si256(q, m3),
                        _mm256_and_si256(_mm256_srli_epi16(q, 2), m3),
                        _mm256_and_si256(_mm256_srli_epi16(q, 4), m3),
                        _mm256_and_si256(_mm256_srli_epi16(q, 6), m3),
                    ];
                    for (l, c) in codes.into_iter().enumerate() {
                        let av = _mm256_loadu_si256(ab.add(64 * l + 32 * h).cast());
                        // Per block at most 8 pair sums of ≤ 2·2·128 per i16 lane: no overflow.
                        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(c, av));
                    }
                }
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(s16, one));
            }
        }
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(acc),
            _mm256_extracti128_si256(acc, 1),
        );
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)))
    }
}
