//! The tokenizer's heap footprint for big vocabularies: deterministic byte counts, not timings.
//! The vocabulary must be held compactly (one text buffer, hash tables of ids), not as several
//! `String` copies per token: for Gemma 3's 262,144 tokens that was ~60 MB of resident memory,
//! more than the gap to llama.cpp's peak RSS.
//!
//! The bytes are counted by this test binary's global allocator ([`Counting`]), not by the
//! tokenizer's own estimate ([`Tokenizer::heap_bytes`], printed beside for comparison): what a
//! tokenizer holds is the number of bytes that dropping it gives back.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use synapse_formats::gguf::GgufFile;
use synapse_tokenizer::{ModelKind, Tokenizer, Vocab, vocab::token_type};

/// The system allocator, counting the bytes each thread allocates and frees (requested sizes).
/// Per thread, so that tests running in parallel threads of one process (`cargo test`) do not
/// count each other's allocations; the tokenizer does not allocate on other threads.
struct Counting;

thread_local! {
    /// (bytes allocated, bytes freed) by this thread. `const` with no destructor: reading it
    /// never allocates and works during thread teardown.
    static COUNTS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

fn count(allocated: usize, freed: usize) {
    let _ = COUNTS.try_with(|c| {
        let (a, f) = c.get();
        c.set((a + allocated as u64, f + freed as u64));
    });
}

// SAFETY: every call is forwarded unchanged to `System`; the counting only touches a
// thread-local `Cell` and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size(), 0);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size(), 0);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` (through this wrapper) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        count(0, layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`; `new_size` is the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size, layout.size());
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Bytes this thread has allocated and not freed (may be negative: frees of memory that
/// another thread allocated).
fn live() -> i64 {
    let (a, f) = COUNTS.with(Cell::get);
    a as i64 - f as i64
}

/// What the allocator saw of one tokenizer's life.
struct Footprint {
    /// Bytes the tokenizer held: what dropping it gave back.
    held: usize,
    /// Bytes still allocated after the drop that were not before `build` ran: leaks and caches
    /// kept outside the tokenizer.
    left: i64,
    /// The tokenizer's own estimate ([`Tokenizer::heap_bytes`]), for comparison only.
    estimate: usize,
}

/// Builds a tokenizer (from data `build` makes or reads itself), lets `check` use it, drops it,
/// and counts. Nothing that allocates on this thread may run in between (no printing: the test
/// harness captures output into a growing buffer).
fn footprint(build: impl FnOnce() -> Tokenizer, check: impl FnOnce(&Tokenizer)) -> Footprint {
    let start = live();
    let tok = build();
    check(&tok);
    let estimate = tok.heap_bytes();
    let before_drop = live();
    drop(tok);
    let after = live();
    Footprint {
        held: usize::try_from(before_drop - after).expect("dropping the tokenizer freed bytes"),
        left: after - start,
        estimate,
    }
}

/// Bytes that may stay allocated after a tokenizer is gone (none are expected; this is slack for
/// the standard library's lazily made per-thread state).
const LEFT_SLACK: i64 = 64 << 10;

fn report(what: &str, fp: &Footprint) {
    println!(
        "{what}: tokenizer held {:.2} MB by the allocator (own estimate {:.2} MB), {} bytes left after drop",
        fp.held as f64 / MB as f64,
        fp.estimate as f64 / MB as f64,
        fp.left
    );
    assert!(
        fp.left.abs() <= LEFT_SLACK,
        "{what}: {} bytes still allocated after the tokenizer was dropped",
        fp.left
    );
}

const MB: usize = 1 << 20;

/// A Gemma-3-sized SPM vocabulary: 262,144 tokens, ~6,000 control tokens, 256 byte tokens,
/// the rest word pieces with `▁` (about Gemma's 2.3 MB of text).
fn synthetic_spm() -> Vocab {
    let mut v = Vocab::new(ModelKind::Spm);
    let mut push = |t: String, score: f32, ty: i32| {
        v.tokens.push(t);
        v.scores.push(score);
        v.token_types.push(ty);
    };
    push("<pad>".into(), 0.0, token_type::CONTROL);
    push("<eos>".into(), 0.0, token_type::CONTROL);
    push("<bos>".into(), 0.0, token_type::CONTROL);
    push("<unk>".into(), 0.0, token_type::UNKNOWN);
    for i in 0..6_000 {
        push(format!("<unused{i}>"), 0.0, token_type::CONTROL);
    }
    for b in 0..=255u8 {
        push(format!("<0x{b:02X}>"), 0.0, token_type::BYTE);
    }
    for i in 0..262_144 - 4 - 6_000 - 256 {
        push(format!("▁w{i:x}"), -(i as f32), token_type::NORMAL);
    }
    v
}

/// A byte-level BPE vocabulary of 150,000 tokens and 150,000 merges (Qwen2/Llama 3 size).
fn synthetic_bpe() -> Vocab {
    let mut v = Vocab::new(ModelKind::Bpe);
    v.pre = Some("llama-bpe".into());
    for i in 0..150_000u32 {
        v.tokens.push(format!("Ġt{i:x}"));
        v.merges.push(format!("Ġt {i:x}"));
    }
    v
}

#[test]
fn spm_vocab_of_262k_tokens_stays_compact() {
    let fp = footprint(
        || Tokenizer::new(synthetic_spm()).unwrap(),
        |tok| {
            assert_eq!(tok.vocab_size(), 262_144);
            // It still works.
            let ids = tok.encode("<unused17>▁w1f", false, true).unwrap();
            assert_eq!(tok.token_text(ids[0]), Some("<unused17>"));
        },
    );
    report("synthetic SPM (262144 tokens, 2.2 MB of text)", &fp);
    // Texts + pieces + 4 arrays of u32/f32 per token + a hash table of u32 ids: about 11 MB.
    // One `String` per token per copy would cost over 14 MB for each copy alone.
    assert!(fp.held < 16 * MB, "tokenizer held {} bytes", fp.held);
}

#[test]
fn bpe_vocab_with_150k_merges_stays_compact() {
    let fp = footprint(
        || Tokenizer::new(synthetic_bpe()).unwrap(),
        |tok| assert_eq!(tok.vocab_size(), 150_000),
    );
    report("synthetic BPE (150000 tokens + 150000 merges)", &fp);
    // Two hash tables of u32, texts, pieces, merge halves, offsets, attributes and the
    // pre-tokenizer's compiled regexes: ~9 MB.
    assert!(fp.held < 12 * MB, "tokenizer held {} bytes", fp.held);
}

#[test]
fn gemma3_tokenizer_heap_is_small() {
    let path = synapse_testdata::model(synapse_testdata::DEFAULT_MODEL);
    if !synapse_testdata::require(&path, "the default model (Gemma 3 270M Q4_K_M)") {
        return;
    }
    let f = GgufFile::open(&path).unwrap();
    let fp = footprint(
        || Tokenizer::from_gguf(&f).unwrap(),
        |tok| assert_eq!(tok.vocab_size(), 262_144),
    );
    report("gemma3", &fp);
    assert!(fp.held < 16 * MB, "tokenizer held {} bytes", fp.held);
}
