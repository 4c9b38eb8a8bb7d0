//! f32 attention primitives in ggml's exact float order (its x86 AVX-512 build, the one the
//! project's oracle runs): `q·k` as `ggml_vec_dot_f32`, the softmax as `ggml_vec_soft_max_f32`
//! (ggml's vector `expf` polynomial, 16-wide chunk sums added in f64), and `P·V` as either
//! llamafile's `tinyBLAS` f32 GEMM (a batch of two or more query rows) or `ggml_vec_dot_f32`
//! (one query row). Every product-sum is a fused multiply-add, as in those kernels, so the
//! results are bit-identical to llama.cpp's non-flash attention with an f32 KV cache.
//!
//! The order is a property of the arithmetic, not of a CPU: the functions here give the same
//! bits on every machine (with or without hardware FMA; `f32::mul_add` is exact either way).
//! Where the CPU has FMA the loops are compiled for it (runtime dispatch), otherwise they run
//! through the correctly-rounded software `fma`.

mod pvt;
pub use pvt::{PvtQuery, PvtRun, pv_t_f32};

/// `_mm512_reduce_add_ps`: halves added pairwise down to one lane.
#[inline(always)]
pub fn reduce16(v: &[f32; 16]) -> f32 {
    let t8: [f32; 8] = std::array::from_fn(|i| v[8 + i] + v[i]);
    let t4: [f32; 4] = std::array::from_fn(|i| t8[4 + i] + t8[i]);
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

#[inline(always)]
fn c(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// ggml's vector `expf` (range reduction by `n = round(x·log2 e)`, a degree-5 polynomial in
/// the reduced argument, `scalef`), one lane of it. Not libm's `expf`: the two differ in the
/// last bit for some inputs, and the softmax must use this one to match ggml.
#[inline(always)]
pub fn expf(x: f32) -> f32 {
    let r = c(0x4b40_0000); // 1.5·2²³: adding it rounds to an integer
    let z = x.mul_add(c(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    let u = b * b;
    let j = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)));
    let j = j.mul_add(u, c(0x3f7f_fff6).mul_add(b, 1.0));
    if n.abs() > 192.0 || n.is_nan() {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // scalef(j, n) = j·2ⁿ rounded once (exact in f64, including the subnormal range);
    // |n| ≤ 192 here, so 2ⁿ is a normal f64 built from its exponent bits.
    let p2 = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    (j as f64 * p2) as f32
}

#[cfg(target_arch = "x86_64")]
fn has_fma() -> bool {
    static F: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F.get_or_init(|| {
        std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("avx2")
    })
}

/// A public function running `$body` compiled for FMA when the CPU has it.
macro_rules! fma_dispatch {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident: $t:ty),*) -> $r:ty => $body:ident) => {
        $(#[$m])*
        $vis fn $name($($a: $t),*) -> $r {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn fast($($a: $t),*) -> $r {
                    $body($($a),*)
                }
                if has_fma() {
                    // SAFETY: the CPU has FMA (checked at run time).
                    return unsafe { fast($($a),*) };
                }
            }
            $body($($a),*)
        }
    };
}

#[inline(always)]
fn dot_body(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut s = [[0f32; 16]; 4];
    for (xc, yc) in x[..np].chunks_exact(64).zip(y[..np].chunks_exact(64)) {
        let (Ok(xc), Ok(yc)) = (<&[f32; 64]>::try_from(xc), <&[f32; 64]>::try_from(yc)) else {
            continue;
        };
        for (j, acc) in s.iter_mut().enumerate() {
            for (l, a) in acc.iter_mut().enumerate() {
                *a = xc[16 * j + l].mul_add(yc[16 * j + l], *a);
            }
        }
    }
    let mut sumf = reduce16(&fold4(&s));
    // The tail is not contracted in ggml's build: product rounded, then added (checked
    // against llama.cpp's `kq` with head_dim 16).
    for k in np..n {
        sumf += x[k] * y[k];
    }
    sumf
}

/// `GGML_F32x16_REDUCE` over four accumulators: `(s0 + s2) + (s1 + s3)` lane by lane.
#[inline(always)]
fn fold4(s: &[[f32; 16]; 4]) -> [f32; 16] {
    std::array::from_fn(|l| (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]))
}

/// `ggml_vec_dot_f32` (AVX-512 build): four 16-lane FMA accumulators over 64-element steps,
/// folded and reduced, then the tail added element by element.
pub fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        return unsafe { simd::dot(x, y) };
    }
    dot_body(x, y)
}

#[inline(always)]
fn gemm_dot_body(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    for (xc, yc) in x.chunks_exact(16).zip(y.chunks_exact(16)) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a = xc[l].mul_add(yc[l], *a);
        }
    }
    reduce16(&acc)
}

/// One output of llamafile's `tinyBLAS` f32 GEMM (AVX-512 build, two or more activation
/// rows): a 16-lane FMA accumulator over the whole row, then `_mm512_reduce_add_ps`.
/// `x.len()` must be a multiple of 16 (tinyBLAS declines other shapes; ggml then uses
/// [`dot_f32`]).
pub fn dot_f32_gemm(x: &[f32], y: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        return unsafe { simd::gemm_dot(x, y) };
    }
    gemm_dot_body(x, y)
}

#[inline(always)]
fn h(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

#[inline(always)]
fn dot_f16_body(x: &[u16], y: &[u16]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut s = [[0f32; 16]; 4];
    for (xc, yc) in x[..np].chunks_exact(64).zip(y[..np].chunks_exact(64)) {
        for (j, acc) in s.iter_mut().enumerate() {
            for (l, a) in acc.iter_mut().enumerate() {
                *a = h(xc[16 * j + l]).mul_add(h(yc[16 * j + l]), *a);
            }
        }
    }
    // GGML_F16_VEC_REDUCE stores into a double, and the tail adds rounded f32 products to it.
    let mut sumf = reduce16(&fold4(&s)) as f64;
    for k in np..n {
        sumf += (h(x[k]) * h(y[k])) as f64;
    }
    sumf as f32
}

#[inline(always)]
fn gemm_dot_f16_body(x: &[u16], y: &[u16]) -> f32 {
    let mut acc = [0f32; 16];
    for (xc, yc) in x.chunks_exact(16).zip(y.chunks_exact(16)) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a = h(xc[l]).mul_add(h(yc[l]), *a);
        }
    }
    reduce16(&acc)
}

/// Whether the CPU has AVX2, FMA and F16C (checked once).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_f16c() -> bool {
    static F: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F.get_or_init(|| has_fma() && std::arch::is_x86_feature_detected!("f16c"))
}

fma_dispatch! {
    /// The portable `dot_f16` (and the reference of the F16C path).
    fn dot_f16_portable(x: &[u16], y: &[u16]) -> f32 => dot_f16_body
}

fma_dispatch! {
    /// The portable `dot_f16_gemm` (and the reference of the F16C path).
    fn dot_f16_gemm_portable(x: &[u16], y: &[u16]) -> f32 => gemm_dot_f16_body
}

/// `ggml_vec_dot_f16` (AVX-512 build without AVX512-FP16): both operands f16 (the
/// activations rounded to f16 first, as ggml's `vec_dot_type` conversion does), widened
/// to f32, four 16-lane FMA accumulators over 64-element steps, folded and reduced into a
/// double, the tail's f32 products added in double, the sum rounded to f32.
pub fn dot_f16(x: &[u16], y: &[u16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked at run time).
        return unsafe { simd::dot_f16(x, y) };
    }
    dot_f16_portable(x, y)
}

/// One output of llamafile's `tinyBLAS` F16 GEMM (AVX-512 build, two or more activation
/// rows, both operands f16 widened to f32): a 16-lane FMA accumulator over the whole row,
/// then `_mm512_reduce_add_ps`. `x.len()` must be a multiple of 16 (tinyBLAS declines
/// other shapes; ggml then uses [`dot_f16`]).
pub fn dot_f16_gemm(x: &[u16], y: &[u16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked at run time).
        return unsafe { simd::gemm_dot_f16(x, y) };
    }
    dot_f16_gemm_portable(x, y)
}

/// A bf16 widened to f32 (exact).
#[inline(always)]
fn bf(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Denormals flushed to a zero of their sign (the `vdpbf16ps` DAZ and FTZ rules).
#[inline(always)]
fn ftz(x: f32) -> f32 {
    if x.is_subnormal() {
        0f32.copysign(x)
    } else {
        x
    }
}

/// One 32-bit lane of `vdpbf16ps`: `acc + a₁·b₁` and then `+ a₀·b₀`, each a fused
/// multiply-add rounded to nearest even, with denormal inputs read as zero and denormal
/// results flushed to zero. Measured bit for bit against the instruction (AMD Zen 4) on
/// random lanes with denormals, overflows and signed zeros (the test below runs it against
/// the CPU's own instruction wherever the CPU has one).
#[inline(always)]
fn dpbf16_lane(acc: f32, a0: u16, a1: u16, b0: u16, b1: u16) -> f32 {
    let t = ftz(ftz(bf(a1)).mul_add(ftz(bf(b1)), ftz(acc)));
    ftz(ftz(bf(a0)).mul_add(ftz(bf(b0)), t))
}

/// `vdpbf16ps` over one 32-element chunk into 16 lanes (lane l: elements 2l and 2l + 1).
#[inline(always)]
fn dpbf16_chunk(acc: &mut [f32; 16], x: &[u16], y: &[u16]) {
    for (l, a) in acc.iter_mut().enumerate() {
        *a = dpbf16_lane(*a, x[2 * l], x[2 * l + 1], y[2 * l], y[2 * l + 1]);
    }
}

#[inline(always)]
fn dot_bf16_body(x: &[u16], y: &[u16]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let (mut c1, mut c2) = ([0f32; 16], [0f32; 16]);
    for (xc, yc) in x[..np].chunks_exact(64).zip(y[..np].chunks_exact(64)) {
        dpbf16_chunk(&mut c1, &xc[..32], &yc[..32]);
        dpbf16_chunk(&mut c2, &xc[32..], &yc[32..]);
    }
    let mut sumf = reduce16(&c1) as f64;
    sumf += reduce16(&c2) as f64;
    for k in np..n {
        sumf += (bf(x[k]) * bf(y[k])) as f64;
    }
    sumf as f32
}

#[inline(always)]
fn gemm_dot_bf16_body(x: &[u16], y: &[u16]) -> f32 {
    let mut c = [0f32; 16];
    for (xc, yc) in x.chunks_exact(32).zip(y.chunks_exact(32)) {
        dpbf16_chunk(&mut c, xc, yc);
    }
    reduce16(&c)
}

fma_dispatch! {
    /// The portable `dot_bf16` (and the reference of the AVX512-BF16 path).
    fn dot_bf16_portable(x: &[u16], y: &[u16]) -> f32 => dot_bf16_body
}

fma_dispatch! {
    /// The portable `dot_bf16_gemm` (and the reference of the AVX512-BF16 path).
    fn dot_bf16_gemm_portable(x: &[u16], y: &[u16]) -> f32 => gemm_dot_bf16_body
}

/// The CPU has AVX-512F and AVX512-BF16 (the BF16 dots' and tiles' instruction).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512bf16() -> bool {
    static F: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    })
}

