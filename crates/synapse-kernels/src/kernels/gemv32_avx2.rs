//! One to five activation rows against the 32-block types Q8_0, Q4_0, Q5_0, Q4_1 and Q5_1 on
//! AVX2 (and AVX-VNNI CPUs, which run the same code): decode's GEMV, two weight rows a pass.
//!
//! The float order is ggml's `vec_dot` for these types, per output: 8 i32 lanes per block (4
//! consecutive products each), `acc = fma(d_w·d_a, lane, acc)`, `hsum_float_8` at the end, and
//! for Q4_1/Q5_1 the `Σ m·s` (each product rounded, then added in block order) added last —
//! the same bits as the per-row kernels (`dot_q5_0` …) and the many-row GEMM (`tile32`).
//! What changes is the instruction count per block, where decode of the small per-layer
//! matrices was compute-bound (Q5_0 read at ~17 GB/s on a Zen 3 whose Q8_0 GEMV reads ~35):
//! - Q4_0 and Q5_0 enter unsigned (`u = q + 8`, `q + 16`: 0..15, 0..31), as `vpmaddubsw`
//!   takes them with no `vpsign`/`vpabs` per block, and each lane starts at `−8·Σ` / `−16·Σ`
//!   of its four activation codes ([`prepare`], once per activation row, shared by every
//!   weight row): `Σ u·a − bias·Σ a = Σ q·a`, exact integers (pair sums ≤ 2·31·127, no
//!   saturation);
//! - a block's nibbles come from one 128-bit broadcast load, one variable shift and a mask;
//! - the two rows' f16 scales (and Q4_1/Q5_1's mins) convert in one `vcvtph2ps`, and each
//!   activation block is loaded once for both rows (and each unpacked block serves up to four
//!   activation rows).
//!
//! Measured (kbench, 2 threads, Zen 3, 262,144 × 640, old and new alternated): Q5_0 one row
//! 6.8–7.0 → 4.8–5.0 ms (~23–24 GB/s), two rows 13.3–13.5 → 7.3–9.4 ms; Q4_1 one row 5.7 →
//! 3.9–5.4 ms.
//!
//! Q8_0 keeps the sign form (`|v|` against `sign(a, v)`); one row of a large Q8_0 matrix,
//! which the per-row kernel streams at the read bandwidth, stays there ([`takes`]).

use std::arch::x86_64::*;

use super::gemv32::{Q4, Q5, Q8, Q41, Q51, dpair, hsum8};
use crate::act::BlockQ8x32;
use synapse_formats::GgmlType;

/// Most activation rows a call takes (from six rows `tile32` is faster, except for Q8_0
/// whose GEMM starts at 7; Q8_0 at 6 rows stays on the per-row kernels).
pub(crate) const MAX_ROWS: usize = 5;

/// Whether this kernel runs `ty`.
pub(crate) fn supports(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q4_1 | GgmlType::Q5_1
    )
}

/// Matrix bytes from which one Q8_0 activation row stays on the per-row kernel.
const Q8_ONE_ROW_BYTES: usize = 16 << 20;

/// Whether a call of `n` activation rows of a `ty` matrix of `bytes` takes this kernel. Not
/// one row of a DRAM-sized Q8_0 matrix (an LM head): the per-row kernel streams it at the
/// read bandwidth already, and the row pairs read it slower (the 262,144 × 640 head 5.4–6.2
/// ms against 6.8–9.1, kbench, 2 threads, Zen 3), while at 2–4 rows they are faster.
pub(crate) fn takes(ty: GgmlType, n: usize, bytes: usize) -> bool {
    supports(ty)
        && (1..=MAX_ROWS).contains(&n)
        && !(ty == GgmlType::Q8_0 && n == 1 && bytes >= Q8_ONE_ROW_BYTES)
}

/// The bias of `ty`'s unsigned codes (`u = q + bias`), 0 for the types that need no lane
/// starts.
fn bias(ty: GgmlType) -> i32 {
    match ty {
        GgmlType::Q4_0 => 8,
        GgmlType::Q5_0 => 16,
        _ => 0,
    }
}

/// The biases with lane starts, in their order in [`prepare`]'s output.
const BIASES: [i32; 2] = [16, 8];

/// The i32 values [`prepare`] writes for `blocks` activation blocks (both biases' starts).
pub(crate) fn init_len(blocks: usize) -> usize {
    BIASES.len() * 8 * blocks
}

