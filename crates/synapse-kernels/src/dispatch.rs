//! Runtime CPU-feature dispatch: which instruction-set path the kernels run.
//!
//! One binary runs everywhere: the best path is detected at run time with
//! `is_x86_feature_detected!` (or `std::arch::is_aarch64_feature_detected!`), and every SIMD
//! function is compiled with `#[target_feature(enable = ...)]`, so no `-C target-cpu=native` is
//! needed. The environment variable `SYNAPSE_KERNEL_PATH` (`scalar`, `avx2`, `avxvnni`,
//! `avx512vnni`, `neon`) caps the path for tests and comparisons; [`crate::KernelCtx::with_path`]
//! does the same from code.

use crate::error::{KernelError, Result};
use std::fmt;

/// An instruction-set path. Paths are ordered: a higher one may use everything a lower one
/// uses on the same architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelPath {
    /// Portable Rust, the reference every other path is tested against.
    Scalar,
    /// aarch64 NEON (+ `dotprod` when present).
    Neon,
    /// x86-64 AVX2 + FMA + F16C: `maddubs`/`madd` integer dots.
    Avx2,
    /// AVX2 plus AVX-VNNI (VEX `vpdpbusd` on 256-bit vectors).
    AvxVnni,
    /// AVX-512 F/BW/VL + VNNI (EVEX `vpdpbusd`).
    Avx512Vnni,
}

/// The environment variable that caps the kernel path.
pub const PATH_ENV: &str = "SYNAPSE_KERNEL_PATH";

impl KernelPath {
    /// Every path, lowest first.
    pub const ALL: [KernelPath; 5] = [
        KernelPath::Scalar,
        KernelPath::Neon,
        KernelPath::Avx2,
        KernelPath::AvxVnni,
        KernelPath::Avx512Vnni,
    ];

    /// The path's name as `SYNAPSE_KERNEL_PATH` spells it.
    pub fn name(self) -> &'static str {
        match self {
            KernelPath::Scalar => "scalar",
            KernelPath::Neon => "neon",
            KernelPath::Avx2 => "avx2",
            KernelPath::AvxVnni => "avxvnni",
            KernelPath::Avx512Vnni => "avx512vnni",
        }
    }

    /// Parses a path name (case-insensitive).
    pub fn from_name(s: &str) -> Result<Self> {
        let l = s.trim().to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|p| p.name() == l)
            .ok_or(KernelError::UnknownPath(s.to_string()))
    }

    /// Whether this CPU can run the path.
    pub fn is_supported(self) -> bool {
        match self {
            KernelPath::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            KernelPath::AvxVnni => {
                KernelPath::Avx2.is_supported() && is_x86_feature_detected!("avxvnni")
            }
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512Vnni => {
                KernelPath::Avx2.is_supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            KernelPath::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every path this CPU supports, lowest first.
    pub fn supported() -> Vec<KernelPath> {
        Self::ALL.into_iter().filter(|p| p.is_supported()).collect()
    }

    /// The best path this CPU supports, ignoring the environment.
    pub fn best_supported() -> Self {
        Self::ALL
            .into_iter()
            .rev()
            .find(|p| p.is_supported())
            .unwrap_or(KernelPath::Scalar)
    }

    /// The best supported path, capped by `SYNAPSE_KERNEL_PATH` when it is set: the result is
    /// the highest supported path not above the requested one. An unknown name is an error.
    pub fn from_env() -> Result<Self> {
        match std::env::var(PATH_ENV) {
            Ok(v) if !v.trim().is_empty() => {
                let cap = Self::from_name(&v)?;
                Ok(Self::ALL
                    .into_iter()
                    .rev()
                    .find(|p| *p <= cap && p.is_supported())
                    .unwrap_or(KernelPath::Scalar))
            }
            _ => Ok(Self::best_supported()),
        }
    }
}

impl fmt::Display for KernelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in KernelPath::ALL {
            assert_eq!(KernelPath::from_name(p.name()).unwrap(), p);
        }
        assert!(KernelPath::from_name("sse9").is_err());
    }

    #[test]
    fn scalar_always_supported_and_best_is_supported() {
        assert!(KernelPath::Scalar.is_supported());
        assert!(KernelPath::best_supported().is_supported());
        assert!(KernelPath::supported().contains(&KernelPath::best_supported()));
    }
}
