//! `P·V` over a transposed value cache, ggml's own V layout (`llama_kv_cache` stores V with
//! the cells contiguous per value dimension when flash attention is off): output value `d` of
//! a query is `Σ_j p[j]·V[d][j]`, a dot of two contiguous rows, summed in ggml's order
//! ([`PvOrder::VecDot`]: `ggml_vec_dot_f32`'s 4×16 lanes, cell `j` in lane `j mod 64`;
//! [`PvOrder::Gemm`]: tinyBLAS's 16 lanes). Every lane is an FMA chain from +0.0 in cell order;
//! the lanes are folded and reduced as those kernels do.
//!
//! The cells need not start on a lane boundary nor lie in one run of columns (a sliding-window
//! ring wraps): the cells `0..n` are given as consecutive [`PvtRun`]s of columns and cell `j`
//! goes to lane `(first_cell + j) mod lanes`. A query's cells outside its own causal range
//! carry `p = 0` (as llama.cpp's masked cells do: `exp(−∞) = 0`).
//!
//! Reading V this way streams it: one value row of a head is read from memory once per call
//! (every query of the call uses it while it is in L1), instead of one 4–16-float slice per
//! cell at the cache's row stride.

use super::PvOrder;

/// Consecutive cells stored in consecutive columns of every value row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PvtRun {
    /// Column of the run's first cell.
    pub col: usize,
    /// Cells in the run.
    pub len: usize,
}

/// One query of [`pv_t_f32`].
#[derive(Debug)]
pub struct PvtQuery<'a> {
    /// Probabilities of the call's cells `0..n` (zero outside the query's own range).
    pub p: &'a [f32],
    /// The output row (the head's width; every query of a call has the same).
    pub out: &'a mut [f32],
}

/// `out[d] = Σ_j p[j] · vt[d·stride + col(j)]` for every query, `d < out.len()`, cells
/// `j ∈ 0..n` laid out in `runs` (cell order; `n` = their total length), cell `j` in lane
/// `(first_cell + j) mod lanes` of `order`. `state` is scratch (grown here, reused).
///
/// # Panics
/// If a run's columns exceed the value rows (`(hd − 1)·stride + col + len > vt.len()` or
/// `col + len > stride`), a query's `p` is shorter than `n`, or the queries' widths differ.
pub fn pv_t_f32(
    order: PvOrder,
    vt: &[f32],
    stride: usize,
    runs: &[PvtRun],
    first_cell: usize,
    qs: &mut [PvtQuery<'_>],
    state: &mut Vec<f32>,
) {
    let Some(hd) = qs.first().map(|q| q.out.len()) else {
        return;
    };
    let n: usize = runs.iter().map(|r| r.len).sum();
    assert!(qs.iter().all(|q| q.out.len() == hd), "query widths differ");
    assert!(
        qs.iter().all(|q| q.p.len() >= n),
        "probabilities shorter than the cells"
    );
    assert!(
        runs.iter().all(
            |r| r.col + r.len <= stride && (hd.max(1) - 1) * stride + r.col + r.len <= vt.len()
        ),
        "value run out of range"
    );
    if hd == 0 {
        return;
    }
    if n == 0 {
        // No cells: every lane stays +0.0, and so does every sum (the SIMD path below never
        // writes a lane state it has no block for).
        for q in qs.iter_mut() {
            q.out.fill(0.0);
        }
        return;
    }
    let lanes = match order {
        PvOrder::VecDot => 64,
        PvOrder::Gemm => 16,
    };
    // Without AVX-512: AVX2 + FMA, no lane state kept between calls.
    #[cfg(target_arch = "x86_64")]
    if !super::has_avx512() && super::has_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time); runs, probabilities and
        // outputs are in range (asserted above).
        unsafe {
            if lanes == 64 {
                avx2::run64(vt, stride, runs, first_cell, qs, hd)
            } else {
                avx2::run16(vt, stride, runs, first_cell, qs, hd)
            }
        };
        return;
    }
    // Lane state of every (query, dim) pair, carried from block to block.
    let need = qs.len() * hd * lanes;
    if state.len() < need {
        state.resize(need, 0.0);
    }
    #[cfg(target_arch = "x86_64")]
    if super::has_avx512() {
        // SAFETY: the CPU has AVX-512F (checked at run time); runs, probabilities and outputs
        // are in range (asserted above); `state` holds `need` floats.
        unsafe {
            avx512::run(
                lanes,
                vt,
                stride,
                runs,
                first_cell,
                qs,
                hd,
                &mut state[..need],
            )
        };
        return;
    }
    state[..need].fill(0.0);
    scalar(
        lanes,
        vt,
        stride,
        runs,
        first_cell,
        qs,
        hd,
        &mut state[..need],
    );
}

