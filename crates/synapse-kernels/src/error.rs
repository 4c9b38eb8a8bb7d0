//! The one error enum of `synapse-kernels`.

use crate::dispatch::KernelPath;
use synapse_formats::GgmlType;

/// Everything that can go wrong building a weight matrix or running a kernel.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    // ---- weights ----
    /// The encoding has no kernel (e.g. integer tensor types, or a type with no decoder).
    #[error("no kernel for weight encoding {0}")]
    UnsupportedEncoding(String),
    /// The row length is not a whole number of blocks of the encoding.
    #[error("{cols} columns is not a multiple of the {block}-element block of {ty}")]
    ColsNotBlockMultiple {
        /// The weight type.
        ty: GgmlType,
        /// Columns (elements per row) asked for.
        cols: usize,
        /// The encoding's block size.
        block: usize,
    },
    /// The byte length of the weights disagrees with rows × cols of the encoding.
    #[error("weights of {rows}×{cols} {ty} need {expected} bytes, got {got}")]
    WeightBytes {
        /// The weight type.
        ty: GgmlType,
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
        /// Bytes the shape needs.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// rows × cols overflows `usize`.
    #[error("shape {rows}×{cols} overflows")]
    ShapeOverflow {
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
    },

    /// A Synapse codec refused the encoding id or the bytes.
    #[error("codec: {0}")]
    Codec(#[from] synapse_codecs::CodecError),

    // ---- calls ----
    /// An argument slice has the wrong length for the operation.
    #[error("{op}: {what} has length {got}, expected {expected}")]
    Shape {
        /// The operation.
        op: &'static str,
        /// Which argument.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Given length.
        got: usize,
    },
    /// An argument is out of the operation's domain (zero heads, head dim not even, ...).
    #[error("{op}: {msg}")]
    BadArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        msg: String,
    },

    // ---- dispatch ----
    /// A kernel path was forced that this CPU cannot run.
    #[error("kernel path {0} is not supported by this CPU")]
    PathUnsupported(KernelPath),
    /// An unknown kernel path name (e.g. in `SYNAPSE_KERNEL_PATH`).
    #[error("unknown kernel path {0:?} (expected scalar, avx2, avxvnni, avx512vnni or neon)")]
    UnknownPath(String),
}

/// `Result` with [`KernelError`].
pub type Result<T, E = KernelError> = std::result::Result<T, E>;
