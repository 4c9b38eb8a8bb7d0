//! Float weights (F32, F16, BF16) against two or more activation rows on AVX-512: register
//! tiles of weight rows × activation rows, each weight and activation vector loaded (and
//! widened) once per tile instead of once per dot. Every output is summed exactly as the
//! one-pair dot of its order sums it — the same products, accumulators, folds and tail — so
//! the bits equal one [`super::DotFn`] call per pair (tested against those functions).
//!
//! The orders ([`Order`]):
//! - [`Order::Gemm`], llamafile `tinyBLAS`'s (F32 and F16 weights in a call of two or more
//!   rows, row length a multiple of 16): one 16-lane accumulator per output over the row,
//!   then `reduce16` (`ggml_f32::dot_f32_gemm`, `dot_f16_gemm`). Tiles of 4 × 4 (16
//!   accumulators; measured against 4 × 5 and 4 × 6, which were no faster).
//! - [`Order::VecDot`], `ggml_vec_dot_f32` / `ggml_vec_dot_f16` (the one-row order, here for
//!   several sessions' decode rows): four 16-lane accumulators over 64-element steps, folded
//!   `(s0 + s2) + (s1 + s3)`, reduced, then the tail element by element (in f32; for f16 in
//!   f64). Tiles of 2 × 2.
//! - [`Order::Bf16`], the x86 BF16 kernel's (`dot_float`: BF16 is not in ggml's order): four
//!   8-lane accumulators over 32-element steps (here two 16-lane registers), then 8-element
//!   steps on the first, `(a0 + a1) + (a2 + a3)`, `hsum_ps`, the tail in f32. Tiles of 2 × 4.
//!
//! F16 weights take their activations already rounded to f16 and widened back to f32 (exact
//! both ways: the values ggml's f16 activations hold), so only the weights are widened in the
//! loop.
//!
//! Only the x86 AVX-512 path runs these (`KernelPath::Avx512Vnni`); other paths keep the
//! one-pair dots, whose bits these equal.

use std::arch::x86_64::*;

use synapse_formats::GgmlType;

use crate::ggml_f32::{has_avx512bf16, reduce16};

/// How an output is summed (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// tinyBLAS's one accumulator per output.
    Gemm,
    /// `ggml_vec_dot_f32` / `_f16`'s four accumulators over 64-element steps.
    VecDot,
    /// The x86 BF16 dot's four 8-lane accumulators over 32-element steps.
    Bf16,
    /// ggml's BF16 GEMM (tinyBLAS on AVX512-BF16): one `vdpbf16ps` accumulator per output over
    /// 32-element steps, then `reduce16`; bf16 activations.
    Bf16Gemm,
    /// `ggml_vec_dot_bf16` (AVX512-BF16): two `vdpbf16ps` accumulators over 64-element steps,
    /// each reduced into a double, the tail in double; bf16 activations.
    Bf16VecDot,
}

impl Order {
    /// The order a call of `ty` weights (`cols` wide) sums in, given whether the kernel
    /// selection took the encoding's many-row dot (`many`) and whether BF16 weights are in
    /// ggml's order (`ggml_bf16`: served only on a CPU with AVX512-BF16, whose instruction
    /// those orders are); `None` for encodings these tiles do not serve.
    pub(crate) fn of(ty: GgmlType, many: bool, cols: usize, ggml_bf16: bool) -> Option<Order> {
        match ty {
            GgmlType::BF16 if ggml_bf16 => {
                if !has_avx512bf16() {
                    None
                } else if many && cols.is_multiple_of(32) {
                    Some(Order::Bf16Gemm)
                } else {
                    Some(Order::Bf16VecDot)
                }
            }
            // The many-row dot of F32/F16 falls back to `vec_dot` for rows not a multiple
            // of 16 (as tinyBLAS declines them).
            GgmlType::F32 | GgmlType::F16 if many && cols.is_multiple_of(16) => Some(Order::Gemm),
            GgmlType::F32 | GgmlType::F16 => Some(Order::VecDot),
            GgmlType::BF16 => Some(Order::Bf16),
            _ => None,
        }
    }
}

/// [`Order`]s as the const parameter of the tile functions (one order per instance).
const GEMM: u8 = 0;
const VECDOT: u8 = 1;
const BF16: u8 = 2;
const BGEMM: u8 = 3;
const BVECDOT: u8 = 4;