/// `ggml_vec_dot_bf16` (AVX512-BF16 build): both operands bf16 (the activations rounded by
/// ggml's `fp32_to_bf16`), two 16-lane `vdpbf16ps` accumulators over 64-element steps (the
/// first 32 elements, the second 32), each reduced as `_mm512_reduce_add_ps` into a double,
/// the tail's f32 products added in double, the sum rounded to f32.
pub fn dot_bf16(x: &[u16], y: &[u16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx512bf16() {
        // SAFETY: the CPU has AVX-512F and AVX512-BF16 (checked at run time).
        return unsafe { bf16x::dot(x, y) };
    }
    dot_bf16_portable(x, y)
}

/// One output of llamafile's `tinyBLAS` BF16 GEMM (AVX512-BF16 build, two or more activation
/// rows): one 16-lane `vdpbf16ps` accumulator over 32-element steps, then
/// `_mm512_reduce_add_ps`. `x.len()` must be a multiple of 32 (tinyBLAS declines other
/// shapes; ggml then uses [`dot_bf16`]).
pub fn dot_bf16_gemm(x: &[u16], y: &[u16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx512bf16() {
        // SAFETY: the CPU has AVX-512F and AVX512-BF16 (checked at run time).
        return unsafe { bf16x::gemm_dot(x, y) };
    }
    dot_bf16_gemm_portable(x, y)
}

/// The BF16 dots with the CPU's own `vdpbf16ps`.
#[cfg(target_arch = "x86_64")]
mod bf16x {
    use std::arch::x86_64::*;

    use super::{bf, reduce16};

    /// 32 bf16 at `p`.
    ///
    /// # Safety
    /// 64 bytes readable at `p`; AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn ld(p: *const u16) -> __m512bh {
        // SAFETY: 64 bytes at `p` (caller); a bit-for-bit reinterpretation.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.cast())) }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn lanes(v: __m512) -> [f32; 16] {
        let mut o = [0f32; 16];
        // SAFETY: a 64-byte store into 16 floats.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v) };
        o
    }

    /// [`super::dot_bf16_body`] with the instruction.
    ///
    /// # Safety
    /// The CPU has AVX-512F and AVX512-BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn dot(x: &[u16], y: &[u16]) -> f32 {
        let n = x.len().min(y.len());
        let np = n & !63;
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        let (mut c1, mut c2) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut i = 0;
        // SAFETY: loads below `np <= n` in both slices.
        unsafe {
            while i < np {
                c1 = _mm512_dpbf16_ps(c1, ld(xp.add(i)), ld(yp.add(i)));
                c2 = _mm512_dpbf16_ps(c2, ld(xp.add(i + 32)), ld(yp.add(i + 32)));
                i += 64;
            }
        }
        let mut sumf = reduce16(&lanes(c1)) as f64;
        sumf += reduce16(&lanes(c2)) as f64;
        for k in np..n {
            sumf += (bf(x[k]) * bf(y[k])) as f64;
        }
        sumf as f32
    }

    /// [`super::gemm_dot_bf16_body`] with the instruction.
    ///
    /// # Safety
    /// The CPU has AVX-512F and AVX512-BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn gemm_dot(x: &[u16], y: &[u16]) -> f32 {
        let n = x.len().min(y.len()) & !31;
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        let mut c = _mm512_setzero_ps();
        let mut i = 0;
        // SAFETY: loads below `n` in both slices.
        unsafe {
            while i < n {
                c = _mm512_dpbf16_ps(c, ld(xp.add(i)), ld(yp.add(i)));
                i += 32;
            }
        }
        reduce16(&lanes(c))
    }

    /// The instruction on one register of lanes (the emulation's test).
    ///
    /// # Safety
    /// The CPU has AVX-512F and AVX512-BF16.
    #[cfg(test)]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn dp(acc: &[f32; 16], a: &[u16; 32], b: &[u16; 32]) -> [f32; 16] {
        // SAFETY: 64-byte loads of 16 floats and 32 bf16 each.
        unsafe {
            lanes(_mm512_dpbf16_ps(
                _mm512_loadu_ps(acc.as_ptr()),
                ld(a.as_ptr()),
                ld(b.as_ptr()),
            ))
        }
    }
}

#[inline(always)]
fn softmax_body(sc: &mut [f32], first_cell: usize) {
    if sc.is_empty() {
        return;
    }
    let max = sc.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0f64;
    let mut chunk = [0f32; 16];
    let mut cur = usize::MAX;
    for (j, v) in sc.iter_mut().enumerate() {
        let cell = first_cell + j;
        if cell / 16 != cur {
            if cur != usize::MAX {
                sum += reduce16(&chunk) as f64;
            }
            chunk = [0.0; 16];
            cur = cell / 16;
        }
        *v = expf(*v - max);
        chunk[cell % 16] = *v;
    }
    if cur != usize::MAX {
        sum += reduce16(&chunk) as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in sc.iter_mut() {
        *v *= inv;
    }
}

#[inline(always)]
fn swiglu_body(g: &[f32], u: &[f32], y: &mut [f32]) {
    let n = y.len().min(g.len()).min(u.len());
    let nv = n & !15;
    for ((y, &g), &u) in y[..nv].iter_mut().zip(&g[..nv]).zip(&u[..nv]) {
        *y = g / (1.0 + expf(0.0 - g)) * u;
    }
    // The tail: ggml's scalar `ggml_silu_f32`, libm's `expf`.
    for ((y, &g), &u) in y[nv..n].iter_mut().zip(&g[nv..n]).zip(&u[nv..n]) {
        *y = g / (1.0 + (-g).exp()) * u;
    }
}

fma_dispatch! {
    /// `ggml_vec_swiglu_f32` over one row (AVX-512 build): `y = silu(g)·u` with
    /// `silu(g) = g / (1 + expf(−g))`, ggml's vector `expf` on whole 16-lane chunks and libm's
    /// on the tail, the quotient and the product each rounded (no fused step). Call it per row:
    /// the tail is where the row ends.
    pub fn swiglu(g: &[f32], u: &[f32], y: &mut [f32]) -> () => swiglu_body
}

fma_dispatch! {
    /// [`softmax_cells`] one cell at a time (the reference; non-AVX-512 CPUs).
    fn softmax_cells_scalar(sc: &mut [f32], first_cell: usize) -> () => softmax_body
}

/// ggml's softmax of one attention row in place. `sc[j]` is the score of KV cell
/// `first_cell + j`; cells outside `sc` are masked (−∞, so exactly 0 after `exp`). The
/// cell index matters: ggml sums the exponentials 16 cells at a time (aligned to cell 0)
/// in f32, then the chunk sums in f64, and scales by `(float)(1/sum)`. On AVX-512 a whole
/// 16-cell chunk at a time (ggml's vector `expf` with its own `scalef`; the same bits), on
/// AVX2 two 8-lane halves of one.
pub fn softmax_cells(sc: &mut [f32], first_cell: usize) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: the CPU has AVX-512F (checked at run time).
        unsafe { avx512::softmax(sc, first_cell) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        unsafe { simd::softmax(sc, first_cell) };
        return;
    }
    softmax_cells_scalar(sc, first_cell)
}

/// `ggml_soft_max` of one row in place (scale 1, no mask: a MoE router's probabilities), in
/// the order of ggml's AVX-512 build: the maximum, then whole 16-wide chunks through ggml's
/// vector [`expf`], each chunk's [`reduce16`] added to an f64 sum, then the tail (the last
/// `len % 16` values, all of them for a row shorter than 16) through libm's `expf` one value
/// at a time into the same f64 sum; every value is scaled by `(float)(1 / sum)`.
pub fn softmax_row(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let max = x
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| if m > v { m } else { v });
    let mut sum = 0f64;
    let nv = x.len() / 16 * 16;
    for ch in x[..nv].chunks_exact_mut(16) {
        let mut v = [0f32; 16];
        for (e, o) in ch.iter_mut().zip(v.iter_mut()) {
            *e = expf(*e - max);
            *o = *e;
        }
        sum += reduce16(&v) as f64;
    }
    for e in &mut x[nv..] {
        *e = (*e - max).exp();
        sum += *e as f64;
    }
    let inv = (1.0 / sum) as f32;
    for e in x.iter_mut() {
        *e *= inv;
    }
}

/// The order in which `P·V` is summed over KV cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PvOrder {
    /// One query row in the batch: `ggml_vec_dot_f32` over the cells (4×16 lanes).
    VecDot,
    /// Two or more query rows: tinyBLAS f32 GEMM (one 16-lane accumulator over the cells).
    Gemm,
}

/// Accumulates `Σ_cells p·v` for one head in ggml's order. Feed cells in increasing order.
#[derive(Debug)]
pub struct PvAcc {
    /// `lanes × head_dim` partial sums (`lanes` = 64 for [`PvOrder::VecDot`], 16 for Gemm).
    acc: Vec<f32>,
    /// Which lanes have received a cell since the last reset (the others read as 0, so a
    /// short context does not pay for clearing all 64 lanes per head).
    touched: [bool; 64],
    /// Reduction scratch of [`PvAcc::finish`].
    scratch: Vec<f32>,
    hd: usize,
    lanes: usize,
}

impl Default for PvAcc {
    fn default() -> Self {
        PvAcc {
            acc: Vec::new(),
            touched: [false; 64],
            scratch: Vec::new(),
            hd: 0,
            lanes: 16,
        }
    }
}

#[inline(always)]
fn axpy_body(acc: &mut [f32], p: f32, v: &[f32]) {
    for (a, &x) in acc.iter_mut().zip(v) {
        *a = x.mul_add(p, *a);
    }
}

/// `acc[i] = fma(v[i], p, acc[i])`.
fn axpy_fma(acc: &mut [f32], p: f32, v: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        return unsafe { simd::axpy(acc, p, v) };
    }
    axpy_body(acc, p, v)
}

