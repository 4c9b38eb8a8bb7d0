//! Per-encoding dot kernels and their selection by [`KernelPath`].
//!
//! A kernel is a pair (activation format, dot function). The dot function computes one weight
//! row against one activation row; the matrix drivers in [`crate::matrix`] quantize the
//! activations once per call and tile rows × activation rows around it.

#[cfg(target_arch = "x86_64")]
pub(crate) mod codec_lanes_avx2;
pub(crate) mod codec_sym;
pub(crate) mod decode;
#[cfg(target_arch = "x86_64")]
pub(crate) mod ftile;
#[cfg(target_arch = "x86_64")]
pub(crate) mod gemv32;
#[cfg(target_arch = "x86_64")]
pub(crate) mod gemv32_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod gemvk;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
pub(crate) mod scalar;
pub(crate) mod ternary_i8;
pub(crate) mod ternary_tl;
#[cfg(target_arch = "x86_64")]
pub(crate) mod tile32;
#[cfg(target_arch = "x86_64")]
pub(crate) mod tiled;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use crate::act::ActKind;
use crate::dispatch::KernelPath;
use synapse_formats::GgmlType;

/// One weight row · one activation row.
///
/// # Safety
/// `w` points to `nb` weight blocks of the kernel's encoding (for float encodings `nb` is the
/// element count), `a` to the matching activation row in the kernel's [`ActKind`] (4-byte
/// aligned), and the CPU supports the path the function was selected for.
pub(crate) type DotFn = unsafe fn(w: *const u8, a: *const u8, nb: usize) -> f32;

/// One weight row · four activation rows (`a + t·astride`, t = 0..4): the weight codes are
/// unpacked once per block for all four. Same safety contract as [`DotFn`], for each row.
pub(crate) type Dot4Fn =
    unsafe fn(w: *const u8, a: *const u8, astride: usize, nb: usize) -> [f32; 4];

/// One weight row · two activation rows (`a`, `a + astride`): [`Dot4Fn`] for two.
pub(crate) type Dot2Fn =
    unsafe fn(w: *const u8, a: *const u8, astride: usize, nb: usize) -> [f32; 2];

/// A selected kernel.
#[derive(Clone, Copy)]
pub(crate) struct Kernel {
    pub act: ActKind,
    pub dot: DotFn,
    /// The many-row tile, where the encoding has one on this path.
    pub dot4: Option<Dot4Fn>,
    /// The two-row tile (the rows a call has past its fours), where the encoding has one.
    pub dot2: Option<Dot2Fn>,
    /// `(from, dot)`: the dot for calls with `from` or more activation rows, where ggml sums
    /// in a different order there (its tiled K-quant matmul from [`MANY_ROWS`], llamafile's
    /// f32 GEMM from 2); replaces `dot` and `dot4`.
    pub many: Option<(usize, DotFn)>,
    /// The many-row order's four-activation-row tile (the weights unpacked once for four
    /// rows), where the path has one; replaces `dot4` with `many`.
    pub many4: Option<Dot4Fn>,
}

/// f32 weights, one activation row: `ggml_vec_dot_f32`'s order.
///
/// # Safety
/// As [`DotFn`] for f32 weights and activations (`n` elements each).
pub(crate) unsafe fn dot_f32_ggml(w: *const u8, a: *const u8, n: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe {
        (
            std::slice::from_raw_parts(w.cast::<f32>(), n),
            std::slice::from_raw_parts(a.cast::<f32>(), n),
        )
    };
    crate::ggml_f32::dot_f32(w, a)
}

/// f32 weights, two or more activation rows: llamafile `tinyBLAS`'s order when the row length
/// is a multiple of 16 (ggml falls back to `vec_dot` otherwise).
///
/// # Safety
/// As [`DotFn`] for f32 weights and activations (`n` elements each).
pub(crate) unsafe fn dot_f32_ggml_gemm(w: *const u8, a: *const u8, n: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe {
        (
            std::slice::from_raw_parts(w.cast::<f32>(), n),
            std::slice::from_raw_parts(a.cast::<f32>(), n),
        )
    };
    if n.is_multiple_of(16) {
        crate::ggml_f32::dot_f32_gemm(w, a)
    } else {
        crate::ggml_f32::dot_f32(w, a)
    }
}