/// The accumulators of an `M × N` tile of bf16 rows (weights at `w + m·ws`, activations at
/// `a + t·as_`, bytes) over `steps` steps of `ACC · 32` elements: output `(m, t)`'s
/// accumulator `c` (at `(m·N + t)·ACC + c`) is `vdpbf16ps` from zero over the 32-element
/// chunks `c, c + ACC, …`.
///
/// # Safety
/// `steps · ACC · 32` elements readable in every row; AVX-512F and AVX512-BF16.
#[inline(always)]
unsafe fn tile_bf16<const M: usize, const N: usize, const ACC: usize>(
    w: *const u8,
    ws: usize,
    a: *const u8,
    as_: usize,
    steps: usize,
) -> [__m512; 16] {
    debug_assert!(M * N * ACC <= 16);
    let ld = |p: *const u8| {
        // SAFETY: 64 bytes at `p` (below); a bit-for-bit reinterpretation.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.cast())) }
    };
    // SAFETY: AVX-512F and AVX512-BF16 (caller); every load is inside the rows' first
    // `steps · ACC · 32` elements.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); 16];
        for s in 0..steps {
            for c in 0..ACC {
                let e = (s * ACC + c) * 64;
                let wv: [__m512bh; M] = std::array::from_fn(|m| ld(w.add(m * ws + e)));
                for t in 0..N {
                    let av = ld(a.add(t * as_ + e));
                    for (m, &wm) in wv.iter().enumerate() {
                        let i = (m * N + t) * ACC + c;
                        acc[i] = _mm512_dpbf16_ps(acc[i], wm, av);
                    }
                }
            }
        }
        acc
    }
}

/// An element type: bytes per element, sixteen of them widened to f32, and one.
trait Elem {
    const ES: usize;
    /// # Safety
    /// 16 elements readable at `p`; AVX-512F and F16C.
    unsafe fn ld(p: *const u8) -> __m512;
    /// Eight elements widened to f32 (the AVX2 tiles).
    ///
    /// # Safety
    /// 8 elements readable at `p`; AVX2 and F16C.
    unsafe fn ld8(p: *const u8) -> __m256;
    /// # Safety
    /// One element readable at `p`.
    unsafe fn one(p: *const u8) -> f32;
}

struct F32;
struct F16;
struct Bf16;

impl Elem for F32 {
    const ES: usize = 4;
    #[inline(always)]
    unsafe fn ld(p: *const u8) -> __m512 {
        // SAFETY: 64 bytes at `p` (caller); AVX-512F.
        unsafe { _mm512_loadu_ps(p.cast()) }
    }
    #[inline(always)]
    unsafe fn ld8(p: *const u8) -> __m256 {
        // SAFETY: 32 bytes at `p` (caller); AVX.
        unsafe { _mm256_loadu_ps(p.cast()) }
    }
    #[inline(always)]
    unsafe fn one(p: *const u8) -> f32 {
        // SAFETY: 4 bytes at `p` (caller).
        unsafe { p.cast::<f32>().read_unaligned() }
    }
}

impl Elem for F16 {
    const ES: usize = 2;
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn ld(p: *const u8) -> __m512 {
        // One `vcvtph2ps` from memory, in inline assembly: the intrinsic's register form
        // (`{sae}`) took its source only from ymm0–15, and with the accumulators there LLVM
        // spilled the loaded halves to the stack (whose address then aliased the data and
        // made the kernel 50–90 GF/s from one process to the next).
        let v: __m512;
        // SAFETY: 32 bytes readable at `p` (caller); AVX-512F (the widening is exact).
        unsafe {
            std::arch::asm!(
                "vcvtph2ps {v}, ymmword ptr [{p}]",
                v = lateout(zmm_reg) v,
                p = in(reg) p,
                options(pure, readonly, nostack, preserves_flags),
            );
        }
        v
    }
    #[inline(always)]
    unsafe fn ld8(p: *const u8) -> __m256 {
        // SAFETY: 16 bytes at `p` (caller); F16C (exact).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn one(p: *const u8) -> f32 {
        // SAFETY: 2 bytes at `p` (caller).
        half::f16::from_bits(unsafe { p.cast::<u16>().read_unaligned() }).to_f32()
    }
}

impl Elem for Bf16 {
    const ES: usize = 2;
    #[inline(always)]
    unsafe fn ld(p: *const u8) -> __m512 {
        // SAFETY: 32 bytes at `p` (caller); AVX-512F. A bf16 is the high half of its f32.
        unsafe {
            let v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32(v, 16))
        }
    }
    #[inline(always)]
    unsafe fn ld8(p: *const u8) -> __m256 {
        // SAFETY: 16 bytes at `p` (caller); AVX2.
        unsafe {
            let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32(v, 16))
        }
    }
    #[inline(always)]
    unsafe fn one(p: *const u8) -> f32 {
        // SAFETY: 2 bytes at `p` (caller).
        f32::from_bits((unsafe { p.cast::<u16>().read_unaligned() } as u32) << 16)
    }
}

