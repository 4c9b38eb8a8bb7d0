//! The tokenizer's heap footprint for big vocabularies: deterministic byte counts (capacities),
//! not timings. The vocabulary must be held compactly (one text buffer, hash tables of ids),
//! not as several `String` copies per token: for Gemma 3's 262,144 tokens that was ~60 MB of
//! resident memory, more than the gap to llama.cpp's peak RSS.

use synapse_formats::gguf::GgufFile;
use synapse_tokenizer::{ModelKind, Tokenizer, Vocab, vocab::token_type};

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
    let v = synthetic_spm();
    let text_bytes: usize = v.tokens.iter().map(String::len).sum();
    let tok = Tokenizer::new(v).unwrap();
    assert_eq!(tok.vocab_size(), 262_144);
    let heap = tok.heap_bytes();
    println!(
        "synthetic SPM: {} tokens, {:.2} MB of text, tokenizer heap {:.2} MB",
        tok.vocab_size(),
        text_bytes as f64 / MB as f64,
        heap as f64 / MB as f64
    );
    // Texts + pieces + 4 arrays of u32/f32 per token + a hash table of u32 ids: about 12 MB.
    // One `String` per token per copy would cost over 14 MB for each copy alone.
    assert!(heap < 16 * MB, "tokenizer heap {heap} bytes");
    // It still works.
    let ids = tok.encode("<unused17>▁w1f", false, true).unwrap();
    assert_eq!(tok.token_text(ids[0]), Some("<unused17>"));
}

#[test]
fn bpe_vocab_with_150k_merges_stays_compact() {
    let tok = Tokenizer::new(synthetic_bpe()).unwrap();
    let heap = tok.heap_bytes();
    println!(
        "synthetic BPE: {} tokens + 150000 merges, tokenizer heap {:.2} MB",
        tok.vocab_size(),
        heap as f64 / MB as f64
    );
    // Two hash tables of u32, texts, pieces, merge halves, offsets and attributes: ~9 MB.
    assert!(heap < 12 * MB, "tokenizer heap {heap} bytes");
}

#[test]
fn gemma3_tokenizer_heap_is_small() {
    let path = synapse_testdata::model(synapse_testdata::DEFAULT_MODEL);
    if !synapse_testdata::require(&path, "the default model (Gemma 3 270M Q4_K_M)") {
        return;
    }
    let f = GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let heap = tok.heap_bytes();
    println!("gemma3: tokenizer heap {:.2} MB", heap as f64 / MB as f64);
    assert!(heap < 16 * MB, "tokenizer heap {heap} bytes");
}
