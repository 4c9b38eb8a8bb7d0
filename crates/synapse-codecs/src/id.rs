//! Encoding IDs: versioned, canonical strings such as `syn.q4.symmetric.g64.v1`.
//!
//! Grammar (every number in canonical decimal, no leading zeros, no sign):
//!
//! ```text
//! syn.q{bits}.symmetric.g{group}.v1     bits 2..=8, group a multiple of 8 in 8..=1024
//! syn.q{bits}.asymmetric.g{group}.v1    same domain
//! syn.ternary.absmean.g{group}.v1       same group domain (g64 is BitNet b1.58's member)
//! syn.ternary.absmean.tensor.v1         one per-tensor scale
//! ggml.{type}.v1                        type one of q8_0 q5_1 q5_0 q4_1 q4_0 (ggml's own blocks)
//! ```

use std::fmt;
use std::str::FromStr;

use crate::error::{CodecError, Result};
use crate::ggml::GgmlBlock;

/// Smallest and largest code width of the `q{bits}` families.
pub const BITS_RANGE: std::ops::RangeInclusive<u32> = 2..=8;
/// Largest group size of any grouped family.
pub const MAX_GROUP: usize = 1024;
/// Group sizes must be a multiple of this (so every group's codes end on a byte boundary).
pub const GROUP_MULTIPLE: usize = 8;
/// The only codec version this build knows.
pub const VERSION: u32 = 1;

/// A parsed, validated encoding ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EncodingId {
    /// `syn.q{bits}.symmetric.g{group}.v1`.
    Symmetric {
        /// Code width in bits (2..=8).
        bits: u32,
        /// Elements per group (multiple of 8, ≤ 1024).
        group: usize,
    },
    /// `syn.q{bits}.asymmetric.g{group}.v1`.
    Asymmetric {
        /// Code width in bits (2..=8).
        bits: u32,
        /// Elements per group (multiple of 8, ≤ 1024).
        group: usize,
    },
    /// `syn.ternary.absmean.g{group}.v1`.
    TernaryGroup {
        /// Elements per group (multiple of 8, ≤ 1024).
        group: usize,
    },
    /// `syn.ternary.absmean.tensor.v1`.
    TernaryTensor,
    /// `ggml.{type}.v1`: one of ggml's block types with a SIMD kernel ([`crate::ggml`]).
    Ggml(GgmlBlock),
}

fn parse_num(id: &str, s: &str, what: &str) -> Result<usize> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if !canonical {
        return Err(CodecError::InvalidEncoding {
            id: id.to_owned(),
            reason: format!("{what} `{s}` is not a canonical decimal number"),
        });
    }
    s.parse::<usize>().map_err(|_| CodecError::InvalidEncoding {
        id: id.to_owned(),
        reason: format!("{what} `{s}` is too large"),
    })
}

fn check_group(id: &str, group: usize) -> Result<()> {
    if group == 0 || !group.is_multiple_of(GROUP_MULTIPLE) || group > MAX_GROUP {
        return Err(CodecError::InvalidEncoding {
            id: id.to_owned(),
            reason: format!(
                "group {group} must be a positive multiple of {GROUP_MULTIPLE} no larger than {MAX_GROUP}"
            ),
        });
    }
    Ok(())
}

fn check_bits(id: &str, bits: usize) -> Result<u32> {
    match u32::try_from(bits) {
        Ok(b) if BITS_RANGE.contains(&b) => Ok(b),
        _ => Err(CodecError::InvalidEncoding {
            id: id.to_owned(),
            reason: format!(
                "{bits} bits is outside {}..={}",
                BITS_RANGE.start(),
                BITS_RANGE.end()
            ),
        }),
    }
}

