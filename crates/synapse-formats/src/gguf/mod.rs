//! GGUF v3: a validating reader over `memmap2` and a writer.
//!
//! # Reading rules
//! [`GgufFile::open`] parses and checks the whole header before anything is handed out; after
//! that, tensor bytes are zero-copy slices of the mapping. Nothing in the file is trusted:
//!
//! - the magic must be `GGUF` and the version 3 (v1/v2 and anything else: a typed
//!   [`FormatError::UnsupportedVersion`](crate::FormatError::UnsupportedVersion) naming it);
//! - every count (metadata pairs, tensors, array elements, string lengths) is bounded by the
//!   bytes left in the file times the smallest encoding of one item **before** any allocation,
//!   so no header field can request a multi-GB buffer;
//! - strings must be UTF-8 (checked at open, string arrays included); metadata value types must be 0–12; arrays may nest at most
//!   [`MAX_ARRAY_DEPTH`] levels; keys and tensor names must be unique;
//! - `general.alignment` (if present) must be a `u32` power of two (default 32);
//! - a tensor has at most [`MAX_DIMS`] dims, each ≤ `i64::MAX` with an element count that does
//!   not overflow `int64`; `ne0` must be a multiple of the type's block size; its relative
//!   offset must be a multiple of the alignment; its byte range (offset + ggml `nbytes`) must be
//!   overflow-free and inside the file; no two tensors may overlap.
//!
//! # Type ids 36–39: upstream ggml or bitnet.cpp?
//! Upstream ggml removed ids 36–38 and assigns 39 to MXFP4; the bitnet.cpp fork assigns
//! 36 = I2_S, 37 = I8_S, 38 = TL1, 39 = TL2. The reader decides by provenance:
//!
//! 1. If `general.architecture` does not start with `bitnet` (case-insensitive), the ids have
//!    their upstream meaning: 39 is MXFP4, 36–38 are [`UnknownType`](crate::FormatError::UnknownType).
//! 2. In a `bitnet*` file, id 39 is MXFP4 only when the tensor's slot (the bytes from its
//!    offset to the next tensor's offset, or to the end of the file) holds exactly MXFP4's
//!    `nbytes` for its shape plus less than one alignment of padding; otherwise it is TL2.
//!    Ids 36–38 in a `bitnet*` file are I2_S, I8_S and TL1.
//! 3. Fork types are reported as [`TensorType::Bitnet`], their `n_bytes` is their slot, and
//!    [`TensorType::ggml`] returns a typed
//!    [`Unsupported`](crate::FormatError::Unsupported) error until BitNet support lands — never
//!    a misread.

mod reader;
mod strings;
mod tensor;
mod value;
mod writer;

pub use reader::GgufFile;
pub use strings::{GgufStrings, Iter as GgufStringsIter};
pub use tensor::{BitnetType, TensorInfo, TensorType};
pub use value::{GgufArray, GgufValue, GgufValueType};
pub use writer::GgufWriter;

/// The four magic bytes at the start of every GGUF file.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// The only GGUF version Synapse reads and writes.
pub const GGUF_VERSION: u32 = 3;
/// Tensor data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of metadata arrays the reader accepts.
pub const MAX_ARRAY_DEPTH: usize = 8;
