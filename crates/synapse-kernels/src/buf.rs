//! Cache-line aligned byte buffers: weight storage and reusable scratch.

use bytemuck::{Pod, Zeroable};

#[repr(C, align(64))]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Line([u8; 64]);

/// A growable byte buffer whose start is 64-byte aligned. Growing reallocates; shrinking never
/// does, so a buffer reused as scratch stops allocating once it has seen the largest call.
#[derive(Clone, Default)]
pub(crate) struct AlignedBuf {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub(crate) fn zeroed(len: usize) -> Self {
        let mut b = Self::default();
        b.set_len(len);
        b
    }

    /// A buffer holding a copy of `bytes`.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Self {
        let mut b = Self::zeroed(bytes.len());
        b.as_bytes_mut().copy_from_slice(bytes);
        b
    }

    /// Makes the buffer `len` bytes long (contents unspecified), allocating only to grow.
    pub(crate) fn set_len(&mut self, len: usize) {
        let lines = len.div_ceil(64);
        if lines > self.lines.len() {
            self.lines.resize(lines, Line([0; 64]));
        }
        self.len = len;
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<Line, u8>(&self.lines)[..self.len]
    }

    pub(crate) fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<Line, u8>(&mut self.lines)[..self.len]
    }
}
