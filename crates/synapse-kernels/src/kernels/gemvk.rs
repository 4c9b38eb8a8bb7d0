//! A few activation rows against a Q4_K or Q6_K matrix (and any number against TQ2_0) on AVX-512 VNNI: two weight rows per
//! 512-bit register, one per 256-bit half, each pair unpacked once for up to [`max_n`]
//! activation rows, in the float order of ggml's `vec_dot_q4_K_q8_K` (x86) per
//! row: per super-block the 8 i32 lanes `Σ_c madd(maddubs(codes, q8), scale)`, `acc = fma(d_a·d,
//! lanes, acc)`; the mins in 4 lanes, `accm = fma(−d_a·dmin, madd(mins, pairwise bsums), accm)`;
//! at the end `hsum_float_8(acc) + (accm₀ + accm₂ + (accm₁ + accm₃))`; Q6_K: the lanes start
//! at `−32·madd(scales, bsums)` and add `madd(maddubs(codes, q8), scale)` per 32 elements —
//! the same bits as the per-row kernels, with every instruction serving two rows (and the
//! integer `madd` + add fused into one `vpdpwssd`: exact integers, same lane values).
//!
//! TQ2_0 (every activation-row count: ggml has no tiled order for it) in the order of
//! `vec_dot_tq2_0_q8_K` (x86): one 64-byte block of codes per register against activations
//! re-laid out once per call ([`super::prepare_tq2`]), the 2-bit codes extracted by GFNI affine maps
//! where the CPU has them (shift and mask otherwise); row pairs for several activation rows,
//! one row and two blocks per step for one (see [`tq2_dispatch`]).

use std::arch::x86_64::*;

use super::gemv32::{dpair, halves, prefetch_dist, row_pair, spread};
use super::ternary_i8::x86::unpack2;
use super::x86::avx512vnni::k4_scales;
use super::{PAK, PAK_BSUMS, PAK_D};
#[cfg(test)]
use super::{prepare_tq2, prepared_len};
use crate::blocks::{Q4K_QS, Q4K_SCALES, Q6K_D, Q6K_QH, Q6K_SCALES};
use synapse_formats::GgmlType;

/// The types this kernel handles.
pub(crate) fn supports(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K | GgmlType::TQ2_0)
}

/// Bytes of a Q4_K block and of a Q8_K activation block (`d`, `qs[256]`, `bsums[16]`).
const TS: usize = 144;
const AK: usize = 292;

/// The mins' 4 lanes reduced as the per-row kernel does: `(m0 + m2) + (m1 + m3)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn hsum4(v: __m128) -> f32 {
    let m2 = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(m2, _mm_movehdup_ps(m2)))
}

/// Most activation rows one pass over a weight-row pair serves (one accumulator set each);
/// more rows go in groups of this many. Q6_K's unpacked codes take four more registers, and
/// with 8 rows it spilled (kbench 640×2048, 2 threads, 8–64 rows: Q6_K ~160 GF/s with 8 per
/// pass, 180–210 with 4; Q4_K 180–200 with 8, 160–180 with 4).
const fn max_n(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q6_K => 4,
        _ => 8,
    }
}

/// Activation-row counts below this take this kernel; from it on, the tiled GEMM (which
/// measured 110–170 GF/s at 16–24 rows against this kernel's 160–210, and overtakes it from
/// about 32).
pub(crate) const UNTIL: usize = 32;

/// Word-index vector for `permutexvar_epi16`: words 0..16 take `lo`, words 16..32 `hi`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn widx2(lo: i16, hi: i16) -> __m512i {
    _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_set1_epi16(lo)),
        _mm256_set1_epi16(hi),
        1,
    )
}

/// Word-index vector: 8 words each of `a0`, `a1`, `b0`, `b1` (low to high).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn widx4(a0: i16, a1: i16, b0: i16, b1: i16) -> __m512i {
    _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16(a1), _mm_set1_epi16(a0))),
        _mm256_set_m128i(_mm_set1_epi16(b1), _mm_set1_epi16(b0)),
        1,
    )
}

/// Per 128-bit chunk of `x` and `y`: `[x0+x2, y0+y2, x1+x3, y1+y3]` (32-bit lanes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn p2(x: __m512i, y: __m512i) -> __m512i {
    _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y))
}

/// Per 128-bit chunk of two [`p2`] results: `[Σx, Σy, Σz, Σw]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q2(x: __m512i, y: __m512i) -> __m512i {
    _mm512_add_epi32(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y))
}

