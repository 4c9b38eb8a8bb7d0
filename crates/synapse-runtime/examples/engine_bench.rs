//! Aggregate decode throughput of the continuous-batching engine at several stream counts.
//!
//! Usage: `engine_bench MODEL.gguf [STREAMS,..] [N_GEN] [THREADS] [PROMPT_TOKENS]`
//!
//! For each stream count S: a scheduler with S slots, S sessions with distinct prompts of
//! PROMPT_TOKENS tokens each (greedy, no end-of-generation stop), stepped until every session
//! has produced N_GEN tokens. Decode is timed from the first step in which every session is
//! decoding to the end: aggregate tok/s = S × (N_GEN − 1) / that time. One JSON line per S.
//!
//! `ENGINE_BENCH_DRAFT=uniform:ENCODING` (exact escalation): the engine gets that draft
//! profile, every session opts in, and the prompts are real text (the model's tokenizer; set
//! it for the plain runs it is compared with too: `ENGINE_BENCH_DRAFT=none`).
//! `ENGINE_BENCH_DRAFT=head:N`: a head-only draft instead (`EngineConfig::head_draft`: the
//! `N` lowest ids and the vocabulary's pieces of at most two ASCII bytes).
//! `ENGINE_BENCH_DRAFT_K` (default 8) and `ENGINE_BENCH_FIXED_K=1` set the drafting.
//! The weights are read into memory as `serve` reads them (`Model::load_resident`);
//! `SYNAPSE_MMAP=1` borrows them from the file's mapping instead.
//! Each line carries `tokens_fnv`, a hash of every session's tokens in order, so runs with
//! and without a draft can be checked for identical output.

use std::sync::Arc;
use std::time::Instant;

use synapse_runtime::Model;
use synapse_runtime::engine::{EngineConfig, Event, Request, Scheduler, TokenPieces};