/// AVX2+FMA versions of the bodies above: the same per-lane operations in the same order
/// (16 lanes as two 8-lane registers), so the same bits.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{fold4, reduce16};
    use std::arch::x86_64::*;

    /// `ggml_vec_dot`'s four 16-lane accumulators over the first `np` (a multiple of 64)
    /// elements, each 16-lane accumulator as two 8-lane halves; `ld(i)` loads elements
    /// `i..i + 8` of both operands as f32.
    ///
    /// # Safety
    /// Inlined only into functions compiled with AVX2 and FMA, on a CPU that has them.
    #[inline(always)]
    unsafe fn lanes64(np: usize, ld: impl Fn(usize) -> (__m256, __m256)) -> [[f32; 16]; 4] {
        // SAFETY: AVX2 and FMA (caller).
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 8];
            let mut i = 0;
            while i < np {
                for (k, a) in acc.iter_mut().enumerate() {
                    let (x, y) = ld(i + 8 * k);
                    *a = _mm256_fmadd_ps(x, y, *a);
                }
                i += 64;
            }
            let mut s = [[0f32; 16]; 4];
            for (j, sj) in s.iter_mut().enumerate() {
                // Each half is 8 floats of the 16-float array.
                _mm256_storeu_ps(sj.as_mut_ptr(), acc[2 * j]);
                _mm256_storeu_ps(sj.as_mut_ptr().add(8), acc[2 * j + 1]);
            }
            s
        }
    }

    /// tinyBLAS's one 16-lane accumulator over the first `n` (a multiple of 16) elements,
    /// reduced; `ld` as for [`lanes64`].
    ///
    /// # Safety
    /// As [`lanes64`].
    #[inline(always)]
    unsafe fn lanes16(n: usize, ld: impl Fn(usize) -> (__m256, __m256)) -> f32 {
        // SAFETY: AVX2 and FMA (caller).
        unsafe {
            let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            while i < n {
                let ((x0, y0), (x1, y1)) = (ld(i), ld(i + 8));
                lo = _mm256_fmadd_ps(x0, y0, lo);
                hi = _mm256_fmadd_ps(x1, y1, hi);
                i += 16;
            }
            let mut v = [0f32; 16];
            // Two 8-float halves of a 16-float array.
            _mm256_storeu_ps(v.as_mut_ptr(), lo);
            _mm256_storeu_ps(v.as_mut_ptr().add(8), hi);
            reduce16(&v)
        }
    }

    /// [`lanes64`] over two f32 rows, folded and reduced in registers: `reduce16(fold4(s))`
    /// lane for lane — the 16-lane accumulator `j` is `acc[2j]` (lanes 0–7) and `acc[2j + 1]`
    /// (lanes 8–15), so the fold is `(acc₀ + acc₄) + (acc₂ + acc₆)` for the low lanes and
    /// `(acc₁ + acc₅) + (acc₃ + acc₇)` for the high ones; then high + low, the two 4-lane
    /// halves, and `(t₀ + t₂) + (t₁ + t₃)`.
    ///
    /// # Safety
    /// AVX2 and FMA; `x` and `y` are valid for `np` (a multiple of 64) reads.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot64(x: *const f32, y: *const f32, np: usize) -> f32 {
        // SAFETY: loads below `np` (caller).
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 8];
            let mut i = 0;
            while i < np {
                for (k, a) in acc.iter_mut().enumerate() {
                    let (xv, yv) = (
                        _mm256_loadu_ps(x.add(i + 8 * k)),
                        _mm256_loadu_ps(y.add(i + 8 * k)),
                    );
                    *a = _mm256_fmadd_ps(xv, yv, *a);
                }
                i += 64;
            }
            let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
            let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
            reduce16_halves(lo, hi)
        }
    }

    /// [`super::reduce16`] of sixteen lanes held as their low and high eight: high + low,
    /// then the two 4-lane halves, then `(t₀ + t₂) + (t₁ + t₃)`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn reduce16_halves(lo: __m256, hi: __m256) -> f32 {
        let t8 = _mm256_add_ps(hi, lo);
        let t4 = _mm_add_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
        let t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
        _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)))
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot(x: &[f32], y: &[f32]) -> f32 {
        let n = x.len().min(y.len());
        let np = n & !63;
        // SAFETY: AVX2/FMA here; `dot64` loads below `np <= n` for both slices.
        let mut sumf = unsafe { dot64(x.as_ptr(), y.as_ptr(), np) };
        for k in np..n {
            sumf += x[k] * y[k];
        }
        sumf
    }

    /// [`super::scores_f32`] for `Q` (1–4) queries of width `hd` (a multiple of 64) at once,
    /// key after key: each key row is loaded once for the `Q` queries (the per-query
    /// [`scores`] loads key and query for every FMA). Each dot is [`dot64`]'s: accumulator
    /// `a` (lanes `8a..8a + 8` of each 64-element step) an FMA chain over the steps from
    /// zero, the accumulators folded `((a₀ + a₄) + (a₂ + a₆))` and `((a₁ + a₅) + (a₃ +
    /// a₇))`, those added `hi + lo`, then [`reduce16_halves`]'s remaining adds — here
    /// accumulator pair by accumulator pair for the `Q` queries together (their registers
    /// fit), and the `Q` dots' last adds transposed ([`reduce4`]), the same operations on
    /// the same operands. `outs[i][j]` is query `i`'s score of key `offs[j]`.
    ///
    /// With `fetch`, the key two rows on is prefetched with each key (the first pass over
    /// keys that come from memory).
    ///
    /// # Safety
    /// AVX2 and FMA; `hd` is a multiple of 64, every `qs[i]` holds `hd` floats and every
    /// `outs[i]` `offs.len()`; every `offs[j] + hd <= keys.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scores_q<const Q: usize>(
        keys: &[f32],
        offs: &[usize],
        qs: [*const f32; Q],
        hd: usize,
        scale: f32,
        outs: [*mut f32; Q],
        fetch: bool,
    ) {
        let kp = keys.as_ptr();
        let z = _mm256_setzero_ps();
        let sv = _mm_set1_ps(scale);
        // SAFETY: loads inside a key row (caller) or a query; stores inside the outputs.
        unsafe {
            for (j, &o) in offs.iter().enumerate() {
                let x = kp.add(o);
                // The key two rows on, asked for now (a decode step's keys come from memory).
                if fetch && let Some(&n2) = offs.get(j + 2) {
                    let r = kp.wrapping_add(n2) as *const i8;
                    let mut ln = 0;
                    while ln < hd {
                        _mm_prefetch::<_MM_HINT_T0>(r.wrapping_add(4 * ln));
                        ln += 16;
                    }
                }
                // Accumulator `a` of every query: its FMA chain over the steps.
                macro_rules! chain {
                    ($a:expr) => {{
                        let mut acc = [z; Q];
                        let mut i = 8 * $a;
                        while i < hd {
                            let xv = _mm256_loadu_ps(x.add(i));
                            for (c, q) in acc.iter_mut().zip(qs) {
                                *c = _mm256_fmadd_ps(xv, _mm256_loadu_ps(q.add(i)), *c);
                            }
                            i += 64;
                        }
                        acc
                    }};
                }
                // `(a + b)` of two accumulators, every query.
                macro_rules! pair {
                    ($a:expr, $b:expr) => {{
                        let (u, v) = (chain!($a), chain!($b));
                        let mut s = [z; Q];
                        for ((s, u), v) in s.iter_mut().zip(u).zip(v) {
                            *s = _mm256_add_ps(u, v);
                        }
                        s
                    }};
                }
                let (s04, s26) = (pair!(0, 4), pair!(2, 6));
                let mut lo = [z; Q];
                for ((l, a), b) in lo.iter_mut().zip(s04).zip(s26) {
                    *l = _mm256_add_ps(a, b);
                }
                let (s15, s37) = (pair!(1, 5), pair!(3, 7));
                let mut t = [z; 4];
                for (((t, a), b), l) in t.iter_mut().zip(s15).zip(s37).zip(lo) {
                    *t = _mm256_add_ps(_mm256_add_ps(a, b), l);
                }
                // The unused lanes of a smaller tile: any value (not stored).
                let r = _mm_mul_ps(reduce4(t4_pair(t[0], t[1]), t4_pair(t[2], t[3])), sv);
                let mut rv = [0f32; 4];
                _mm_storeu_ps(rv.as_mut_ptr(), r);
                for (out, v) in outs.iter().zip(rv) {
                    *out.add(j) = v;
                }
            }
        }
    }

    /// `[t(a) | t(b)]`, `t = hi₁₂₈ + lo₁₂₈` of each: [`reduce16_halves`]'s second add for two
    /// dots.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn t4_pair(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x31>(a, b),
            _mm256_permute2f128_ps::<0x20>(a, b),
        )
    }

    /// The rest of [`reduce16_halves`] for four dots given as [`t4_pair`]s `ab` and `cd`:
    /// `[a, b, c, d]`, each `(t₀ + t₂) + (t₁ + t₃)` of its `t`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn reduce4(ab: __m256, cd: __m256) -> __m128 {
        // Per 128-bit lane [x₀ + x₂, x₁ + x₃, y₀ + y₂, y₁ + y₃]: [a, a, c, c | b, b, d, d].
        let u = _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(ab, cd),
            _mm256_shuffle_ps::<0b11_10_11_10>(ab, cd),
        );
        // [a, c, ·, · | b, d, ·, ·].
        let r = _mm256_add_ps(
            _mm256_shuffle_ps::<0b00_00_10_00>(u, u),
            _mm256_shuffle_ps::<0b00_00_11_01>(u, u),
        );
        _mm_unpacklo_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps::<1>(r))
    }

    /// [`super::scores_f32`] for a query whose width `hd` is a multiple of 64: `dot(key, q)
    /// · scale` per key, each dot [`dot64`].
    ///
    /// # Safety
    /// AVX2 and FMA; `hd` is a multiple of 64 and every `offs[j] + hd <= keys.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scores(
        keys: &[f32],
        offs: &[usize],
        q: &[f32],
        scale: f32,
        out: &mut [f32],
    ) {
        let hd = q.len();
        let (kp, qp) = (keys.as_ptr(), q.as_ptr());
        let mut j = 0;
        if hd == 64 {
            // One 64-element step per dot: four keys' dots are independent straight-line
            // code, interleaved so their add chains overlap.
            while j + 4 <= out.len().min(offs.len()) {
                // SAFETY: key rows `offs[j..j + 4]` are in range (caller).
                let v = unsafe {
                    [
                        dot64(kp.add(offs[j]), qp, 64),
                        dot64(kp.add(offs[j + 1]), qp, 64),
                        dot64(kp.add(offs[j + 2]), qp, 64),
                        dot64(kp.add(offs[j + 3]), qp, 64),
                    ]
                };
                for (o, v) in out[j..j + 4].iter_mut().zip(v) {
                    *o = v * scale;
                }
                j += 4;
            }
        }
        for (o, &at) in out[j..].iter_mut().zip(&offs[j..]) {
            // SAFETY: key row `at..at + hd` is in range (caller), `q` holds hd floats.
            *o = unsafe { dot64(kp.add(at), qp, hd) } * scale;
        }
    }

    /// Keys transposed per block of [`scores_t`]: a block of this many keys (16 KB at head
    /// width 64) stays in L1 while every query scores it.
    pub(super) const T_KEYS: usize = 64;

    /// Keys `offs` (a multiple of eight, at most [`T_KEYS`]) of width 64 transposed into
    /// `kt`: element `e` of keys `8g .. 8g + 8` is the eight floats at `kt[(64g + e) · 8 ..]`.
    /// Group `g`'s eight keys of the `next` block are prefetched with it (keys from memory came
    /// at ~80% of the key-by-key path's speed without).
    ///
    /// # Safety
    /// AVX2; every `offs[j] + 64 <= keys.len()`, and `kt` holds `64 · offs.len()` floats
    /// (`next` is only prefetched, never read).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn transpose64(keys: &[f32], offs: &[usize], kt: *mut f32, next: &[usize]) {
        let kp = keys.as_ptr();
        // SAFETY: loads inside the key rows, stores inside `kt` (caller).
        unsafe {
            for (g, o) in offs.chunks_exact(8).enumerate() {
                for &n in next.iter().skip(8 * g).take(8) {
                    let r = kp.wrapping_add(n) as *const i8;
                    for ln in 0..4 {
                        _mm_prefetch::<_MM_HINT_T0>(r.wrapping_add(64 * ln));
                    }
                }
                for c in 0..8 {
                    let r: [__m256; 8] =
                        std::array::from_fn(|i| _mm256_loadu_ps(kp.add(o[i] + 8 * c)));
                    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
                    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
                    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
                    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
                    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
                    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
                    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
                    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
                    // Columns 0–3 of keys 0–3 (low 128 bits) and of keys 4–7, and 4–7 (high).
                    let u = [
                        _mm256_shuffle_ps::<0x44>(t0, t2),
                        _mm256_shuffle_ps::<0xee>(t0, t2),
                        _mm256_shuffle_ps::<0x44>(t1, t3),
                        _mm256_shuffle_ps::<0xee>(t1, t3),
                    ];
                    let v = [
                        _mm256_shuffle_ps::<0x44>(t4, t6),
                        _mm256_shuffle_ps::<0xee>(t4, t6),
                        _mm256_shuffle_ps::<0x44>(t5, t7),
                        _mm256_shuffle_ps::<0xee>(t5, t7),
                    ];
                    let d = kt.add((64 * g + 8 * c) * 8);
                    for k in 0..4 {
                        _mm256_storeu_ps(d.add(8 * k), _mm256_permute2f128_ps::<0x20>(u[k], v[k]));
                        _mm256_storeu_ps(
                            d.add(8 * (k + 4)),
                            _mm256_permute2f128_ps::<0x31>(u[k], v[k]),
                        );
                    }
                }
            }
        }
    }

    /// Scores of `NQ` queries of width 64 against `KG` groups of eight transposed keys
    /// ([`transpose64`]), eight keys per register lane: each dot is [`dot64`]'s — the
    /// products `fma(k, q, 0)` of accumulator `a`, lane `l` (element `8a + l`), folded
    /// `((a₀ + a₄) + (a₂ + a₆))` and `((a₁ + a₅) + (a₃ + a₇))` lane by lane, `hi + lo`, then
    /// [`reduce16_halves`]' `t₄ᵢ = t₈₍ᵢ₊₄₎ + t₈ᵢ` and `(t₄₀ + t₄₂) + (t₄₁ + t₄₃)` — the same
    /// additions of the same operands, with no horizontal step. Scores of group `g` go to
    /// `outs[i] + 8g`.
    ///
    /// # Safety
    /// AVX2 and FMA; `kt` holds `KG` transposed groups, each query 64 floats and each output
    /// `8 · KG`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scores_t<const NQ: usize, const KG: usize>(
        kt: *const f32,
        qs: [*const f32; NQ],
        scale: f32,
        outs: [*mut f32; NQ],
    ) {
        let z = _mm256_setzero_ps();
        // SAFETY: loads inside `kt` and the queries, stores inside the outputs (caller).
        unsafe {
            let p = |e: usize| -> [[__m256; KG]; NQ] {
                let k: [__m256; KG] =
                    std::array::from_fn(|g| _mm256_loadu_ps(kt.add((64 * g + e) * 8)));
                std::array::from_fn(|i| {
                    let b = _mm256_broadcast_ss(&*qs[i].add(e));
                    std::array::from_fn(|g| _mm256_fmadd_ps(k[g], b, z))
                })
            };
            let add = |a: [[__m256; KG]; NQ], b: [[__m256; KG]; NQ]| -> [[__m256; KG]; NQ] {
                std::array::from_fn(|i| std::array::from_fn(|g| _mm256_add_ps(a[i][g], b[i][g])))
            };
            let t8 = |l: usize| {
                let lo = add(add(p(l), p(32 + l)), add(p(16 + l), p(48 + l)));
                let hi = add(add(p(8 + l), p(40 + l)), add(p(24 + l), p(56 + l)));
                add(hi, lo)
            };
            let t20 = add(add(t8(4), t8(0)), add(t8(6), t8(2)));
            let r = add(t20, add(add(t8(5), t8(1)), add(t8(7), t8(3))));
            let sv = _mm256_set1_ps(scale);
            for (o, ri) in outs.iter().zip(r) {
                for (g, v) in ri.into_iter().enumerate() {
                    _mm256_storeu_ps(o.add(8 * g), _mm256_mul_ps(v, sv));
                }
            }
        }
    }

    /// The lanes `lo..hi` of eight as an all-ones mask (bounds may lie outside `0..8`: a
    /// half of a 16-lane range).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn lane_mask(lo: i32, hi: i32) -> __m256i {
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_and_si256(
            _mm256_cmpgt_epi32(lane, _mm256_set1_epi32(lo - 1)),
            _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), lane),
        )
    }

    /// ggml's vector [`super::expf`] on eight lanes, lane for lane the scalar one's bits:
    /// the same fused steps, and `scalef(j, n)` as `j·2ⁿ` — exact when every lane's `n` is in
    /// −125..=127 (`j` is within [0.7, 1.5], so the product is a normal float); otherwise
    /// (a subnormal or flushed result, a NaN) the eight lanes go through the scalar `expf`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn v_expf(x: __m256) -> __m256 {
        let c = |b: u32| _mm256_set1_ps(f32::from_bits(b));
        let r = c(0x4b40_0000);
        let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm256_fmadd_ps(c(0x3f7f_fff6), b, _mm256_set1_ps(1.0)),
        );
        // Ordered compares: a NaN lane fails them and takes the scalar path.
        let ok = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_GE_OQ>(n, _mm256_set1_ps(-125.0)),
            _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_set1_ps(127.0)),
        );
        if _mm256_movemask_ps(ok) == 0xff {
            let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(n),
                _mm256_set1_epi32(127),
            ));
            return _mm256_mul_ps(j, _mm256_castsi256_ps(e));
        }
        let mut v = [0f32; 8];
        // SAFETY: 8 floats.
        unsafe { _mm256_storeu_ps(v.as_mut_ptr(), x) };
        let v = v.map(super::expf);
        // SAFETY: 8 floats.
        unsafe { _mm256_loadu_ps(v.as_ptr()) }
    }

    /// [`super::softmax_cells`] a 16-cell chunk (two 8-lane halves) at a time: the same
    /// maximum, exponentials, per-chunk `reduce16` added to an f64 sum, and scaling.
    ///
    /// # Safety
    /// AVX2 and FMA are available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn softmax(sc: &mut [f32], first_cell: usize) {
        let n = sc.len();
        if n == 0 {
            return;
        }
        let p = sc.as_mut_ptr();
        // The largest score, NaNs skipped as `f32::max` does (a NaN lane of `v` yields the
        // running maximum), eight lanes at a time, then the tail.
        let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n.
            mv = _mm256_max_ps(unsafe { _mm256_loadu_ps(p.add(i)) }, mv);
            i += 8;
        }
        let mut m8 = [0f32; 8];
        // SAFETY: 8 floats.
        unsafe { _mm256_storeu_ps(m8.as_mut_ptr(), mv) };
        let max = sc[i..]
            .iter()
            .chain(&m8)
            .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mx = _mm256_set1_ps(max);
        let mut sum = 0f64;
        let (c0, c1) = (first_cell / 16, (first_cell + n - 1) / 16);
        for c in c0..=c1 {
            let cell0 = 16 * c;
            // The chunk's cells inside `sc`, as lane indices lo..hi of the 16.
            let lo = first_cell.max(cell0) - cell0;
            let hi = (first_cell + n).min(cell0 + 16) - cell0;
            if lo == 0 && hi == 16 {
                // A whole chunk: plain loads and stores (a masked store is microcoded on
                // AMD's cores).
                let at = p.wrapping_add(cell0).wrapping_sub(first_cell);
                // SAFETY: the chunk's 16 cells are inside `sc`.
                unsafe {
                    let e0 = v_expf(_mm256_sub_ps(_mm256_loadu_ps(at), mx));
                    let e1 = v_expf(_mm256_sub_ps(_mm256_loadu_ps(at.add(8)), mx));
                    _mm256_storeu_ps(at, e0);
                    _mm256_storeu_ps(at.add(8), e1);
                    sum += reduce16_halves(e0, e1) as f64;
                }
                continue;
            }
            let mut halves = [_mm256_setzero_ps(); 2];
            for (h, out) in halves.iter_mut().enumerate() {
                let (l, r) = (lo.max(8 * h), hi.min(8 * h + 8));
                if l >= r {
                    continue;
                }
                let m = lane_mask((l - 8 * h) as i32, (r - 8 * h) as i32);
                // Lane k of this half is cell cell0 + 8h + k, i.e. sc[cell0 + 8h + k −
                // first_cell]; only the masked-in lanes (inside sc) are touched.
                let base = p.wrapping_add(cell0 + 8 * h).wrapping_sub(first_cell);
                // SAFETY: masked loads and stores touch only lanes inside `sc`.
                unsafe {
                    let v = _mm256_maskload_ps(base, m);
                    let e = _mm256_and_ps(v_expf(_mm256_sub_ps(v, mx)), _mm256_castsi256_ps(m));
                    _mm256_maskstore_ps(base, m, e);
                    *out = e;
                }
            }
            sum += reduce16_halves(halves[0], halves[1]) as f64;
        }
        let inv = (1.0 / sum) as f32;
        let iv = _mm256_set1_ps(inv);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n.
            unsafe { _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), iv)) };
            i += 8;
        }
        for v in &mut sc[i..] {
            *v *= inv;
        }
    }

    /// 8 f16 at `p` widened to f32 (exact).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn ld8h(p: *const u16) -> __m256 {
        // SAFETY: 8 halves at `p` (caller).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }

    /// `dot_f16_body` with the widening in hardware (F16C) and each 16-lane accumulator as
    /// two 8-lane halves: the same products, sums and order.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_f16(x: &[u16], y: &[u16]) -> f32 {
        let n = x.len().min(y.len());
        let np = n & !63;
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        // SAFETY: AVX2/FMA/F16C here; `lanes64` loads below `np <= n` for both slices.
        let s = unsafe { lanes64(np, |i| (ld8h(xp.add(i)), ld8h(yp.add(i)))) };
        let mut sumf = reduce16(&fold4(&s)) as f64;
        for k in np..n {
            sumf += (super::h(x[k]) * super::h(y[k])) as f64;
        }
        sumf as f32
    }

    /// `gemm_dot_f16_body` with F16C widening (see [`dot_f16`]).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn gemm_dot_f16(x: &[u16], y: &[u16]) -> f32 {
        let n = x.len().min(y.len()) & !15;
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        // SAFETY: AVX2/FMA/F16C here; `lanes16` loads below `n` for both slices.
        unsafe { lanes16(n, |i| (ld8h(xp.add(i)), ld8h(yp.add(i)))) }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gemm_dot(x: &[f32], y: &[f32]) -> f32 {
        let n = x.len().min(y.len()) & !15;
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        // SAFETY: AVX2/FMA here; `lanes16` loads below `n` for both slices.
        unsafe {
            lanes16(n, |i| {
                (_mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(yp.add(i)))
            })
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn axpy(acc: &mut [f32], p: f32, v: &[f32]) {
        let n = acc.len().min(v.len());
        let (ap, vp) = (acc.as_mut_ptr(), v.as_ptr());
        let pv = _mm256_set1_ps(p);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n for both slices.
            unsafe {
                let a = _mm256_loadu_ps(ap.add(i));
                _mm256_storeu_ps(
                    ap.add(i),
                    _mm256_fmadd_ps(_mm256_loadu_ps(vp.add(i)), pv, a),
                );
            }
            i += 8;
        }
        for k in i..n {
            acc[k] = v[k].mul_add(p, acc[k]);
        }
    }
}

