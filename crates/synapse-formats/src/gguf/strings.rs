//! [`GgufStrings`]: a metadata string array held as one byte buffer plus one offset per
//! string, so a 262,144-entry token list costs two allocations instead of 262,144.
//!
//! The bytes are the array's GGUF encoding (each string a `u64` length, then its UTF-8 bytes).
//! An array read by [`super::GgufFile`] borrows them from the file image itself (the mapping is
//! shared through an `Arc`, so a value outlives neither its bytes nor needs a copy of them); an
//! array built in memory (`From<Vec<String>>`, `FromIterator`) encodes its own buffer the same
//! way. Either way the only per-string cost is one `u32` end offset (`u64` past 4 GiB).
//!
//! Invariant: every string in the buffer was validated as UTF-8 when the value was built (the
//! reader rejects invalid UTF-8 with a typed error at open; an array built in memory encodes
//! `&str`s), and the buffer is never written afterwards, so reading hands out `&str`s without
//! validating again and never fails.

use std::sync::Arc;

/// The bytes a [`GgufStrings`] lives in: a read-only file mapping or an owned buffer.
pub(crate) enum Backing {
    /// A memory-mapped file.
    Mmap(memmap2::Mmap),
    /// An in-memory image (or the encoded strings of an array built in memory).
    Bytes(Vec<u8>),
}

impl Backing {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Bytes(b) => b,
        }
    }
}

/// Size of a string's length prefix in the GGUF encoding.
const LEN_PREFIX: usize = 8;

/// The end (relative to the array's first byte) of each string's bytes.
#[derive(Clone)]
enum Ends {
    /// Arrays whose encoding spans at most `u32::MAX` bytes (every real vocabulary).
    Narrow(Vec<u32>),
    /// Larger arrays.
    Wide(Vec<u64>),
}

/// A GGUF string array: `len()` strings, indexable and iterable as `&str`, stored compactly.
///
/// The strings stay in their GGUF encoding in one buffer (for an array read by
/// [`GgufFile`](super::GgufFile): the file image itself, shared, not copied), with one `u32`
/// end offset per string (`u64` past 4 GiB). Every string was validated as UTF-8 when the
/// value was built, so reading never fails.
///
/// ```
/// use synapse_formats::gguf::GgufStrings;
/// let s: GgufStrings = vec!["<pad>".to_string(), "▁the".into(), String::new()].into();
/// assert_eq!(s.len(), 3);
/// assert_eq!(s.get(1), Some("▁the"));
/// assert_eq!(&s[2], "");
/// assert_eq!(s.iter().collect::<Vec<_>>(), ["<pad>", "▁the", ""]);
/// ```
#[derive(Clone)]
pub struct GgufStrings {
    /// The buffer holding the encoded array.
    backing: Arc<Backing>,
    /// Where the array's first length prefix starts in `backing`.
    start: usize,
    ends: Ends,
    /// Whether `backing` is this array's own buffer (built in memory), not a file image.
    owns_backing: bool,
}

impl GgufStrings {
    /// An array over already-validated encoded strings.
    ///
    /// # Safety
    /// From `start`, `backing` must hold `n` complete GGUF strings (a little-endian `u64`
    /// length, then that many bytes), each valid UTF-8: [`GgufStrings::get`] hands them out
    /// as `&str` without checking again.
    pub(crate) unsafe fn from_validated(backing: Arc<Backing>, start: usize, n: usize) -> Self {
        let bytes = backing.bytes();
        let span_end = |n: usize| {
            let mut pos = start;
            for _ in 0..n {
                let len = read_len(bytes, pos).unwrap_or(0);
                pos = pos.saturating_add(LEN_PREFIX).saturating_add(len);
            }
            pos - start
        };
        // One pass to size the offsets exactly, then one to fill them.
        let span = span_end(n);
        let ends = if u32::try_from(span).is_ok() {
            Ends::Narrow(collect_ends(bytes, start, n, |e| e as u32))
        } else {
            Ends::Wide(collect_ends(bytes, start, n, |e| e as u64))
        };
        GgufStrings {
            backing,
            start,
            ends,
            owns_backing: false,
        }
    }

    /// Number of strings.
    pub fn len(&self) -> usize {
        match &self.ends {
            Ends::Narrow(v) => v.len(),
            Ends::Wide(v) => v.len(),
        }
    }

