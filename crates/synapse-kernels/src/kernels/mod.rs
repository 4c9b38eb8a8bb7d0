//! Per-encoding dot kernels and their selection by [`KernelPath`].
//!
//! A kernel is a pair (activation format, dot function). The dot function computes one weight
//! row against one activation row; the matrix drivers in [`crate::matrix`] quantize the
//! activations once per call and tile rows × activation rows around it.

pub(crate) mod decode;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
pub(crate) mod scalar;
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

/// A selected kernel.
#[derive(Clone, Copy)]
pub(crate) struct Kernel {
    pub act: ActKind,
    pub dot: DotFn,
    /// The many-row tile, where the encoding has one on this path.
    pub dot4: Option<Dot4Fn>,
}

/// The kernel for `ty` on `path` (falling back to lower paths when a type has no kernel on the
/// requested one). The caller guarantees `path.is_supported()`.
pub(crate) fn select(ty: GgmlType, path: KernelPath) -> Option<Kernel> {
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