impl PvAcc {
    /// Clears the accumulator for a head of `head_dim` values in `order`.
    pub fn reset(&mut self, head_dim: usize, order: PvOrder) {
        self.hd = head_dim;
        self.lanes = match order {
            PvOrder::VecDot => 64,
            PvOrder::Gemm => 16,
        };
        if self.acc.len() < self.lanes * head_dim {
            self.acc.resize(self.lanes * head_dim, 0.0);
        }
        self.touched = [false; 64];
    }

    /// Adds `p · v` for KV cell `cell` (`v.len() == head_dim`).
    pub fn add(&mut self, cell: usize, p: f32, v: &[f32]) {
        let l = cell % self.lanes;
        let acc = &mut self.acc[l * self.hd..(l + 1) * self.hd];
        if !self.touched[l] {
            acc.fill(0.0);
            self.touched[l] = true;
        }
        axpy_fma(acc, p, v);
    }

    /// Writes the reduced sums into `out` (`head_dim` values).
    pub fn finish(&mut self, out: &mut [f32]) {
        let hd = self.hd.min(out.len());
        // Whole rows of the head dimension at a time (vectorizes). An untouched lane is a row
        // of +0.0 in ggml, and `x + 0 = x` for every x but −0.0; a lane sum is −0.0 only when
        // all its products underflowed, and then skipping changes at most the sign of a zero
        // (which the next matmul's quantizer maps to 0 either way). Otherwise the same bits
        // as `fold4` + `reduce16` over all lanes.
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(32 * hd, 0.0);
        let (v, rest) = scratch.split_at_mut(16 * hd);
        let (t, rest) = rest.split_at_mut(8 * hd);
        let (u, w) = rest.split_at_mut(4 * hd);
        let (p02, p13) = w.split_at_mut(2 * hd);
        let acc = &self.acc;
        let row = |l: usize| self.touched[l].then(|| &acc[l * self.hd..l * self.hd + hd]);
        let mut vh = [false; 16];
        for (l, vh) in vh.iter_mut().enumerate() {
            let vl = &mut v[l * hd..(l + 1) * hd];
            *vh = if self.lanes == 64 {
                let a = add_rows(&mut p02[..hd], row(l), row(32 + l));
                let b = add_rows(&mut p13[..hd], row(16 + l), row(48 + l));
                add_rows(vl, a.then_some(&p02[..hd]), b.then_some(&p13[..hd]))
            } else {
                add_rows(vl, row(l), None)
            };
        }
        let vr = |i: usize, h: &[bool]| h[i].then(|| &v[i * hd..(i + 1) * hd]);
        let mut th = [false; 8];
        for (i, th) in th.iter_mut().enumerate() {
            *th = add_rows(&mut t[i * hd..(i + 1) * hd], vr(8 + i, &vh), vr(i, &vh));
        }
        let tr = |i: usize, h: &[bool]| h[i].then(|| &t[i * hd..(i + 1) * hd]);
        let mut uh = [false; 4];
        for (i, uh) in uh.iter_mut().enumerate() {
            *uh = add_rows(&mut u[i * hd..(i + 1) * hd], tr(4 + i, &th), tr(i, &th));
        }
        let ur = |i: usize| uh[i].then(|| &u[i * hd..(i + 1) * hd]);
        let a = add_rows(&mut p02[..hd], ur(0), ur(2));
        let b = add_rows(&mut p13[..hd], ur(1), ur(3));
        if !add_rows(
            &mut out[..hd],
            a.then_some(&p02[..hd]),
            b.then_some(&p13[..hd]),
        ) {
            out[..hd].fill(0.0);
        }
        self.scratch = scratch;
    }
}

/// `dst = x + y` where a missing row is +0.0 (so it is skipped); returns whether `dst` was
/// written (false: both missing, `dst` untouched, the sum is a row of zeros).
#[inline]
fn add_rows(dst: &mut [f32], x: Option<&[f32]>, y: Option<&[f32]>) -> bool {
    match (x, y) {
        (Some(x), Some(y)) => {
            for ((d, a), b) in dst.iter_mut().zip(x).zip(y) {
                *d = *a + *b;
            }
            true
        }
        (Some(x), None) | (None, Some(x)) => {
            dst.copy_from_slice(&x[..dst.len()]);
            true
        }
        (None, None) => false,
    }
}