/// f16 weights and activations (`n` elements each, the activations rounded to f16): ggml's
/// `vec_dot_f16` order.
///
/// # Safety
/// As [`DotFn`] for f16 weights and activations.
pub(crate) unsafe fn dot_f16_ggml(w: *const u8, a: *const u8, n: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`; both are 2-byte aligned f16 rows.
    let (w, a) = unsafe {
        (
            std::slice::from_raw_parts(w.cast::<u16>(), n),
            std::slice::from_raw_parts(a.cast::<u16>(), n),
        )
    };
    crate::ggml_f32::dot_f16(w, a)
}

/// f16 weights, two or more activation rows: llamafile `tinyBLAS`'s order when the row length
/// is a multiple of 16 (ggml falls back to `vec_dot_f16` otherwise).
///
/// # Safety
/// As [`DotFn`] for f16 weights and activations.
pub(crate) unsafe fn dot_f16_ggml_gemm(w: *const u8, a: *const u8, n: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe {
        (
            std::slice::from_raw_parts(w.cast::<u16>(), n),
            std::slice::from_raw_parts(a.cast::<u16>(), n),
        )
    };
    if n.is_multiple_of(16) {
        crate::ggml_f32::dot_f16_gemm(w, a)
    } else {
        crate::ggml_f32::dot_f16(w, a)
    }
}

/// The f16 kernel on every path: ggml's orders over f16-rounded activations.
pub(crate) fn f16_kernel() -> Kernel {
    Kernel {
        act: ActKind::F16,
        dot: dot_f16_ggml,
        dot4: None,
        dot2: None,
        many: Some((2, dot_f16_ggml_gemm)),
        many4: None,
    }
}

/// bf16 weights and activations (`n` elements each, the activations rounded by ggml's
/// `fp32_to_bf16`): `ggml_vec_dot_bf16`'s order (its AVX512-BF16 build).
///
/// # Safety
/// As [`DotFn`] for bf16 weights and activations.
pub(crate) unsafe fn dot_bf16_ggml(w: *const u8, a: *const u8, n: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`; both are 2-byte aligned bf16 rows.
    let (w, a) = unsafe {
        (
            std::slice::from_raw_parts(w.cast::<u16>(), n),
            std::slice::from_raw_parts(a.cast::<u16>(), n),
        )
    };
    crate::ggml_f32::dot_bf16(w, a)
}

/// bf16 weights, two or more activation rows: llamafile `tinyBLAS`'s order when the row length
/// is a multiple of 32 (ggml falls back to `vec_dot_bf16` otherwise).
///
/// # Safety
/// As [`DotFn`] for bf16 weights and activations.
pub(crate) unsafe fn dot_bf16_ggml_gemm(w: *const u8, a: *const u8, n: usize) -> f32 {
    // SAFETY: forwarded contract of `DotFn`.
    let (w, a) = unsafe {
        (
            std::slice::from_raw_parts(w.cast::<u16>(), n),
            std::slice::from_raw_parts(a.cast::<u16>(), n),
        )
    };
    if n.is_multiple_of(32) {
        crate::ggml_f32::dot_bf16_gemm(w, a)
    } else {
        crate::ggml_f32::dot_bf16(w, a)
    }
}

/// The BF16 kernel in ggml's orders (the same on every path; the instruction where the CPU
/// has AVX512-BF16, its exact emulation elsewhere).
pub(crate) fn bf16_kernel() -> Kernel {
    Kernel {
        act: ActKind::Bf16,
        dot: dot_bf16_ggml,
        dot4: None,
        dot2: None,
        many: Some((2, dot_bf16_ggml_gemm)),
        many4: None,
    }
}

/// The f32 kernel on every path: ggml's orders (the arithmetic is the same on all CPUs).
pub(crate) fn f32_kernel() -> Kernel {
    Kernel {
        act: ActKind::F32,
        dot: dot_f32_ggml,
        dot4: None,
        dot2: None,
        many: Some((2, dot_f32_ggml_gemm)),
        many4: None,
    }
}

/// From this many activation rows on, llama.cpp's CPU backend runs K-quants through its
/// tiled matmul (`ggml_tiled_min_batch`), whose float order [`Kernel::many`] reproduces.
pub(crate) const MANY_ROWS: usize = 8;