/// The tiled order's 16 outputs of a row pair and 8 activation rows, as lanes
/// `[a t0..4, b t0..4, a t4..8, b t4..8]` (`a`, `b` the weight rows, `t` the activation rows).
///
/// Each half (8 i32 lanes, one weight row) of `v[t]` summed: exact integers, any order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn reduce8(v: [__m512i; 8]) -> __m512i {
    let lo = q2(p2(v[0], v[1]), p2(v[2], v[3]));
    let hi = q2(p2(v[4], v[5]), p2(v[6], v[7]));
    // Chunks 0+1 are row a, 2+3 row b.
    _mm512_add_epi32(
        _mm512_shuffle_i64x2(lo, hi, 0x88),
        _mm512_shuffle_i64x2(lo, hi, 0xDD),
    )
}

/// The mins' sums in [`reduce8`]'s layout from each activation row's 8 lanes `m[t]`
/// (4 for row a, then 4 for row b).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn reduce_mins(m: [__m256i; 8]) -> __m512i {
    // [a_t, b_t, a_t+4, b_t+4] per register: the layout reduce8's first two levels leave.
    let z = |t: usize| _mm512_inserti64x4(_mm512_castsi256_si512(m[t]), m[t + 4], 1);
    q2(p2(z(0), z(1)), p2(z(2), z(3)))
}

/// Weight scales `[d_a, d_b]` (lanes 0, 1) spread to [`reduce8`]'s layout.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn spread_rows(d: __m128) -> __m512 {
    let idx = _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(d))
}

/// The `N` activation rows' scales of super-block `ai` in [`reduce8`]'s layout (0 past `N`).
///
/// # Safety
/// `ai + t·astride` holds a Q8_K block for `t < N`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn spread_acts<const N: usize>(ai: *const u8, astride: usize) -> __m512 {
    // SAFETY: caller.
    let d = |t: usize| unsafe {
        if t < N {
            std::ptr::read_unaligned(ai.add(t * astride).cast::<f32>())
        } else {
            0.0
        }
    };
    let lo = _mm_set_ps(d(3), d(2), d(1), d(0));
    let hi = _mm_set_ps(d(7), d(6), d(5), d(4));
    let z = _mm512_castps256_ps512(_mm256_set_m128(hi, lo));
    _mm512_shuffle_f32x4(z, z, 0x50)
}

/// Writes the tiled order's accumulator (layout of [`reduce8`]) for `N` activation rows.
///
/// # Safety
/// `y + t·ystride + r` (and `+ rb`) are valid for writes for `t < N`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn store_tiled<const N: usize>(
    acc: __m512,
    y: *mut f32,
    ystride: usize,
    r: usize,
    rb: usize,
) {
    let mut v = [0f32; 16];
    // SAFETY: 16 floats to a local array; the outputs by the caller.
    unsafe {
        _mm512_storeu_ps(v.as_mut_ptr(), acc);
        for t in 0..N {
            let base = if t < 4 { t } else { 8 + t - 4 };
            *y.add(t * ystride + r) = v[base];
            if rb != r {
                *y.add(t * ystride + rb) = v[base + 4];
            }
        }
    }
}