/// The accumulators of an `M × N` tile over `steps` steps of `ACC · 16` elements: output
/// `(m, t)`'s accumulator `c` — at `(m·N + t)·ACC + c` of the result (`M·N·ACC ≤ 16`) — sums,
/// from zero, `fma(w, a, acc)` over the 16-element chunks `c, c + ACC, c + 2·ACC, …` of weight
/// row `m` (at `w + m·ws` bytes) and activation row `t` (at `a + t·as_`). One flat array of
/// registers: nested arrays left some accumulators in stack memory across the loop.
///
/// # Safety
/// `steps · ACC · 16` elements readable in every row; AVX-512F and F16C.
#[inline(always)]
unsafe fn tile<W: Elem, A: Elem, const M: usize, const N: usize, const ACC: usize>(
    w: *const u8,
    ws: usize,
    a: *const u8,
    as_: usize,
    steps: usize,
) -> [__m512; 16] {
    debug_assert!(M * N * ACC <= 16);
    // SAFETY: AVX-512F (caller); every load below is inside the rows' first
    // `steps · ACC · 16` elements.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); 16];
        for s in 0..steps {
            for c in 0..ACC {
                let e = (s * ACC + c) * 16;
                let wv: [__m512; M] = std::array::from_fn(|m| W::ld(w.add(m * ws + e * W::ES)));
                for t in 0..N {
                    let av = A::ld(a.add(t * as_ + e * A::ES));
                    for (m, &wm) in wv.iter().enumerate() {
                        let i = (m * N + t) * ACC + c;
                        acc[i] = _mm512_fmadd_ps(wm, av, acc[i]);
                    }
                }
            }
        }
        acc
    }
}

#[inline(always)]
fn lanes(v: __m512) -> [f32; 16] {
    let mut o = [0f32; 16];
    // SAFETY: a 64-byte store into a 16-float array; AVX-512F (every caller's features).
    unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v) };
    o
}

/// One output of the `VecDot` order from its four 16-lane accumulators (`s[16c + l]`: lane `l`
/// of accumulator `c`): the fold, the reduction and the tail `np..n` (`wp`, `ap`: the pair's
/// rows).
///
/// # Safety
/// `n` elements readable in both rows.
#[inline(always)]
unsafe fn finish_vecdot<W: Elem, A: Elem>(
    s: &[f32; 64],
    wp: *const u8,
    ap: *const u8,
    np: usize,
    n: usize,
    wide_tail: bool,
) -> f32 {
    let f: [f32; 16] = std::array::from_fn(|l| (s[l] + s[32 + l]) + (s[16 + l] + s[48 + l]));
    // SAFETY: elements below `n` (caller).
    unsafe {
        if wide_tail {
            // `GGML_F16_VEC_REDUCE` stores into a double; the tail adds rounded f32 products.
            let mut sumf = reduce16(&f) as f64;
            for k in np..n {
                sumf += (W::one(wp.add(k * W::ES)) * A::one(ap.add(k * A::ES))) as f64;
            }
            sumf as f32
        } else {
            let mut sumf = reduce16(&f);
            for k in np..n {
                sumf += W::one(wp.add(k * W::ES)) * A::one(ap.add(k * A::ES));
            }
            sumf
        }
    }
}

/// One output of the `Bf16` order from its 32 accumulator lanes (the four 8-lane accumulators
/// of `dot_float` one after another), after `full` elements: the 8-element steps on the first,
/// the sum of the four, `hsum_ps`, the tail.
///
/// # Safety
/// `n` elements readable in both rows.
#[inline(always)]
unsafe fn finish_bf16(s: &[f32; 32], wp: *const u8, ap: *const u8, full: usize, n: usize) -> f32 {
    let (z0, z1) = (&s[..16], &s[16..]);
    let mut a0: [f32; 8] = std::array::from_fn(|l| z0[l]);
    let mut i = full;
    // SAFETY: elements below `n` (caller).
    unsafe {
        while i + 8 <= n {
            for (l, v) in a0.iter_mut().enumerate() {
                *v = Bf16::one(wp.add((i + l) * 2)).mul_add(F32::one(ap.add((i + l) * 4)), *v);
            }
            i += 8;
        }
        let v: [f32; 8] = std::array::from_fn(|l| (a0[l] + z0[8 + l]) + (z1[l] + z1[8 + l]));
        // `hsum_ps`: the 128-bit halves, then lanes (0 + 2) and (1 + 3).
        let h: [f32; 4] = std::array::from_fn(|l| v[l] + v[4 + l]);
        let mut s = (h[0] + h[2]) + (h[1] + h[3]);
        while i < n {
            s += Bf16::one(wp.add(i * 2)) * F32::one(ap.add(i * 4));
            i += 1;
        }
        s
    }
}

