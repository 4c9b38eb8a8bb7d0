//! `synapse-cli generate --special` and `--chat --system`: how the prompt becomes token ids.
//!
//! `--special` parses control tokens written in a raw prompt (`<|im_start|>` is one id, not
//! seven pieces of text); `--system TEXT` puts a system message before the user turn when
//! `--chat` renders the prompt, with the GGUF's template (SmolLM2-135M-Instruct) or, for
//! Gemma's GGUF that has none, llama.cpp's built-in `gemma` format, which merges the system
//! text into the user turn. Every run is greedy and short; `--json` reports the prompt ids.
//!
//! Models: SmolLM2-135M-Instruct and the default Gemma 3 270M from the model cache
//! (`.ci/fetch-test-data`); absent, a test is skipped locally and fails when `CI` is set.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use synapse_formats::gguf::GgufFile;
use synapse_tokenizer::{ChatTemplate, Message, Tokenizer};

const BIN: &str = env!("CARGO_BIN_EXE_synapse-cli");

fn cli(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("SYNAPSE_STORE")
        .env_remove("SYNAPSE_MODEL")
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap()
}

/// What one `generate --json` run produced.
#[derive(Debug, PartialEq)]
struct Run {
    prompt_tokens: Vec<u32>,
    tokens: Vec<u32>,
    text: String,
}

/// `generate --json --temp 0 -n N` with `flags`.
fn generate(model: &Path, n: usize, flags: &[&str], prompt: &str) -> Run {
    let n = n.to_string();
    let model = model.to_str().unwrap();
    let mut args = vec![
        "generate", "--model", model, "--json", "--temp", "0", "-n", &n, "-t", "1",
    ];
    args.extend_from_slice(flags);
    args.push(prompt);
    let out = cli(&args);
    assert!(
        out.status.success(),
        "synapse-cli {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = String::from_utf8(out.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let ids = |k: &str| -> Vec<u32> {
        v[k].as_array()
            .unwrap_or_else(|| panic!("no `{k}` in {out}"))
            .iter()
            .map(|x| u32::try_from(x.as_u64().unwrap()).unwrap())
            .collect()
    };
    Run {
        prompt_tokens: ids("prompt_tokens"),
        tokens: ids("tokens"),
        text: v["text"].as_str().unwrap().to_string(),
    }
}

/// A published model (a name of `synapse_source::KNOWN_MODELS`) in the model cache. Absent:
/// skipped with a message locally, a failure when `CI` is set (`synapse_testdata::require`).
fn cached(name: &str) -> Option<PathBuf> {
    let path = synapse_testdata::model(name);
    synapse_testdata::require(&path, name).then_some(path)
}

fn tokenizer(model: &Path) -> Tokenizer {
    Tokenizer::from_gguf(&GgufFile::open(model).unwrap()).unwrap()
}

#[test]
fn special_parses_control_tokens_in_a_raw_prompt() {
    let Some(m) = cached("smollm2-135m-instruct") else {
        return;
    };
    let tok = tokenizer(&m);
    let im_start = tok.token_id("<|im_start|>").unwrap();
    let im_end = tok.token_id("<|im_end|>").unwrap();

    // `<|im_start|>` alone: one id with `--special`, several pieces of text without.
    let one = generate(&m, 1, &["--special"], "<|im_start|>");
    assert_eq!(one.prompt_tokens, [im_start], "{one:?}");
    let text = generate(&m, 1, &[], "<|im_start|>");
    assert!(text.prompt_tokens.len() > 1, "{text:?}");
    assert!(!text.prompt_tokens.contains(&im_start), "{text:?}");

    // A whole ChatML prompt typed raw: its control tokens become those ids, the rest is the
    // text's own tokenization, exactly as the tokenizer parses it with special tokens on.
    let raw = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    let special = generate(&m, 4, &["--special"], raw);
    assert_eq!(special.prompt_tokens, tok.encode(raw, true, true).unwrap());
    let count = |ids: &[u32], id: u32| ids.iter().filter(|&&t| t == id).count();
    assert_eq!(count(&special.prompt_tokens, im_start), 2, "{special:?}");
    assert_eq!(count(&special.prompt_tokens, im_end), 1, "{special:?}");
    // Without the flag nothing changes: the markers stay text.
    let plain = generate(&m, 4, &[], raw);
    assert_eq!(plain.prompt_tokens, tok.encode(raw, true, false).unwrap());
    assert_eq!(count(&plain.prompt_tokens, im_start), 0, "{plain:?}");
    assert_eq!(count(&plain.prompt_tokens, im_end), 0, "{plain:?}");
    assert!(plain.prompt_tokens.len() > special.prompt_tokens.len() + 10);
    eprintln!(
        "raw ChatML prompt: {} ids with --special, {} without",
        special.prompt_tokens.len(),
        plain.prompt_tokens.len()
    );
}