impl EncodingId {
    /// Parses and validates an ID. Unknown families give [`CodecError::UnknownEncoding`];
    /// known families with bad parameters or a non-canonical spelling give
    /// [`CodecError::InvalidEncoding`].
    pub fn parse(id: &str) -> Result<Self> {
        let unknown = || CodecError::UnknownEncoding { id: id.to_owned() };
        let parts: Vec<&str> = id.split('.').collect();
        if let ["ggml", ty, v] = parts[..] {
            let b = GgmlBlock::from_name(ty).ok_or_else(unknown)?;
            let version = v.strip_prefix('v').ok_or_else(unknown)?;
            if parse_num(id, version, "version")? != VERSION as usize {
                return Err(CodecError::InvalidEncoding {
                    id: id.to_owned(),
                    reason: format!("codec version {v} is not known (this build has v{VERSION})"),
                });
            }
            return Ok(EncodingId::Ggml(b));
        }
        if parts.first() != Some(&"syn") || parts.len() < 4 {
            return Err(unknown());
        }
        let version = parts[parts.len() - 1];
        let version = version.strip_prefix('v').ok_or_else(unknown)?;
        let version = parse_num(id, version, "version")?;
        let parsed = match parts[1..parts.len() - 1] {
            [q, kind @ ("symmetric" | "asymmetric"), g] => {
                let bits = q.strip_prefix('q').ok_or_else(unknown)?;
                let group = g.strip_prefix('g').ok_or_else(unknown)?;
                let bits = check_bits(id, parse_num(id, bits, "bits")?)?;
                let group = parse_num(id, group, "group")?;
                check_group(id, group)?;
                if kind == "symmetric" {
                    EncodingId::Symmetric { bits, group }
                } else {
                    EncodingId::Asymmetric { bits, group }
                }
            }
            ["ternary", "absmean", "tensor"] => EncodingId::TernaryTensor,
            ["ternary", "absmean", g] => {
                let group = g.strip_prefix('g').ok_or_else(unknown)?;
                let group = parse_num(id, group, "group")?;
                check_group(id, group)?;
                EncodingId::TernaryGroup { group }
            }
            _ => return Err(unknown()),
        };
        if version != VERSION as usize {
            return Err(CodecError::InvalidEncoding {
                id: id.to_owned(),
                reason: format!(
                    "codec version v{version} is not known (this build has v{VERSION})"
                ),
            });
        }
        Ok(parsed)
    }

    /// Builds a symmetric ID, validating its parameters.
    pub fn symmetric(bits: u32, group: usize) -> Result<Self> {
        let me = EncodingId::Symmetric { bits, group };
        Self::parse(&me.to_string())
    }

    /// Builds an asymmetric ID, validating its parameters.
    pub fn asymmetric(bits: u32, group: usize) -> Result<Self> {
        let me = EncodingId::Asymmetric { bits, group };
        Self::parse(&me.to_string())
    }

    /// Nominal stored bits per weight for full groups (codes plus scales, amortised).
    pub fn bits_per_weight(&self) -> f64 {
        match *self {
            EncodingId::Symmetric { bits, group } => bits as f64 + 16.0 / group as f64,
            EncodingId::Asymmetric { bits, group } => bits as f64 + 32.0 / group as f64,
            EncodingId::TernaryGroup { group } => 2.0 + 16.0 / group as f64,
            EncodingId::TernaryTensor => 2.0,
            EncodingId::Ggml(b) => b.bits_per_weight(),
        }
    }
}

impl fmt::Display for EncodingId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            EncodingId::Symmetric { bits, group } => {
                write!(f, "syn.q{bits}.symmetric.g{group}.v{VERSION}")
            }
            EncodingId::Asymmetric { bits, group } => {
                write!(f, "syn.q{bits}.asymmetric.g{group}.v{VERSION}")
            }
            EncodingId::TernaryGroup { group } => {
                write!(f, "syn.ternary.absmean.g{group}.v{VERSION}")
            }
            EncodingId::TernaryTensor => write!(f, "syn.ternary.absmean.tensor.v{VERSION}"),
            EncodingId::Ggml(b) => write!(f, "ggml.{}.v{VERSION}", b.name()),
        }
    }
}

impl FromStr for EncodingId {
    type Err = CodecError;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}
