//! Streaming detokenization that never emits a broken character.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Turns a stream of token ids into text, holding back bytes of a UTF-8 sequence split over
/// tokens until it is complete. Bytes that can never form a valid character come out as U+FFFD
/// (as soon as they are known to be invalid).
///
/// Pieces are emitted raw: no leading-space removal and no punctuation clean-up, which need the
/// whole sequence ([`Tokenizer::detokenize`] does those).
#[derive(Debug)]
pub struct Decoder<'a> {
    tok: &'a Tokenizer,
    pending: Vec<u8>,
    special: bool,
}

impl<'a> Decoder<'a> {
    /// A decoder that skips control tokens.
    pub fn new(tok: &'a Tokenizer) -> Self {
        Self {
            tok,
            pending: Vec::new(),
            special: false,
        }
    }

    /// Also render control tokens as their text.
    pub fn with_special(mut self, special: bool) -> Self {
        self.special = special;
        self
    }

    /// Adds one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        let piece = self.tok.token_to_piece(id, self.special)?;
        self.pending.extend_from_slice(piece);
        Ok(self.drain(false))
    }

    /// Ends the stream: whatever is still pending comes out, incomplete bytes as U+FFFD.
    pub fn flush(&mut self) -> String {
        self.drain(true)
    }

    /// Bytes held back, waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    fn drain(&mut self, all: bool) -> String {
        let mut out = String::new();
        let mut start = 0usize;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // SAFETY-free: the prefix up to `valid` is valid UTF-8 by definition.
                    out.push_str(&String::from_utf8_lossy(
                        &self.pending[start..start + valid],
                    ));
                    start += valid;
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            start += bad;
                        }
                        None => {
                            if all {
                                out.push('\u{FFFD}');
                                start = self.pending.len();
                            }
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }
}