#[test]
fn chat_system_message_comes_before_the_user_turn() {
    let Some(m) = cached("smollm2-135m-instruct") else {
        return;
    };
    let tok = tokenizer(&m);
    let tpl = ChatTemplate::from_gguf(&GgufFile::open(&m).unwrap()).unwrap();
    let (system, user) = ("You are a pirate.", "Hi");

    let with = generate(&m, 6, &["--chat", "--system", system], user);
    let rendered = tpl
        .render(
            &[Message::new("system", system), Message::new("user", user)],
            true,
        )
        .unwrap();
    assert_eq!(
        rendered,
        "<|im_start|>system\nYou are a pirate.<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        with.prompt_tokens,
        tok.encode(&rendered, true, true).unwrap()
    );

    // `--chat` alone: the template's own default system message instead.
    let without = generate(&m, 6, &["--chat"], user);
    let default = tpl.render(&[Message::new("user", user)], true).unwrap();
    assert!(
        default.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"),
        "{default:?}"
    );
    assert_eq!(
        without.prompt_tokens,
        tok.encode(&default, true, true).unwrap()
    );
    assert_ne!(with.prompt_tokens, without.prompt_tokens);

    // The rendering typed raw with `--special`: the same ids, so the same greedy tokens.
    assert_eq!(generate(&m, 6, &["--special"], &rendered), with);
    eprintln!(
        "--chat --system: {} prompt ids -> {:?}; --chat: {} prompt ids -> {:?}",
        with.prompt_tokens.len(),
        with.text,
        without.prompt_tokens.len(),
        without.text
    );
}

/// The default Gemma GGUF has no chat template: `--chat` uses llama.cpp's built-in `gemma`
/// format, where a system message opens the user turn, followed by a blank line.
#[test]
fn gemma_builtin_format_merges_the_system_message_into_the_user_turn() {
    let Some(m) = cached("gemma-3-270m") else {
        return;
    };
    assert!(ChatTemplate::from_gguf(&GgufFile::open(&m).unwrap()).is_err());
    let tok = tokenizer(&m);
    let (system, user) = ("Answer in one line.", "Write a haiku about the sea.");
    let with = generate(&m, 4, &["--chat", "--system", system], user);
    let rendered =
        format!("<start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n<start_of_turn>model\n");
    assert_eq!(
        with.prompt_tokens,
        tok.encode(&rendered, true, true).unwrap()
    );
    assert_eq!(with.prompt_tokens[0], tok.bos().unwrap());
    assert_eq!(generate(&m, 4, &["--special"], &rendered), with);

    let without = generate(&m, 4, &["--chat"], user);
    let plain = format!("<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n");
    assert_eq!(
        without.prompt_tokens,
        tok.encode(&plain, true, true).unwrap()
    );
    assert!(with.prompt_tokens.len() > without.prompt_tokens.len());
}

#[test]
fn system_without_chat_is_a_usage_error() {
    let out = cli(&["generate", "--system", "Be brief.", "-n", "1", "Hi"]);
    assert!(!out.status.success());
    assert_eq!(out.status.code(), Some(2), "clap's usage-error status");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--chat"), "{err}");
    assert!(out.stdout.is_empty());
}
