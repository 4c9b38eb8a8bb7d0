//! A few activation rows against a Q4_K or Q6_K matrix on AVX-512 VNNI: two weight rows per
//! 512-bit register, one per 256-bit half, each pair unpacked once for up to [`max_n`]
//! activation rows, in the float order of ggml's `vec_dot_q4_K_q8_K` (x86) per
//! row: per super-block the 8 i32 lanes `Σ_c madd(maddubs(codes, q8), scale)`, `acc = fma(d_a·d,
//! lanes, acc)`; the mins in 4 lanes, `accm = fma(−d_a·dmin, madd(mins, pairwise bsums), accm)`;
//! at the end `hsum_float_8(acc) + (accm₀ + accm₂ + (accm₁ + accm₃))`; Q6_K: the lanes start
//! at `−32·madd(scales, bsums)` and add `madd(maddubs(codes, q8), scale)` per 32 elements —
//! the same bits as the per-row kernels, with every instruction serving two rows (and the
//! integer `madd` + add fused into one `vpdpwssd`: exact integers, same lane values).

use std::arch::x86_64::*;

use super::gemv32::{dpair, halves, prefetch_dist, row_pair, spread};
use super::x86::avx512vnni::k4_scales;
use crate::blocks::{Q4K_QS, Q4K_SCALES, Q6K_D, Q6K_QH, Q6K_SCALES};
use synapse_formats::GgmlType;

/// The types this kernel handles.
pub(crate) fn supports(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K)
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
    debug_assert!(a.len() >= n * nb * AK);
    let mut t0 = 0;
    while t0 < n {
        let k = (n - t0).min(if tiled { 8 } else { max_n(ty) });
        // SAFETY: forwarded contract, for activation rows t0..t0 + k.
        unsafe {
            let (at, yt) = (a.as_ptr().add(t0 * nb * AK), y.add(t0 * ystride));
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