/// Scores of one query against many keys: `out[j] = dot_f32(keys[offs[j]..][..q.len()], q)
/// · scale`, bit-identical to calling [`dot_f32`] per key (tested), four keys at a time on
/// AVX-512 so each query load serves four keys.
pub fn scores_f32(keys: &[f32], offs: &[usize], q: &[f32], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    let n = offs.len().min(out.len());
    assert!(
        offs[..n].iter().all(|&o| o + hd <= keys.len()),
        "key offset out of range"
    );
    #[cfg(target_arch = "x86_64")]
    if has_avx512() && hd >= 64 {
        // SAFETY: the CPU has AVX-512F (checked at run time); every key row is in range
        // (asserted above).
        unsafe {
            if hd.is_multiple_of(64) {
                avx512::scores_multi(keys, &offs[..n], &[q], hd, scale, &mut [&mut out[..n]]);
            } else {
                avx512::scores(keys, &offs[..n], q, scale, &mut out[..n]);
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_fma() && hd >= 64 && hd.is_multiple_of(64) {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time); every key row is in range
        // (asserted above).
        unsafe { simd::scores(keys, &offs[..n], q, scale, &mut out[..n]) };
        return;
    }
    for (o, &at) in out[..n].iter_mut().zip(offs) {
        *o = dot_f32(&keys[at..at + hd], q) * scale;
    }
}

/// [`scores_f32`] for several queries against the same keys: `out[i·n + j]` is query `i`'s
/// score of key `j` (`n = offs.len()`), each bit-identical to [`scores_f32`]'s. On AVX-512 the
/// keys are swept in blocks of sixteen, every query scoring a block while it is in L1 (a
/// key row is read from memory once per call instead of once per query). On AVX2 at head
/// width 64, from [`T_MIN_QUERIES`] queries (a prompt's rows × a KV head's query heads), key
/// blocks are transposed once and scored eight keys per register lane (`scores_t64`).
pub fn scores_f32_multi(keys: &[f32], offs: &[usize], qs: &[&[f32]], scale: f32, out: &mut [f32]) {
    let n = offs.len();
    assert!(out.len() >= qs.len() * n, "score rows out of range");
    #[cfg(target_arch = "x86_64")]
    if !has_avx512() && has_fma() && qs.len() >= T_MIN_QUERIES && whole_steps(qs) == Some(64) {
        assert!(
            offs.iter().all(|&o| o + 64 <= keys.len()),
            "key offset out of range"
        );
        let op = out.as_mut_ptr();
        // SAFETY: the CPU has AVX2 and FMA (checked at run time); every key row is in range
        // and every query holds 64 floats (asserted above); query i's row `i·n .. (i + 1)·n`
        // is inside `out` (asserted above).
        unsafe { scores_t64(keys, offs, qs, scale, &|i| op.add(i * n)) };
        return;
    }
    let mut rest = out;
    for qc in qs.chunks(16) {
        let (head, tail) = rest.split_at_mut(qc.len() * n);
        rest = tail;
        let mut rows: [&mut [f32]; 16] = Default::default();
        for (r, o) in rows.iter_mut().zip(head.chunks_mut(n.max(1))) {
            *r = o;
        }
        scores_f32_into(keys, offs, qc, scale, &mut rows[..qc.len()]);
    }
}

/// [`scores_f32_multi`] with each query's scores written to its own row: `outs[i][j]` is
/// query `i`'s score of key `j` (each row at least `offs.len()` long), so a caller's score
/// matrix is filled in place.
///
/// # Panics
/// If a key row is out of range, `outs` is shorter than `qs`, or a row is shorter than
/// `offs`.
pub fn scores_f32_into(
    keys: &[f32],
    offs: &[usize],
    qs: &[&[f32]],
    scale: f32,
    outs: &mut [&mut [f32]],
) {
    let n = offs.len();
    assert!(
        outs.len() >= qs.len() && outs.iter().take(qs.len()).all(|o| o.len() >= n),
        "score rows out of range"
    );
    #[cfg(target_arch = "x86_64")]
    if has_avx512()
        && let Some(hd) = whole_steps(qs)
    {
        assert!(
            offs.iter().all(|&o| o + hd <= keys.len()),
            "key offset out of range"
        );
        // SAFETY: the CPU has AVX-512F (checked at run time); every key row is in range
        // and every output row holds `n` scores (asserted above).
        unsafe { avx512::scores_multi(keys, offs, qs, hd, scale, outs) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx512() && qs.iter().all(|q| q.len() >= 64) {
        let hd = qs.iter().map(|q| q.len()).max().unwrap_or(64);
        // Checked once here for every query (not per block and query).
        assert!(
            offs.iter().all(|&o| o + hd <= keys.len()),
            "key offset out of range"
        );
        // Key blocks of ~16 KB (at least 16 keys): they stay in L1 across the queries.
        let b = (4096 / hd).max(16) / 16 * 16;
        for j0 in (0..n).step_by(b) {
            let j1 = (j0 + b).min(n);
            for (q, o) in qs.iter().zip(outs.iter_mut()) {
                // SAFETY: the CPU has AVX-512F (checked at run time); every key row is in
                // range for the longest query (asserted above).
                unsafe { avx512::scores(keys, &offs[j0..j1], q, scale, &mut o[j0..j1]) };
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_fma()
        && let Some(hd) = whole_steps(qs)
    {
        assert!(
            offs.iter().all(|&o| o + hd <= keys.len()),
            "key offset out of range"
        );
        // Key blocks of ~16 KB: they stay in L1 across the queries.
        let b = (4096 / hd).max(8);
        if hd == 64 && qs.len() >= T_MIN_QUERIES {
            let o = outs.as_mut_ptr();
            // SAFETY: the CPU has AVX2 and FMA (checked at run time); every key row is in
            // range, every query holds 64 floats and every output row `n` scores (asserted
            // above).
            unsafe { scores_t64(keys, offs, qs, scale, &|i| (*o.add(i)).as_mut_ptr()) };
            return;
        }
        if hd < SCORES_Q_MIN_HD {
            for j0 in (0..n).step_by(b) {
                let j1 = (j0 + b).min(n);
                for (q, o) in qs.iter().zip(outs.iter_mut()) {
                    // SAFETY: the CPU has AVX2 and FMA (checked at run time); every key row
                    // is in range (asserted above).
                    unsafe { simd::scores(keys, &offs[j0..j1], q, scale, &mut o[j0..j1]) };
                }
            }
            return;
        }
        // Wide heads: four queries at a time, each key loaded once per four
        // ([`simd::scores_q`]); the first four's pass prefetches the keys ahead of it.
        for j0 in (0..n).step_by(b) {
            let j1 = (j0 + b).min(n);
            let ks = &offs[j0..j1];
            for (c, (qc, oc)) in qs.chunks(4).zip(outs.chunks_mut(4)).enumerate() {
                let m = qc.len();
                let qp: [*const f32; 4] = std::array::from_fn(|i| qc[i.min(m - 1)].as_ptr());
                let op: [*mut f32; 4] =
                    std::array::from_fn(|i| oc[i.min(m - 1)][j0..].as_mut_ptr());
                let fetch = c == 0;
                macro_rules! go {
                    ($q:literal) => {
                        simd::scores_q::<$q>(
                            keys,
                            ks,
                            std::array::from_fn(|i| qp[i]),
                            hd,
                            scale,
                            std::array::from_fn(|i| op[i]),
                            fetch,
                        )
                    };
                }
                // SAFETY: the CPU has AVX2 and FMA (checked at run time); every key row is
                // in range, every query holds hd floats and every output row `n` scores
                // (asserted above).
                unsafe {
                    match m {
                        4 => go!(4),
                        3 => go!(3),
                        2 => go!(2),
                        _ => go!(1),
                    }
                }
            }
        }
        return;
    }
    for (q, o) in qs.iter().zip(outs.iter_mut()) {
        scores_f32(keys, offs, q, scale, &mut o[..n]);
    }
}

/// The AVX2 scores of head width 64 transpose key blocks ([`simd::scores_t`]) from this many
/// queries (a prompt's rows × a KV head's query heads, or a decode step's query heads of one
/// KV head). AMD EPYC Zen 3, one thread, ns per dot (best of 15, alternated with the
/// key-by-key path): 2048 keys in L3, 12 queries 3.90 → 2.77, 28 queries 3.90 → 2.46, 6
/// queries 4.05 → 3.77; keys from memory (8,000 × 16 heads, the next block prefetched while
/// one is transposed) 8 queries 5.06 → 4.32, 7 queries 5.38 → 4.87; 4 queries mixed (6.41 →
/// 6.23 from memory, 4.19 → 4.61 from L3), 3 queries slower (6.97 → 7.15).
#[cfg(target_arch = "x86_64")]
const T_MIN_QUERIES: usize = 6;

/// [`scores_f32_multi`] at head width 64 on AVX2: key blocks of [`simd::T_KEYS`] transposed
/// once, then scored by every query, two queries × sixteen keys at a time, eight keys per
/// register ([`simd::scores_t`]); the last keys of a count not a multiple of eight key by
/// key ([`simd::scores`]). Query `i`'s scores go to `row(i)`.
///
/// # Safety
/// AVX2 and FMA; every query holds 64 floats, every `offs[j] + 64 <= keys.len()` and every
/// `row(i)` is valid for `offs.len()` writes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_t64(
    keys: &[f32],
    offs: &[usize],
    qs: &[&[f32]],
    scale: f32,
    row: &dyn Fn(usize) -> *mut f32,
) {
    let n = offs.len();
    let n8 = n & !7;
    // Line-aligned: every 8-float load of a transposed group is inside one cache line.
    #[repr(align(64))]
    struct Block([f32; 64 * simd::T_KEYS]);
    let mut kt = Block([0f32; 64 * simd::T_KEYS]);
    let kt = &mut kt.0;
    for j0 in (0..n8).step_by(simd::T_KEYS) {
        let j1 = (j0 + simd::T_KEYS).min(n8);
        let next = &offs[j1..(j1 + simd::T_KEYS).min(n8)];
        // SAFETY: key rows in range, `kt` holds 64 floats per key of the block (caller).
        unsafe { simd::transpose64(keys, &offs[j0..j1], kt.as_mut_ptr(), next) };
        let ng = (j1 - j0) / 8;
        let mut i = 0;
        while i < qs.len() {
            let m = (qs.len() - i).min(2);
            let qp: [*const f32; 2] = std::array::from_fn(|k| qs[i + k.min(m - 1)].as_ptr());
            let mut g = 0;
            while g < ng {
                let kg = (ng - g).min(2);
                let kp = kt[64 * 8 * g..].as_ptr();
                let at = j0 + 8 * g;
                // SAFETY: inside query i's row of `n` scores (caller).
                let op: [*mut f32; 2] =
                    std::array::from_fn(|k| unsafe { row(i + k.min(m - 1)).add(at) });
                macro_rules! go {
                    ($q:literal, $g:literal) => {
                        simd::scores_t::<$q, $g>(
                            kp,
                            std::array::from_fn(|k| qp[k]),
                            scale,
                            std::array::from_fn(|k| op[k]),
                        )
                    };
                }
                // SAFETY: `kt` holds the block's groups, each query 64 floats, each output
                // row the block's keys (caller).
                unsafe {
                    match (m, kg) {
                        (1, 1) => go!(1, 1),
                        (1, 2) => go!(1, 2),
                        (2, 1) => go!(2, 1),
                        _ => go!(2, 2),
                    }
                }
                g += kg;
            }
            i += m;
        }
    }
    if n8 < n {
        for (i, q) in qs.iter().enumerate() {
            // SAFETY: as above.
            unsafe {
                let o = std::slice::from_raw_parts_mut(row(i).add(n8), n - n8);
                simd::scores(keys, &offs[n8..], q, scale, o);
            }
        }
    }
}

/// From this head width the AVX2 scores of several queries take them four at a time
/// (`simd::scores_q`). AMD EPYC Zen 3, one thread, 4 queries (attn_bench, alternated with the
/// query-at-a-time path): head width 256, 8000 keys from memory 7.9–9.1 → 10.3–12.0 GB/s of
/// keys, 256 keys in L2 12–16 → 23 GB/s; head width 64 slower (6.8–8.8 → 5.6–8.4 GB/s with 7
/// queries, 2048 keys).
#[cfg(target_arch = "x86_64")]
const SCORES_Q_MIN_HD: usize = 128;

/// The queries' common width when it is a whole number of `vec_dot_f32`'s 64-element steps
/// (every query the same width, at least one step).
#[cfg(target_arch = "x86_64")]
fn whole_steps(qs: &[&[f32]]) -> Option<usize> {
    let hd = qs.first()?.len();
    (hd >= 64 && hd.is_multiple_of(64) && qs.iter().all(|q| q.len() == hd)).then_some(hd)
}

#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    static F: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"))
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    /// [`scores_multi`] takes three or four queries one after another over each block of
    /// sixteen keys ([`block_rows`]) at head width 64. Zen 4, one thread, 512 keys in L2
    /// (`attn_bench`, median of 2,000 passes, alternated with [`block_keys`]): 3 queries
    /// 22.1–22.5 → 29.2–30.0 GB/s of keys, 4 queries 22.3–23.0 → 24.7–24.8; one or two
    /// queries, and head widths 128 and 256, were as fast or faster key after key.
    const ROWS_QUERIES: std::ops::RangeInclusive<usize> = 3..=4;
    /// [`scores_multi`] tiles keys × queries ([`block_tiles`]) from this head width …
    const TILE_MIN_HD: usize = 128;
    /// … and this many queries (fewer stream key after key, [`block_keys`]).
    const TILE_MIN_QUERIES: usize = 5;

    /// `reduce16` of one register: halves added pairwise, as `_mm512_reduce_add_ps`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn hsum(v: __m512) -> f32 {
        let t8 = _mm256_add_ps(
            _mm512_castps512_ps256(v),
            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)),
        );
        let t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
        let s = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
    }

    /// The vector part of `dot_f32` for four keys; returns the four (folded, reduced) sums.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn dot4(k: [*const f32; 4], q: *const f32, np: usize) -> [f32; 4] {
        // SAFETY: forwarded contract.
        unsafe { fold4(k, q, np) }.map(|v| hsum(v))
    }

    /// The four keys' `GGML_F32x16_REDUCE` folds (before the horizontal sum).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn fold4(k: [*const f32; 4], q: *const f32, np: usize) -> [__m512; 4] {
        let mut a = [[_mm512_setzero_ps(); 4]; 4];
        let mut i = 0;
        while i < np {
            for c in 0..4 {
                // SAFETY: i + 16c + 16 <= np: inside q and every key row.
                unsafe {
                    let qv = _mm512_loadu_ps(q.add(i + 16 * c));
                    for (key, acc) in k.iter().zip(a.iter_mut()) {
                        acc[c] = _mm512_fmadd_ps(_mm512_loadu_ps(key.add(i + 16 * c)), qv, acc[c]);
                    }
                }
            }
            i += 64;
        }
        a.map(|s| fold(s))
    }

    /// `GGML_F32x16_REDUCE`'s folding of four accumulators: `(s0 + s2) + (s1 + s3)`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) fn fold(s: [__m512; 4]) -> __m512 {
        _mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3]))
    }

    /// `_mm512_reduce_add_ps`'s first level for two registers side by side: 256-bit lanes
    /// `[a[8..] + a[..8], b[8..] + b[..8]]`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn halves2(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
        )
    }

    /// The second level for four registers from two [`halves2`] results: 128-bit lane m holds
    /// `t8[4..] + t8[..4]` of register m (`a` holding registers 0 and 1, `b` 2 and 3).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn quarters4(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
        )
    }

    /// The last two levels, `(t0 + t2) + (t1 + t3)`, of sixteen registers whose `t4`s are in
    /// `u` (register `4i + m` in 128-bit lane m of `u[i]`), as a 4×4 transpose inside each
    /// 128-bit lane and two vertical adds: lane `4m + i` of the result is register `4i + m`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn last_levels(u: &[__m512; 4]) -> __m512 {
        let x0 = _mm512_unpacklo_ps(u[0], u[1]);
        let x1 = _mm512_unpackhi_ps(u[0], u[1]);
        let x2 = _mm512_unpacklo_ps(u[2], u[3]);
        let x3 = _mm512_unpackhi_ps(u[2], u[3]);
        let pd = _mm512_castps_pd;
        let ps = _mm512_castpd_ps;
        let t0 = ps(_mm512_unpacklo_pd(pd(x0), pd(x2)));
        let t1 = ps(_mm512_unpackhi_pd(pd(x0), pd(x2)));
        let t2 = ps(_mm512_unpacklo_pd(pd(x1), pd(x3)));
        let t3 = ps(_mm512_unpackhi_pd(pd(x1), pd(x3)));
        _mm512_add_ps(_mm512_add_ps(t0, t2), _mm512_add_ps(t1, t3))
    }

    /// [`last_levels`]' lane order back to register order.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn key_order(r: __m512) -> __m512 {
        let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        _mm512_permutexvar_ps(order, r)
    }

    /// Sixteen keys' scores of one query from its four quads' [`quarters4`] registers (`u[g]`
    /// for keys `4g..4g + 4`): the last reduction levels, the scale, stored at `o[j..j + 16]`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn store16(u: &[__m512; 4], sv: __m512, o: &mut [f32], j: usize) {
        let dst = &mut o[j..j + 16];
        let r = _mm512_mul_ps(key_order(last_levels(u)), sv);
        // SAFETY: `dst` holds 16 floats.
        unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), r) };
    }

    /// `reduce16` (`_mm512_reduce_add_ps`) of sixteen registers at once, lane c of the result
    /// from `v[c]`: the same additions per register, done for 2, 4 and 16 registers per
    /// instruction.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn reduce16x16_ordered(v: &[__m512; 16]) -> __m512 {
        let w: [__m512; 8] = std::array::from_fn(|i| halves2(v[2 * i], v[2 * i + 1]));
        let u: [__m512; 4] = std::array::from_fn(|i| quarters4(w[2 * i], w[2 * i + 1]));
        key_order(last_levels(&u))
    }

    /// [`scores_multi`]'s whole blocks of sixteen keys for `hd == 64` and more than four
    /// queries (one 64-element step per dot): a quad of keys is
    /// loaded into registers once and every query's folds are formed from it, each quad's
    /// four folds reduced at once to the register [`last_levels`] takes as `u[g]`; after four
    /// quads, each query's sixteen scores are finished and stored. A key row is loaded once
    /// per call instead of once per query. The same operations per score as [`scores`].
    ///
    /// # Safety
    /// As [`scores_multi`] with `hd == 64`.
    #[target_feature(enable = "avx512f")]
    unsafe fn scores_multi64(
        keys: &[f32],
        offs: &[usize],
        qs: &[&[f32]],
        scale: f32,
        outs: &mut [&mut [f32]],
    ) {
        let full = offs.len() / 16 * 16;
        let kp = keys.as_ptr();
        let sv = _mm512_set1_ps(scale);
        let z = _mm512_setzero_ps();
        // Written (every query of a chunk, every quad) before it is read; left uninitialised
        // (zeroed, it was a 4 KB `memset` per call).
        let mut ub = [[std::mem::MaybeUninit::<__m512>::uninit(); 4]; 16];
        for (qc, oc) in qs.chunks(16).zip(outs.chunks_mut(16)) {
            let mut j = 0;
            while j < full {
                for g in 0..4 {
                    let k: [[__m512; 4]; 4] = std::array::from_fn(|m| {
                        let row = kp.wrapping_add(offs[j + 4 * g + m]);
                        // SAFETY: the key row's 64 floats are in range (caller).
                        std::array::from_fn(|c| unsafe { _mm512_loadu_ps(row.add(16 * c)) })
                    });
                    for (q, u) in qc.iter().zip(ub.iter_mut()) {
                        // SAFETY: the query has 64 floats (caller).
                        let qv: [__m512; 4] = std::array::from_fn(|c| unsafe {
                            _mm512_loadu_ps(q.as_ptr().add(16 * c))
                        });
                        let f: [__m512; 4] = std::array::from_fn(|m| {
                            fold(std::array::from_fn(|c| _mm512_fmadd_ps(k[m][c], qv[c], z)))
                        });
                        u[g].write(quarters4(halves2(f[0], f[1]), halves2(f[2], f[3])));
                    }
                }
                for (u, o) in ub.iter().zip(oc.iter_mut()).take(qc.len()) {
                    // SAFETY: all four quads of this query were written above.
                    store16(&u.map(|x| unsafe { x.assume_init() }), sv, o, j);
                }
                j += 16;
            }
        }
    }

    /// Sixteen keys (`offs`) against `Q` (1..=4) queries of width `hd` (a multiple of 64),
    /// key after key: each key row is read once, front to back, and every query forms
    /// its four ggml accumulators from the same loads (`fold4`'s operations per key and
    /// query, so the same bits), then each query's sixteen sums are reduced into one register,
    /// scaled and stored at column `j` of its row. Reading the keys in order, one row at a
    /// time, keeps the hardware prefetcher streaming (four rows side by side at one offset, as
    /// `fold4` reads them, streamed 7.3 GB/s on one core at head_dim 256, 4 queries).
    ///
    /// # Safety
    /// AVX-512F; `offs.len() == 16`, every key row `hd` floats in range; `qs.len() == Q`,
    /// every query `hd` floats; `outs.len() >= Q`, each row at least `j + 16` floats.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn block_keys<const Q: usize>(
        kp: *const f32,
        offs: &[usize],
        qs: &[&[f32]],
        hd: usize,
        sv: __m512,
        outs: &mut [&mut [f32]],
        j: usize,
    ) {
        let z = _mm512_setzero_ps();
        let qp: [*const f32; Q] = std::array::from_fn(|i| qs[i].as_ptr());
        // Each quad of keys' folds reduced at once to the register `last_levels` takes (as
        // `reduce16x16_ordered` does), so no array of sixteen folds per query is kept: LLVM
        // cleared that one (3–4 KB, a `memset`) on every call, i.e. per 16 keys — as many
        // bytes as the keys themselves at head_dim 64 (11% of a SmolLM2 decode step at 8,000
        // cells).
        let mut u = [[z; 4]; Q];
        for g in 0..4 {
            let mut f = [[z; 4]; Q];
            for m in 0..4 {
                let row = kp.wrapping_add(offs[4 * g + m]);
                let mut a = [[z; 4]; Q];
                let mut i = 0;
                while i < hd {
                    // SAFETY: i + 64 <= hd: inside the key row and every query (caller).
                    unsafe {
                        let kv: [__m512; 4] =
                            std::array::from_fn(|c| _mm512_loadu_ps(row.add(i + 16 * c)));
                        for (acc, q) in a.iter_mut().zip(qp) {
                            for c in 0..4 {
                                let qv = _mm512_loadu_ps(q.add(i + 16 * c));
                                acc[c] = _mm512_fmadd_ps(kv[c], qv, acc[c]);
                            }
                        }
                    }
                    i += 64;
                }
                for (fq, acc) in f.iter_mut().zip(a) {
                    fq[m] = fold(acc);
                }
            }
            for (uq, fq) in u.iter_mut().zip(f) {
                uq[g] = quarters4(halves2(fq[0], fq[1]), halves2(fq[2], fq[3]));
            }
        }
        for (uq, o) in u.iter().zip(outs.iter_mut()) {
            store16(uq, sv, o, j);
        }
    }

    /// One chunk `c` (elements `16c..16c+16` of every 64) of four keys' dots with `Q`
    /// queries: `ggml_vec_dot_f32`'s accumulator `c` of each (key, query) pair, summed over
    /// the whole width in its own order.
    ///
    /// # Safety
    /// AVX-512F; every key row and query holds `hd` floats, `hd % 64 == 0`, `c < 4`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn chunk_acc<const Q: usize>(
        rows: &[*const f32; 4],
        qp: &[*const f32; Q],
        hd: usize,
        c: usize,
    ) -> [[__m512; Q]; 4] {
        let mut a = [[_mm512_setzero_ps(); Q]; 4];
        let mut i = 16 * c;
        while i < hd {
            // SAFETY: i + 16 <= hd: inside every key row and query (caller).
            unsafe {
                let kv: [__m512; 4] = std::array::from_fn(|m| _mm512_loadu_ps(rows[m].add(i)));
                for (q, &p) in qp.iter().enumerate() {
                    let qv = _mm512_loadu_ps(p.add(i));
                    for m in 0..4 {
                        a[m][q] = _mm512_fmadd_ps(kv[m], qv, a[m][q]);
                    }
                }
            }
            i += 64;
        }
        a
    }

    /// Four keys × `Q` queries as register tiles: the four ggml accumulators of every pair
    /// are formed chunk by chunk (each chunk's `4·Q` sums in registers, two loads per
    /// `Q`-wide … four-wide row of FMAs instead of one per FMA), folded as `fold` does —
    /// `(s0 + s2) + (s1 + s3)` — and each query's four folds reduced to the register
    /// [`last_levels`] takes as `u[q][g]`. The same operations per score as [`fold4`].
    ///
    /// # Safety
    /// As [`chunk_acc`].
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn quad_tile<const Q: usize>(
        rows: &[*const f32; 4],
        qp: &[*const f32; Q],
        hd: usize,
        u: &mut [[__m512; 4]],
        g: usize,
    ) {
        // SAFETY: forwarded contract.
        let (s0, s2) = unsafe {
            (
                chunk_acc::<Q>(rows, qp, hd, 0),
                chunk_acc::<Q>(rows, qp, hd, 2),
            )
        };
        let t02: [[__m512; Q]; 4] =
            std::array::from_fn(|m| std::array::from_fn(|q| _mm512_add_ps(s0[m][q], s2[m][q])));
        // SAFETY: forwarded contract.
        let (s1, s3) = unsafe {
            (
                chunk_acc::<Q>(rows, qp, hd, 1),
                chunk_acc::<Q>(rows, qp, hd, 3),
            )
        };
        for q in 0..Q {
            let f: [__m512; 4] = std::array::from_fn(|m| {
                _mm512_add_ps(t02[m][q], _mm512_add_ps(s1[m][q], s3[m][q]))
            });
            u[q][g] = quarters4(halves2(f[0], f[1]), halves2(f[2], f[3]));
        }
    }

    /// Sixteen keys (`offs`) against queries of width `hd` (a multiple of 64) as
    /// [`quad_tile`]s of four keys × four queries, each query's sixteen sums then
    /// reduced into one register, scaled and stored at column `j` of its row. Many queries
    /// over wide heads (a prompt's rows × a KV head's query heads) make the dots
    /// compute-bound: one load per FMA (the key-after-key order) caps them at the load
    /// port, the tiles need half a load per FMA.
    ///
    /// # Safety
    /// AVX-512F; `offs.len() == 16`, every key row `hd` floats in range; every query `hd`
    /// floats; `outs.len() >= qs.len()`, each row at least `j + 16` floats.
    #[target_feature(enable = "avx512f")]
    unsafe fn block_tiles(
        kp: *const f32,
        offs: &[usize],
        qs: &[&[f32]],
        hd: usize,
        sv: __m512,
        outs: &mut [&mut [f32]],
        j: usize,
    ) {
        let z = _mm512_setzero_ps();
        let rows: [[*const f32; 4]; 4] =
            std::array::from_fn(|g| std::array::from_fn(|m| kp.wrapping_add(offs[4 * g + m])));
        for (qc, oc) in qs.chunks(4).zip(outs.chunks_mut(4)) {
            // One quad of queries at a time (its `u` is sixteen registers; an array for every
            // query would be a 4 KB `memset` per sixteen keys).
            let mut u = [[z; 4]; 4];
            let qp = |i: usize| qc[i].as_ptr();
            for (g, r) in rows.iter().enumerate() {
                // SAFETY: forwarded contract.
                unsafe {
                    match qc.len() {
                        4 => quad_tile::<4>(r, &[qp(0), qp(1), qp(2), qp(3)], hd, &mut u, g),
                        3 => quad_tile::<3>(r, &[qp(0), qp(1), qp(2)], hd, &mut u, g),
                        2 => quad_tile::<2>(r, &[qp(0), qp(1)], hd, &mut u, g),
                        _ => quad_tile::<1>(r, &[qp(0)], hd, &mut u, g),
                    }
                }
            }
            for (uq, o) in u.iter().zip(oc.iter_mut()).take(qc.len()) {
                store16(uq, sv, o, j);
            }
        }
    }

    /// Sixteen keys (`offs`) against each query in turn at head width `64·S`: the query's
    /// `4·S` registers loaded once, every key's `S` steps into ggml's four accumulators from
    /// `+0.0`, folded, each quad's four folds reduced to the register [`last_levels`] takes,
    /// and the sixteen scores stored (the operations of [`block_keys`], so the same bits).
    /// The first query reads the sixteen rows from memory, the others from L1; nothing is
    /// kept across queries, so no register spills (`block_keys` with a runtime width kept
    /// its quads' folds of all queries on the stack).
    ///
    /// # Safety
    /// AVX-512F; `offs.len() == 16`, every key row `64·S` floats in range; every query
    /// `64·S` floats; `outs.len() >= qs.len()`, each row at least `j + 16` floats.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn block_rows<const S: usize>(
        kp: *const f32,
        offs: &[usize],
        qs: &[&[f32]],
        sv: __m512,
        outs: &mut [&mut [f32]],
        j: usize,
    ) {
        let z = _mm512_setzero_ps();
        let rows: [*const f32; 16] = std::array::from_fn(|m| kp.wrapping_add(offs[m]));
        // Plain loops, no closures: a closure does not inherit the target feature, and
        // LLVM called the larger ones out of line, with the registers through the stack.
        for (q, o) in qs.iter().zip(outs.iter_mut()) {
            let qp = q.as_ptr();
            let mut qv = [[z; 4]; S];
            for (s, qs) in qv.iter_mut().enumerate() {
                for (c, x) in qs.iter_mut().enumerate() {
                    // SAFETY: the query holds 64·S floats (caller).
                    *x = unsafe { _mm512_loadu_ps(qp.add(64 * s + 16 * c)) };
                }
            }
            let mut u = [z; 4];
            for (g, ug) in u.iter_mut().enumerate() {
                let mut f = [z; 4];
                for (m, fm) in f.iter_mut().enumerate() {
                    let r = rows[4 * g + m];
                    let mut a = [z; 4];
                    for (s, qs) in qv.iter().enumerate() {
                        for c in 0..4 {
                            // SAFETY: the key row holds 64·S floats (caller).
                            let k = unsafe { _mm512_loadu_ps(r.add(64 * s + 16 * c)) };
                            a[c] = _mm512_fmadd_ps(k, qs[c], a[c]);
                        }
                    }
                    *fm = fold(a);
                }
                *ug = quarters4(halves2(f[0], f[1]), halves2(f[2], f[3]));
            }
            store16(&u, sv, o, j);
        }
    }

    /// [`super::scores_f32_multi`] for queries of one width `hd`, a multiple of 64: sixteen
    /// keys at a time, every query scoring them while they are in L1, the sixteen sums
    /// reduced into one register (no lane extracted), scaled and stored as one vector. The
    /// rest of the keys (fewer than sixteen) as [`scores`]. Bit-identical to [`scores`] per
    /// query. (Software prefetch of the rows ahead measured no gain: 2,048 keys × 64 heads
    /// out of cache, 11 GB/s with or without it at distances of 16–256 keys.)
    ///
    /// # Safety
    /// AVX-512F is available; every query is `hd` floats, `hd % 64 == 0`; `offs[j] + hd <=
    /// keys.len()` for every j; `outs[i]` holds `offs.len()` floats for every query `i`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scores_multi(
        keys: &[f32],
        offs: &[usize],
        qs: &[&[f32]],
        hd: usize,
        scale: f32,
        outs: &mut [&mut [f32]],
    ) {
        let n = offs.len();
        let full = n / 16 * 16;
        let kp = keys.as_ptr();
        let sv = _mm512_set1_ps(scale);
        let mut j = 0;
        // Head dim 64: one or two queries key after key as wider heads (attn_bench 8,000 keys
        // × 64 heads out of cache, one core: 3 queries 10.8–12.6 → 14.4 GB/s, 1 query
        // 10.3–12.5 → 15.0–17.0), three or four query after query over sixteen keys
        // ([`ROWS_QUERIES`]); more queries share each quad of keys.
        if hd == 64 && qs.len() > 4 {
            // SAFETY: forwarded contract.
            unsafe { scores_multi64(keys, offs, qs, scale, outs) };
            j = full;
        } else if hd >= TILE_MIN_HD && qs.len() >= TILE_MIN_QUERIES {
            while j < full {
                // SAFETY: forwarded contract; keys j..j + 16 exist.
                unsafe { block_tiles(kp, &offs[j..j + 16], qs, hd, sv, outs, j) };
                j += 16;
            }
        } else if hd == 64 && ROWS_QUERIES.contains(&qs.len()) {
            while j < full {
                // SAFETY: forwarded contract; keys j..j + 16 exist, hd = 64.
                unsafe { block_rows::<1>(kp, &offs[j..j + 16], qs, sv, outs, j) };
                j += 16;
            }
        } else {
            while j < full {
                for (qc, oc) in qs.chunks(4).zip(outs.chunks_mut(4)) {
                    // SAFETY: forwarded contract; keys j..j + 16 exist.
                    unsafe {
                        match qc.len() {
                            4 => block_keys::<4>(kp, &offs[j..j + 16], qc, hd, sv, oc, j),
                            3 => block_keys::<3>(kp, &offs[j..j + 16], qc, hd, sv, oc, j),
                            2 => block_keys::<2>(kp, &offs[j..j + 16], qc, hd, sv, oc, j),
                            _ => block_keys::<1>(kp, &offs[j..j + 16], qc, hd, sv, oc, j),
                        }
                    }
                }
                j += 16;
            }
        }
        if j < n {
            for (q, o) in qs.iter().zip(outs.iter_mut()) {
                // SAFETY: forwarded contract.
                unsafe { scores(keys, &offs[j..], q, scale, &mut o[j..n]) };
            }
        }
    }

    /// # Safety
    /// AVX-512F is available; `offs[j] + q.len() <= keys.len()` for every j; `out.len() ==
    /// offs.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scores(
        keys: &[f32],
        offs: &[usize],
        q: &[f32],
        scale: f32,
        out: &mut [f32],
    ) {
        let hd = q.len();
        let np = hd & !63;
        let kp = keys.as_ptr();
        // The tail is not contracted in ggml's build (see `dot_body`).
        let tail = |at: usize, s: f32| {
            let mut s = s;
            for k in np..hd {
                s += keys[at + k] * q[k];
            }
            s
        };
        let mut j = 0;
        // Sixteen keys at a time with the horizontal sums vectorised across keys (same bits).
        while j + 16 <= offs.len() {
            let mut f = [_mm512_setzero_ps(); 16];
            for g in 0..4 {
                // SAFETY: key rows in range (caller).
                let v = unsafe {
                    fold4(
                        [0, 1, 2, 3].map(|c| kp.add(offs[j + 4 * g + c])),
                        q.as_ptr(),
                        np,
                    )
                };
                f[4 * g..4 * g + 4].copy_from_slice(&v);
            }
            let mut d = [0f32; 16];
            // SAFETY: `d` holds 16 floats.
            unsafe { _mm512_storeu_ps(d.as_mut_ptr(), reduce16x16_ordered(&f)) };
            for c in 0..16 {
                out[j + c] = tail(offs[j + c], d[c]) * scale;
            }
            j += 16;
        }
        while j + 4 <= offs.len() {
            // SAFETY: key rows in range (caller).
            let d = unsafe { dot4([0, 1, 2, 3].map(|c| kp.add(offs[j + c])), q.as_ptr(), np) };
            for c in 0..4 {
                out[j + c] = tail(offs[j + c], d[c]) * scale;
            }
            j += 4;
        }
        while j < offs.len() {
            // SAFETY: as above (the same key repeated; one result used).
            let d = unsafe { dot4([kp.add(offs[j]); 4], q.as_ptr(), np) };
            out[j] = tail(offs[j], d[0]) * scale;
            j += 1;
        }
    }

    /// ggml's `ggml_v_expf` (AVX-512), 16 lanes.
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    fn v_expf(x: __m512) -> __m512 {
        let c = |b: u32| _mm512_set1_ps(f32::from_bits(b));
        let r = c(0x4b40_0000);
        let z = _mm512_fmadd_ps(x, c(0x3fb8_aa3b), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(n, c(0x35bf_be8e), _mm512_fnmadd_ps(n, c(0x3f31_7200), x));
        let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm512_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm512_fmadd_ps(c(0x3f7f_fff6), b, _mm512_set1_ps(1.0)),
        );
        let res = _mm512_scalef_ps(j, n);
        if d == 0 {
            return res;
        }
        let alt = _mm512_mask_blend_ps(
            _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps()),
            _mm512_set1_ps(f32::INFINITY),
            _mm512_setzero_ps(),
        );
        _mm512_mask_blend_ps(d, res, alt)
    }

    /// [`super::softmax_cells`] a 16-cell chunk at a time.
    ///
    /// # Safety
    /// AVX-512F and FMA are available.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn softmax(sc: &mut [f32], first_cell: usize) {
        let n = sc.len();
        if n == 0 {
            return;
        }
        // The largest score (NaNs skipped, as `f32::max` does: a NaN lane of `v` yields the
        // running maximum), sixteen lanes at a time.
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut mv = ninf;
        let mut i = 0;
        while i < n {
            let m: __mmask16 = if n - i >= 16 {
                0xffff
            } else {
                ((1u32 << (n - i)) - 1) as u16
            };
            // SAFETY: only the masked-in elements (inside sc) are read.
            let v = unsafe { _mm512_mask_loadu_ps(ninf, m, sc.as_ptr().add(i)) };
            mv = _mm512_max_ps(v, mv);
            i += 16;
        }
        let max = _mm512_reduce_max_ps(mv);
        let mx = _mm512_set1_ps(max);
        let p = sc.as_mut_ptr();
        let mut sum = 0f64;
        // Chunk c covers cells 16c..16c+16; `j` is the index in `sc` of its first cell.
        let (c0, c1) = (first_cell / 16, (first_cell + n - 1) / 16);
        for c in c0..=c1 {
            let cell0 = 16 * c;
            let lo = first_cell.max(cell0) - cell0;
            let hi = (first_cell + n).min(cell0 + 16) - cell0;
            let mask: __mmask16 = (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as u16;
            // Element l of the chunk is sc[cell0 + l - first_cell] (masked outside sc).
            let base = p.wrapping_add(cell0).wrapping_sub(first_cell);
            // SAFETY: only the masked-in elements are read or written; they are inside sc.
            unsafe {
                let v = _mm512_maskz_loadu_ps(mask, base);
                let e = _mm512_maskz_mov_ps(mask, v_expf(_mm512_sub_ps(v, mx)));
                _mm512_mask_storeu_ps(base, mask, e);
                sum += hsum(e) as f64;
            }
        }
        let inv = _mm512_set1_ps((1.0 / sum) as f32);
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 <= n.
            unsafe { _mm512_storeu_ps(p.add(i), _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), inv)) };
            i += 16;
        }
        let inv = (1.0 / sum) as f32;
        for v in &mut sc[i..] {
            *v *= inv;
        }
    }
}

