//! The tokenizer's compact lookup tables.
//!
//! A vocabulary has up to a few hundred thousand short strings (Gemma 3: 262,144 tokens, 2.3 MB
//! of text). Held as one `String` each, every copy costs about 56 bytes per token in headers
//! and allocator chunks, several times the text itself. These tables keep every string set in
//! one buffer with `u32` end offsets, and index it with hash tables of ids, so the tokenizer
//! holds each text once and allocates a handful of large blocks instead of a million small
//! ones (which glibc would keep resident after they are freed).

use crate::error::{Result, TokenizerError};
use crate::vocab::StrList;
use hashbrown::HashTable;
use std::hash::{BuildHasher, RandomState};

fn too_big(what: &str) -> TokenizerError {
    TokenizerError::InvalidKey {
        key: what.to_string(),
        reason: "more than 4 GiB of text".into(),
    }
}

/// Strings packed end to end: entry `i` is `buf[ends[i - 1]..ends[i]]` (`ends[-1]` = 0).
#[derive(Debug, Clone, Default)]
pub(crate) struct PackedStrs {
    buf: String,
    ends: Vec<u32>,
}

impl PackedStrs {
    /// Room for `n` strings totalling `bytes` bytes.
    pub(crate) fn with_capacity(n: usize, bytes: usize) -> Self {
        Self {
            buf: String::with_capacity(bytes),
            ends: Vec::with_capacity(n),
        }
    }

    /// Appends `s` as the next entry.
    pub(crate) fn push(&mut self, s: &str, what: &str) -> Result<()> {
        self.buf.push_str(s);
        let end = u32::try_from(self.buf.len()).map_err(|_| too_big(what))?;
        self.ends.push(end);
        Ok(())
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(crate) fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)? as usize;
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1] as usize,
        };
        self.buf.get(start..end)
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.buf.capacity() + self.ends.capacity() * size_of::<u32>()
    }
}

/// Byte strings packed end to end (the detokenizer's pieces), laid out like [`PackedStrs`].
#[derive(Debug, Clone, Default)]
pub(crate) struct PackedBytes {
    buf: Vec<u8>,
    ends: Vec<u32>,
}

impl PackedBytes {
    pub(crate) fn with_capacity(n: usize, bytes: usize) -> Self {
        Self {
            buf: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(n),
        }
    }

    /// The buffer to append the next entry's bytes to; [`PackedBytes::finish_entry`] closes it.
    pub(crate) fn buf_mut(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// Ends the entry whose bytes were appended since the previous one.
    pub(crate) fn finish_entry(&mut self, what: &str) -> Result<()> {
        let end = u32::try_from(self.buf.len()).map_err(|_| too_big(what))?;
        self.ends.push(end);
        Ok(())
    }

    pub(crate) fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)? as usize;
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1] as usize,
        };
        self.buf.get(start..end)
    }

    /// Gives back the unused capacity (the size was only estimated up front).
    pub(crate) fn shrink_to_fit(&mut self) {
        self.buf.shrink_to_fit();
        self.ends.shrink_to_fit();
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.buf.capacity() + self.ends.capacity() * size_of::<u32>()
    }
}

/// Text → id over a [`PackedStrs`]: a hash table of ids whose keys are the packed texts
/// themselves, so no key is stored twice.
#[derive(Debug, Clone, Default)]
pub(crate) struct TextIndex {
    table: HashTable<u32>,
    hasher: RandomState,
}

impl TextIndex {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Self {
            table: HashTable::with_capacity(n),
            hasher: RandomState::new(),
        }
    }

    /// Indexes entry `id` of `texts`; on a duplicate text returns the id that has it already.
    pub(crate) fn insert(&mut self, texts: &PackedStrs, id: u32) -> std::result::Result<(), u32> {
        let text = texts.get(id as usize).unwrap_or_default();
        let hasher = &self.hasher;
        let hash = hasher.hash_one(text);
        match self.table.entry(
            hash,
            |&other| texts.get(other as usize) == Some(text),
            |&other| hasher.hash_one(texts.get(other as usize).unwrap_or_default()),
        ) {
            hashbrown::hash_table::Entry::Occupied(e) => Err(*e.get()),
            hashbrown::hash_table::Entry::Vacant(e) => {
                e.insert(id);
                Ok(())
            }
        }
    }

    pub(crate) fn get(&self, texts: &PackedStrs, text: &str) -> Option<u32> {
        self.table
            .find(self.hasher.hash_one(text), |&id| {
                texts.get(id as usize) == Some(text)
            })
            .copied()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.table.allocation_size()
    }
}