/// A register width's tiles: outputs of weight rows `m0..m0 + M` × activation rows
/// `t0..t0 + N` into `y` (`y[(t0 + t)·rows + m0 + m]`).
trait Tiles {
    /// # Safety
    /// As [`rows`], for rows inside the call; the CPU has the width's features.
    #[allow(clippy::too_many_arguments)]
    unsafe fn cell_block<W: Elem, A: Elem, const O: u8, const M: usize, const N: usize>(
        w: *const u8,
        wrb: usize,
        a: *const u8,
        arb: usize,
        cols: usize,
        y: *mut f32,
        rows: usize,
        m0: usize,
        t0: usize,
    );
}

/// 512-bit tiles: each output's accumulators whole in registers (`M·N·ACC ≤ 16`).
struct Zmm;
/// 256-bit tiles: the accumulators' 8-lane parts one pass at a time (`M·N ≤ 12`), each pass
/// over the same rows, then every output finished from its stored lanes — the same sums.
struct Ymm;

/// The 16·`C` lanes of the `C` accumulators at `acc[i..]`, as [`finish_vecdot`] and
/// [`finish_bf16`] take them.
#[inline(always)]
fn lanes_of<const L: usize>(acc: &[__m512]) -> [f32; L] {
    let mut o = [0f32; L];
    for (c, &v) in acc.iter().take(L / 16).enumerate() {
        o[16 * c..16 * c + 16].copy_from_slice(&lanes(v));
    }
    o
}

/// Each of an `M × N` tile's one-accumulator outputs (`acc[m·N + t]`) reduced as `reduce16`
/// reduces it, stored through `out(m, t)`: sixteen at once when the tile fills most of a
/// register set (unused accumulators are zeros), else one by one.
///
/// # Safety
/// `out` gives writable outputs; AVX-512F.
#[inline(always)]
unsafe fn store_reduced<const M: usize, const N: usize>(
    acc: &[__m512; 16],
    out: impl Fn(usize, usize) -> *mut f32,
) {
    // SAFETY: writable outputs (caller).
    unsafe {
        if M * N >= 12 {
            let r = lanes(crate::ggml_f32::avx512::reduce16x16_ordered(acc));
            for (c, &r) in r[..M * N].iter().enumerate() {
                *out(c / N, c % N) = r;
            }
        } else {
            for m in 0..M {
                for t in 0..N {
                    *out(m, t) = reduce16(&lanes(acc[m * N + t]));
                }
            }
        }
    }
}

impl Tiles for Zmm {
    #[inline(always)]
    unsafe fn cell_block<W: Elem, A: Elem, const O: u8, const M: usize, const N: usize>(
        w: *const u8,
        wrb: usize,
        a: *const u8,
        arb: usize,
        cols: usize,
        y: *mut f32,
        rows: usize,
        m0: usize,
        t0: usize,
    ) {
        let wp = |m: usize| w.wrapping_add((m0 + m) * wrb);
        let ap = |t: usize| a.wrapping_add((t0 + t) * arb);
        let out = |m: usize, t: usize| y.wrapping_add((t0 + t) * rows + m0 + m);
        // SAFETY: the rows are inside the call's weights and activations, `cols` elements
        // each (caller); each output written is this chunk's.
        unsafe {
            match O {
                GEMM => {
                    let acc = tile::<W, A, M, N, 1>(wp(0), wrb, ap(0), arb, cols / 16);
                    store_reduced::<M, N>(&acc, out);
                }
                VECDOT => {
                    let np = cols & !63;
                    let acc = tile::<W, A, M, N, 4>(wp(0), wrb, ap(0), arb, np / 64);
                    for m in 0..M {
                        for t in 0..N {
                            let s = lanes_of::<64>(&acc[(m * N + t) * 4..]);
                            *out(m, t) =
                                finish_vecdot::<W, A>(&s, wp(m), ap(t), np, cols, W::ES == 2);
                        }
                    }
                }
                BGEMM => {
                    let acc = tile_bf16::<M, N, 1>(wp(0), wrb, ap(0), arb, cols / 32);
                    store_reduced::<M, N>(&acc, out);
                }
                BVECDOT => {
                    let np = cols & !63;
                    let acc = tile_bf16::<M, N, 2>(wp(0), wrb, ap(0), arb, np / 64);
                    for m in 0..M {
                        for t in 0..N {
                            let i = (m * N + t) * 2;
                            let mut sumf = reduce16(&lanes(acc[i])) as f64;
                            sumf += reduce16(&lanes(acc[i + 1])) as f64;
                            for k in np..cols {
                                sumf += (Bf16::one(wp(m).add(2 * k)) * Bf16::one(ap(t).add(2 * k)))
                                    as f64;
                            }
                            *out(m, t) = sumf as f32;
                        }
                    }
                }
                _ => {
                    let full = cols & !31;
                    let acc = tile::<W, A, M, N, 2>(wp(0), wrb, ap(0), arb, full / 32);
                    for m in 0..M {
                        for t in 0..N {
                            let s = lanes_of::<32>(&acc[(m * N + t) * 2..]);
                            *out(m, t) = finish_bf16(&s, wp(m), ap(t), full, cols);
                        }
                    }
                }
            }
        }
    }
}

