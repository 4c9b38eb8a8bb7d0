//! `synapse-cli generate --model PACKAGE`: a model imported into a Synapse package (a
//! directory made by `import --out`, or a hash or hash prefix in a store) generates exactly the
//! tokens its source file generates — same prompt tokens (the tokenizer is rebuilt from what
//! the package carries), same greedy and same seeded sampled tokens (the weights come from the
//! package's objects, tied heads through their alias).
//!
//! Models: a generated sharded, tied BF16 safetensors checkpoint; the tiny transformers-made
//! safetensors checkpoints and llama.cpp-converted GGUF files of `fixtures/tiny/`; and the
//! default real model (Gemma 3 270M Q4_K_M) when `.ci/fetch-test-data` has put it in the model
//! cache (required when `CI` is set).

#[path = "../../synapse-import/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_synapse-cli");

fn cli(args: &[&str], store: Option<&Path>) -> Output {
    let mut c = Command::new(BIN);
    c.args(args)
        .env_remove("SYNAPSE_STORE")
        .env_remove("SYNAPSE_MODEL")
        .env_remove("RUST_BACKTRACE");
    if let Some(s) = store {
        c.env("SYNAPSE_STORE", s);
    }
    c.output().unwrap()
}

fn ok(args: &[&str], store: Option<&Path>) -> String {
    let out = cli(args, store);
    assert!(
        out.status.success(),
        "synapse-cli {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// What one `generate --json` run produced.
#[derive(Debug, PartialEq)]
struct Run {
    prompt_tokens: Vec<u64>,
    tokens: Vec<u64>,
    text: String,
}

/// `generate --json -n N` with the given sampling flags; `store` becomes `$SYNAPSE_STORE`.
fn generate(model: &str, prompt: &str, n: usize, flags: &[&str], store: Option<&Path>) -> Run {
    let n = n.to_string();
    let mut args = vec!["generate", "--model", model, "--json", "-n", &n, "-t", "1"];
    args.extend_from_slice(flags);
    args.push(prompt);
    let out = ok(&args, store);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let ids = |k: &str| -> Vec<u64> {
        v[k].as_array()
            .unwrap_or_else(|| panic!("no `{k}` in {out}"))
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    Run {
        prompt_tokens: ids("prompt_tokens"),
        tokens: ids("tokens"),
        text: v["text"].as_str().unwrap().to_string(),
    }
}

const GREEDY: &[&str] = &["--temp", "0"];
const SAMPLED: &[&str] = &["--temp", "0.9", "--top-k", "40", "--seed", "7"];

/// Generates from `source` and from each package reference, greedy and sampled, and asserts
/// identical prompt tokens and generated tokens. Returns the greedy source run.
fn assert_same(source: &str, packages: &[(&str, Option<&Path>)], prompt: &str, n: usize) -> Run {
    let mut first = None;
    for flags in [GREEDY, SAMPLED] {
        let want = generate(source, prompt, n, flags, None);
        assert!(!want.prompt_tokens.is_empty() && !want.tokens.is_empty());
        for (pkg, store) in packages {
            let got = generate(pkg, prompt, n, flags, *store);
            assert_eq!(
                got, want,
                "{pkg} generates differently from {source} with {flags:?}"
            );
        }
        eprintln!(
            "{source} {flags:?}: prompt {:?} -> {:?}, same from {} package reference(s)",
            want.prompt_tokens,
            want.tokens,
            packages.len()
        );
        first.get_or_insert(want);
    }
    first.unwrap()
}

fn import_json(args: &[&str]) -> String {
    let v: serde_json::Value = serde_json::from_str(&ok(args, None)).unwrap();
    v["package"].as_str().unwrap().to_string()
}

/// A byte-level BPE `tokenizer.json` of exactly `n` entries (n ≥ 259): `<unk>`, `<s>`, `</s>`,
/// the 256 GPT-2 byte symbols, then merges of lowercase letter pairs (and `Ġ` + letter).
fn write_bpe_tokenizer(dir: &Path, n: usize) {
    assert!(n >= 259);
    // GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the rest to 256+.
    let mut byte_chars = Vec::with_capacity(256);
    let mut extra = 0u32;
    for b in 0u32..256 {
        let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
        if printable {
            byte_chars.push(char::from_u32(b).unwrap());
        } else {
            byte_chars.push(char::from_u32(256 + extra).unwrap());
            extra += 1;
        }
    }
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
        vocab.insert(t.to_string(), i.into());
    }
    for (i, c) in byte_chars.iter().enumerate() {
        vocab.insert(c.to_string(), (3 + i).into());
    }
    let space = byte_chars[b' ' as usize];
    let mut merges = Vec::new();
    let letters: Vec<char> = ('a'..='z').collect();
    'outer: for a in std::iter::once(space).chain(letters.iter().copied()) {
        for &b in &letters {
            if vocab.len() == n {
                break 'outer;
            }
            let merged = format!("{a}{b}");
            if !vocab.contains_key(&merged) {
                vocab.insert(merged, vocab.len().into());
                merges.push(format!("{a} {b}"));
            }
        }
    }
    assert_eq!(vocab.len(), n);
    let tokenizer = serde_json::json!({
        "version": "1.0",
        "added_tokens": [
            {"id": 0, "content": "<unk>", "special": true},
            {"id": 1, "content": "<s>", "special": true},
            {"id": 2, "content": "</s>", "special": true}
        ],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": merges}
    });
    std::fs::write(
        dir.join("tokenizer.json"),
        serde_json::to_vec_pretty(&tokenizer).unwrap(),
    )
    .unwrap();
}

fn tiny() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn sharded_tied_safetensors_package_generates_like_its_source() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let dims = common::Dims {
        vocab: 320,
        ..common::TINY
    };
    common::write_sharded_safetensors(&ck, dims);
    write_bpe_tokenizer(&ck, dims.vocab as usize);
    let pkg = tmp.path().join("pkg");
    let hash = import_json(&["import", p(&ck), "--out", p(&pkg), "--json"]);
    // The tied head is stored once, as an alias.
    let manifest = std::fs::read_to_string(pkg.join("manifest.toml")).unwrap();
    assert!(manifest.contains("lm_head.weight"), "{manifest}");

    let store = tmp.path().join("store");
    let hash2 = import_json(&["import", p(&ck), "--store", p(&store), "--json"]);
    assert_eq!(hash, hash2, "directory and store imports differ");
    let hex = hash.strip_prefix("blake3:").unwrap();
    let prefix = &hex[..12];
    let prompt = "the quick brown fox jumps over the lazy dog";
    let run = assert_same(
        p(&ck),
        &[
            (p(&pkg), None),
            (&hash, Some(&store)),
            (prefix, Some(&store)),
        ],
        prompt,
        16,
    );
    // Merged pairs, no unknown pieces: the tokenizer really ran.
    assert!(!run.prompt_tokens.contains(&0), "{run:?}");
    assert!(run.prompt_tokens.len() > 3 && run.prompt_tokens.len() < prompt.len());

    // The chat template (tokenizer_config.json) travels with the package too.
    let chat =
        |m: &str, s: Option<&Path>| generate(m, "hi there", 4, &["--temp", "0", "--chat"], s);
    let want = chat(p(&ck), None);
    assert_eq!(chat(p(&pkg), None), want);
    assert_eq!(chat(prefix, Some(&store)), want);
    // `<s>hi there</s>` with the template's BOS kept once, `</s>` parsed as special.
    assert_eq!(want.prompt_tokens.first(), Some(&1));
    assert_eq!(want.prompt_tokens.last(), Some(&2));
    assert_eq!(want.prompt_tokens.iter().filter(|&&t| t == 1).count(), 1);
}

