//! [`GgufStrings`]: a metadata string array kept in its GGUF encoding, so a 262,144-entry
//! token list costs no per-string allocation.
//!
//! The bytes are the array's GGUF encoding (each string a `u64` length, then its UTF-8 bytes).
//! An array read by [`super::GgufFile`] borrows them from the file image itself (the mapping is
//! shared through an `Arc`, so a value never outlives its bytes and needs no copy of them); an
//! array built in memory (`From<Vec<String>>`, `FromIterator`) encodes its own buffer the same
//! way. Iteration walks the length prefixes; the first indexed access ([`GgufStrings::get`])
//! builds one `u32` end offset per string (`u64` past 4 GiB), once.
//!
//! Invariant: every string in the buffer was validated as UTF-8 when the value was built (the
//! reader rejects invalid UTF-8 with a typed error at open; an array built in memory encodes
//! `&str`s), and the buffer is never written afterwards, so reading hands out `&str`s without
//! validating again and never fails.

use std::sync::{Arc, OnceLock};

pub(crate) use crate::backing::Backing;

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

/// A GGUF string array: `len()` strings, iterable and indexable as `&str`, stored compactly.
///
/// The strings stay in their GGUF encoding in one buffer (for an array read by
/// [`GgufFile`](super::GgufFile): the file image itself, shared, not copied). Iterating walks
/// the buffer; the first [`get`](GgufStrings::get) builds one `u32` end offset per string
/// (`u64` past 4 GiB). Every string was validated as UTF-8 when the value was built, so
/// reading never fails.
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
    /// Bytes of the encoded array (prefixes included).
    span: usize,
    /// Number of strings.
    n: usize,
    /// Built on the first indexed access.
    ends: OnceLock<Ends>,
    /// Whether `backing` is this array's own buffer (built in memory), not a file image.
    owns_backing: bool,
}

impl GgufStrings {
    /// An array over already-validated encoded strings.
    ///
    /// # Safety
    /// `backing[start..start + span]` must be exactly `n` complete GGUF strings (a
    /// little-endian `u64` length, then that many bytes), each valid UTF-8: they are handed
    /// out as `&str` without checking again.
    pub(crate) unsafe fn from_validated(
        backing: Arc<Backing>,
        start: usize,
        span: usize,
        n: usize,
    ) -> Self {
        GgufStrings {
            backing,
            start,
            span,
            n,
            ends: OnceLock::new(),
            owns_backing: false,
        }
    }

    /// Number of strings.
    pub fn len(&self) -> usize {
        self.n
    }

    /// True when the array has no strings.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The encoded array (each string's `u64` length and bytes; no count).
    pub(crate) fn encoded(&self) -> &[u8] {
        self.start
            .checked_add(self.span)
            .and_then(|end| self.backing.bytes().get(self.start..end))
            .unwrap_or(&[])
    }

    fn ends(&self) -> &Ends {
        self.ends.get_or_init(|| {
            let walk = Walk {
                bytes: self.encoded(),
                pos: 0,
                left: self.n,
            };
            if u32::try_from(self.span).is_ok() {
                Ends::Narrow(walk.map(|(_, end)| end as u32).collect())
            } else {
                Ends::Wide(walk.map(|(_, end)| end as u64).collect())
            }
        })
    }

    fn end(&self, i: usize) -> Option<usize> {
        match self.ends() {
            Ends::Narrow(v) => v.get(i).map(|&e| e as usize),
            Ends::Wide(v) => v.get(i).and_then(|&e| usize::try_from(e).ok()),
        }
    }

    /// String `i`, or `None` past the end. The first call indexes the array (one offset per
    /// string); iterate with [`iter`](GgufStrings::iter) to avoid that.
    pub fn get(&self, i: usize) -> Option<&str> {
        if i >= self.n {
            return None;
        }
        let end = self.end(i)?;
        let begin = match i {
            0 => 0,
            _ => self.end(i - 1)?,
        } + LEN_PREFIX;
        // SAFETY: `begin..end` is exactly one of the strings `from_validated`'s caller checked
        // to be UTF-8 (the offsets were computed from the same bytes, never written since).
        self.encoded().get(begin..end).map(|b| unsafe { as_str(b) })
    }

    /// The strings in order (a walk over the buffer: no index is built).
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            walk: Walk {
                bytes: self.encoded(),
                pos: 0,
                left: self.n,
            },
        }
    }

    /// An owned copy as one `String` per element.
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_owned).collect()
    }

    /// Heap bytes this value owns apart from a shared file image: the offsets once built,
    /// plus the encoded strings when the array was built in memory rather than read from a
    /// file.
    pub fn heap_bytes(&self) -> usize {
        let offsets = match self.ends.get() {
            None => 0,
            Some(Ends::Narrow(v)) => v.capacity() * 4,
            Some(Ends::Wide(v)) => v.capacity() * 8,
        };
        let own = match &*self.backing {
            Backing::Bytes(b) if self.owns_backing => b.capacity(),
            _ => 0,
        };
        offsets + own
    }
}

/// # Safety
/// `b` must be valid UTF-8 (one of the validated strings).
unsafe fn as_str(b: &[u8]) -> &str {
    debug_assert!(std::str::from_utf8(b).is_ok());
    // SAFETY: the caller's contract. Checking again would cost more than the rest of a walk
    // over a vocabulary (~35 ns a string: 262k Gemma tokens 1.3 ms -> 10 ms).
    unsafe { std::str::from_utf8_unchecked(b) }
}

/// A walk over encoded strings: yields each string's byte range (relative to `bytes`).
#[derive(Debug, Clone)]
struct Walk<'a> {
    bytes: &'a [u8],
    pos: usize,
    left: usize,
}

impl Iterator for Walk<'_> {
    /// (begin, end) of the next string's bytes.
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        if self.left == 0 {
            return None;
        }
        let begin = self.pos.checked_add(LEN_PREFIX)?;
        let prefix: [u8; LEN_PREFIX] = self.bytes.get(self.pos..begin)?.try_into().ok()?;
        let end = begin.checked_add(usize::try_from(u64::from_le_bytes(prefix)).ok()?)?;
        if end > self.bytes.len() {
            return None;
        }
        self.pos = end;
        self.left -= 1;
        Some((begin, end))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
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
        let span = buf.len();
        GgufStrings {
            owns_backing: true,
            // SAFETY: `buf` is exactly the `n` strings just encoded, each from a `&str`.
            ..unsafe { GgufStrings::from_validated(Arc::new(Backing::Bytes(buf)), 0, span, n) }
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

/// Iterator over a [`GgufStrings`]' elements, in order.
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    walk: Walk<'a>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let bytes = self.walk.bytes;
        let (begin, end) = self.walk.next()?;
        // SAFETY: the walk follows the validated strings' own length prefixes from the first,
        // and stops after the `n` of them (`from_validated`'s contract).
        bytes.get(begin..end).map(|b| unsafe { as_str(b) })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.walk.size_hint()
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl std::iter::FusedIterator for Iter<'_> {}

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
        assert_eq!(s.heap_bytes(), s.encoded().len());
        assert_eq!(s.get(2), Some("▁x y"));
        assert_eq!(s.heap_bytes(), s.encoded().len() + 4 * 4);
        assert_eq!(s.get(4), None);
        assert_eq!(s.iter().len(), 4);
        assert_eq!(s.encoded().len(), 4 * 8 + 2 + 6);
        assert_eq!(s.to_vec(), ["", "é", "▁x y", ""]);
    }
}