/// One 256-bit pass of an `M × N` tile: output `(m, t)`'s lanes `off..off + 8` of each
/// `stride`-element step, summed from zero over `steps` steps (`fma(w, a, acc)`), at
/// `m·N + t` of the result.
///
/// # Safety
/// `steps · stride` elements readable in every row; AVX2, FMA and F16C.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pass8<W: Elem, A: Elem, const M: usize, const N: usize>(
    w: *const u8,
    ws: usize,
    a: *const u8,
    as_: usize,
    steps: usize,
    stride: usize,
    off: usize,
) -> [__m256; 12] {
    debug_assert!(M * N <= 12);
    // SAFETY: AVX2/FMA/F16C (caller); every load is inside the rows' first `steps · stride`
    // elements.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 12];
        for s in 0..steps {
            let e = s * stride + off;
            let wv: [__m256; M] = std::array::from_fn(|m| W::ld8(w.add(m * ws + e * W::ES)));
            for t in 0..N {
                let av = A::ld8(a.add(t * as_ + e * A::ES));
                for (m, &wm) in wv.iter().enumerate() {
                    acc[m * N + t] = _mm256_fmadd_ps(wm, av, acc[m * N + t]);
                }
            }
        }
        acc
    }
}

/// The `L` accumulator lanes (`L / 8` passes of [`pass8`], pass `p` the lanes `8p..8p + 8`)
/// of every output of an `M × N` tile over `steps` steps of `L / ACC`… elements (`stride`).
///
/// # Safety
/// As [`pass8`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn passes<W: Elem, A: Elem, const M: usize, const N: usize, const L: usize>(
    w: *const u8,
    ws: usize,
    a: *const u8,
    as_: usize,
    steps: usize,
    stride: usize,
) -> [[f32; L]; 12] {
    let mut cells = [[0f32; L]; 12];
    for p in 0..L / 8 {
        // SAFETY: forwarded.
        let acc = unsafe { pass8::<W, A, M, N>(w, ws, a, as_, steps, stride, 8 * p) };
        for (cell, v) in cells.iter_mut().zip(acc).take(M * N) {
            // SAFETY: 8 floats at `8p` of a cell of `L`.
            unsafe { _mm256_storeu_ps(cell[8 * p..].as_mut_ptr(), v) };
        }
    }
    cells
}

impl Tiles for Ymm {
    #[inline(always)]
    unsafe fn cell_block<W: Elem, A: Elem, const O: u8, const M: usize, const N: usize>(
        w: *const u8,
        wrb: usize,
        a: *const u8,
        arb: usize,
        cols: usize,
        y: *mut f32,
        rows: usize,
        m0: usize,
        t0: usize,
    ) {
        let wp = |m: usize| w.wrapping_add((m0 + m) * wrb);
        let ap = |t: usize| a.wrapping_add((t0 + t) * arb);
        let out = |m: usize, t: usize| y.wrapping_add((t0 + t) * rows + m0 + m);
        // SAFETY: as `Zmm`'s.
        unsafe {
            match O {
                GEMM => {
                    let c = passes::<W, A, M, N, 16>(wp(0), wrb, ap(0), arb, cols / 16, 16);
                    for (i, c) in c.iter().take(M * N).enumerate() {
                        *out(i / N, i % N) = reduce16(c);
                    }
                }
                VECDOT => {
                    let np = cols & !63;
                    let c = passes::<W, A, M, N, 64>(wp(0), wrb, ap(0), arb, np / 64, 64);
                    for (i, c) in c.iter().take(M * N).enumerate() {
                        let (m, t) = (i / N, i % N);
                        *out(m, t) = finish_vecdot::<W, A>(c, wp(m), ap(t), np, cols, W::ES == 2);
                    }
                }
                _ => {
                    let full = cols & !31;
                    let c = passes::<W, A, M, N, 32>(wp(0), wrb, ap(0), arb, full / 32, 32);
                    for (i, c) in c.iter().take(M * N).enumerate() {
                        let (m, t) = (i / N, i % N);
                        *out(m, t) = finish_bf16(c, wp(m), ap(t), full, cols);
                    }
                }
            }
        }
    }
}

