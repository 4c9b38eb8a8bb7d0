//! Tokenizing a 100 KB text with the real Gemma 3 vocabulary (262,144 tokens).
//!
//! The model is looked up where `synapse-source` keeps it (`synapse_testdata::model`:
//! `$SYNAPSE_MODEL_DIR`, else `$XDG_CACHE_HOME/synapse/models`, else `~/.cache/synapse/models`);
//! without it the bench prints why and does nothing (also under `CI`).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use std::path::PathBuf;
use synapse_formats::gguf::GgufFile;
use synapse_tokenizer::Tokenizer;

fn model_path() -> PathBuf {
    synapse_testdata::model(synapse_testdata::DEFAULT_MODEL)
}

/// ~100 KB of mixed text: prose, code, numbers, multilingual snippets and whitespace runs.
fn corpus() -> String {
    let parts = [
        "The quick brown fox jumps over the lazy dog. ",
        "fn main() {\n    let x: Vec<u32> = (0..10).map(|i| i * 2).collect();\n    println!(\"{x:?}\");\n}\n",
        "Le cœur a ses raisons que la raison ne connaît point. ",
        "日本語のテキストも少し含めます。",
        "Числа: 3.14159, 2.71828, 1e-9; ",
        "    indented   text\twith\ttabs\n\n",
        "emoji 🦀🚀 and accents: naïve café résumé. ",
    ];
    let mut s = String::new();
    let mut i = 0usize;
    while s.len() < 100 * 1024 {
        s.push_str(parts[i % parts.len()]);
        s.push_str(&i.to_string());
        i += 1;
    }
    s
}

fn bench(c: &mut Criterion) {
    let path = model_path();
    if !path.exists() {
        eprintln!(
            "skipping: {} not found (run .ci/fetch-test-data or set SYNAPSE_MODEL_DIR)",
            path.display()
        );
        return;
    }
    let f = GgufFile::open(&path).expect("open model");
    let tok = Tokenizer::from_gguf(&f).expect("tokenizer");
    let text = corpus();
    let mut g = c.benchmark_group("gemma3");
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.sample_size(10);
    g.bench_function("encode_100KB", |b| {
        b.iter(|| tok.encode(black_box(&text), true, false).unwrap())
    });
    g.bench_function("encode_100KB_parse_special", |b| {
        b.iter(|| tok.encode(black_box(&text), true, true).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