/// Output rows `r0..r1` of `W·X` (`ty` one of [`supports`]) for `n` Q8_K activation rows `a`
/// (`nb` blocks each, row `t` at `t·nb·292` bytes), written to `y[t·ystride + r]`. Each
/// weight-row pair is unpacked once for up to [`max_n`] activation rows (8 in the tiled order,
/// from [`super::MANY_ROWS`] rows, where ggml switches to its tiled matmul's float order:
/// per super-block `r = s1·d`, `r = fma(−dmin, s2, r)`, `acc = fma(r, d_a, acc)` on the whole
/// integer sums, each output one scalar chain — vectorised here across 2 weight × 8 activation
/// rows).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL, VNNI, FMA and F16C; `w` holds the rows (`row_bytes` each) of
/// `nb` blocks of `ty`; `a` holds `n·nb` Q8_K blocks; `y` is valid for writes at
/// `t·ystride + r` (`t < n`, `r0 <= r < r1`), which this call alone writes.
///
/// `tiled` picks the float order: ggml's `vec_dot` (false: what a call of fewer than
/// [`super::MANY_ROWS`] rows sums in) or its tiled matmul's (true), for any `n`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    a: &[u8],
    n: usize,
    tiled: bool,
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    // TQ2_0's activations come re-laid out by `prepare_tq2` (PAK bytes a block).
    let ak = if ty == GgmlType::TQ2_0 { PAK } else { AK };
    debug_assert!(a.len() >= n * nb * ak);
    let mut t0 = 0;
    while t0 < n {
        let k = (n - t0).min(if tiled { 8 } else { max_n(ty) });
        // SAFETY: forwarded contract, for activation rows t0..t0 + k.
        unsafe {
            let (at, yt) = (a.as_ptr().add(t0 * nb * ak), y.add(t0 * ystride));
            macro_rules! go {
                ($f:ident, $t:literal) => {
                    match k {
                        1 => $f::<1, $t>(w, row_bytes, nb, at, yt, ystride, r0, r1),
                        2 => $f::<2, $t>(w, row_bytes, nb, at, yt, ystride, r0, r1),
                        3 => $f::<3, $t>(w, row_bytes, nb, at, yt, ystride, r0, r1),
                        4 => $f::<4, $t>(w, row_bytes, nb, at, yt, ystride, r0, r1),
                        5 => $f::<5, $t>(w, row_bytes, nb, at, yt, ystride, r0, r1),
                        6 => $f::<6, $t>(w, row_bytes, nb, at, yt, ystride, r0, r1),
                        7 => $f::<7, $t>(w, row_bytes, nb, at, yt, ystride, r0, r1),
                        8 => $f::<8, $t>(w, row_bytes, nb, at, yt, ystride, r0, r1),
                        _ => unreachable!("1..=8 rows"),
                    }
                };
            }
            if ty == GgmlType::TQ2_0 {
                // ggml has no tiled order for TQ2_0: `vec_dot` at every row count.
                if std::is_x86_feature_detected!("gfni") {
                    go!(tq2_rows_gfni, false)
                } else {
                    go!(tq2_rows_shift, false)
                }
                t0 += k;
                continue;
            }
            match (ty == GgmlType::Q6_K, tiled) {
                (true, false) => go!(q6k_rows, false),
                (true, true) => go!(q6k_rows, true),
                (false, false) => go!(q4k_rows, false),
                (false, true) => go!(q4k_rows, true),
            }
        }
        t0 += k;
    }
}