/// Weight rows `m0..m0 + M` against every activation row: tiles of `N` rows, then the rest.
///
/// # Safety
/// As [`rows`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn weight_rows<B: Tiles, W: Elem, A: Elem, const O: u8, const M: usize, const N: usize>(
    w: *const u8,
    wrb: usize,
    a: *const u8,
    arb: usize,
    cols: usize,
    (t0, t1): (usize, usize),
    y: *mut f32,
    rows: usize,
    m0: usize,
) {
    let mut t = t0;
    // SAFETY: forwarded (every activation row below `t1` is inside the call).
    unsafe {
        while t + N <= t1 {
            B::cell_block::<W, A, O, M, N>(w, wrb, a, arb, cols, y, rows, m0, t);
            t += N;
        }
        // The rest in tiles of 4, 2 and 1 rows (of those narrower than `N`).
        while t < t1 {
            let r = t1 - t;
            if r >= 4 && N > 4 {
                B::cell_block::<W, A, O, M, 4>(w, wrb, a, arb, cols, y, rows, m0, t);
                t += 4;
            } else if r >= 2 && N > 2 {
                B::cell_block::<W, A, O, M, 2>(w, wrb, a, arb, cols, y, rows, m0, t);
                t += 2;
            } else {
                B::cell_block::<W, A, O, M, 1>(w, wrb, a, arb, cols, y, rows, m0, t);
                t += 1;
            }
        }
    }
}

/// Activation rows per block: a block's rows stay in L2 while the chunk's weight rows pass
/// over them.
const TBLOCK: usize = 64;

/// The tiles over weight rows `r0..r1` (`M` at a time, then one by one) and every
/// activation row (blocks of [`TBLOCK`]).
///
/// # Safety
/// As [`rows`], with the width's CPU features.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn drive<B: Tiles, W: Elem, A: Elem, const O: u8, const M: usize, const N: usize>(
    w: *const u8,
    wrb: usize,
    a: *const u8,
    arb: usize,
    cols: usize,
    n: usize,
    y: *mut f32,
    rows: usize,
    r0: usize,
    r1: usize,
) {
    let block = (TBLOCK / N).max(1) * N;
    let mut t0 = 0;
    while t0 < n {
        let t1 = (t0 + block).min(n);
        let mut m = r0;
        // SAFETY: forwarded from `rows`.
        unsafe {
            while m + M <= r1 {
                weight_rows::<B, W, A, O, M, N>(w, wrb, a, arb, cols, (t0, t1), y, rows, m);
                m += M;
            }
            for m in m..r1 {
                weight_rows::<B, W, A, O, 1, N>(w, wrb, a, arb, cols, (t0, t1), y, rows, m);
            }
        }
        t0 = t1;
    }
}

/// [`drive`] with 512-bit tiles.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn run<W: Elem, A: Elem, const O: u8, const M: usize, const N: usize>(
    w: *const u8,
    wrb: usize,
    a: *const u8,
    arb: usize,
    cols: usize,
    n: usize,
    y: *mut f32,
    rows: usize,
    r0: usize,
    r1: usize,
) {
    // SAFETY: forwarded; AVX-512F here.
    unsafe { drive::<Zmm, W, A, O, M, N>(w, wrb, a, arb, cols, n, y, rows, r0, r1) }
}

/// [`drive`] with 512-bit tiles of bf16 rows (`vdpbf16ps`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn run_bf<const O: u8, const M: usize, const N: usize>(
    w: *const u8,
    wrb: usize,
    a: *const u8,
    arb: usize,
    cols: usize,
    n: usize,
    y: *mut f32,
    rows: usize,
    r0: usize,
    r1: usize,
) {
    // SAFETY: forwarded; AVX-512F and AVX512-BF16 here.
    unsafe { drive::<Zmm, Bf16, Bf16, O, M, N>(w, wrb, a, arb, cols, n, y, rows, r0, r1) }
}

/// [`drive`] with 256-bit tiles.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn run2<W: Elem, A: Elem, const O: u8, const M: usize, const N: usize>(
    w: *const u8,
    wrb: usize,
    a: *const u8,
    arb: usize,
    cols: usize,
    n: usize,
    y: *mut f32,
    rows: usize,
    r0: usize,
    r1: usize,
) {
    // SAFETY: forwarded; AVX2, FMA and F16C here.
    unsafe { drive::<Ymm, W, A, O, M, N>(w, wrb, a, arb, cols, n, y, rows, r0, r1) }
}

