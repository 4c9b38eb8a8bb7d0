//! llama.cpp's SentencePiece-style tokenizer: score-driven pair merging with byte fallback.
//!
//! The text (spaces already escaped to `▁`) starts as one symbol per UTF-8 character. Every
//! adjacent pair whose concatenation is a vocabulary entry is queued by that entry's score;
//! the best pair (ties: leftmost) is merged, and the new neighbours are queued, until nothing
//! merges. Each final symbol is its token, or its bytes as `<0xXX>` tokens.
//!
//! This is not SentencePiece's Unigram/Viterbi search: on real inputs the two disagree, and
//! Synapse must agree with llama.cpp.

use crate::error::{Result, TokenizerError};
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

struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .partial_cmp(&o.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| o.left.cmp(&self.left))
    }
}

/// Tokenizes one fragment (whitespace already escaped) and appends the ids to `out`.
pub(crate) fn tokenize(tok: &Tokenizer, text: &str, out: &mut Vec<u32>) -> Result<()> {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (i, (start, c)) in text.char_indices().enumerate() {
        let len = c.len_utf8();
        symbols.push(Symbol {
            start,
            len,
            prev: i.checked_sub(1),
            next: if start + len == text.len() {
                None
            } else {
                Some(i + 1)
            },
        });
    }
    if symbols.is_empty() {
        return Ok(());
    }
    let mut queue = BinaryHeap::with_capacity(symbols.len());
    let try_add = |symbols: &[Symbol],
                   queue: &mut BinaryHeap<Bigram>,
                   left: Option<usize>,
                   right: Option<usize>| {
        let (Some(l), Some(r)) = (left, right) else {
            return;
        };
        let (ls, rs) = (symbols[l], symbols[r]);
        let s = &text[ls.start..ls.start + ls.len + rs.len];
        if let Some(id) = tok.text_to_token(s) {
            queue.push(Bigram {
                left: l,
                right: r,
                score: tok.score(id),
                size: s.len(),
            });
        }
    };
    for i in 1..symbols.len() {
        try_add(&symbols, &mut queue, Some(i - 1), Some(i));
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
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
    let mut i = Some(0usize);
    while let Some(k) = i {
        let s = symbols[k];
        let piece = &text[s.start..s.start + s.len];
        if let Some(id) = tok.text_to_token(piece) {
            out.push(id);
        } else {
            // Every merged symbol is a vocabulary entry, so only single characters land here:
            // emit their bytes.
            for &b in piece.as_bytes() {
                out.push(
                    tok.spm_byte_to_token(b)
                        .ok_or(TokenizerError::NoByteToken { byte: b })?,
                );
            }
        }
        i = s.next;
    }
    Ok(())
}