#[test]
fn tiny_fixture_packages_generate_like_their_sources() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    for family in ["llama", "qwen2", "gemma3"] {
        // The transformers-made checkpoint (gemma3's head is tied: stored once, as an alias),
        // with a byte-level BPE tokenizer.json over its 512 ids (the fixture ships only
        // SentencePiece's tokenizer.model, which the tokenizer ring does not read).
        let ck = tmp.path().join(family);
        copy_dir(&tiny().join(family), &ck);
        write_bpe_tokenizer(&ck, 512);
        let pkg = tmp.path().join(format!("{family}-pkg"));
        ok(&["import", p(&ck), "--out", p(&pkg)], None);
        let hash = import_json(&["import", p(&ck), "--store", p(&store), "--json"]);
        let prefix = &hash["blake3:".len()..][..10];
        assert_same(
            p(&ck),
            &[(p(&pkg), None), (prefix, Some(&store))],
            "hello world, this is a test",
            16,
        );
        // llama.cpp's GGUF conversion of the same model: tokenizer and template from the
        // package's GGUF metadata.
        let gguf = tiny().join(family).join("model.q8_0.gguf");
        let gpkg = tmp.path().join(format!("{family}-gguf-pkg"));
        ok(&["import", p(&gguf), "--out", p(&gpkg)], None);
        assert_same(
            p(&gguf),
            &[(p(&gpkg), None)],
            "hello world, this is a test",
            16,
        );
    }
}