/// Outputs `y[t·rows + r]` for weight rows `r0..r1` and every activation row `t < n`, in
/// `order`: `w` the matrix's rows (`ty`, `cols` elements each, `rows` of them), `a` the
/// activation rows (f32, `cols` elements each, densely packed; for F16 weights rounded to f16
/// values, see [`round_f16`]; for the ggml BF16 orders bf16 as ggml rounds them); 512-bit tiles
/// with `zmm`, else 256-bit ones (the ggml BF16 orders always 512-bit).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C, and with `zmm` (or a ggml BF16 order) AVX-512F (and
/// AVX512-BF16 for those orders); `w` holds `rows` rows and `a`
/// `n`; `order` is one `Order::of(ty, …)` gave; `y` holds `n · rows` outputs, of which this
/// call writes only those of rows `r0..r1 ≤ rows`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows(
    zmm: bool,
    ty: GgmlType,
    order: Order,
    w: &[u8],
    cols: usize,
    a: &[u8],
    n: usize,
    y: *mut f32,
    rows: usize,
    r0: usize,
    r1: usize,
) {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let args = (wp, ap, cols, n, y, rows, r0, r1);
    // SAFETY: forwarded (caller).
    unsafe {
        match (ty, order, zmm) {
            (GgmlType::F32, Order::Gemm, true) => go(run::<F32, F32, GEMM, 4, 4>, 4, 4, args),
            (GgmlType::F16, Order::Gemm, true) => go(run::<F16, F32, GEMM, 4, 4>, 2, 4, args),
            (GgmlType::F32, Order::VecDot, true) => go(run::<F32, F32, VECDOT, 2, 2>, 4, 4, args),
            (GgmlType::F16, Order::VecDot, true) => go(run::<F16, F32, VECDOT, 1, 4>, 2, 4, args),
            (GgmlType::BF16, Order::Bf16, true) => go(run::<Bf16, F32, BF16, 2, 4>, 2, 4, args),
            (GgmlType::F32, Order::Gemm, false) => go(run2::<F32, F32, GEMM, 3, 4>, 4, 4, args),
            (GgmlType::F16, Order::Gemm, false) => go(run2::<F16, F32, GEMM, 3, 4>, 2, 4, args),
            (GgmlType::F32, Order::VecDot, false) => go(run2::<F32, F32, VECDOT, 3, 4>, 4, 4, args),
            (GgmlType::F16, Order::VecDot, false) => go(run2::<F16, F32, VECDOT, 3, 4>, 2, 4, args),
            (GgmlType::BF16, Order::Bf16, false) => go(run2::<Bf16, F32, BF16, 3, 4>, 2, 4, args),
            (GgmlType::BF16, Order::Bf16Gemm, _) => go(run_bf::<BGEMM, 4, 4>, 2, 2, args),
            (GgmlType::BF16, Order::Bf16VecDot, _) => go(run_bf::<BVECDOT, 2, 4>, 2, 2, args),
            _ => unreachable!("ftile::rows: {ty:?} in {order:?} is no pair Order::of gives"),
        }
    }
}

/// A run function's signature.
type RunFn =
    unsafe fn(*const u8, usize, *const u8, usize, usize, usize, *mut f32, usize, usize, usize);

/// Calls `f` with the rows' byte strides (`wes`, `aes` bytes an element).
///
/// # Safety
/// As [`rows`], for the width `f` was made for.
#[inline(always)]
unsafe fn go(
    f: RunFn,
    wes: usize,
    aes: usize,
    (wp, ap, cols, n, y, rows, r0, r1): (
        *const u8,
        *const u8,
        usize,
        usize,
        *mut f32,
        usize,
        usize,
        usize,
    ),
) {
    // SAFETY: forwarded.
    unsafe { f(wp, cols * wes, ap, cols * aes, cols, n, y, rows, r0, r1) }
}

