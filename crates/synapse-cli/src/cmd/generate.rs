//! `synapse-cli generate`: load a model, tokenize a prompt, generate and stream the text.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args as ClapArgs;
use synapse_runtime::{Executor, GenerateParams, KvCache, KvDtype, SamplingParams, generate};
use synapse_tokenizer::{ChatTemplate, Message};

use super::load::load_model;

/// Arguments of `generate`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The prompt (read from stdin when absent).
    prompt: Option<String>,
    /// A GGUF file, a safetensors checkpoint directory, a Synapse package directory (made by
    /// `import --out`), a package hash (or unique prefix, at least 8 hex digits) in the
    /// store, or a published model's name (`smollm2-135m-instruct`,
    /// `qwen2.5-coder-0.5b-instruct`: fetched once) (default: Gemma 3 270M Q4_K_M from the
    /// model cache).
    #[arg(long, short = 'm', env = "SYNAPSE_MODEL")]
    model: Option<PathBuf>,
    /// The store package hashes are looked up in (default: `$SYNAPSE_STORE`, else
    /// `${XDG_DATA_HOME:-~/.local/share}/synapse/store`).
    #[arg(long)]
    store: Option<PathBuf>,
    /// Most tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 64)]
    n: usize,
    /// Temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    temp: f32,
    /// Top-k (0: off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Top-p (1: off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Min-p (0: off).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Repetition penalty (1: off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Presence penalty (0: off).
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    /// Frequency penalty (0: off).
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// RNG seed for sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Compute threads.
    #[arg(long, short = 't', default_value_t = 2)]
    threads: usize,
    /// Apply the model's chat template to the prompt (as one user turn); a Gemma model
    /// without one gets llama.cpp's built-in `gemma` format.
    #[arg(long)]
    chat: bool,
    /// Stop strings (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Context length (positions) of the session.
    #[arg(long, default_value_t = 4096)]
    ctx: usize,
    /// KV cache element type: f32 or f16.
    #[arg(long, default_value = "f32")]
    kv: String,
    /// Print one JSON object at the end instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Keep generating after an end-of-generation token (benchmarks: always `-n` tokens).
    #[arg(long)]
    ignore_eos: bool,
}

/// Runs `generate`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let kv_dtype = match args.kv.as_str() {
        "f32" => KvDtype::F32,
        "f16" => KvDtype::F16,
        other => bail!("--kv must be f32 or f16, not {other:?}"),
    };
    let prompt = match &args.prompt {
        Some(p) => p.clone(),
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            s
        }
    };

    let t_load = Instant::now();
    let (model, tok) = load_model(args.model.as_deref(), args.store.as_deref())?;
    let model = Arc::new(model);
    let load_s = t_load.elapsed().as_secs_f64();

    let text = if args.chat {
        match ChatTemplate::from_tokenizer(&tok) {
            Ok(tpl) => tpl.render(&[Message::new("user", prompt.clone())], true)?,
            // Gemma GGUFs often carry no template; llama.cpp then uses its built-in `gemma`
            // format, which is this for one user turn (no BOS: the tokenizer adds it).
            Err(_) if model.ir.family.name() == "gemma3" => format!(
                "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n",
                prompt.trim()
            ),
            Err(e) => return Err(e).context("chat template"),
        }
    } else {
        prompt.clone()
    };
    let mut ids = tok.encode(&text, true, args.chat)?;
    // A template that writes BOS itself plus the tokenizer's own BOS: keep one.
    if ids.len() >= 2 && Some(ids[0]) == tok.bos() && ids[1] == ids[0] {
        ids.remove(0);
    }
    if ids.is_empty() {
        bail!("the prompt tokenizes to nothing");
    }

    let chunk = 512.min(args.ctx);
    let mut kv = KvCache::new(&model, kv_dtype, 1, args.ctx, chunk)?;
    let mut exec = Executor::new(model.clone(), args.threads)?;
    let params = GenerateParams {
        max_tokens: args.n,
        sampling: SamplingParams {
            temperature: args.temp,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            repetition_penalty: args.repeat_penalty,
            presence_penalty: args.presence_penalty,
            frequency_penalty: args.frequency_penalty,
            seed: args.seed,
            ..SamplingParams::default()
        },
        stop: args.stop.clone(),
        prefill_chunk: chunk,
        stop_at_eog: !args.ignore_eos,
    };

    let mut dec = tok.decoder();
    let mut text_out = String::new();
    let stream = !args.json;
    let mut stdout = std::io::stdout().lock();
    if stream && std::io::stderr().is_terminal() {
        eprint!("{prompt}");
    }
    let mut piece = |id: u32| dec.push(id).unwrap_or_default();
    let mut on_text = |s: &str| {
        text_out.push_str(s);
        if stream {
            let _ = stdout.write_all(s.as_bytes());
            let _ = stdout.flush();
        }
    };
    let out = generate(
        &mut exec,
        &mut kv,
        0,
        &ids,
        &params,
        &mut piece,
        &mut on_text,
    )?;
    drop(stdout);
    let t = out.timings;
    if args.json {
        let j = serde_json::json!({
            "prompt_tokens": ids,
            "tokens": out.tokens,
            "text": text_out,
            "stop": format!("{:?}", out.stop),
            "timings": {
                "load_s": load_s,
                "prefill_tok_s": t.prefill_tok_s(),
                "decode_tok_s": t.decode_tok_s(),
                "prefill_tokens": t.prefill_tokens,
                "decode_tokens": t.decode_tokens,
            },
        });
        println!("{}", serde_json::to_string(&j)?);
    } else {
        println!();
        eprintln!(
            "[{} prompt tokens, {} generated, stop: {:?}; load {:.2} s, prefill {:.1} tok/s, \
             decode {:.1} tok/s, {} threads, kernels {}]",
            ids.len(),
            out.tokens.len(),
            out.stop,
            load_s,
            t.prefill_tok_s(),
            t.decode_tok_s(),
            args.threads,
            exec.kernel_path().name(),
        );
    }
    Ok(())
}