#[cfg(test)]
mod tests {

    /// The F16C dots give the portable bodies' bits (lengths with and without a tail, values
    /// of mixed sign and magnitude).
    /// The `vdpbf16ps` emulation against the CPU's instruction (where it has one), and the BF16
    /// dots' fast paths against their portable bodies.
    #[test]
    fn bf16_dots_equal_the_instruction_and_the_portable_bodies() {
        let mut st = 0x9e3779b97f4a7c15u64;
        let mut rnd = move || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            st
        };
        #[cfg(target_arch = "x86_64")]
        if has_avx512bf16() {
            for it in 0..20_000 {
                // Wide exponents every fifth round (overflow, denormals), else moderate ones.
                let mut elem = || {
                    let r = rnd();
                    let exp = if it % 5 == 0 {
                        (r >> 20) % 255
                    } else {
                        100 + (r >> 20) % 50
                    };
                    (((r & 1) << 15) | (exp << 7) | ((r >> 8) & 0x7f)) as u16
                };
                let a: [u16; 32] = std::array::from_fn(|_| elem());
                let b: [u16; 32] = std::array::from_fn(|_| elem());
                let acc: [f32; 16] = std::array::from_fn(|_| {
                    let r = rnd();
                    if it % 7 == 0 {
                        f32::from_bits((r as u32) & 0x807f_ffff)
                    } else {
                        ((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
                            * 2f32.powi((r % 60) as i32 - 30)
                    }
                });
                // SAFETY: the CPU has the instruction (checked above).
                let hw = unsafe { bf16x::dp(&acc, &a, &b) };
                for l in 0..16 {
                    let e = dpbf16_lane(acc[l], a[2 * l], a[2 * l + 1], b[2 * l], b[2 * l + 1]);
                    assert!(
                        e.to_bits() == hw[l].to_bits() || (e.is_nan() && hw[l].is_nan()),
                        "lane {l}: emulated {e:e}, instruction {:e}",
                        hw[l]
                    );
                }
            }
        }
        for n in [1usize, 31, 32, 63, 64, 65, 96, 576, 1000] {
            let x: Vec<u16> = (0..n).map(|_| (rnd() as u16 & 0x3fff) | 0x3000).collect();
            let y: Vec<u16> = (0..n).map(|_| rnd() as u16 & 0xbfff).collect();
            assert_eq!(
                dot_bf16(&x, &y).to_bits(),
                dot_bf16_body(&x, &y).to_bits(),
                "{n}"
            );
            let m = n & !31;
            assert_eq!(
                dot_bf16_gemm(&x[..m], &y[..m]).to_bits(),
                gemm_dot_bf16_body(&x[..m], &y[..m]).to_bits(),
                "{n}"
            );
        }
    }

    #[test]
    fn f16_dots_equal_the_portable_bodies() {
        let mut state = 0x1234_5678u32;
        let mut half = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let v = ((state >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 8.0;
            half::f16::from_f32(v).to_bits()
        };
        for n in [0usize, 5, 16, 63, 64, 100, 640, 2560, 2567] {
            let x: Vec<u16> = (0..n).map(|_| half()).collect();
            let y: Vec<u16> = (0..n).map(|_| half()).collect();
            assert_eq!(
                dot_f16(&x, &y).to_bits(),
                dot_f16_portable(&x, &y).to_bits(),
                "n {n}"
            );
            let m = n & !15;
            assert_eq!(
                dot_f16_gemm(&x[..m], &y[..m]).to_bits(),
                dot_f16_gemm_portable(&x[..m], &y[..m]).to_bits(),
                "gemm n {m}"
            );
        }
    }
    use super::*;

    #[test]
    fn softmax_row_sums_chunks_then_the_tail_as_ggml_does() {
        let mut st = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            ((st >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 12.0
        };
        for n in [1usize, 2, 4, 8, 15, 16, 17, 32, 60, 64, 128] {
            let x: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let mut got = x.clone();
            softmax_row(&mut got);
            // The same arithmetic written out: vector expf + reduce16 per whole chunk, libm's
            // expf per tail value, f64 sum, f32 scale.
            let max = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let nv = n / 16 * 16;
            let mut e: Vec<f32> = x
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    if i < nv {
                        expf(v - max)
                    } else {
                        (v - max).exp()
                    }
                })
                .collect();
            let mut sum = 0f64;
            for c in e[..nv].chunks_exact(16) {
                sum += reduce16(c.try_into().unwrap()) as f64;
            }
            for &v in &e[nv..] {
                sum += v as f64;
            }
            let inv = (1.0 / sum) as f32;
            e.iter_mut().for_each(|v| *v *= inv);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                e.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "n = {n}"
            );
            // And it is a softmax: within 1e-6 of the f64 one.
            let m64 = x
                .iter()
                .map(|&v| v as f64)
                .fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = x.iter().map(|&v| (v as f64 - m64).exp()).sum();
            for (g, &v) in got.iter().zip(&x) {
                let r = (v as f64 - m64).exp() / z;
                assert!((*g as f64 - r).abs() <= 1e-6, "n = {n}: {g} vs {r}");
            }
            // Whole chunks from cell 0 are attention's softmax too.
            if n % 16 == 0 {
                let mut a = x.clone();
                softmax_cells(&mut a, 0);
                assert_eq!(a, got, "n = {n}");
            }
        }
    }