/// The kernel for `ty` on `path` (falling back to lower paths when a type has no kernel on the
/// requested one). The caller guarantees `path.is_supported()`.
pub(crate) fn select(ty: GgmlType, path: KernelPath) -> Option<Kernel> {
    if ty == GgmlType::F32 {
        return Some(f32_kernel());
    }
    #[cfg(target_arch = "x86_64")]
    if path >= KernelPath::Avx2
        && let Some(k) = x86::select(ty, path)
    {
        return Some(k);
    }
    #[cfg(target_arch = "aarch64")]
    if path == KernelPath::Neon
        && let Some(k) = neon::select(ty)
    {
        return Some(k);
    }
    let _ = path;
    scalar::select(ty)
}

/// Bytes of a Q8_K activation block (`d`, `qs[256]`, `bsums[16]`).
const AK: usize = std::mem::size_of::<crate::act::BlockQ8K>();

/// Bytes of one activation block as [`prepare_tq2`] lays it out: `qs[256]` first (so in a
/// 64-byte aligned buffer every 64-byte chunk a kernel loads is one aligned cache line: the
/// Q8_K block's 292-byte stride split nearly every such load over two lines, which cost the
/// one-row TQ2_0 GEMV ~6% of its cache-resident rate), then 8 `i32` lanes at
/// [`PAK_BSUMS`], `d` at [`PAK_D`], padding to a multiple of 64.
pub(crate) const PAK: usize = 320;
/// Offset of the prepared block's 8 negated pair-bsum `i32` lanes.
pub(crate) const PAK_BSUMS: usize = 256;
/// Offset of the prepared block's `d` (`f32`).
pub(crate) const PAK_D: usize = 288;

/// Re-lays out `nblocks` Q8_K activation blocks (at the start of `a`, [`AK`] bytes each) in
/// place as blocks of [`PAK`] bytes for [`rows`] on TQ2_0 and for `ternary_i8`: each block's
/// 32-byte quarters `v0..v8` become `[v0 v4 v1 v5 v2 v6 v3 v7]` at offset 0 (64-byte chunk `l` =
/// the activations of code vector `l` of both 32-byte halves of a TQ2_0 block), its 16 `i16`
/// bsums 8 `i32` lanes `−(bsums[2j] + bsums[2j+1])` at [`PAK_BSUMS`], `d` at [`PAK_D`].
///
/// # Panics
/// If `a` is shorter than `nblocks · PAK` bytes (callers size their scratch with
/// [`prepared_len`]).
pub(crate) fn prepare_tq2(a: &mut [u8], nblocks: usize) {
    assert!(a.len() >= nblocks * PAK, "prepare_tq2: scratch too short");
    // Last block first: block i's new place starts at or after its old one and ends inside
    // the places of blocks > i, which are already moved.
    for i in (0..nblocks).rev() {
        let mut b = [0u8; AK];
        b.copy_from_slice(&a[i * AK..(i + 1) * AK]);
        let out = &mut a[i * PAK..(i + 1) * PAK];
        for l in 0..4 {
            out[64 * l..64 * l + 32].copy_from_slice(&b[4 + 32 * l..4 + 32 * l + 32]);
            out[64 * l + 32..64 * l + 64]
                .copy_from_slice(&b[4 + 32 * (4 + l)..4 + 32 * (4 + l) + 32]);
        }
        for j in 0..8 {
            let bs = |k: usize| i16::from_le_bytes([b[260 + 2 * k], b[261 + 2 * k]]) as i32;
            let v = -(bs(2 * j) + bs(2 * j + 1));
            out[PAK_BSUMS + 4 * j..PAK_BSUMS + 4 * j + 4].copy_from_slice(&v.to_le_bytes());
        }
        out[PAK_D..PAK_D + 4].copy_from_slice(&b[..4]);
        out[PAK_D + 4..].fill(0);
    }
}

/// Scratch bytes for `nblocks` activation blocks quantised as Q8_K (`q8k_len` bytes) and then
/// re-laid out by [`prepare_tq2`].
pub(crate) fn prepared_len(q8k_len: usize, nblocks: usize) -> usize {
    q8k_len.max(nblocks * PAK)
}
