//! The bytes a parsed file lives in — a read-only mapping with its open file, or an owned
//! image — shared by the GGUF and safetensors readers.

/// A file's bytes: a read-only mapping (the open file kept for positional reads), or an
/// in-memory image.
pub(crate) enum Backing {
    /// A memory-mapped file, with the open file kept for positional reads.
    Mmap(memmap2::Mmap, std::fs::File),
    /// An in-memory image (or the encoded strings of a GGUF array built in memory).
    Bytes(Vec<u8>),
}

impl Backing {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m, _) => m,
            Backing::Bytes(b) => b,
        }
    }

    /// The mapping (`None` for an in-memory image).
    pub(crate) fn mapping(&self) -> Option<&memmap2::Mmap> {
        match self {
            Backing::Mmap(m, _) => Some(m),
            Backing::Bytes(_) => None,
        }
    }

    /// Reads `dst.len()` bytes from byte `at` of the `len`-byte range at file offset `offset`
    /// into `dst` through the file (a positional read: no mapped page is touched).
    /// `Ok(false)` for an in-memory image, a range outside the `len` bytes, or a platform
    /// without positional reads.
    pub(crate) fn read_at(
        &self,
        offset: u64,
        len: u64,
        at: u64,
        dst: &mut [u8],
    ) -> std::io::Result<bool> {
        let Backing::Mmap(_, file) = self else {
            return Ok(false);
        };
        let end = at.checked_add(dst.len() as u64);
        if end.is_none_or(|e| e > len) {
            return Ok(false);
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileExt;
            file.read_exact_at(dst, offset + at)?;
            Ok(true)
        }
        #[cfg(not(unix))]
        {
            let _ = file;
            Ok(false)
        }
    }
}