    #[test]
    fn vector_softmax_equals_the_per_cell_one() {
        let mut st = 0x1234_5678_9abc_def1u64;
        let mut rnd = || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            ((st >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 40.0
        };
        for (n, first) in [
            (1, 0),
            (1, 7),
            (5, 14),
            (16, 0),
            (17, 15),
            (300, 3),
            (2049, 0),
            (70, 33),
        ] {
            let mut a: Vec<f32> = (0..n).map(|_| rnd()).collect();
            // Some far below the max (ggml's expf flushes |n| > 192 to 0), some where its
            // result is subnormal.
            for v in a.iter_mut().step_by(7) {
                *v -= 500.0;
            }
            let max = a.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            for (k, v) in a.iter_mut().skip(3).step_by(11).enumerate() {
                // x − max from −87.5 to −131: 2ⁿ·j from the smallest normals down into the
                // subnormals (n from −127 to −189).
                *v = max - 87.5 - (k % 12) as f32 * 4.0;
            }
            let mut b = a.clone();
            softmax_cells(&mut a, first);
            softmax_cells_scalar(&mut b, first);
            for j in 0..n {
                assert_eq!(
                    a[j].to_bits(),
                    b[j].to_bits(),
                    "n {n} first {first} cell {j}"
                );
            }
        }
    }

    #[test]
    fn multi_query_scores_equal_the_single_query_calls() {
        let mut st = 0x9e3779b97f4a7c15u64;
        let mut rnd = || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            ((st >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
        };
        for (hd, n, nq) in [
            (64, 300, 5),
            (64, 45, 20),
            // Three or four queries at head width 64: query after query over each sixteen
            // keys (AVX-512), a tail of keys after whole blocks.
            (64, 300, 3),
            (64, 40, 4),
            (64, 33, 1),
            // Transposed key blocks (AVX2, head width 64, from 6 queries): whole and partial
            // blocks, odd query counts, a tail of keys, fewer keys than one group.
            (64, 300, 12),
            (64, 130, 9),
            (64, 64, 8),
            (64, 7, 11),
            (256, 70, 3),
            (80, 41, 2),
            (128, 17, 9),
            // Key × query tiles (from 5 queries at head_dim 128+): whole and partial
            // query quads, more than sixteen queries, a tail of keys.
            (256, 70, 16),
            (256, 35, 6),
            (128, 48, 21),
            (192, 33, 7),
        ] {
            let width = hd * 3;
            let cache: Vec<f32> = (0..(n + 2) * width).map(|_| rnd()).collect();
            let offs: Vec<usize> = (0..n).map(|j| ((j * 5) % (n + 2)) * width + hd).collect();
            let qv: Vec<Vec<f32>> = (0..nq).map(|_| (0..hd).map(|_| rnd()).collect()).collect();
            let qs: Vec<&[f32]> = qv.iter().map(|q| q.as_slice()).collect();
            let mut multi = vec![0f32; nq * n];
            scores_f32_multi(&cache, &offs, &qs, 0.125, &mut multi);
            // The same scores into rows of a wider matrix (query i in row nq − 1 − i, at
            // column 3 of rows n + 5 wide).
            let w = n + 5;
            let mut wide = vec![f32::NAN; nq * w];
            {
                let mut rows: Vec<&mut [f32]> =
                    wide.chunks_mut(w).rev().map(|r| &mut r[3..]).collect();
                scores_f32_into(&cache, &offs, &qs, 0.125, &mut rows);
            }
            for (i, q) in qs.iter().enumerate() {
                let mut one = vec![0f32; n];
                scores_f32(&cache, &offs, q, 0.125, &mut one);
                for j in 0..n {
                    let want = dot_f32(&cache[offs[j]..offs[j] + hd], q) * 0.125;
                    assert_eq!(one[j].to_bits(), want.to_bits(), "dot_f32: hd {hd} key {j}");
                    assert_eq!(
                        multi[i * n + j].to_bits(),
                        one[j].to_bits(),
                        "hd {hd} q {i} key {j}"
                    );
                    assert_eq!(
                        wide[(nq - 1 - i) * w + 3 + j].to_bits(),
                        one[j].to_bits(),
                        "into: hd {hd} q {i} key {j}"
                    );
                }
            }
        }
    }

    #[test]
    fn expf_is_close_to_libm_and_exact_at_zero() {
        assert_eq!(expf(0.0), 1.0);
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(-200.0), 0.0);
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x < 0.0 {
            let (a, b) = (expf(x), x.exp());
            worst = worst.max(((a - b) / b).abs());
            x += 0.0137;
        }
        // ggml's polynomial is accurate to a few ulp.
        assert!(worst < 4e-7, "worst relative error {worst}");
    }

    #[test]
    fn swiglu_reference_value_on_chunks_and_tail() {
        // 16 lanes through ggml's vector expf, one through libm's: silu(1) = 0.7310586.
        let mut y = [0f32; 17];
        swiglu(&[1.0; 17], &[1.0; 17], &mut y);
        assert!(y.iter().all(|v| (v - 0.731_058_6).abs() < 1e-6), "{y:?}");
        let mut y = [0f32; 3];
        swiglu(&[-2.0, 0.0, 3.0], &[2.0, 5.0, 1.0], &mut y);
        let silu = |x: f32| x / (1.0 + (-x).exp());
        assert_eq!(y, [silu(-2.0) * 2.0, 0.0, silu(3.0)]);
    }

    #[test]
    fn dot_matches_f64_and_is_order_fixed() {
        let x: Vec<f32> = (0..300)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let y: Vec<f32> = (0..300)
            .map(|i| ((i * 53 % 89) as f32 - 44.0) / 5.0)
            .collect();
        let exact: f64 = x.iter().zip(&y).map(|(a, b)| *a as f64 * *b as f64).sum();
        let d = dot_f32(&x, &y);
        assert!((d as f64 - exact).abs() < 1e-3 * exact.abs().max(1.0));
        // The scalar (software fma) path gives the same bits, at every width the SIMD path
        // folds in registers (multiples of 64) and with tails.
        assert_eq!(d.to_bits(), dot_body(&x, &y).to_bits());
        for n in [0usize, 17, 63, 64, 65, 128, 192, 256, 299] {
            let (xs, ys) = (&x[..n], &y[300 - n..]);
            assert_eq!(
                dot_f32(xs, ys).to_bits(),
                dot_body(xs, ys).to_bits(),
                "length {n}"
            );
        }
        assert_eq!(
            dot_f32_gemm(&x[..288], &y[..288]).to_bits(),
            gemm_dot_body(&x[..288], &y[..288]).to_bits()
        );
        let mut a1: Vec<f32> = y.iter().map(|v| v * 0.5).collect();
        let mut a2 = a1.clone();
        axpy_fma(&mut a1, 0.37, &x);
        axpy_body(&mut a2, 0.37, &x);
        assert!(a1.iter().zip(&a2).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    #[test]
    fn batched_scores_are_bit_identical_to_the_per_key_dot() {
        let mut st = 0x2545f4914f6cdd1du64;
        let mut rnd = || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            ((st >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
        };
        for (hd, n) in [
            (256, 37),
            (64, 16),
            (80, 3),
            (96, 70),
            (32, 1),
            (256, 300),
            (128, 130),
        ] {
            let width = hd * 2 + 16;
            let cache: Vec<f32> = (0..(n + 4) * width).map(|_| rnd()).collect();
            let q: Vec<f32> = (0..hd).map(|_| rnd()).collect();
            // Rows in a scrambled order, at a head offset inside each cache row.
            let offs: Vec<usize> = (0..n).map(|j| ((j * 7) % (n + 4)) * width + hd).collect();
            let mut got = vec![0f32; n];
            scores_f32(&cache, &offs, &q, 0.0625, &mut got);
            for (j, g) in got.iter().enumerate() {
                let want = dot_f32(&cache[offs[j]..offs[j] + hd], &q) * 0.0625;
                assert_eq!(g.to_bits(), want.to_bits(), "score hd {hd} key {j}");
            }
        }
    }

    #[test]
    fn softmax_sums_to_one_and_pv_orders_agree_closely() {
        let mut sc: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
        softmax_cells(&mut sc, 5);
        let s: f32 = sc.iter().sum();
        assert!((s - 1.0).abs() < 1e-5);
        let v: Vec<Vec<f32>> = (0..37)
            .map(|j| (0..8).map(|d| (j * 8 + d) as f32 * 0.01).collect())
            .collect();
        let mut outs = Vec::new();
        for order in [PvOrder::VecDot, PvOrder::Gemm] {
            let mut acc = PvAcc::default();
            acc.reset(8, order);
            for (j, p) in sc.iter().enumerate() {
                acc.add(5 + j, *p, &v[j]);
            }
            let mut o = [0f32; 8];
            acc.finish(&mut o);
            outs.push(o);
        }
        for d in 0..8 {
            let exact: f64 = sc
                .iter()
                .zip(&v)
                .map(|(p, v)| *p as f64 * v[d] as f64)
                .sum();
            for o in &outs {
                assert!((o[d] as f64 - exact).abs() < 1e-5);
            }
        }
    }
}