/// `x` rounded to f16 values (round to nearest even, as ggml's conversion of F16 weights'
/// activations), kept as f32 in `out`.
pub(crate) fn round_f16(x: &[f32], out: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    let mut h = [half::f16::ZERO; 256];
    for (xc, oc) in x.chunks(256).zip(out.chunks_mut(256)) {
        let h = &mut h[..xc.len()];
        h.convert_from_f32_slice(xc);
        h.convert_to_f32_slice(oc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::{ActKind, quantize_rows};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn has_avx512() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("f16c")
            && std::arch::is_x86_feature_detected!("fma")
    }

    /// Every order, shape remainder and row count against the one-pair dots, bit for bit.
    #[test]
    fn tiles_equal_the_one_pair_dots() {
        if !has_avx512() {
            eprintln!("skipped: no AVX-512F/F16C on this CPU");
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let cases: &[(GgmlType, Order, &[usize])] = &[
            (GgmlType::F32, Order::Gemm, &[16, 48, 576, 1040]),
            (GgmlType::F16, Order::Gemm, &[16, 48, 576, 1040]),
            (GgmlType::F32, Order::VecDot, &[1, 17, 64, 100, 576, 1000]),
            (GgmlType::F16, Order::VecDot, &[1, 17, 64, 100, 576, 1000]),
            (
                GgmlType::BF16,
                Order::Bf16,
                &[1, 9, 31, 32, 40, 100, 576, 1000],
            ),
            (GgmlType::BF16, Order::Bf16Gemm, &[32, 96, 576, 1024]),
            (
                GgmlType::BF16,
                Order::Bf16VecDot,
                &[1, 31, 64, 100, 576, 1000],
            ),
        ];
        for &(ty, order, colss) in cases {
            let ggml_bf16 = matches!(order, Order::Bf16Gemm | Order::Bf16VecDot);
            if ggml_bf16 && !has_avx512bf16() {
                continue;
            }
            let (dot, act) = match (ty, order) {
                (_, Order::Bf16Gemm) => (super::super::dot_bf16_ggml_gemm as _, ActKind::Bf16),
                (_, Order::Bf16VecDot) => (super::super::dot_bf16_ggml as _, ActKind::Bf16),
                (GgmlType::F32, Order::Gemm) => (
                    super::super::dot_f32_ggml_gemm as super::super::DotFn,
                    ActKind::F32,
                ),
                (GgmlType::F16, Order::Gemm) => {
                    (super::super::dot_f16_ggml_gemm as _, ActKind::F16)
                }
                (GgmlType::F32, Order::VecDot) => (super::super::dot_f32_ggml as _, ActKind::F32),
                (GgmlType::F16, Order::VecDot) => (super::super::dot_f16_ggml as _, ActKind::F16),
                _ => (super::super::x86::avx2::dot_bf16 as _, ActKind::F32),
            };
            for &cols in colss {
                for &(nrows, n) in &[
                    (4, 2),
                    (8, 5),
                    (13, 4),
                    (7, 9),
                    (1, 3),
                    (12, 70),
                    (8, 11),
                    (4, 6),
                ] {
                    let wf: Vec<f32> = (0..nrows * cols)
                        .map(|_| rng.random_range(-2.0..2.0))
                        .collect();
                    let w: Vec<u8> = match ty {
                        GgmlType::F32 => bytemuck::cast_slice(&wf).to_vec(),
                        GgmlType::F16 => wf
                            .iter()
                            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                            .collect(),
                        _ => wf
                            .iter()
                            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                            .collect(),
                    };
                    let x: Vec<f32> = (0..n * cols).map(|_| rng.random_range(-2.0..2.0)).collect();
                    let arb = act.row_bytes(cols);
                    let mut a = vec![0u8; n * arb];
                    quantize_rows(act, &x, cols, &mut a);
                    // The tiles' activations: f32, rounded to f16 values for F16 weights.
                    let mut xa = x.clone();
                    if ty == GgmlType::F16 {
                        round_f16(&x, &mut xa);
                    }
                    let mut y = vec![f32::NAN; n * nrows];
                    let wrb = w.len() / nrows;
                    // Two chunks, as two threads would split them.
                    let mid = nrows / 2;
                    for zmm in [true, false] {
                        y.fill(f32::NAN);
                        // SAFETY: AVX-512F/F16C/FMA checked; shapes as documented.
                        unsafe {
                            let a = if ggml_bf16 {
                                &a[..]
                            } else {
                                bytemuck::cast_slice(&xa)
                            };
                            rows(
                                zmm,
                                ty,
                                order,
                                &w,
                                cols,
                                a,
                                n,
                                y.as_mut_ptr(),
                                nrows,
                                0,
                                mid,
                            );
                            rows(
                                zmm,
                                ty,
                                order,
                                &w,
                                cols,
                                a,
                                n,
                                y.as_mut_ptr(),
                                nrows,
                                mid,
                                nrows,
                            );
                        }
                        for t in 0..n {
                            for r in 0..nrows {
                                // SAFETY: one row of each; the dot's path is supported.
                                let want = unsafe {
                                    dot(w[r * wrb..].as_ptr(), a[t * arb..].as_ptr(), cols)
                                };
                                assert_eq!(
                                    y[t * nrows + r].to_bits(),
                                    want.to_bits(),
                                    "{ty:?} {order:?} zmm {zmm} cols {cols} rows {nrows} n {n}: ({r}, {t})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
