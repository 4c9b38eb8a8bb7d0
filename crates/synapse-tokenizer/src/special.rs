//! llama.cpp's special-token partitioning (`tokenizer_st_partition`).
//!
//! Before the model's algorithm runs, the text is cut at occurrences of special tokens, longest
//! token text first. Control and unknown tokens take part only when `parse_special` is set;
//! user-defined tokens always do. Tokens flagged LSTRIP/RSTRIP eat the whitespace beside them.

use crate::tokenizer::{Tokenizer, attr, c_isspace};

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
    for &id in tok.special_cache() {
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