    /// True when the array has no strings.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn end(&self, i: usize) -> Option<usize> {
        match &self.ends {
            Ends::Narrow(v) => v.get(i).map(|&e| e as usize),
            Ends::Wide(v) => v.get(i).and_then(|&e| usize::try_from(e).ok()),
        }
    }

    /// String `i`, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = self.end(i)?;
        let begin = match i {
            0 => 0,
            _ => self.end(i - 1)?,
        } + LEN_PREFIX;
        let bytes = self
            .backing
            .bytes()
            .get(self.start.checked_add(begin)?..self.start.checked_add(end)?)?;
        debug_assert!(std::str::from_utf8(bytes).is_ok());
        // SAFETY: `bytes` is exactly one of the strings `from_validated`'s caller checked to be
        // UTF-8 (the offsets were computed from the same bytes), and the backing is never
        // written. Checking again would cost more than the rest of a walk over a vocabulary
        // (~35 ns a string: 262k Gemma tokens 1.3 ms -> 10 ms).
        Some(unsafe { std::str::from_utf8_unchecked(bytes) })
    }

    /// The strings in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            strings: self,
            next: 0,
            end: self.len(),
        }
    }

    /// An owned copy as one `String` per element.
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_owned).collect()
    }

    /// The array's GGUF encoding (each string's `u64` length and bytes; no count).
    pub(crate) fn encoded(&self) -> &[u8] {
        let span = match self.len() {
            0 => 0,
            n => self.end(n - 1).unwrap_or(0),
        };
        self.backing
            .bytes()
            .get(self.start..self.start + span)
            .unwrap_or(&[])
    }

    /// Heap bytes this value owns apart from a shared file image: the offsets, plus the
    /// encoded strings when the array was built in memory rather than read from a file.
    pub fn heap_bytes(&self) -> usize {
        let offsets = match &self.ends {
            Ends::Narrow(v) => v.capacity() * 4,
            Ends::Wide(v) => v.capacity() * 8,
        };
        let own = match &*self.backing {
            Backing::Bytes(b) if self.owns_backing => b.capacity(),
            _ => 0,
        };
        offsets + own
    }
}

fn read_len(bytes: &[u8], pos: usize) -> Option<usize> {
    let b: [u8; LEN_PREFIX] = bytes
        .get(pos..pos.checked_add(LEN_PREFIX)?)?
        .try_into()
        .ok()?;
    usize::try_from(u64::from_le_bytes(b)).ok()
}

fn collect_ends<T>(bytes: &[u8], start: usize, n: usize, f: impl Fn(usize) -> T) -> Vec<T> {
    let mut ends = Vec::with_capacity(n);
    let mut pos = start;
    for _ in 0..n {
        let len = read_len(bytes, pos).unwrap_or(0);
        pos = pos.saturating_add(LEN_PREFIX).saturating_add(len);
        ends.push(f(pos - start));
    }
    ends
}

impl<S: AsRef<str>> FromIterator<S> for GgufStrings {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut buf = Vec::new();
        let mut n = 0;
        for s in iter {
            let s = s.as_ref();
            buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
            buf.extend_from_slice(s.as_bytes());
            n += 1;
        }
        buf.shrink_to_fit();
        GgufStrings {
            owns_backing: true,
            // SAFETY: `buf` holds the `n` strings just encoded, each from a `&str`.
            ..unsafe { GgufStrings::from_validated(Arc::new(Backing::Bytes(buf)), 0, n) }
        }
    }
}

impl From<Vec<String>> for GgufStrings {
    fn from(v: Vec<String>) -> Self {
        v.iter().collect()
    }
}

impl From<&[&str]> for GgufStrings {
    fn from(v: &[&str]) -> Self {
        v.iter().collect()
    }
}

impl PartialEq for GgufStrings {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for GgufStrings {}

impl std::fmt::Debug for GgufStrings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl std::ops::Index<usize> for GgufStrings {
    type Output = str;

    /// Panics past the end, like a slice.
    fn index(&self, i: usize) -> &str {
        match self.get(i) {
            Some(s) => s,
            None => panic!("index {i} out of range for {} strings", self.len()),
        }
    }
}

impl<'a> IntoIterator for &'a GgufStrings {
    type Item = &'a str;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// Iterator over a [`GgufStrings`]' elements.
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    strings: &'a GgufStrings,
    next: usize,
    end: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.next >= self.end {
            return None;
        }
        let s = self.strings.get(self.next);
        self.next += 1;
        s
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end - self.next;
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.next >= self.end {
            return None;
        }
        self.end -= 1;
        self.strings.get(self.end)
    }
}

impl ExactSizeIterator for Iter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_unicode() {
        let e = GgufStrings::from(Vec::new());
        assert!(e.is_empty());
        assert_eq!(e.get(0), None);
        assert_eq!(e.encoded(), b"");
        let s: GgufStrings = ["", "é", "▁x y", ""].into_iter().collect();
        assert_eq!(s.iter().collect::<Vec<_>>(), ["", "é", "▁x y", ""]);
        assert_eq!(s.iter().rev().collect::<Vec<_>>(), ["", "▁x y", "é", ""]);
        assert_eq!(s.get(4), None);
        assert_eq!(s.iter().len(), 4);
        assert_eq!(s.encoded().len(), 4 * 8 + 2 + 6);
        assert_eq!(s.to_vec(), ["", "é", "▁x y", ""]);
    }
}
