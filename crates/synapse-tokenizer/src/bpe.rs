//! llama.cpp's BPE tokenizer: regex pre-split, then rank-driven merging inside each word.
//!
//! Each word (GPT-2 byte-encoded unless the vocabulary is SPM-style like Gemma 4) starts as one
//! symbol per character; the adjacent pair with the lowest merge rank (ties: leftmost) is
//! merged until no pair has a rank. A final symbol that is not a token falls back to its
//! bytes (single-byte tokens for byte-level vocabularies, `<0xXX>` for Gemma 4), silently
//! dropping bytes without a token, as llama.cpp does.

use crate::error::Result;
use crate::tokenizer::Tokenizer;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

#[derive(PartialEq, Eq)]
struct Bigram {
    left: usize,
    right: usize,
    rank: u32,
    size: usize,
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    /// Max-heap order: lowest rank first, then the leftmost pair.
    fn cmp(&self, o: &Self) -> Ordering {
        o.rank.cmp(&self.rank).then_with(|| o.left.cmp(&self.left))
    }
}

/// Tokenizes one fragment of raw text (whitespace already escaped where the vocabulary wants
/// it) and appends the ids to `out`.
pub(crate) fn tokenize(tok: &Tokenizer, text: &str, out: &mut Vec<u32>) -> Result<()> {
    let Some(pre) = tok.pre_tokenizer() else {
        return Ok(());
    };
    let mut word_buf = String::new();
    let mut symbols: Vec<Symbol> = Vec::new();
    let mut queue: BinaryHeap<Bigram> = BinaryHeap::new();
    for (s, e) in pre.split(text)? {
        let raw = &text[s..e];
        let word: &str = if tok.byte_encode() {
            word_buf.clear();
            let table = tok.byte_table();
            for &b in raw.as_bytes() {
                word_buf.push(table[b as usize]);
            }
            &word_buf
        } else {
            raw
        };
        symbols.clear();
        queue.clear();
        let mut offset = 0usize;
        // A word that is itself a token is kept whole: always for Llama-3-style vocabularies,
        // and for Gemma 4 when the word is a run of newlines.
        let whole = (tok.ignore_merges() || (tok.is_gemma4() && word.bytes().all(|b| b == b'\n')))
            && tok.text_to_token(word).is_some();
        if whole {
            offset = word.len();
            symbols.push(Symbol {
                start: 0,
                len: word.len(),
                prev: None,
                next: None,
            });
        }
        let first = symbols.len();
        for (index, c) in (first..).zip(word[offset..].chars()) {
            let len = c.len_utf8();
            symbols.push(Symbol {
                start: offset,
                len,
                prev: index.checked_sub(1),
                next: if offset + len == word.len() {
                    None
                } else {
                    Some(index + 1)
                },
            });
            offset += len;
        }
        let try_add = |symbols: &[Symbol],
                       queue: &mut BinaryHeap<Bigram>,
                       left: Option<usize>,
                       right: Option<usize>| {
            let (Some(l), Some(r)) = (left, right) else {
                return;
            };
            let (ls, rs) = (symbols[l], symbols[r]);
            let a = &word[ls.start..ls.start + ls.len];
            let b = &word[rs.start..rs.start + rs.len];
            if let Some(rank) = tok.bpe_rank(a, b) {
                queue.push(Bigram {
                    left: l,
                    right: r,
                    rank,
                    size: ls.len + rs.len,
                });
            }
        };
        for i in 1..symbols.len() {
            try_add(&symbols, &mut queue, Some(i - 1), Some(i));
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            // Both alive and still adjacent with the same extent means the text is unchanged.
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size || l.next != Some(b.right) {
                continue;
            }
            symbols[b.left].len += r.len;
            symbols[b.right].len = 0;
            symbols[b.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(b.left);
            }
            let lp = symbols[b.left].prev;
            let ln = symbols[b.left].next;
            try_add(&symbols, &mut queue, lp, Some(b.left));
            try_add(&symbols, &mut queue, Some(b.left), ln);
        }
        for sym in symbols.iter().filter(|s| s.len > 0) {
            let piece = &word[sym.start..sym.start + sym.len];
            if let Some(id) = tok.text_to_token(piece) {
                out.push(id);
                continue;
            }
            for &byte in piece.as_bytes() {
                let id = if tok.byte_encode() {
                    // llama.cpp looks up the single raw byte of the encoded text: only ASCII
                    // bytes can name a token; the rest are dropped.
                    if byte.is_ascii() {
                        let b = [byte];
                        std::str::from_utf8(&b)
                            .ok()
                            .and_then(|s| tok.text_to_token(s))
                    } else {
                        None
                    }
                } else {
                    tok.hex_byte_token(byte)
                };
                if let Some(id) = id {
                    out.push(id);
                }
            }
        }
    }
    Ok(())
}
