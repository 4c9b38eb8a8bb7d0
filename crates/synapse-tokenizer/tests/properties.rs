//! Properties that hold for any input, on small hand-built vocabularies.

use proptest::prelude::*;
use synapse_tokenizer::{ModelKind, Tokenizer, Vocab, vocab::token_type};

/// An SPM vocabulary: specials, the 256 byte tokens and a few merged pieces with scores.
fn spm() -> Tokenizer {
    let mut v = Vocab::new(ModelKind::Spm);
    let mut push = |t: &str, score: f32, ty: i32| {
        v.tokens.push(t.to_string());
        v.scores.push(score);
        v.token_types.push(ty);
    };
    push("<unk>", 0.0, token_type::UNKNOWN);
    push("<s>", 0.0, token_type::CONTROL);
    push("</s>", 0.0, token_type::CONTROL);
    for b in 0..=255u8 {
        push(&format!("<0x{b:02X}>"), 0.0, token_type::BYTE);
    }
    for (i, p) in ["▁", "a", "b", "c", "ab", "bc", "abc", "▁a", "é", "▁é"]
        .iter()
        .enumerate()
    {
        push(p, -(i as f32), token_type::NORMAL);
    }
    v.add_space_prefix = Some(false);
    Tokenizer::new(v).unwrap()
}

proptest! {
    #[test]
    fn spm_round_trips_any_text(s in "\\PC{0,40}") {
        // U+2581 is SPM's own space marker: it decodes to a space by design.
        prop_assume!(!s.contains('\u{2581}'));
        let tok = spm();
        let ids = tok.encode(&s, false, false).unwrap();
        prop_assert_eq!(tok.decode(&ids).unwrap(), s);
    }

    #[test]
    fn streaming_decoder_equals_lossy_decode(ids in proptest::collection::vec(3u32..259, 0..40)) {
        // Arbitrary byte tokens: the stream may hold invalid and split UTF-8.
        let tok = spm();
        let mut d = tok.decoder();
        let mut out = String::new();
        let mut bytes = Vec::new();
        for &id in &ids {
            out.push_str(&d.push(id).unwrap());
            bytes.extend_from_slice(tok.token_to_piece(id, false).unwrap());
        }
        out.push_str(&d.flush());
        prop_assert_eq!(out, String::from_utf8_lossy(&bytes).into_owned());
    }
}

#[test]
fn spm_prefers_best_scoring_pair_not_viterbi() {
    // llama.cpp merges the best-scoring pair first: "abc" has "ab" (-4) and "bc" (-5);
    // "ab" wins, then "ab"+"c" = "abc" exists, so one token.
    let tok = spm();
    let ids = tok.encode("abc", false, false).unwrap();
    assert_eq!(ids.len(), 1);
    assert_eq!(tok.token_text(ids[0]), Some("abc"));
}

#[test]
fn control_tokens_only_parsed_when_asked() {
    let tok = spm();
    let plain = tok.encode("<s>", false, false).unwrap();
    assert!(plain.len() > 1, "control text must stay text: {plain:?}");
    assert_eq!(tok.encode("<s>", false, true).unwrap(), vec![1]);
    assert_eq!(
        tok.encode("a", true, false).unwrap()[0],
        1,
        "BOS added for SPM by default"
    );
}