#[test]
fn unknown_and_ambiguous_package_hashes_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let dims = common::Dims {
        vocab: 320,
        ..common::TINY
    };
    common::write_sharded_safetensors(&ck, dims);
    write_bpe_tokenizer(&ck, dims.vocab as usize);
    let store = tmp.path().join("store");
    let hash = import_json(&["import", p(&ck), "--store", p(&store), "--json"]);
    let hex = &hash["blake3:".len()..];
    let err = |model: &str, store: Option<&Path>| {
        let out = cli(&["generate", "--model", model, "-n", "1", "hi"], store);
        assert!(!out.status.success(), "{model}: expected a failure");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // No store at all.
    let e = err(&hex[..12], Some(&tmp.path().join("nowhere")));
    assert!(
        e.contains("no package found") && e.contains("no store at"),
        "{e}"
    );
    // A hash no package has.
    let other = if hex.starts_with('0') { "1" } else { "0" }.repeat(12);
    let e = err(&other, Some(&store));
    assert!(
        e.contains("no package found") && e.contains("no such package"),
        "{e}"
    );
    // Too short to be a prefix, or not a path and not hex.
    let e = err(&hex[..4], Some(&store));
    assert!(e.contains("at least 8 hex digits"), "{e}");
    let e = err("no-such-model.gguf", Some(&store));
    assert!(e.contains("no such file or directory"), "{e}");
    // A second manifest sharing the first 8 digits: the 8-digit prefix is ambiguous, the full
    // hash still resolves (and, being that manifest, generates).
    let packages = store.join("packages");
    let twin = format!("{}{}", &hex[..8], "f".repeat(56));
    assert_ne!(twin, hex);
    std::fs::copy(
        packages.join(format!("{hex}.toml")),
        packages.join(format!("{twin}.toml")),
    )
    .unwrap();
    let e = err(&hex[..8], Some(&store));
    assert!(e.contains("matches 2 packages"), "{e}");
    ok(
        &[
            "generate",
            "--model",
            hex,
            "-n",
            "1",
            "--store",
            p(&store),
            "hi",
        ],
        None,
    );
}

/// The default real model where `synapse-cli generate` looks for it. Absent: skipped with a
/// message locally, a failure when `CI` is set (`synapse_testdata::require`).
fn default_model() -> Option<PathBuf> {
    let path = synapse_testdata::model(synapse_testdata::DEFAULT_MODEL);
    synapse_testdata::require(&path, "the default model (Gemma 3 270M Q4_K_M)").then_some(path)
}

#[test]
fn default_model_package_generates_like_the_gguf() {
    let Some(src) = default_model() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let pkg = tmp.path().join("pkg");
    ok(&["import", p(&src), "--out", p(&pkg)], None);
    let run = assert_same(p(&src), &[(p(&pkg), None)], "The capital of France is", 16);
    // Gemma's BOS, and a real continuation (not an immediate end of generation).
    assert_eq!(run.prompt_tokens[0], 2);
    assert_eq!(run.tokens.len(), 16, "{run:?}");
}

/// `--chat` on the default model, whose GGUF has no chat template: llama.cpp's built-in
/// `gemma` format, so the prompt ids and greedy tokens equal llama.cpp's for the parity
/// fixture's chat prompt.
#[test]
fn chat_on_the_default_model_matches_llama_cpp() {
    let Some(src) = default_model() else {
        return;
    };
    let fx =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/parity/gemma3-270m-q4_k_m.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fx).unwrap()).unwrap();
    let p = doc["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "chat_gemma")
        .unwrap();
    // The user turn of `chat_gemma` in xtask/py/parity_fixtures.py's PROMPTS; the fixture
    // keeps the rendered text, which must be llama.cpp's `gemma` format of it.
    let user = "Write a haiku about the sea.";
    assert_eq!(
        p["text"].as_str().unwrap(),
        format!("<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n")
    );
    let want = |k: &str| -> Vec<u64> {
        p[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    let run = generate(p_str(&src), user, 8, &["--temp", "0", "--chat"], None);
    assert_eq!(run.prompt_tokens, want("prompt_ids"));
    assert_eq!(run.tokens, want("greedy_ids")[..8].to_vec());
}

fn p_str(path: &Path) -> &str {
    path.to_str().unwrap()
}