/// [`rows`] for Q4_K and `N` activation rows.
///
/// # Safety
/// As [`rows`], with `a` pointing at `N` activation rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn q4k_rows<const N: usize, const TILED: bool>(
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    a: *const u8,
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    let m4 = _mm512_set1_epi8(15);
    let astride = nb * AK;
    let dist = prefetch_dist(row_bytes);
    let mut r = r0;
    while r < r1 {
        let (rb, pa, pb) = row_pair(w, row_bytes, r, r1);
        // SAFETY: rows r and rb are inside `w`; blocks and activations sized by the caller.
        unsafe {
            let mut acc = [_mm512_setzero_ps(); N];
            let mut accm = [_mm256_setzero_ps(); N];
            let mut acc1 = _mm512_setzero_ps();
            for i in 0..nb {
                let (wa, wb, ai) = (pa.add(i * TS), pb.add(i * TS), a.add(i * AK));
                for k in [0, 64, 128] {
                    _mm_prefetch::<_MM_HINT_T1>(wa.wrapping_add(dist + k).cast());
                    _mm_prefetch::<_MM_HINT_T1>(wb.wrapping_add(dist + k).cast());
                }
                let (sca, ma) = k4_scales(wa.add(Q4K_SCALES));
                let (scb, mb) = k4_scales(wb.add(Q4K_SCALES));
                // Scales as words: [a0..a7, b0..b7] in a ymm, spread per sub-block below.
                let sc16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_set_epi64x(
                    i64::from_le_bytes(scb),
                    i64::from_le_bytes(sca),
                )));
                // Per lane Σ_c scale·madd(maddubs(codes, q8)): exact integers, so the
                // `vpdpwssd` accumulation gives ggml's lane values.
                let mut sumi = [_mm512_setzero_si512(); N];
                for c in 0..4 {
                    let q = ld2(wa, wb, Q4K_QS + 32 * c);
                    let lo = _mm512_and_si512(q, m4);
                    let hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                    let (j0, j1) = (2 * c as i16, 2 * c as i16 + 1);
                    let s_lo = _mm512_permutexvar_epi16(widx2(j0, j0 + 8), sc16);
                    let s_hi = _mm512_permutexvar_epi16(widx2(j1, j1 + 8), sc16);
                    for (t, st) in sumi.iter_mut().enumerate() {
                        let ab = ai.add(t * astride + 4 + 64 * c);
                        let alo = _mm512_broadcast_i64x4(_mm256_loadu_si256(ab.cast()));
                        let ahi = _mm512_broadcast_i64x4(_mm256_loadu_si256(ab.add(32).cast()));
                        *st = _mm512_dpwssd_epi32(*st, _mm512_maddubs_epi16(lo, alo), s_lo);
                        *st = _mm512_dpwssd_epi32(*st, _mm512_maddubs_epi16(hi, ahi), s_hi);
                    }
                }
                // Mins: madd(mins, pairwise bsums), 4 lanes per row.
                let mv = _mm256_cvtepu8_epi16(_mm_set_epi64x(
                    i64::from_le_bytes(mb),
                    i64::from_le_bytes(ma),
                ));
                let (dw, dmw) = (dpair(wa, wb), dpair(wa.add(2), wb.add(2)));
                if TILED {
                    let mut s1 = [_mm512_setzero_si512(); 8];
                    s1[..N].copy_from_slice(&sumi);
                    let mut mins = [_mm256_setzero_si256(); 8];
                    for (t, m) in mins.iter_mut().enumerate().take(N) {
                        let ab = ai.add(t * astride);
                        let q8s = _mm_hadd_epi16(
                            _mm_loadu_si128(ab.add(260).cast()),
                            _mm_loadu_si128(ab.add(276).cast()),
                        );
                        *m = _mm256_madd_epi16(mv, _mm256_set_m128i(q8s, q8s));
                    }
                    let s1 = _mm512_cvtepi32_ps(reduce8(s1));
                    let s2 = _mm512_cvtepi32_ps(reduce_mins(mins));
                    // r = s1·d; r = fma(−dmin, s2, r) (`fnmadd`: the same single rounding).
                    let r =
                        _mm512_fnmadd_ps(spread_rows(dmw), s2, _mm512_mul_ps(s1, spread_rows(dw)));
                    acc1 = _mm512_fmadd_ps(r, spread_acts::<N>(ai, astride), acc1);
                    continue;
                }
                for t in 0..N {
                    let ab = ai.add(t * astride);
                    let da = std::ptr::read_unaligned(ab.cast::<f32>());
                    let q8s = _mm_hadd_epi16(
                        _mm_loadu_si128(ab.add(260).cast()),
                        _mm_loadu_si128(ab.add(276).cast()),
                    );
                    let prod = _mm256_madd_epi16(mv, _mm256_set_m128i(q8s, q8s));
                    let dmin = _mm_mul_ps(dmw, _mm_set1_ps(-da));
                    let dm = _mm256_permutexvar_ps(
                        _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0),
                        _mm256_castps128_ps256(dmin),
                    );
                    accm[t] = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(prod), accm[t]);
                    acc[t] = _mm512_fmadd_ps(spread(dw, da), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
                }
            }
            if TILED {
                store_tiled::<N>(acc1, y, ystride, r, rb);
                r += 2;
                continue;
            }
            for t in 0..N {
                let (ya, yb) = halves(acc[t]);
                // `+ 0.0`: the per-row kernel adds Q5_K's (here empty) scalar min sum there.
                *y.add(t * ystride + r) = ya + (hsum4(_mm256_castps256_ps128(accm[t])) + 0.0);
                if rb != r {
                    *y.add(t * ystride + rb) =
                        yb + (hsum4(_mm256_extractf128_ps(accm[t], 1)) + 0.0);
                }
            }
        }
        r += 2;
    }
}

/// Bytes of a Q6_K block.
const TS6: usize = 210;

/// Two rows' 32-byte chunks at `a + off` and `b + off` as one zmm (row `a` low).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn ld2(a: *const u8, b: *const u8, off: usize) -> __m512i {
    // SAFETY: 32 bytes at both addresses (caller).
    unsafe {
        _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(a.add(off).cast())),
            _mm256_loadu_si256(b.add(off).cast()),
            1,
        )
    }
}