/// For the types of `tys` that have a bias (Q5_0, Q4_0), each activation block's 8 lane
/// starts `−bias·Σ(its 4 codes)` (block `i` at `8·i` of that bias's part of `init`: Q5_0's
/// first, then Q4_0's; a part no type of `tys` reads is left as it was).
pub(crate) fn prepare(act: &[BlockQ8x32], tys: &[GgmlType], init: &mut [i32]) {
    for (&b, part) in BIASES.iter().zip(init.chunks_exact_mut(8 * act.len())) {
        if !tys.iter().any(|&t| bias(t) == b) {
            continue;
        }
        for (a, o) in act.iter().zip(part.chunks_exact_mut(8)) {
            for (j, v) in o.iter_mut().enumerate() {
                *v = -b
                    * a.qs[4 * j..4 * j + 4]
                        .iter()
                        .map(|&q| q as i32)
                        .sum::<i32>();
            }
        }
    }
}

/// `ty`'s part of [`prepare`]'s output (empty for a type without a bias).
fn starts(ty: GgmlType, init: &[i32]) -> &[i32] {
    let part = init.len() / BIASES.len();
    match BIASES.iter().position(|&b| b == bias(ty)) {
        Some(i) => &init[i * part..(i + 1) * part],
        None => &[],
    }
}

/// A block's 32 nibbles in element order (low nibbles, then high), from the 16 bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: `p` holds 16 bytes.
    unsafe {
        let x = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
        _mm256_and_si256(
            _mm256_srlv_epi64(x, _mm256_set_epi64x(4, 4, 0, 0)),
            _mm256_set1_epi8(15),
        )
    }
}

/// 0x10 in byte `j` where bit `j` of the 32 bits at `p` is set (Q5_0/Q5_1's fifth bits).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fifth_bits(p: *const u8) -> __m256i {
    // SAFETY: `p` holds 4 bytes.
    unsafe {
        let v = _mm256_set1_epi32(std::ptr::read_unaligned(p.cast::<i32>()));
        let shuf = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let v = _mm256_and_si256(_mm256_shuffle_epi8(v, shuf), bit);
        _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10))
    }
}

/// A block's codes as `vpmaddubsw`'s unsigned operand: Q4_0/Q5_0/Q4_1/Q5_1 their unsigned
/// codes, Q8_0 its signed values (made `|v|` by the caller).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn codes<const T: u8>(b: *const u8) -> __m256i {
    // SAFETY: `b` points at a whole block of the type.
    unsafe {
        match T {
            Q8 => _mm256_loadu_si256(b.add(2).cast()),
            Q4 => nibbles(b.add(2)),
            Q5 => _mm256_or_si256(nibbles(b.add(6)), fifth_bits(b.add(2))),
            Q41 => nibbles(b.add(4)),
            _ => _mm256_or_si256(nibbles(b.add(8)), fifth_bits(b.add(4))),
        }
    }
}