/// The reference: one lane array per (query, dim), cell by cell (the same bits as the SIMD
/// path: each lane's FMA chain and the final fold/reduce are the same operations).
#[allow(clippy::too_many_arguments)]
fn scalar(
    lanes: usize,
    vt: &[f32],
    stride: usize,
    runs: &[PvtRun],
    first_cell: usize,
    qs: &mut [PvtQuery<'_>],
    hd: usize,
    state: &mut [f32],
) {
    for (qi, q) in qs.iter_mut().enumerate() {
        for d in 0..hd {
            let st = &mut state[(qi * hd + d) * lanes..][..lanes];
            let row = &vt[d * stride..];
            let mut j = 0;
            for r in runs {
                for (k, &v) in row[r.col..r.col + r.len].iter().enumerate() {
                    let l = (first_cell + j + k) % lanes;
                    st[l] = v.mul_add(q.p[j + k], st[l]);
                }
                j += r.len;
            }
            q.out[d] = reduce_lanes(st);
        }
    }
}

/// `GGML_F32x16_REDUCE` of 64 lanes (`(l + l₃₂) + (l₁₆ + l₄₈)`, then `_mm512_reduce_add_ps`)
/// or `_mm512_reduce_add_ps` of 16.
fn reduce_lanes(st: &[f32]) -> f32 {
    let v: [f32; 16] = if st.len() == 64 {
        std::array::from_fn(|l| (st[l] + st[32 + l]) + (st[16 + l] + st[48 + l]))
    } else {
        std::array::from_fn(|l| st[l])
    };
    super::reduce16(&v)
}

/// AVX2 + FMA: the same lanes (64 or 16) and the same FMA chains, eight lanes to a register,
/// several queries (and in the 16-lane order several value dimensions) to a tile, so a value
/// load serves every query of the tile. Each (query, dimension) pair is summed whole in one
/// go, its lanes in registers while whole lane cycles of cells stream by, in a local array
/// before and after (where a run starts or ends inside a cycle), so no state is kept between
/// calls.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{PvtQuery, PvtRun};
    use crate::ggml_f32::simd::lane_mask;
    use std::arch::x86_64::*;

    /// `ggml_vec_dot_f32`'s 64-lane order ([`super::PvOrder::VecDot`], a decode step) for
    /// `D` value rows × `Q` queries at once (the queries of one KV head): every value load
    /// serves `Q` queries and every probability load `D` rows, and a value row is read from
    /// memory once per call instead of once per query. The lanes are swept eight at a time
    /// (the `D × Q` registers of one lane octet stay in registers), over blocks of
    /// [`CHUNK`] cycles that stay in L1 for the eight sweeps, while the block
    /// [`PF_BLOCKS`] ahead is prefetched a line per step (a decode step's values come from
    /// memory; asked for all at once, or not at all, they came at ~45% of a plain streaming
    /// read, one thread, 8000 cells × 256 dims). Every lane is the same FMA
    /// chain as [`super::scalar`]'s (cells one or eight at a time up to a cycle boundary,
    /// whole 64-cell cycles in registers, the rest the same way), then [`reduce`].
    ///
    /// # Safety
    /// AVX2 and FMA; the runs lie inside value rows `d0..d0 + D` of `vt` at `stride`; every
    /// `ps[q]` has the cells and every `outs[q]` `d0 + D` floats.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile64<const D: usize, const Q: usize>(
        vt: *const f32,
        stride: usize,
        runs: &[PvtRun],
        first_cell: usize,
        ps: [*const f32; Q],
        outs: [*mut f32; Q],
        d0: usize,
    ) {
        const LANES: usize = 64;
        // SAFETY: the caller's contract; every index below stays inside a run's columns, a
        // query's cells or a lane array.
        unsafe {
            let mut st = [[[0f32; LANES]; Q]; D];
            let mut j = 0;
            for r in runs {
                let v: [*const f32; D] =
                    std::array::from_fn(|dd| vt.add((d0 + dd) * stride + r.col));
                let (mut k, mut l) = (0, (first_cell + j) % LANES);
                // Cell k into lane l for every row and query, then on; or eight cells.
                macro_rules! one {
                    () => {
                        for (sd, vd) in st.iter_mut().zip(v) {
                            let x = *vd.add(k);
                            for (s, p) in sd.iter_mut().zip(ps) {
                                s[l] = x.mul_add(*p.add(j + k), s[l]);
                            }
                        }
                        (k, l) = (k + 1, (l + 1) % LANES);
                    };
                }
                macro_rules! eight {
                    () => {
                        for (sd, vd) in st.iter_mut().zip(v) {
                            let x = _mm256_loadu_ps(vd.add(k));
                            for (s, p) in sd.iter_mut().zip(ps) {
                                let a = s.as_mut_ptr().add(l);
                                let y = _mm256_loadu_ps(p.add(j + k));
                                _mm256_storeu_ps(a, _mm256_fmadd_ps(x, y, _mm256_loadu_ps(a)));
                            }
                        }
                        (k, l) = (k + 8, (l + 8) % LANES);
                    };
                }
                // Lanes `a..b` of the lane octet at `l − a`, cell `k + (lane − a)` in each:
                // masked loads give the other lanes v = p = +0.0, and `fma(0, 0, s) = s` (a
                // lane is never −0.0: its chain starts at +0.0 and an exact-zero sum is +0.0).
                macro_rules! part {
                    ($a:expr, $b:expr) => {
                        let (a, b) = ($a, $b);
                        let m = lane_mask(a as i32, b as i32);
                        for (sd, vd) in st.iter_mut().zip(v) {
                            // Lane 0's cell (before the part for a > 0: masked off, never read).
                            let x = _mm256_maskload_ps(vd.wrapping_add(k).wrapping_sub(a), m);
                            for (s, p) in sd.iter_mut().zip(ps) {
                                let o = s.as_mut_ptr().add(l - a);
                                let y =
                                    _mm256_maskload_ps(p.wrapping_add(j + k).wrapping_sub(a), m);
                                _mm256_storeu_ps(o, _mm256_fmadd_ps(x, y, _mm256_loadu_ps(o)));
                            }
                        }
                        (k, l) = (k + b - a, (l + b - a) % LANES);
                    };
                }
                if k < r.len && l % 8 != 0 {
                    let a = l % 8;
                    part!(a, 8.min(a + r.len - k));
                }
                while k + 8 <= r.len && l != 0 {
                    eight!();
                }
                // Whole cycles, a block of them at a time, eight lanes per sweep.
                let cycles = if l == 0 { (r.len - k) / LANES } else { 0 };
                let mut c0 = 0;
                while c0 < cycles {
                    let cn = (cycles - c0).min(CHUNK);
                    for g in (0..LANES).step_by(8) {
                        let mut acc: [[__m256; Q]; D] = std::array::from_fn(|dd| {
                            std::array::from_fn(|qq| _mm256_loadu_ps(st[dd][qq].as_ptr().add(g)))
                        });
                        let mut c = k + c0 * LANES + g;
                        for i in 0..cn {
                            // One line of a block [`PF_BLOCKS`] ahead per step, the rows in
                            // turn, so the block's lines are asked for evenly over its
                            // sweeps (a prefetch never faults, even past the row).
                            let it = g / 8 * CHUNK + i;
                            let (dd, ln) = (it % D, it / D);
                            if ln < CHUNK * LANES / 16 {
                                let f = v[dd]
                                    .wrapping_add(k + (c0 + PF_BLOCKS * CHUNK) * LANES + 16 * ln);
                                _mm_prefetch::<_MM_HINT_T0>(f as *const i8);
                            }
                            let x: [__m256; D] =
                                std::array::from_fn(|dd| _mm256_loadu_ps(v[dd].add(c)));
                            for (qq, p) in ps.iter().enumerate() {
                                let y = _mm256_loadu_ps(p.add(j + c));
                                for dd in 0..D {
                                    acc[dd][qq] = _mm256_fmadd_ps(x[dd], y, acc[dd][qq]);
                                }
                            }
                            c += LANES;
                        }
                        for (sd, ad) in st.iter_mut().zip(acc) {
                            for (s, a) in sd.iter_mut().zip(ad) {
                                _mm256_storeu_ps(s.as_mut_ptr().add(g), a);
                            }
                        }
                    }
                    c0 += cn;
                }
                k += cycles * LANES;
                // The rest of the run: less than a cycle, each lane at most once.
                while k + 8 <= r.len && l % 8 == 0 {
                    eight!();
                }
                if k < r.len && l % 8 == 0 {
                    part!(0, r.len - k);
                }
                while k < r.len {
                    one!();
                }
                j += r.len;
            }
            for (dd, sd) in st.iter().enumerate() {
                for (o, s) in outs.iter().zip(sd) {
                    *o.add(d0 + dd) = reduce(s.as_ptr(), 8);
                }
            }
        }
    }

    /// Cycles of 64 cells per block of [`tile64`] (2 KB of each value row).
    const CHUNK: usize = 8;
    /// How many blocks ahead [`tile64`] prefetches.
    const PF_BLOCKS: usize = 2;

    /// [`tile64`] over every value row and query: up to four queries two rows at a time, five
    /// to eight one row at a time (one sweep of a row serves them all; two rows of eight
    /// would not fit the registers), more in tiles of eight (the last smaller).
    ///
    /// # Safety
    /// As [`tile64`], for value rows `0..hd` and the queries' `p` and `out`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn run64(
        vt: &[f32],
        stride: usize,
        runs: &[PvtRun],
        first_cell: usize,
        qs: &mut [PvtQuery<'_>],
        hd: usize,
    ) {
        let v = vt.as_ptr();
        for chunk in qs.chunks_mut(8) {
            let m = chunk.len();
            let ps: [*const f32; 8] = std::array::from_fn(|i| chunk[i.min(m - 1)].p.as_ptr());
            let os: [*mut f32; 8] = std::array::from_fn(|i| chunk[i.min(m - 1)].out.as_mut_ptr());
            let mut d0 = 0;
            while d0 < hd {
                let dn = if m > 4 { 1 } else { (hd - d0).min(2) };
                macro_rules! go {
                    ($d:literal, $q:literal) => {
                        tile64::<$d, $q>(
                            v,
                            stride,
                            runs,
                            first_cell,
                            std::array::from_fn(|i| ps[i]),
                            std::array::from_fn(|i| os[i]),
                            d0,
                        )
                    };
                }
                // SAFETY: the caller's contract, for this tile's rows and queries.
                unsafe {
                    match (dn, m) {
                        (2, 4) => go!(2, 4),
                        (2, 3) => go!(2, 3),
                        (2, 2) => go!(2, 2),
                        (2, _) => go!(2, 1),
                        (_, 8) => go!(1, 8),
                        (_, 7) => go!(1, 7),
                        (_, 6) => go!(1, 6),
                        (_, 5) => go!(1, 5),
                        (_, 4) => go!(1, 4),
                        (_, 3) => go!(1, 3),
                        (_, 2) => go!(1, 2),
                        _ => go!(1, 1),
                    }
                }
                d0 += dn;
            }
        }
    }

    /// tinyBLAS's 16-lane order ([`super::PvOrder::Gemm`], a call of two or more rows) with
    /// `D` value dimensions × `Q` queries at once: every value load serves `Q` queries and
    /// every probability load `D` dimensions. The same lanes and FMA chains as
    /// [`super::scalar`]: cells one at a time up to a lane-cycle boundary, whole 16-cell
    /// cycles in registers, the rest one at a time.
    ///
    /// # Safety
    /// AVX2 and FMA; the runs lie inside value rows `d0..d0 + D` of `vt` at `stride`; the
    /// queries' `p` rows at `ps` each have the cells and their outputs at `outs` each
    /// `d0 + D` floats.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile16<const D: usize, const Q: usize>(
        vt: *const f32,
        stride: usize,
        runs: &[PvtRun],
        first_cell: usize,
        ps: [*const f32; Q],
        d0: usize,
        outs: [*mut f32; Q],
    ) {
        // SAFETY: the caller's contract; indices stay inside the runs' columns, the cells and
        // the lane arrays.
        unsafe {
            let mut st = [[[0f32; 16]; Q]; D];
            let mut j = 0;
            for r in runs {
                let rows: [*const f32; D] =
                    std::array::from_fn(|dd| vt.add((d0 + dd) * stride + r.col));
                let (mut k, l) = (0, (first_cell + j) % 16);
                // Lanes `a..b` of a part cycle, cell `k + (lane − a)` in each: masked loads
                // give the other lanes v = p = +0.0, and `fma(0, 0, s) = s` (a lane is
                // never −0.0: its chain starts at +0.0 and an exact-zero sum is +0.0).
                let part = |k: usize, a: usize, b: usize, st: &mut [[[f32; 16]; Q]; D]| {
                    let (a32, b32) = (a as i32, b as i32);
                    let (m0, m1) = (lane_mask(a32, b32), lane_mask(a32 - 8, b32 - 8));
                    // Lane 0's cell (before the part for a > 0: masked off, never read).
                    let at = |x: *const f32| x.wrapping_add(k).wrapping_sub(a);
                    let v: [[__m256; 2]; D] = std::array::from_fn(|dd| {
                        let x = at(rows[dd]);
                        [
                            _mm256_maskload_ps(x, m0),
                            _mm256_maskload_ps(x.wrapping_add(8), m1),
                        ]
                    });
                    for qq in 0..Q {
                        let x = at(ps[qq].add(j));
                        let (p0, p1) = (
                            _mm256_maskload_ps(x, m0),
                            _mm256_maskload_ps(x.wrapping_add(8), m1),
                        );
                        for dd in 0..D {
                            let a = st[dd][qq].as_mut_ptr();
                            _mm256_storeu_ps(a, _mm256_fmadd_ps(v[dd][0], p0, _mm256_loadu_ps(a)));
                            _mm256_storeu_ps(
                                a.add(8),
                                _mm256_fmadd_ps(v[dd][1], p1, _mm256_loadu_ps(a.add(8))),
                            );
                        }
                    }
                };
                if l != 0 && r.len > 0 {
                    let b = 16.min(l + r.len);
                    part(0, l, b, &mut st);
                    k = b - l;
                }
                if k + 16 <= r.len {
                    let mut acc: [[[__m256; 2]; Q]; D] = std::array::from_fn(|dd| {
                        std::array::from_fn(|qq| {
                            let a = st[dd][qq].as_ptr();
                            [_mm256_loadu_ps(a), _mm256_loadu_ps(a.add(8))]
                        })
                    });
                    while k + 16 <= r.len {
                        let v: [[__m256; 2]; D] = std::array::from_fn(|dd| {
                            [
                                _mm256_loadu_ps(rows[dd].add(k)),
                                _mm256_loadu_ps(rows[dd].add(k + 8)),
                            ]
                        });
                        for qq in 0..Q {
                            let pq = ps[qq].add(j + k);
                            let (p0, p1) = (_mm256_loadu_ps(pq), _mm256_loadu_ps(pq.add(8)));
                            for dd in 0..D {
                                let a = &mut acc[dd][qq];
                                a[0] = _mm256_fmadd_ps(v[dd][0], p0, a[0]);
                                a[1] = _mm256_fmadd_ps(v[dd][1], p1, a[1]);
                            }
                        }
                        k += 16;
                    }
                    for dd in 0..D {
                        for qq in 0..Q {
                            let a = st[dd][qq].as_mut_ptr();
                            _mm256_storeu_ps(a, acc[dd][qq][0]);
                            _mm256_storeu_ps(a.add(8), acc[dd][qq][1]);
                        }
                    }
                }
                if k < r.len {
                    // The last cells from lane 0 (k is on a cycle boundary here).
                    part(k, 0, r.len - k, &mut st);
                }
                j += r.len;
            }
            for (dd, sd) in st.iter().enumerate() {
                for (o, sq) in outs.iter().zip(sd) {
                    *o.add(d0 + dd) = reduce(sq.as_ptr(), 2);
                }
            }
        }
    }

    /// [`tile16`] over every value dimension and query: dimension pairs outside (their rows
    /// stay in L1), query triples inside.
    ///
    /// # Safety
    /// As [`tile16`], for every value row `0..hd` and the queries' `p` and `out`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn run16(
        vt: &[f32],
        stride: usize,
        runs: &[PvtRun],
        first_cell: usize,
        qs: &mut [PvtQuery<'_>],
        hd: usize,
    ) {
        let v = vt.as_ptr();
        let nq = qs.len();
        // SAFETY: the caller's contract; every tile's rows, queries and outputs are in range.
        unsafe {
            let mut d0 = 0;
            while d0 < hd {
                let dn = (hd - d0).min(2);
                let mut q0 = 0;
                while q0 < nq {
                    let qn = (nq - q0).min(3);
                    // The tile's queries (the last repeated where fewer than three are left;
                    // the smaller tiles take only the first `qn`).
                    let pp: [*const f32; 3] =
                        std::array::from_fn(|i| qs[q0 + i.min(qn - 1)].p.as_ptr());
                    let oo: [*mut f32; 3] =
                        std::array::from_fn(|i| qs[q0 + i.min(qn - 1)].out.as_mut_ptr());
                    let p3 = |i: usize| pp[i];
                    let o3 = |i: usize| oo[i];
                    match (dn, qn) {
                        (2, 3) => tile16::<2, 3>(
                            v,
                            stride,
                            runs,
                            first_cell,
                            [p3(0), p3(1), p3(2)],
                            d0,
                            [o3(0), o3(1), o3(2)],
                        ),
                        (2, 2) => tile16::<2, 2>(
                            v,
                            stride,
                            runs,
                            first_cell,
                            [p3(0), p3(1)],
                            d0,
                            [o3(0), o3(1)],
                        ),
                        (2, _) => tile16::<2, 1>(v, stride, runs, first_cell, [p3(0)], d0, [o3(0)]),
                        (_, 3) => tile16::<1, 3>(
                            v,
                            stride,
                            runs,
                            first_cell,
                            [p3(0), p3(1), p3(2)],
                            d0,
                            [o3(0), o3(1), o3(2)],
                        ),
                        (_, 2) => tile16::<1, 2>(
                            v,
                            stride,
                            runs,
                            first_cell,
                            [p3(0), p3(1)],
                            d0,
                            [o3(0), o3(1)],
                        ),
                        _ => tile16::<1, 1>(v, stride, runs, first_cell, [p3(0)], d0, [o3(0)]),
                    }
                    q0 += qn;
                }
                d0 += dn;
            }
        }
    }

    /// [`super::reduce_lanes`] in registers: 64 lanes (`N == 8`) folded `(l + l₃₂) + (l₁₆ + l₄₈)`
    /// to 16, then high eight + low eight, the two 4-lane halves, and `(t₀ + t₂) + (t₁ + t₃)`.
    ///
    /// # Safety
    /// AVX2; `st` holds `8·n` floats, `n` is 2 or 8.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn reduce(st: *const f32, n: usize) -> f32 {
        // SAFETY: loads inside the 8·n lanes (caller).
        unsafe {
            let l = |i: usize| _mm256_loadu_ps(st.add(8 * i));
            let (lo, hi) = if n == 8 {
                (
                    _mm256_add_ps(_mm256_add_ps(l(0), l(4)), _mm256_add_ps(l(2), l(6))),
                    _mm256_add_ps(_mm256_add_ps(l(1), l(5)), _mm256_add_ps(l(3), l(7))),
                )
            } else {
                (l(0), l(1))
            };
            crate::ggml_f32::simd::reduce16_halves(lo, hi)
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{PvtQuery, PvtRun};
    use crate::ggml_f32::avx512::{fold, reduce16x16_ordered};
    use std::arch::x86_64::*;

    /// Cells per block: a block's probabilities (every query's) and one value row's slice of
    /// it stay in L1 while all dimensions and queries use them.
    const BLOCK: usize = 512;

    /// The lane state of every (query, dim) pair; `fresh` until the first block has written
    /// it (that block's tiles start from +0.0 instead of loading it, so the state is never
    /// cleared first: a `memset` of 12–18 KB per call in a decode step's P·V).
    struct Lanes<'a> {
        buf: &'a mut [f32],
        fresh: bool,
    }

    /// Part of a run inside one block: cells `j0..j0 + len` at columns `col..`.
    #[derive(Clone, Copy)]
    struct Piece {
        col: usize,
        j0: usize,
        len: usize,
    }

    /// Blocks of cells (outer), dimension tiles, query tiles (inner).
    ///
    /// # Safety
    /// AVX-512F; the runs lie inside `hd` value rows of `vt` at `stride`; every query's `p`
    /// has the cells and its `out` `hd` floats; `state` holds `qs.len()·hd·lanes` floats.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn run(
        lanes: usize,
        vt: &[f32],
        stride: usize,
        runs: &[PvtRun],
        first_cell: usize,
        qs: &mut [PvtQuery<'_>],
        hd: usize,
        state: &mut [f32],
    ) {
        let n: usize = runs.iter().map(|r| r.len).sum();
        let state = &mut Lanes {
            buf: state,
            fresh: true,
        };
        let mut pieces: [Piece; 8] = [Piece {
            col: 0,
            j0: 0,
            len: 0,
        }; 8];
        let mut b0 = 0;
        while b0 < n {
            let b1 = (b0 + BLOCK).min(n);
            // The runs' parts inside b0..b1.
            let mut np = 0;
            let mut j = 0;
            for r in runs {
                let (a, b) = (j.max(b0), (j + r.len).min(b1));
                if a < b {
                    if np == pieces.len() {
                        // More runs than a block can list: finish this block here.
                        break;
                    }
                    pieces[np] = Piece {
                        col: r.col + (a - j),
                        j0: a,
                        len: b - a,
                    };
                    np += 1;
                }
                j += r.len;
            }
            let b1 = pieces[..np].last().map_or(b1, |p| p.j0 + p.len);
            let ps = &pieces[..np];
            if lanes == 16 && qs.len() > 4 {
                // Many queries (a prompt's rows × a KV head's query heads), tinyBLAS's order:
                // dimension tiles outside, query quads inside, so each tile's four value rows
                // are read from L1 by every quad (queries outside would sweep the whole
                // block's rows, 512 KB at head_dim 256, from L2 once per quad).
                let mut d = 0;
                while d < hd {
                    // SAFETY: forwarded contract; d + D <= hd.
                    d += unsafe {
                        if d + 4 <= hd {
                            quads::<4>(vt, stride, ps, first_cell, qs, d, hd, state)
                        } else {
                            quads::<1>(vt, stride, ps, first_cell, qs, d, hd, state)
                        }
                    };
                }
            } else {
                let mut qi = 0;
                while qi < qs.len() {
                    let m = (qs.len() - qi).min(4);
                    // SAFETY: forwarded contract.
                    unsafe {
                        match (lanes, m) {
                            (64, 1) => {
                                tiles::<4, 1, 4>(vt, stride, ps, first_cell, qs, qi, hd, state)
                            }
                            (64, 2) => {
                                tiles::<4, 2, 2>(vt, stride, ps, first_cell, qs, qi, hd, state)
                            }
                            (64, 3) => {
                                tiles::<4, 3, 2>(vt, stride, ps, first_cell, qs, qi, hd, state)
                            }
                            // Four queries as two pairs of two dimensions at a time: two value
                            // rows stream side by side (with all four queries in one tile only
                            // one row fits the registers; one core read V at 7.7 GB/s that way,
                            // 9.7 GB/s this way, head_dim 256, 4,096 cells), the second pair
                            // reading the block from L2.
                            (64, _) => {
                                tiles::<4, 2, 2>(vt, stride, ps, first_cell, qs, qi, hd, state);
                                tiles::<4, 2, 2>(vt, stride, ps, first_cell, qs, qi + 2, hd, state);
                            }
                            (_, 1) => {
                                tiles::<1, 1, 4>(vt, stride, ps, first_cell, qs, qi, hd, state)
                            }
                            (_, 2) => {
                                tiles::<1, 2, 4>(vt, stride, ps, first_cell, qs, qi, hd, state)
                            }
                            (_, 3) => {
                                tiles::<1, 3, 4>(vt, stride, ps, first_cell, qs, qi, hd, state)
                            }
                            (_, _) => {
                                tiles::<1, 4, 4>(vt, stride, ps, first_cell, qs, qi, hd, state)
                            }
                        }
                    }
                    qi += m;
                }
            }
            b0 = b1;
            state.fresh = false;
        }
        // Reduce every (query, dim) lane set: sixteen dims at a time in registers (the same
        // additions as `reduce_lanes`), the rest one by one.
        let l = lanes;
        let sp = state.buf.as_ptr();
        for (qi, q) in qs.iter_mut().enumerate() {
            let mut d = 0;
            while d + 16 <= hd {
                let v: [__m512; 16] = std::array::from_fn(|k| {
                    let at = sp.wrapping_add((qi * hd + d + k) * l);
                    // SAFETY: lane set (qi, d + k) is inside state (qs.len()·hd·lanes).
                    unsafe {
                        if l == 64 {
                            fold(std::array::from_fn(|c| _mm512_loadu_ps(at.add(16 * c))))
                        } else {
                            _mm512_loadu_ps(at)
                        }
                    }
                });
                let r = reduce16x16_ordered(&v);
                // SAFETY: d + 16 <= hd = q.out.len().
                unsafe { _mm512_storeu_ps(q.out.as_mut_ptr().add(d), r) };
                d += 16;
            }
            for d in d..hd {
                q.out[d] = super::reduce_lanes(&state.buf[(qi * hd + d) * l..][..l]);
            }
        }
    }

    /// The probabilities of queries `qi..qi + Q`.
    #[inline]
    fn qp<const Q: usize>(qs: &[PvtQuery<'_>], qi: usize) -> [*const f32; Q] {
        std::array::from_fn(|k| qs[qi + k].p.as_ptr())
    }

    /// Every query, four at a time, over dimensions `d0..d0 + D` of the block's pieces (the
    /// first quad asks for the next block's columns of these rows); returns `D`.
    ///
    /// # Safety
    /// As [`run`]; `d0 + D <= hd`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn quads<const D: usize>(
        vt: &[f32],
        stride: usize,
        ps: &[Piece],
        first_cell: usize,
        qs: &[PvtQuery<'_>],
        d0: usize,
        hd: usize,
        state: &mut Lanes<'_>,
    ) -> usize {
        let mut qi = 0;
        while qi < qs.len() {
            let m = (qs.len() - qi).min(4);
            let pf = qi == 0;
            let (v, c) = (vt, first_cell);
            // SAFETY: forwarded contract; qi + m <= qs.len().
            unsafe {
                match m {
                    1 => tile::<1, 1, D>(v, stride, ps, c, qp::<1>(qs, qi), qi, d0, hd, state, pf),
                    2 => tile::<1, 2, D>(v, stride, ps, c, qp::<2>(qs, qi), qi, d0, hd, state, pf),
                    3 => tile::<1, 3, D>(v, stride, ps, c, qp::<3>(qs, qi), qi, d0, hd, state, pf),
                    _ => tile::<1, 4, D>(v, stride, ps, c, qp::<4>(qs, qi), qi, d0, hd, state, pf),
                }
            }
            qi += m;
        }
        D
    }

    /// Queries `qi..qi + Q` over the block's pieces, `D` dimensions at a time (a remainder
    /// one at a time), `G` registers of 16 lanes per (query, dim).
    ///
    /// # Safety
    /// As [`run`]; `qi + Q <= qs.len()`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tiles<const G: usize, const Q: usize, const D: usize>(
        vt: &[f32],
        stride: usize,
        ps: &[Piece],
        first_cell: usize,
        qs: &[PvtQuery<'_>],
        qi: usize,
        hd: usize,
        state: &mut Lanes<'_>,
    ) {
        let p = qp::<Q>(qs, qi);
        let mut d = 0;
        while d + D <= hd {
            // SAFETY: forwarded; d + D <= hd.
            unsafe { tile::<G, Q, D>(vt, stride, ps, first_cell, p, qi, d, hd, state, true) };
            d += D;
        }
        while d < hd {
            // SAFETY: as above, d < hd.
            unsafe { tile::<G, Q, 1>(vt, stride, ps, first_cell, p, qi, d, hd, state, true) };
            d += 1;
        }
    }

    /// One tile: `Q` queries × `D` dims, accumulators loaded from `state`, every piece's
    /// cells added (masked where a 16-cell group is cut by a piece's ends, so a cell outside
    /// the pieces leaves its lane untouched), stored back; with `prefetch`, the next block's
    /// columns of the tile's rows are asked for.
    ///
    /// # Safety
    /// As [`tiles`]; `d0 + D <= hd`.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile<const G: usize, const Q: usize, const D: usize>(
        vt: &[f32],
        stride: usize,
        ps: &[Piece],
        first_cell: usize,
        p: [*const f32; Q],
        qi: usize,
        d0: usize,
        hd: usize,
        state: &mut Lanes<'_>,
        prefetch: bool,
    ) {
        let lanes = 16 * G;
        let sp = state.buf.as_mut_ptr();
        let at = |q: usize, d: usize, g: usize| ((qi + q) * hd + d0 + d) * lanes + 16 * g;
        let mut acc = [[[_mm512_setzero_ps(); G]; D]; Q];
        for (q, aq) in acc.iter_mut().enumerate().filter(|_| !state.fresh) {
            for (d, ad) in aq.iter_mut().enumerate() {
                for (g, a) in ad.iter_mut().enumerate() {
                    // SAFETY: (qi + q, d0 + d) is inside state's qs.len() × hd lane sets.
                    *a = unsafe { _mm512_loadu_ps(sp.add(at(q, d, g))) };
                }
            }
        }
        let vp = vt.as_ptr();
        // The next block's columns of this tile's value rows, into L2: each row is a stream
        // of its own (64–256 of them a head), more than the hardware prefetcher follows, and
        // asked for here, tile by tile, the requests spread over the block (attn_bench, 8,000
        // cells × 64 heads out of cache, one core: head_dim 64, 3 queries 9.4–10.1 GB/s with
        // none, 11.5–11.9 with the whole next block asked for at the block's start, 11.8–12.1
        // this way against 9.5–9.6 that way in a slower hour).
        if let Some(last) = ps.last().filter(|_| prefetch) {
            let c0 = last.col + last.len;
            for d in 0..D {
                let row = vp.wrapping_add((d0 + d) * stride + c0);
                for k in (0..BLOCK).step_by(16) {
                    _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(k).cast());
                }
            }
        }
        for pc in ps {
            // Virtual cell index x = first_cell + j; lane x mod lanes; group (x mod lanes)/16.
            let s = first_cell + pc.j0;
            let e = s + pc.len;
            let mut t = s / lanes * lanes;
            while t < e {
                if t >= s && t + lanes <= e {
                    // Whole lane sets inside the piece: plain loads and FMAs, pointers
                    // stepping by a lane set.
                    let sets = (e - t) / lanes;
                    let off = t - s;
                    let mut pq: [*const f32; Q] =
                        std::array::from_fn(|q| p[q].wrapping_add(pc.j0 + off));
                    let mut rows: [*const f32; D] =
                        std::array::from_fn(|d| vp.wrapping_add((d0 + d) * stride + pc.col + off));
                    for _ in 0..sets {
                        for g in 0..G {
                            let pv: [__m512; Q] = std::array::from_fn(|q| {
                                // SAFETY: cells pc.j0 + off .. + lanes are in the piece (< n).
                                unsafe { _mm512_loadu_ps(pq[q].add(16 * g)) }
                            });
                            for d in 0..D {
                                // SAFETY: the matching columns of row d0 + d are the piece's.
                                let v = unsafe { _mm512_loadu_ps(rows[d].add(16 * g)) };
                                for q in 0..Q {
                                    acc[q][d][g] = _mm512_fmadd_ps(v, pv[q], acc[q][d][g]);
                                }
                            }
                        }
                        pq = pq.map(|x| x.wrapping_add(lanes));
                        rows = rows.map(|x| x.wrapping_add(lanes));
                    }
                    t += sets * lanes;
                    continue;
                }
                for g in 0..G {
                    let b = t + 16 * g;
                    let lo = s.saturating_sub(b).min(16);
                    let hi = e.saturating_sub(b).min(16);
                    if lo >= hi {
                        continue;
                    }
                    let m = (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as __mmask16;
                    // Element k of the group is cell j = pc.j0 + (b + k − s); the masked-off
                    // elements (outside the piece) are neither loaded nor added. The offset
                    // may point before the piece: wrapping pointer arithmetic, and the
                    // masked load reads only the in-range elements.
                    let off = b as isize - s as isize;
                    let pv: [__m512; Q] = std::array::from_fn(|q| {
                        // SAFETY: the unmasked elements are cells of the piece (< n).
                        unsafe {
                            _mm512_maskz_loadu_ps(m, p[q].wrapping_add(pc.j0).wrapping_offset(off))
                        }
                    });
                    for d in 0..D {
                        let row = vp.wrapping_add((d0 + d) * stride + pc.col);
                        // SAFETY: the unmasked elements are columns of the piece in row d0 + d.
                        let v = unsafe { _mm512_maskz_loadu_ps(m, row.wrapping_offset(off)) };
                        for q in 0..Q {
                            acc[q][d][g] = _mm512_mask3_fmadd_ps(v, pv[q], acc[q][d][g], m);
                        }
                    }
                }
                t += lanes;
            }
        }
        for (q, aq) in acc.iter().enumerate() {
            for (d, ad) in aq.iter().enumerate() {
                for (g, a) in ad.iter().enumerate() {
                    // SAFETY: as for the loads.
                    unsafe { _mm512_storeu_ps(sp.add(at(q, d, g)), *a) };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml_f32::PvAcc;

    fn rng(seed: u64) -> impl FnMut() -> f32 {
        let mut st = seed;
        move || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            ((st >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
        }
    }

    /// Bits equal, or both zeros (the per-cell [`PvAcc`] skips an untouched lane where ggml
    /// adds its +0.0, which can only change the sign of a zero sum).
    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a == 0.0 && b == 0.0)
    }

    #[test]
    fn transposed_pv_equals_the_per_cell_accumulator_and_the_scalar_path() {
        let mut rnd = rng(0x51ab_77c3_0042_9e11);
        // (head dim, column stride, runs, first cell, queries)
        type Case = (usize, usize, &'static [(usize, usize)], usize, usize);
        let cases: &[Case] = &[
            (64, 300, &[(0, 300)], 0, 3),
            (64, 1200, &[(5, 1100)], 5, 1),
            (80, 700, &[(650, 50), (0, 600)], 650, 7),
            (16, 70, &[(3, 17)], 17, 2),
            (256, 130, &[(0, 129)], 0, 4),
            (128, 2000, &[(1900, 100), (0, 1500)], 1900, 9),
            (64, 1030, &[(0, 1025)], 0, 5),
            (2, 40, &[(7, 9), (20, 3)], 63, 1),
            // More than four queries in tinyBLAS's order: dimension tiles outside, query
            // quads inside (a head width that is not a multiple of four, a wrapped ring).
            (256, 600, &[(500, 100), (0, 400)], 500, 16),
            (6, 90, &[(3, 80)], 7, 6),
            // An odd head width and query count (the AVX2 16-lane tiles' smaller shapes).
            (5, 60, &[(2, 50)], 16, 7),
            // An odd head width over many 64-cell cycles (several blocks of them, a partial
            // last block) in a wrapped ring: the AVX2 64-lane tiles' two-row and one-row
            // shapes with four and one queries.
            (7, 1700, &[(1650, 40), (0, 1600)], 1650, 5),
            // Six to eight queries (one-row tiles), then a second tile of eight and of one.
            (3, 700, &[(0, 650)], 0, 6),
            (2, 1100, &[(40, 1000)], 3, 17),
            // No cells at all (after calls that left the state dirty): zeros.
            (64, 10, &[], 0, 5),
        ];
        let mut state = Vec::new();
        let mut acc = PvAcc::default();
        for &(hd, stride, runs, first, nq) in cases {
            let runs: Vec<PvtRun> = runs.iter().map(|&(col, len)| PvtRun { col, len }).collect();
            let n: usize = runs.iter().map(|r| r.len).sum();
            let vt: Vec<f32> = (0..hd * stride).map(|_| rnd()).collect();
            let p: Vec<Vec<f32>> = (0..nq)
                .map(|i| {
                    // Some queries see only part of the cells (the rest p = 0).
                    (0..n)
                        .map(|j| if j + i < n { rnd().abs() } else { 0.0 })
                        .collect()
                })
                .collect();
            // Columns of the cells, in cell order.
            let cols: Vec<usize> = runs.iter().flat_map(|r| r.col..r.col + r.len).collect();
            for order in [PvOrder::VecDot, PvOrder::Gemm] {
                let mut outs = vec![vec![0f32; hd]; nq];
                let mut qs: Vec<PvtQuery<'_>> = p
                    .iter()
                    .zip(outs.iter_mut())
                    .map(|(p, out)| PvtQuery { p, out })
                    .collect();
                pv_t_f32(order, &vt, stride, &runs, first, &mut qs, &mut state);
                let lanes = if order == PvOrder::VecDot { 64 } else { 16 };
                let mut souts = vec![vec![0f32; hd]; nq];
                let mut sq: Vec<PvtQuery<'_>> = p
                    .iter()
                    .zip(souts.iter_mut())
                    .map(|(p, out)| PvtQuery { p, out })
                    .collect();
                let mut st = vec![0f32; nq * hd * lanes];
                scalar(lanes, &vt, stride, &runs, first, &mut sq, hd, &mut st);
                for i in 0..nq {
                    acc.reset(hd, order);
                    let mut col = vec![0f32; hd];
                    for (j, &c) in cols.iter().enumerate() {
                        for (d, x) in col.iter_mut().enumerate() {
                            *x = vt[d * stride + c];
                        }
                        acc.add(first + j, p[i][j], &col);
                    }
                    let mut want = vec![0f32; hd];
                    acc.finish(&mut want);
                    for d in 0..hd {
                        assert_eq!(
                            outs[i][d].to_bits(),
                            souts[i][d].to_bits(),
                            "simd vs scalar: hd {hd} n {n} first {first} q {i} d {d} {order:?}"
                        );
                        assert!(
                            same(outs[i][d], want[d]),
                            "vs PvAcc: hd {hd} n {n} first {first} q {i} d {d} {order:?}: {} {}",
                            outs[i][d],
                            want[d]
                        );
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "value run out of range")]
    fn a_run_past_the_rows_is_refused() {
        let vt = vec![0f32; 2 * 10];
        let p = vec![0f32; 8];
        let mut out = vec![0f32; 2];
        let mut qs = [PvtQuery {
            p: &p,
            out: &mut out,
        }];
        pv_t_f32(
            PvOrder::VecDot,
            &vt,
            10,
            &[PvtRun { col: 4, len: 8 }],
            0,
            &mut qs,
            &mut Vec::new(),
        );
    }
}