/// [`rows`] for Q6_K and `N` activation rows.
///
/// # Safety
/// As [`rows`], with `a` pointing at `N` activation rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn q6k_rows<const N: usize, const TILED: bool>(
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    a: *const u8,
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    let m4 = _mm512_set1_epi8(15);
    let m2 = _mm512_set1_epi8(3);
    let astride = nb * AK;
    let dist = prefetch_dist(row_bytes);
    let mut r = r0;
    while r < r1 {
        let (rb, pa, pb) = row_pair(w, row_bytes, r, r1);
        // SAFETY: rows r and rb are inside `w`; blocks and activations sized by the caller.
        unsafe {
            let mut acc = [_mm512_setzero_ps(); N];
            let mut acc1 = _mm512_setzero_ps();
            for i in 0..nb {
                let (wa, wb, ai) = (pa.add(i * TS6), pb.add(i * TS6), a.add(i * AK));
                for k in [0, 64, 128, 192] {
                    _mm_prefetch::<_MM_HINT_T1>(wa.wrapping_add(dist + k).cast());
                    _mm_prefetch::<_MM_HINT_T1>(wb.wrapping_add(dist + k).cast());
                }
                // Scales as words: row a's 16 in words 0..16, row b's in 16..32.
                let sc16 = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128(wa.add(Q6K_SCALES).cast())),
                    _mm_loadu_si128(wb.add(Q6K_SCALES).cast()),
                    1,
                ));
                // −32·Σ_g sc_g·bsum_g, the lanes' start (exact integers throughout).
                let mut sumi = [_mm512_setzero_si512(); N];
                for (t, st) in sumi.iter_mut().enumerate() {
                    let bs = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        ai.add(t * astride + 260).cast(),
                    ));
                    let corr = _mm512_madd_epi16(sc16, bs);
                    *st = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(corr, 5));
                }
                for h in 0..2 {
                    let ql0 = ld2(wa, wb, 64 * h);
                    let ql1 = ld2(wa, wb, 64 * h + 32);
                    let qh = ld2(wa, wb, Q6K_QH + 32 * h);
                    let hb = |v: __m512i| _mm512_slli_epi16(_mm512_and_si512(v, m2), 4);
                    let codes = [
                        _mm512_or_si512(_mm512_and_si512(ql0, m4), hb(qh)),
                        _mm512_or_si512(_mm512_and_si512(ql1, m4), hb(_mm512_srli_epi16(qh, 2))),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16(ql0, 4), m4),
                            hb(_mm512_srli_epi16(qh, 4)),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16(ql1, 4), m4),
                            hb(_mm512_srli_epi16(qh, 6)),
                        ),
                    ];
                    for (k, c) in codes.into_iter().enumerate() {
                        let g = (h * 8 + 2 * k) as i16;
                        // Words: [a_g ×8, a_g+1 ×8, b_g ×8, b_g+1 ×8].
                        let s = _mm512_permutexvar_epi16(widx4(g, g + 1, g + 16, g + 17), sc16);
                        for (t, st) in sumi.iter_mut().enumerate() {
                            let av = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                ai.add(t * astride + 4 + 16 * g as usize).cast(),
                            ));
                            *st = _mm512_dpwssd_epi32(*st, _mm512_maddubs_epi16(c, av), s);
                        }
                    }
                }
                let dw = dpair(wa.add(Q6K_D), wb.add(Q6K_D));
                if TILED {
                    let mut s1 = [_mm512_setzero_si512(); 8];
                    s1[..N].copy_from_slice(&sumi);
                    let r = _mm512_mul_ps(_mm512_cvtepi32_ps(reduce8(s1)), spread_rows(dw));
                    acc1 = _mm512_fmadd_ps(r, spread_acts::<N>(ai, astride), acc1);
                    continue;
                }
                for t in 0..N {
                    let da = std::ptr::read_unaligned(ai.add(t * astride).cast::<f32>());
                    acc[t] = _mm512_fmadd_ps(spread(dw, da), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
                }
            }
            if TILED {
                store_tiled::<N>(acc1, y, ystride, r, rb);
                r += 2;
                continue;
            }
            for (t, at) in acc.iter().enumerate() {
                let (ya, yb) = halves(*at);
                *y.add(t * ystride + r) = ya;
                if rb != r {
                    *y.add(t * ystride + rb) = yb;
                }
            }
        }
        r += 2;
    }
}

/// Bytes of a TQ2_0 block (`qs[64]`, f16 `d`).
const TS2: usize = 66;

/// [`rows`] for TQ2_0 with the 2-bit codes extracted by shift and mask.
///
/// # Safety
/// As [`rows`], with `a` pointing at `N` activation rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn tq2_rows_shift<const N: usize, const TILED: bool>(
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    a: *const u8,
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    // SAFETY: forwarded contract.
    unsafe { tq2_dispatch::<N>(w, row_bytes, nb, a, y, ystride, r0, r1, |q| unpack2(q)) }
}

/// [`rows`] for TQ2_0 with the 2-bit codes extracted by one GF(2) affine map each
/// (`vgf2p8affineqb`: bits `2l, 2l+1` of every byte to bits 0, 1, the rest cleared).
///
/// # Safety
/// As [`rows`], and the CPU has GFNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
#[allow(clippy::too_many_arguments)]
unsafe fn tq2_rows_gfni<const N: usize, const TILED: bool>(
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    a: *const u8,
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    // Output bit i of a byte is the parity of (matrix byte 7 − i) & input: bit 0 ← input
    // bit 2l (byte 7), bit 1 ← input bit 2l + 1 (byte 6).
    let m =
        |l: u32| _mm512_set1_epi64((((1u64 << (2 * l)) << 56) | ((2u64 << (2 * l)) << 48)) as i64);
    let (m0, m1, m2, m3) = (m(0), m(1), m(2), m(3));
    let codes = |q: __m512i| {
        [
            _mm512_gf2p8affine_epi64_epi8::<0>(q, m0),
            _mm512_gf2p8affine_epi64_epi8::<0>(q, m1),
            _mm512_gf2p8affine_epi64_epi8::<0>(q, m2),
            _mm512_gf2p8affine_epi64_epi8::<0>(q, m3),
        ]
    };
    // SAFETY: forwarded contract.
    unsafe { tq2_dispatch::<N>(w, row_bytes, nb, a, y, ystride, r0, r1, codes) }
}