/// `N` activation rows (row `t`'s blocks at `act[t·nb..]`, its lane starts at `init[8·t·nb..]`
/// when the type has a bias) against weight rows `r0..r1`, two at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_impl<const T: u8, const N: usize>(
    ts: usize,
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    act: &[BlockQ8x32],
    init: &[i32],
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    let mins = T == Q41 || T == Q51;
    let biased = T == Q4 || T == Q5;
    let dist = super::gemv32::prefetch_dist(row_bytes);
    let mut r = r0;
    while r < r1 {
        let (rb, pa, pb) = super::gemv32::row_pair(w, row_bytes, r, r1);
        // SAFETY: rows r and rb hold nb blocks of the type; N rows of nb activation blocks
        // (and their lane starts when biased, caller); outputs t·ystride + r, rb are this
        // call's.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let mut acc = [[_mm256_setzero_ps(); 2]; N];
            // Q4_1/Q5_1: each activation row's `Σ m·s`, rows r and rb in lanes 1 and 3.
            let mut sm = [_mm_setzero_ps(); N];
            for b in 0..nb {
                let (wa, wb) = (pa.add(b * ts), pb.add(b * ts));
                _mm_prefetch::<_MM_HINT_T1>(wa.wrapping_add(dist).cast());
                _mm_prefetch::<_MM_HINT_T1>(wb.wrapping_add(dist).cast());
                let (ca, cb) = (codes::<T>(wa), codes::<T>(wb));
                let (ua, ub) = if T == Q8 {
                    (_mm256_abs_epi8(ca), _mm256_abs_epi8(cb))
                } else {
                    (ca, cb)
                };
                // Q4_1/Q5_1: [d_a, m_a, d_b, m_b]; the others: [d_a, d_b] (measured: their
                // scales as one pair of f16 stay faster).
                let s4 = if mins {
                    super::gemv32::scales4(wa, wb)
                } else {
                    dpair(wa, wb)
                };
                for (t, at) in acc.iter_mut().enumerate() {
                    let ab = act.get_unchecked(t * nb + b);
                    let av = _mm256_loadu_si256(ab.qs.as_ptr().cast());
                    let (sa, sb) = if T == Q8 {
                        (_mm256_sign_epi8(av, ca), _mm256_sign_epi8(av, cb))
                    } else {
                        (av, av)
                    };
                    let mut la = _mm256_madd_epi16(_mm256_maddubs_epi16(ua, sa), ones);
                    let mut lb = _mm256_madd_epi16(_mm256_maddubs_epi16(ub, sb), ones);
                    if biased {
                        let iv = _mm256_loadu_si256(init.as_ptr().add(8 * (t * nb + b)).cast());
                        la = _mm256_add_epi32(la, iv);
                        lb = _mm256_add_epi32(lb, iv);
                    }
                    // ggml's `d_w·d_a` (one rounded product per row), then the FMA; for
                    // Q4_1/Q5_1 also `m·s`, all four products at once: [d_a·d, m_a·s, d_b·d,
                    // m_b·s] from the activation's [d, s, d, s] (`d` and `s` lie side by side).
                    let (p, da, db) = if mins {
                        let ds = _mm_castpd_ps(_mm_loaddup_pd((&raw const ab.d).cast::<f64>()));
                        let p = _mm_mul_ps(s4, ds);
                        (
                            p,
                            _mm256_broadcastss_ps(p),
                            _mm256_broadcastss_ps(_mm_movehl_ps(p, p)),
                        )
                    } else {
                        let d = _mm_mul_ps(s4, _mm_set1_ps(ab.d));
                        (
                            d,
                            _mm256_broadcastss_ps(d),
                            _mm256_broadcastss_ps(_mm_movehdup_ps(d)),
                        )
                    };
                    at[0] = _mm256_fmadd_ps(da, _mm256_cvtepi32_ps(la), at[0]);
                    at[1] = _mm256_fmadd_ps(db, _mm256_cvtepi32_ps(lb), at[1]);
                    if mins {
                        sm[t] = _mm_add_ps(sm[t], p);
                    }
                }
            }
            for (t, at) in acc.iter().enumerate() {
                let mut m = [0f32; 4];
                _mm_storeu_ps(m.as_mut_ptr(), sm[t]);
                let (mut ya, mut yb) = (hsum8(at[0]), hsum8(at[1]));
                if mins {
                    ya += m[1];
                    yb += m[3];
                }
                *y.add(t * ystride + r) = ya;
                if rb != r {
                    *y.add(t * ystride + rb) = yb;
                }
            }
        }
        r = rb + 1;
    }
}

/// Output rows `r0..r1` of `W·X` for the `n` activation rows of `act` (`n·nb` blocks, row `t`
/// at `t·nb`), written to `y[t·ystride + r]`, each in the one-row order. `init`: [`prepare`]
/// of `act` with `ty` among its types ([`init_len`] values; unread for a type without a bias).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; [`takes`]`(ty, n)`; `w` holds the rows (`row_bytes` each)
/// of `nb` blocks of `ty`; `init` holds [`init_len`]`(n·nb)` values when the type has a bias; `y` is valid
/// for writes at `t·ystride + r` (`t < n`, `r0 <= r < r1`), which this call alone writes.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    act: &[BlockQ8x32],
    init: &[i32],
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    let ts = ty.type_size();
    let n = act.len() / nb.max(1);
    debug_assert!(takes(ty, n, 0));
    let init = starts(ty, init);
    debug_assert!(bias(ty) == 0 || init.len() == 8 * n * nb);
    macro_rules! go {
        ($t:ident, $k:literal, $t0:expr) => {
            rows_impl::<$t, $k>(
                ts,
                w,
                row_bytes,
                nb,
                &act[$t0 * nb..($t0 + $k) * nb],
                if bias(ty) == 0 {
                    &[]
                } else {
                    &init[8 * $t0 * nb..8 * ($t0 + $k) * nb]
                },
                y.add($t0 * ystride),
                ystride,
                r0,
                r1,
            )
        };
    }
    macro_rules! by_rows {
        ($t:ident) => {
            match n {
                1 => go!($t, 1, 0),
                2 => go!($t, 2, 0),
                3 => go!($t, 3, 0),
                4 => go!($t, 4, 0),
                _ => {
                    go!($t, 3, 0);
                    go!($t, 2, 3);
                }
            }
        };
    }
    // SAFETY: forwarded contract, for the activation rows of each call.
    unsafe {
        match ty {
            GgmlType::Q8_0 => by_rows!(Q8),
            GgmlType::Q4_0 => by_rows!(Q4),
            GgmlType::Q5_0 => by_rows!(Q5),
            GgmlType::Q4_1 => by_rows!(Q41),
            _ => by_rows!(Q51),
        }
    }
}