/// BPE merge ranks: `(left, right)` → the rank of the first merge that names the pair.
///
/// Merge `k` is stored as its two halves packed end to end (`bounds[2k]` ends the left half,
/// `bounds[2k + 1]` the right one); the hash table holds merge numbers, which are the ranks.
#[derive(Debug, Clone, Default)]
pub(crate) struct MergeRanks {
    buf: String,
    bounds: Vec<u32>,
    table: HashTable<u32>,
    hasher: RandomState,
}

impl MergeRanks {
    /// Builds the table from `"left right"` lines in rank order. The line is split at the first
    /// space after its first byte; a line without one names the pair `("", "")`, which no
    /// lookup asks for. The first rank of a repeated pair wins.
    pub(crate) fn new(merges: StrList<'_>) -> Result<Self> {
        const WHAT: &str = "tokenizer.ggml.merges";
        let n = u32::try_from(merges.len()).map_err(|_| TokenizerError::InvalidKey {
            key: WHAT.into(),
            reason: "more than 2^32 merges".into(),
        })?;
        let bytes = merges.iter().map(str::len).sum();
        let mut r = Self {
            buf: String::with_capacity(bytes),
            bounds: Vec::with_capacity(2 * merges.len()),
            table: HashTable::with_capacity(merges.len()),
            hasher: RandomState::new(),
        };
        for (rank, m) in (0..n).zip(merges.iter()) {
            // Byte search (the first character may be multi-byte); a space is always a boundary.
            let (left, right) = match m.as_bytes().iter().skip(1).position(|&b| b == b' ') {
                Some(p) => (&m[..p + 1], &m[p + 2..]),
                None => ("", ""),
            };
            r.buf.push_str(left);
            r.bounds
                .push(u32::try_from(r.buf.len()).map_err(|_| too_big(WHAT))?);
            r.buf.push_str(right);
            r.bounds
                .push(u32::try_from(r.buf.len()).map_err(|_| too_big(WHAT))?);
            let Self {
                buf,
                bounds,
                table,
                hasher,
            } = &mut r;
            let pair = |k: u32| pair_at(buf, bounds, k);
            let hash = hasher.hash_one((left, right));
            if let hashbrown::hash_table::Entry::Vacant(e) = table.entry(
                hash,
                |&k| pair(k) == (left, right),
                |&k| hasher.hash_one(pair(k)),
            ) {
                e.insert(rank);
            }
        }
        Ok(r)
    }

    pub(crate) fn rank(&self, left: &str, right: &str) -> Option<u32> {
        self.table
            .find(self.hasher.hash_one((left, right)), |&k| {
                pair_at(&self.buf, &self.bounds, k) == (left, right)
            })
            .copied()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.buf.capacity()
            + self.bounds.capacity() * size_of::<u32>()
            + self.table.allocation_size()
    }
}

/// The two halves of merge `k` (empty strings if `k` is out of range).
fn pair_at<'a>(buf: &'a str, bounds: &[u32], k: u32) -> (&'a str, &'a str) {
    let k = k as usize;
    let start = match k {
        0 => 0,
        _ => bounds.get(2 * k - 1).copied().unwrap_or(0) as usize,
    };
    let mid = bounds.get(2 * k).copied().unwrap_or(0) as usize;
    let end = bounds.get(2 * k + 1).copied().unwrap_or(0) as usize;
    (
        buf.get(start..mid).unwrap_or_default(),
        buf.get(mid..end).unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_strs_round_trip() {
        let mut p = PackedStrs::with_capacity(3, 4);
        for s in ["ab", "", "▁c"] {
            p.push(s, "t").unwrap();
        }
        assert_eq!(p.len(), 3);
        assert_eq!(
            (p.get(0), p.get(1), p.get(2), p.get(3)),
            (Some("ab"), Some(""), Some("▁c"), None)
        );
        let mut idx = TextIndex::with_capacity(3);
        idx.insert(&p, 0).unwrap();
        idx.insert(&p, 2).unwrap();
        assert_eq!(idx.get(&p, "▁c"), Some(2));
        assert_eq!(idx.get(&p, "a"), None);
        p.push("ab", "t").unwrap();
        assert_eq!(idx.insert(&p, 3), Err(0));
    }

    #[test]
    fn merge_ranks_first_wins_and_multibyte_split() {
        let merges: Vec<String> = ["a b", "é x", "a b", "nospace", "ab c", "a bc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let r = MergeRanks::new(StrList::Strings(&merges)).unwrap();
        assert_eq!(r.rank("a", "b"), Some(0));
        assert_eq!(r.rank("é", "x"), Some(1));
        assert_eq!(r.rank("ab", "c"), Some(4));
        assert_eq!(r.rank("a", "bc"), Some(5));
        assert_eq!(r.rank("b", "a"), None);
        assert_eq!(r.rank("", "a"), None);
    }
}