/// Bytes ahead of the current block the one-row TQ2_0 kernel prefetches into L2 (the 2-bit
/// W1.58A8 kernel's distance). Measured from DRAM (kbench_ggml, 2 threads, three alternating
/// rounds, % of the paired streaming read): 1536 bytes into L1 with two lines a pair 80–82% at
/// 2560×2560, 83–84% at 6912×2560, 73–74% at 640×2560; this, three lines a pair, 89–93%,
/// 92–96%, 81–89% (2560×6912 alike, 83–90%).
const TQ2_PREFETCH: usize = 6144;

/// [`tq2_body`] and [`tq2_body1`] by activation-row count: with one activation row, one
/// weight row at a time (one weight stream per thread: a row pair's two streams measured
/// 10–20% slower from DRAM, kbench_ggml 2560×6912, 2 threads), otherwise row pairs (codes
/// unpacked once for both rows and every activation row).
///
/// # Safety
/// As [`tq2_body`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tq2_dispatch<const N: usize>(
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    a: *const u8,
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
    codes: impl Fn(__m512i) -> [__m512i; 4],
) {
    // SAFETY: forwarded contract.
    unsafe {
        if N == 1 {
            tq2_body1::<N>(w, row_bytes, nb, a, y, ystride, r0, r1, codes)
        } else {
            tq2_body::<N>(w, row_bytes, nb, a, y, ystride, r0, r1, codes)
        }
    }
}

/// [`tq2_body`]'s order, one weight row at a time and two of its blocks per step: the two
/// blocks' lanes in one register (`[block i | block i + 1]`), then `acc = fma(lanes, d, acc)`
/// for block `i`, then for block `i + 1` (8 lanes each, as ggml).
///
/// # Safety
/// As [`tq2_body`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tq2_body1<const N: usize>(
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    a: *const u8,
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
    codes: impl Fn(__m512i) -> [__m512i; 4],
) {
    let astride = nb * PAK;
    /// One block's lanes, each half apart: code vectors `l` against [`super::prepare_tq2`]'s chunk
    /// `l` in two chains (exact integers).
    #[inline(always)]
    unsafe fn lanes(c: &[__m512i; 4], ab: *const u8) -> __m512i {
        unsafe {
            let mut s = [_mm512_setzero_si512(); 2];
            for l in 0..4 {
                let av = _mm512_loadu_si512(ab.add(64 * l).cast());
                s[l & 1] = _mm512_dpbusd_epi32(s[l & 1], c[l], av);
            }
            _mm512_add_epi32(s[0], s[1])
        }
    }
    for r in r0..r1 {
        // SAFETY: row r is inside `w`; blocks and activations sized by the caller.
        unsafe {
            let p = w[r * row_bytes..].as_ptr();
            let mut acc = [_mm256_setzero_ps(); N];
            let mut i = 0;
            while i + 2 <= nb {
                let (w0, w1) = (p.add(i * TS2), p.add((i + 1) * TS2));
                // Into L2: three lines cover the pair's 132 bytes.
                for k in [0, 64, 128] {
                    _mm_prefetch::<_MM_HINT_T1>(w0.wrapping_add(TQ2_PREFETCH + k).cast());
                }
                let c0 = codes(_mm512_loadu_si512(w0.cast()));
                let c1 = codes(_mm512_loadu_si512(w1.cast()));
                let dw = dpair(w0.add(64), w1.add(64));
                let (dw0, dw1) = (_mm_cvtss_f32(dw), _mm_cvtss_f32(_mm_movehdup_ps(dw)));
                for (t, acc) in acc.iter_mut().enumerate() {
                    let a0 = a.add(t * astride + i * PAK);
                    let a1 = a0.add(PAK);
                    let (s0, s1) = (lanes(&c0, a0), lanes(&c1, a1));
                    let s = _mm512_add_epi32(
                        _mm512_shuffle_i64x2::<0x44>(s0, s1),
                        _mm512_shuffle_i64x2::<0xEE>(s0, s1),
                    );
                    let bs = _mm512_inserti64x4(
                        _mm512_castsi256_si512(_mm256_loadu_si256(a0.add(PAK_BSUMS).cast())),
                        _mm256_loadu_si256(a1.add(PAK_BSUMS).cast()),
                        1,
                    );
                    let f = _mm512_cvtepi32_ps(_mm512_add_epi32(s, bs));
                    let d0 = dw0 * std::ptr::read_unaligned(a0.add(PAK_D).cast::<f32>());
                    let d1 = dw1 * std::ptr::read_unaligned(a1.add(PAK_D).cast::<f32>());
                    *acc = _mm256_fmadd_ps(_mm512_castps512_ps256(f), _mm256_set1_ps(d0), *acc);
                    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1));
                    *acc = _mm256_fmadd_ps(hi, _mm256_set1_ps(d1), *acc);
                }
                i += 2;
            }
            if i < nb {
                let w0 = p.add(i * TS2);
                let c0 = codes(_mm512_loadu_si512(w0.cast()));
                let dw0 = _mm_cvtss_f32(dpair(w0.add(64), w0.add(64)));
                for (t, acc) in acc.iter_mut().enumerate() {
                    let a0 = a.add(t * astride + i * PAK);
                    let s0 = lanes(&c0, a0);
                    let s = _mm256_add_epi32(
                        _mm512_castsi512_si256(s0),
                        _mm512_extracti64x4_epi64(s0, 1),
                    );
                    let s = _mm256_add_epi32(s, _mm256_loadu_si256(a0.add(PAK_BSUMS).cast()));
                    let d0 = dw0 * std::ptr::read_unaligned(a0.add(PAK_D).cast::<f32>());
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d0), *acc);
                }
            }
            for (t, at) in acc.iter().enumerate() {
                let (ya, _) = halves(_mm512_castps256_ps512(*at));
                *y.add(t * ystride + r) = ya;
            }
        }
    }
}