struct NoText;
impl TokenPieces for NoText {
    fn piece(&self, _: u32) -> Vec<u8> {
        Vec::new()
    }
    fn piece_into(&self, _: u32, _: &mut Vec<u8>) {}
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let model_path = args
        .get(1)
        .ok_or_else(|| anyhow::anyhow!("usage: engine_bench MODEL"))?;
    let streams: Vec<usize> = args
        .get(2)
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 4, 8, 16]);
    let n_gen: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(128);
    let threads: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(2);
    let prompt_len: usize = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(16);
    let path = std::path::Path::new(model_path);
    let model = Arc::new(if std::env::var("SYNAPSE_MMAP").is_ok_and(|v| v == "1") {
        Model::load(path)?
    } else {
        Model::load_resident(path)?
    });
    let vocab = model.vocab() as u32;
    let draft_spec = std::env::var("ENGINE_BENCH_DRAFT").ok();
    let head_n: Option<usize> = draft_spec
        .as_deref()
        .and_then(|d| d.strip_prefix("head:"))
        .map(|n| n.parse())
        .transpose()?;
    let draft = match draft_spec.as_deref() {
        None | Some("none") => None,
        Some(_) if head_n.is_some() => None,
        Some(spec) => {
            let p = synapse_runtime::precision::Precision::parse_profile(spec)?;
            Some(synapse_runtime::precision::apply(&model, &p, None)?.model)
        }
    };
    let draft_k: usize = std::env::var("ENGINE_BENCH_DRAFT_K")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let fixed_k = std::env::var("ENGINE_BENCH_FIXED_K").is_ok_and(|v| v == "1");
    // Real text prompts for drafting runs (and the plain runs they are compared with).
    let texts = draft_spec.is_some().then(|| {
        let f = synapse_formats::gguf::GgufFile::open(std::path::Path::new(model_path))?;
        let tok = synapse_tokenizer::Tokenizer::from_gguf(&f)?;
        anyhow::Ok(tok)
    });
    let tok = texts.transpose()?;
    let head_draft = match (head_n, &tok) {
        (Some(n), Some(t)) => {
            let mut ids: Vec<u32> = (0..(n as u32).min(vocab)).collect();
            ids.extend(t.short_ascii_pieces(2));
            Some(ids)
        }
        _ => None,
    };
    let escalate = draft.is_some() || head_draft.is_some();
    const TEXTS: [&str; 4] = [
        "Once upon a time, in a small village at the edge of a great forest, there lived",
        "def quicksort(items):\n    \"\"\"Sort a list of numbers.\"\"\"\n",
        "The history of the printing press begins",
        "Photosynthesis is the process by which plants",
    ];
    for &s in &streams {
        let cfg = EngineConfig {
            slots: s,
            ctx: if tok.is_some() { 64 } else { prompt_len } + n_gen + 8,
            ubatch: 512,
            step_tokens: 512.max(s + 1),
            queue: s,
            threads,
            draft: draft.clone(),
            head_draft: head_draft.clone(),
            draft_k,
            draft_adaptive: !fixed_k,
            ..EngineConfig::default()
        };
        let mut sched = Scheduler::new(model.clone(), Arc::new(NoText), cfg)?;
        let mut sessions: Vec<_> = (0..s)
            .map(|i| {
                // Distinct prompts: BOS then a deterministic spread of ordinary ids.
                let prompt: Vec<u32> = std::iter::once(2)
                    .chain((1..prompt_len).map(|k| {
                        let spread = (i * 7919 + k * 104_729) as u32;
                        if vocab > 4000 {
                            1000 + spread % (vocab - 2000)
                        } else {
                            // Small vocabularies (the synthetic MoE's 512 pieces).
                            3 + spread % (vocab - 3)
                        }
                    }))
                    .collect();
                let prompt = match &tok {
                    Some(t) => t
                        .encode(
                            &format!("{} {}", i + 1, TEXTS[i % TEXTS.len()]),
                            true,
                            false,
                        )
                        .unwrap_or(prompt),
                    None => prompt,
                };
                let mut r = Request::greedy(prompt, n_gen);
                r.stop_at_eog = false;
                r.escalation = escalate;
                sched.submit(r)
            })
            .collect::<Result<_, _>>()?;
        let t0 = Instant::now();
        let mut produced = vec![0usize; s];
        let mut ids: Vec<Vec<u32>> = vec![Vec::new(); s];
        let mut t_decode: Option<Instant> = None;
        let mut steps_decode = 0usize;
        while sched.step() {
            for (i, ss) in sessions.iter_mut().enumerate() {
                while let Some(e) = ss.try_next() {
                    if let Event::Token(t) = e {
                        produced[i] += 1;
                        ids[i].push(t.id);
                    }
                }
            }
            if t_decode.is_none() && produced.iter().all(|&p| p >= 1) {
                t_decode = Some(Instant::now());
            } else if t_decode.is_some() {
                steps_decode += 1;
            }
        }
        let total = t0.elapsed().as_secs_f64();
        // FNV-1a over every session's tokens in order.
        let mut fnv = 0xcbf2_9ce4_8422_2325u64;
        for t in ids.iter().flatten() {
            for b in t.to_le_bytes() {
                fnv = (fnv ^ b as u64).wrapping_mul(0x0100_0000_01b3);
            }
        }
        let dt = t_decode.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let decoded: usize = produced.iter().map(|&p| p.saturating_sub(1)).sum();
        println!(
            "{}",
            serde_json::json!({
                "streams": s,
                "n_gen": n_gen,
                "prompt_tokens": prompt_len,
                "threads": threads,
                "decode_steps": steps_decode,
                "decode_s": dt,
                "aggregate_decode_tok_s": decoded as f64 / dt,
                "per_stream_tok_s": decoded as f64 / dt / s as f64,
                "total_s": total,
                "drafted": sched.stats().drafted,
                "draft_accepted": sched.stats().draft_accepted,
                "tokens_fnv": format!("{fnv:016x}"),
            })
        );
    }
    Ok(())
}
