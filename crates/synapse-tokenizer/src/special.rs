//! llama.cpp's special-token partitioning (`tokenizer_st_partition`).
//!
//! Before the model's algorithm runs, the text is cut at occurrences of special tokens, longest
//! token text first. Control and unknown tokens take part only when `parse_special` is set;
//! user-defined tokens always do. Tokens flagged LSTRIP/RSTRIP eat the whitespace beside them.

use crate::tokenizer::{Tokenizer, attr, c_isspace};
use aho_corasick::AhoCorasick;
use std::collections::HashSet;

/// One Aho–Corasick automaton over every special token's text, so that [`partition`] only
/// visits the special tokens that occur in the input: one pass over the text instead of one
/// substring search per special token (Gemma 3 has about 6,000 of them).
#[derive(Debug, Clone, Default)]
pub(crate) struct SpecialMatcher {
    ac: Option<AhoCorasick>,
    ids: Vec<u32>,
}

impl SpecialMatcher {
    pub(crate) fn new<'a>(items: impl Iterator<Item = (u32, &'a str)>) -> Self {
        let (ids, pats): (Vec<u32>, Vec<&str>) = items.filter(|(_, t)| !t.is_empty()).unzip();
        // If the automaton cannot be built, `present` answers None and every token is tried.
        let ac = AhoCorasick::new(&pats).ok();
        Self { ac, ids }
    }

    /// Heap bytes held (the automaton and the id list).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.ac.as_ref().map_or(0, AhoCorasick::memory_usage)
            + self.ids.capacity() * size_of::<u32>()
    }

    /// The ids whose text occurs anywhere in `text`; `None` when there is no automaton.
    fn present(&self, text: &str) -> Option<HashSet<u32>> {
        let ac = self.ac.as_ref()?;
        Some(
            ac.find_overlapping_iter(text)
                .filter_map(|m| self.ids.get(m.pattern().as_usize()).copied())
                .collect(),
        )
    }
}

/// A piece of the partitioned input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Raw text, as a byte range of the input.
    Text(usize, usize),
    /// A special token matched in the text.
    Token(u32),
}

pub(crate) fn partition(tok: &Tokenizer, text: &str, parse_special: bool) -> Vec<Fragment> {
    let bytes = text.as_bytes();
    let mut frags = vec![Fragment::Text(0, text.len())];
    // Every fragment is a substring of `text`: a token absent from it occurs in no fragment.
    let present = tok.special_matcher().present(text);
    for &id in tok.special_cache() {
        if let Some(p) = &present
            && !p.contains(&id)
        {
            continue;
        }
        let a = tok.token_attr(id);
        if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let needle = tok.token_text_unchecked(id);
        if needle.is_empty() {
            continue;
        }
        // Cheap skip: no text fragment contains the token.
        if !frags
            .iter()
            .any(|f| matches!(*f, Fragment::Text(s, e) if text[s..e].contains(needle)))
        {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len() + 2);
        for f in frags {
            let Fragment::Text(s, e) = f else {
                next.push(f);
                continue;
            };
            let mut cur = s;
            loop {
                let Some(rel) = text[cur..e].find(needle) else {
                    if cur < e {
                        next.push(Fragment::Text(cur, e));
                    }
                    break;
                };
                let m = cur + rel;
                let mut left_end = m;
                if a & attr::LSTRIP != 0 {
                    while left_end > cur && c_isspace(bytes[left_end - 1]) {
                        left_end -= 1;
                    }
                }
                if left_end > cur {
                    next.push(Fragment::Text(cur, left_end));
                }
                next.push(Fragment::Token(id));
                cur = m + needle.len();
                if a & attr::RSTRIP != 0 {
                    while cur < e && c_isspace(bytes[cur]) {
                        cur += 1;
                    }
                }
                if cur >= e {
                    break;
                }
            }
        }
        frags = next;
    }
    frags
}