/// TQ2_0 rows in ggml's `vec_dot_tq2_0_q8_K` order (x86): per block the 8 i32 lanes
/// `Σ_v Σ₄ code·q8 − pairwise bsums` (codes `t + 1` in 0..2; exact integers, any order),
/// `acc = fma(lanes, d_a·d, acc)`, then `hsum_float_8(acc)`. One weight row's whole block per
/// register (code vector `l` of both halves against [`super::prepare_tq2`]'s chunk `l`), the two
/// halves of rows `a` and `b` folded into one register of both rows' lanes.
/// `codes(q)` gives the four code vectors `l = 0..4` (bits `2l` of every byte).
///
/// # Safety
/// As [`rows`], with `a` pointing at `N` activation rows laid out by [`super::prepare_tq2`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tq2_body<const N: usize>(
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    a: *const u8,
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
    codes: impl Fn(__m512i) -> [__m512i; 4],
) {
    let astride = nb * PAK;
    let dist = prefetch_dist(row_bytes);
    let mut r = r0;
    while r < r1 {
        let (rb, pa, pb) = row_pair(w, row_bytes, r, r1);
        // SAFETY: rows r and rb are inside `w`; blocks and activations sized by the caller.
        unsafe {
            let mut acc = [_mm512_setzero_ps(); N];
            for i in 0..nb {
                let (wa, wb, ai) = (pa.add(i * TS2), pb.add(i * TS2), a.add(i * PAK));
                _mm_prefetch::<_MM_HINT_T1>(wa.wrapping_add(dist).cast());
                _mm_prefetch::<_MM_HINT_T1>(wb.wrapping_add(dist).cast());
                let ca = codes(_mm512_loadu_si512(wa.cast()));
                let cb = codes(_mm512_loadu_si512(wb.cast()));
                let dw = dpair(wa.add(64), wb.add(64));
                for (t, acc) in acc.iter_mut().enumerate() {
                    let ab = ai.add(t * astride);
                    // Two chains per row (exact integers: any grouping gives the lanes).
                    let mut sa = [_mm512_setzero_si512(); 2];
                    let mut sb = [_mm512_setzero_si512(); 2];
                    for l in 0..4 {
                        let av = _mm512_loadu_si512(ab.add(64 * l).cast());
                        sa[l & 1] = _mm512_dpbusd_epi32(sa[l & 1], ca[l], av);
                        sb[l & 1] = _mm512_dpbusd_epi32(sb[l & 1], cb[l], av);
                    }
                    let (sa, sb) = (
                        _mm512_add_epi32(sa[0], sa[1]),
                        _mm512_add_epi32(sb[0], sb[1]),
                    );
                    // [a's lanes | b's lanes]: each row's two halves added.
                    let s = _mm512_add_epi32(
                        _mm512_shuffle_i64x2::<0x44>(sa, sb),
                        _mm512_shuffle_i64x2::<0xEE>(sa, sb),
                    );
                    let s = _mm512_add_epi32(
                        s,
                        _mm512_broadcast_i64x4(_mm256_loadu_si256(ab.add(PAK_BSUMS).cast())),
                    );
                    let da = std::ptr::read_unaligned(ab.add(PAK_D).cast::<f32>());
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), spread(dw, da), *acc);
                }
            }
            for (t, at) in acc.iter().enumerate() {
                let (ya, yb) = halves(*at);
                *y.add(t * ystride + r) = ya;
                if rb != r {
                    *y.add(t * ystride + rb) = yb;
                }
            }
        }
        r += 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::{ActKind, quantize_rows};
    use rand::{Rng, SeedableRng};

    /// Both TQ2_0 code extractions (shift-and-mask and GFNI) give the per-row kernel's bits
    /// (ggml's `vec_dot_tq2_0_q8_K` order, checked against ggml by `tests/ggml_oracle.rs`) for
    /// 1..=8 activation rows, an odd row count and several block counts.
    #[test]
    fn tq2_pairs_equal_the_per_row_kernel() {
        if !crate::dispatch::KernelPath::Avx512Vnni.is_supported() {
            eprintln!("no AVX-512 VNNI here: nothing to compare");
            return;
        }
        let gfni = std::is_x86_feature_detected!("gfni");
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for nb in [1usize, 3, 10] {
            let (rows, k) = (7usize, 256 * nb);
            let mut w = vec![0u8; rows * nb * TS2];
            rng.fill(&mut w[..]);
            for b in w.chunks_exact_mut(TS2) {
                let d = half::f16::from_f32(rng.random_range(0.001f32..0.1));
                b[64..66].copy_from_slice(&d.to_le_bytes());
            }
            for n in 1..=8usize {
                let x: Vec<f32> = (0..n * k).map(|_| rng.random_range(-3f32..3.0)).collect();
                let mut a = vec![0u8; n * nb * AK];
                quantize_rows(ActKind::Q8K, &x, k, &mut a);
                let mut want = vec![0f32; n * rows];
                for t in 0..n {
                    for r in 0..rows {
                        // SAFETY: AVX-512 VNNI checked above; whole blocks on both sides.
                        want[t * rows + r] = unsafe {
                            crate::kernels::x86::avx512vnni::dot_tq2_0(
                                w[r * nb * TS2..].as_ptr(),
                                a[t * nb * AK..].as_ptr(),
                                nb,
                            )
                        };
                    }
                }
                let mut prepared = crate::buf::AlignedBuf::default();
                prepared.set_len(prepared_len(a.len(), n * nb));
                prepared.as_bytes_mut()[..a.len()].copy_from_slice(&a);
                prepare_tq2(prepared.as_bytes_mut(), n * nb);
                for variant in ["shift", "gfni"] {
                    if variant == "gfni" && !gfni {
                        continue;
                    }
                    let mut got = vec![f32::NAN; n * rows];
                    let y = got.as_mut_ptr();
                    let (wr, rb, ap) = (&w[..], nb * TS2, prepared.as_bytes().as_ptr());
                    macro_rules! run {
                        ($f:ident) => {
                            match n {
                                1 => $f::<1, false>(wr, rb, nb, ap, y, rows, 0, rows),
                                2 => $f::<2, false>(wr, rb, nb, ap, y, rows, 0, rows),
                                3 => $f::<3, false>(wr, rb, nb, ap, y, rows, 0, rows),
                                4 => $f::<4, false>(wr, rb, nb, ap, y, rows, 0, rows),
                                5 => $f::<5, false>(wr, rb, nb, ap, y, rows, 0, rows),
                                6 => $f::<6, false>(wr, rb, nb, ap, y, rows, 0, rows),
                                7 => $f::<7, false>(wr, rb, nb, ap, y, rows, 0, rows),
                                _ => $f::<8, false>(wr, rb, nb, ap, y, rows, 0, rows),
                            }
                        };
                    }
                    // SAFETY: the CPU features are checked above; sizes match.
                    unsafe {
                        if variant == "gfni" {
                            run!(tq2_rows_gfni)
                        } else {
                            run!(tq2_rows_shift)
                        }
                    }
                    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            e.to_bits(),
                            "{variant}: nb {nb}, n {n}, output {i}: {g} vs {e}"
                        );
                    }
                }
            }
        }
    }
}
