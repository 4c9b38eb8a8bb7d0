//! `synapse-cli generate`: load a model, tokenize a prompt, generate and stream the text.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use synapse_server::metrics::proc_status_bytes;

use anyhow::{Context, bail};
use clap::Args as ClapArgs;
use synapse_runtime::escalation::{DraftParams, generate_exact};
use synapse_runtime::head_draft::{Shortlist, generate_head_draft};
use synapse_runtime::residency::LayerPager;
use synapse_runtime::selective::{SelectiveParams, generate_selective, generate_selective_head};
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
    /// Apply the model's chat template to the prompt (as one user turn, after the `--system`
    /// message if given); a Gemma model without one gets llama.cpp's built-in `gemma` format.
    #[arg(long)]
    chat: bool,
    /// A system message before the user turn (with `--chat`). The built-in `gemma` format has
    /// no system turn: as in llama.cpp, the text opens the user turn, then a blank line.
    #[arg(long, requires = "chat", value_name = "TEXT")]
    system: Option<String>,
    /// Parse control tokens written in the prompt (`<|im_start|>`, `<start_of_turn>`) as their
    /// ids instead of tokenizing them as plain text (`--chat` always does).
    #[arg(long)]
    special: bool,
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
    #[command(flatten)]
    precision: super::load::PrecisionArgs,
    /// `exact`: a low-precision draft proposes tokens and the model's own precision verifies
    /// them in one pass per round — greedy output is token for token plain greedy decoding's;
    /// with `--temp` > 0, speculative sampling (each token distributed exactly as the model's
    /// own sampler draws it, reproducible from `--seed`, not plain sampling's sequence).
    /// `selective` (opt-in, approximate): the draft decodes alone and the steps whose top-1 /
    /// top-2 logit margin is below `--margin` (or whose entropy is above `--max-entropy`) are
    /// recomputed at the model's precision; with `--draft-profile head:N` the body runs at the
    /// model's precision and only the head is the shortlist's, so a recomputed step is one
    /// full-head call.
    #[arg(long, value_enum, default_value_t = Escalation::Off)]
    escalation: Escalation,
    #[command(flatten)]
    draft: super::load::DraftArgs,
    /// With `--escalation selective`: the draft-logit margin below which a step escalates
    /// (`inf`: every step — the model's own output; 0: none — the draft's).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    margin: f32,
    /// With `--escalation selective`: the entropy (nats) of the draft's distribution above
    /// which a step escalates (`inf`, the default: the entropy never fires).
    #[arg(long, default_value_t = f32::INFINITY, allow_negative_numbers = true)]
    max_entropy: f32,
    /// Memory budget (`2G`, `512M`, bytes) over everything generation holds beyond the
    /// process's start: what loading left resident (tokenizer, metadata), the weights, the KV
    /// cache for `--ctx`, and compute scratch. A mixture of experts keeps its routed experts
    /// within what remains (paged in and out as tokens route to them; the same tokens); a
    /// budget that cannot run the model is an error before generation.
    #[arg(long)]
    memory: Option<String>,
    /// Borrow the weights from the model file's mapping (pages read in as they are first
    /// used) instead of reading them into memory at load. Without `--memory` and in the
    /// source precision a GGUF's weights are read into the process's memory, on huge pages
    /// where the system allows; with `--memory`, `--budget` or `--profile` they are always
    /// borrowed.
    #[arg(long)]
    mmap: bool,
}

/// Precision escalation modes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Escalation {
    /// Plain decoding at the model's precision.
    Off,
    /// Drafts verified by the model's precision: its exact greedy tokens.
    Exact,
    /// The draft alone, uncertain steps recomputed at the model's precision (approximate).
    Selective,
}

/// Runs `generate`.
pub fn run(mut args: Args) -> anyhow::Result<()> {
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

    let memory = args
        .memory
        .as_deref()
        .map(super::serve::parse_bytes)
        .transpose()?;
    if memory.is_some() && args.escalation != Escalation::Off && !args.draft.is_head() {
        bail!(
            "--memory with --escalation takes a head-only draft (--draft-profile head:N) only \
             (another draft profile's weights, and the measuring of auto, would sit outside the budget)"
        );
    }
    let baseline_rss = proc_status_bytes("VmRSS:");
    let t_load = Instant::now();
    // Without a memory budget, in the source precision, the weights are read into memory
    // (`--mmap` borrows them from the file's mapping instead).
    let resident = memory.is_none() && args.precision.is_source() && !args.mmap;
    let (model, tok) = load_model(args.model.as_deref(), args.store.as_deref(), resident)?;
    let source = Arc::new(model);
    let source_bytes = source.weight_bytes();
    // `--budget fit`: the KV cache and scratch do not depend on the precision (the source's
    // shapes).
    args.precision = args.precision.fit_into(memory, || {
        let chunk = 512.min(args.ctx);
        let kv = KvCache::new(&source, kv_dtype, 1, args.ctx, chunk)?.slot_bytes() as u64;
        let scratch = source.pass_scratch_bytes(chunk, 1, args.ctx, args.threads);
        Ok(proc_status_bytes("VmRSS:").saturating_sub(baseline_rss) + kv + scratch)
    })?;
    let prepared = args
        .precision
        .apply(&source, args.model.as_deref(), args.store.as_deref())?;
    let model = prepared.applied.model.clone();
    if args.escalation == Escalation::Off && args.draft.given() {
        bail!("--draft-profile and --draft-budget need --escalation exact or selective");
    }
    let mut head = args.draft.head_shortlist()?;
    if head.is_some() && args.escalation == Escalation::Off {
        bail!("a head-only draft (--draft-profile head:N) is for --escalation exact or selective");
    }
    let selective = SelectiveParams {
        margin: args.margin,
        max_entropy: args.max_entropy,
    };
    if args.escalation == Escalation::Selective {
        selective.check()?;
    }
    // Exact escalation without a draft flag chooses its draft by measurement (below, on the
    // prompt); selective escalation takes the default draft.
    let auto = args.escalation == Escalation::Exact
        && head.is_none()
        && (!args.draft.given() || args.draft.auto());
    if args.escalation == Escalation::Selective && args.draft.auto() {
        bail!(
            "--draft-profile auto is for --escalation exact (selective escalation's output depends on its draft)"
        );
    }
    let mut draft = match args.escalation {
        Escalation::Exact | Escalation::Selective if !auto && head.is_none() => {
            Some(args.draft.apply(
                &model,
                &args.precision,
                args.model.as_deref(),
                args.store.as_deref(),
                super::load::DEFAULT_DRAFT_PROFILE,
            )?)
        }
        _ => None,
    };
    let mut load_s = t_load.elapsed().as_secs_f64();

    let text = if args.chat {
        let mut messages = Vec::with_capacity(2);
        if let Some(system) = &args.system {
            messages.push(Message::new("system", system.clone()));
        }
        messages.push(Message::new("user", prompt.clone()));
        match ChatTemplate::from_tokenizer(&tok) {
            Ok(tpl) => tpl.render(&messages, true)?,
            // Gemma GGUFs often carry no template; llama.cpp then uses its built-in `gemma`
            // format.
            Err(_) if model.ir.family.name() == "gemma3" => {
                gemma_builtin(args.system.as_deref(), &prompt)
            }
            Err(e) => return Err(e).context("chat template"),
        }
    } else {
        prompt.clone()
    };
    let mut ids = tok.encode(&text, true, args.chat || args.special)?;
    // A template that writes BOS itself plus the tokenizer's own BOS: keep one.
    if ids.len() >= 2 && Some(ids[0]) == tok.bos() && ids[1] == ids[0] {
        ids.remove(0);
    }
    if ids.is_empty() {
        bail!("the prompt tokenizes to nothing");
    }

    let mut exec = Executor::new(model.clone(), args.threads)?;
    let mut auto_report = None;
    if auto {
        let a = args.draft.choose_auto(
            &model,
            &args.precision,
            args.model.as_deref(),
            args.store.as_deref(),
            &mut exec,
            kv_dtype,
            &ids,
            Some(&super::load::shortlist_extra(&tok, &ids)),
        )?;
        draft = a.chosen.map(|c| c.1);
        head = head.or(a.head);
        auto_report = Some(a.report);
    }
    drop(source);
    let chunk = 512.min(args.ctx);
    let slots = if draft.is_some() { 2 } else { 1 };
    let mut kv = KvCache::new(&model, kv_dtype, slots, args.ctx, chunk)?;
    // A head-only draft's shortlist, gathered before the budget is checked (it counts).
    let mut shortlist = match head {
        Some(size) => {
            let extra = super::load::shortlist_extra(&tok, &ids);
            Some(Shortlist::lowest_ids(&model, size, &extra)?)
        }
        None => None,
    };
    let ledger = match memory {
        Some(budget) => Some(budget_memory(
            budget,
            baseline_rss,
            &model,
            (kv.slot_bytes() * slots) as u64,
            shortlist
                .as_ref()
                .map_or(0, |s| s.bytes_bound(&model, args.n)),
            chunk,
            args.ctx,
            args.threads,
            &mut exec,
        )?),
        None => None,
    };
    // The cache committed before the prompt (as the engine does at start), after the
    // ledger read the process's memory (which counts the cache by its size), and counted in
    // the load time, not in the prefill's.
    let t_kv = Instant::now();
    kv.commit_slots();
    load_s += t_kv.elapsed().as_secs_f64();
    // `SYNAPSE_PREFETCH=off`: a pager reads each miss only when it is needed (no router
    // lookahead, no reads advised ahead; for `bench-moe-paging --prefetch off`).
    if std::env::var("SYNAPSE_PREFETCH").is_ok_and(|v| v == "off") {
        if let Some(p) = exec.expert_pager_mut() {
            p.set_prefetch(false);
        }
        if let Some(p) = exec.layer_pager_mut() {
            p.set_prefetch(false);
        }
    }
    // `SYNAPSE_EXPERT_ADMISSION=off`: every expert miss is copied in over the LRU-2 victim
    // (no frequency filter, no run from the mapping; for `bench-moe-paging --admission`).
    if std::env::var("SYNAPSE_EXPERT_ADMISSION").is_ok_and(|v| v == "off")
        && let Some(p) = exec.expert_pager_mut()
    {
        p.set_admission(false);
    }
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
    // Time to the first generated token, from the start of generation (after loading).
    let t_gen = Instant::now();
    let mut first_token_s: Option<f64> = None;
    let mut piece = |id: u32| {
        first_token_s.get_or_insert_with(|| t_gen.elapsed().as_secs_f64());
        dec.push(id).unwrap_or_default()
    };
    let mut on_text = |s: &str| {
        text_out.push_str(s);
        if stream {
            let _ = stdout.write_all(s.as_bytes());
            let _ = stdout.flush();
        }
    };
    let mut sel = None;
    let mut head_stats = None;
    let (out, esc) = match &draft {
        None if args.escalation == Escalation::Selective
            && let (Some(size), Some(shortlist)) = (head, shortlist.as_mut()) =>
        {
            let (g, st) = generate_selective_head(
                &mut exec,
                &mut kv,
                0,
                &ids,
                &params,
                &selective,
                shortlist,
                &mut piece,
                &mut on_text,
            )?;
            sel = Some((
                format!("head:{size}"),
                shortlist.bytes(),
                shortlist.len(),
                st,
            ));
            (g, None)
        }
        None if let (Some(size), Some(shortlist)) = (head, shortlist.as_mut()) => {
            let dp = DraftParams {
                max_k: args.draft.draft_k,
                adaptive: !args.draft.fixed_k,
            };
            let (g, st) = generate_head_draft(
                &mut exec,
                &mut kv,
                0,
                &ids,
                &params,
                &dp,
                shortlist,
                &mut piece,
                &mut on_text,
            )?;
            head_stats = Some((size, st));
            (g, Some(st.escalation))
        }
        None => (
            generate(
                &mut exec,
                &mut kv,
                0,
                &ids,
                &params,
                &mut piece,
                &mut on_text,
            )?,
            None,
        ),
        Some(d) if args.escalation == Escalation::Selective => {
            // The draft borrows the source's thread pool while it runs.
            let mut dexec = Executor::new(d.applied.model.clone(), 1)?;
            let (g, st) = generate_selective(
                &mut exec,
                &mut dexec,
                &mut kv,
                0,
                1,
                &ids,
                &params,
                &selective,
                &mut piece,
                &mut on_text,
            )?;
            sel = Some((
                d.applied.model.profile.hash(),
                d.applied.model.weight_bytes() as u64,
                0,
                st,
            ));
            (g, None)
        }
        Some(d) => {
            // The draft borrows the verifier's thread pool while it runs.
            let mut dexec = Executor::new(d.applied.model.clone(), 1)?;
            let dp = DraftParams {
                max_k: args.draft.draft_k,
                adaptive: !args.draft.fixed_k,
            };
            let (g, st) = generate_exact(
                &mut exec,
                &mut dexec,
                &mut kv,
                0,
                1,
                &ids,
                &params,
                &dp,
                &mut piece,
                &mut on_text,
            )?;
            (g, Some(st))
        }
    };
    drop(stdout);
    let t = out.timings;
    if args.json {
        let j = serde_json::json!({
            "prompt_tokens": ids,
            "tokens": out.tokens,
            "text": text_out,
            "stop": format!("{:?}", out.stop),
            "weight_bytes": model.weight_bytes(),
            "source_weight_bytes": source_bytes,
            "profile": model.profile.hash(),
            "variants": prepared.json(),
            "decode_read_bytes": model.decode_read_bytes(),
            "kv_read_bytes_mid": model.kv_read_bytes_f32(ids.len() + out.tokens.len() / 2),
            "memory": ledger.map(|l| {
                let paging = exec
                    .paging_stats()
                    .or(exec.layer_pager().map(|p| p.stats()));
                serde_json::json!({
                    "budget": l.budget,
                    "loaded": l.loaded,
                    "weights_outside_experts": l.outside,
                    "kv": l.kv,
                    "scratch": l.scratch,
                    "draft": l.draft,
                    "experts_total": l.experts_total,
                    "experts_budget": l.experts_budget,
                    "experts_resident": exec.expert_pager().map(|p| p.resident_bytes()),
                    "experts_held": exec.expert_pager().map(|p| p.held_bytes()),
                    "layers_total": l.layers_total,
                    "layers_budget": l.layers_budget,
                    "layers_held": exec.layer_pager().map(|p| p.held_bytes()),
                    "layers_kept": exec.layer_pager().map(|p| p.kept_blocks()),
                    "layers_stream": exec.layer_pager().map(|p| format!("{:?}", p.stream())),
                    "paging": paging.map(|p| serde_json::json!({
                        "hits": p.hits,
                        "misses": p.misses,
                        "evictions": p.evictions,
                        "bytes_in": p.bytes_in,
                        "hit_rate": p.hit_rate(),
                        "prefetches": p.prefetches,
                        "prefetched_misses": p.prefetched_misses,
                        "predicted": p.predicted,
                        "predicted_used": p.predicted_used,
                        "bypassed": p.bypassed,
                    })),
                    "baseline_rss": baseline_rss,
                    "peak_rss": proc_status_bytes("VmHWM:"),
                })
            }),
            "timings": {
                "load_s": load_s,
                "first_token_s": first_token_s,
                "prefill_tok_s": t.prefill_tok_s(),
                "decode_tok_s": t.decode_tok_s(),
                "prefill_tokens": t.prefill_tokens,
                "decode_tokens": t.decode_tokens,
            },
        });
        let mut j = j;
        if let Some((size, hs)) = &head_stats {
            let st = &hs.escalation;
            let mut e = exact_json(&args.draft, st);
            e["draft_profile"] = format!("head:{size}").into();
            e["shortlist_initial"] = (*size).into();
            e["shortlist"] = hs.shortlist.into();
            e["off_shortlist"] = hs.misses.into();
            j["escalation"] = e;
        }
        if let (Some(st), Some(d)) = (&esc, &draft) {
            let mut e = exact_json(&args.draft, st);
            e["draft_profile"] = d.applied.model.profile.hash().into();
            e["draft_weight_bytes"] = d.applied.model.weight_bytes().into();
            e["draft_variants"] = d.json();
            j["escalation"] = e;
        }
        if args.escalation == Escalation::Exact && esc.is_none() && head.is_none() {
            // `auto` found no draft that pays: plain decoding, which is the exact output.
            j["escalation"] = serde_json::json!({
                "mode": "exact",
                "draft_profile": null,
                "drafted": 0,
                "accepted": 0,
                "acceptance": 0.0,
            });
        }
        if let Some(r) = auto_report {
            j["escalation"]["auto"] = r;
        }
        if let Some((profile, bytes, list, st)) = &sel {
            j["escalation"] = serde_json::json!({
                "mode": "selective",
                "approximate": true,
                "margin": args.margin,
                "max_entropy": if args.max_entropy.is_finite() {
                    serde_json::Value::from(args.max_entropy)
                } else {
                    serde_json::Value::Null
                },
                "draft_profile": profile,
                "draft_weight_bytes": bytes,
                "steps": st.steps,
                "escalated": st.escalated,
                "source_rows": st.source_rows,
                "draft_s": st.draft_s,
                "source_s": st.source_s,
            });
            if head.is_some() {
                j["escalation"]["shortlist"] = (*list).into();
                j["escalation"]["off_shortlist"] = st.off_shortlist.into();
            }
        }
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
        if args.escalation == Escalation::Exact && esc.is_none() {
            eprintln!("[exact escalation: no draft pays on this machine; decoded plainly]");
        }
        if let Some(st) = &esc {
            eprintln!(
                "[exact escalation: {} of {} drafts accepted ({:.0}%), {} rounds, {} without drafts]",
                st.accepted,
                st.drafted,
                100.0 * st.acceptance(),
                st.rounds,
                st.plain_rounds,
            );
        }
        if let Some((_, _, _, st)) = &sel {
            eprintln!(
                "[selective escalation (approximate output): {} of {} steps recomputed at the \
                 model's precision]",
                st.escalated, st.steps,
            );
        }
    }
    Ok(())
}

/// llama.cpp's built-in `gemma` chat format (`llm_chat_apply_template`, `LLM_CHAT_TEMPLATE_GEMMA`)
/// for an optional system message and one user turn, with the generation prompt. No BOS: the
/// tokenizer adds it. Gemma has no system role, so a system text (trimmed; nothing when that
/// leaves it empty) opens the user turn, followed by a blank line.
fn gemma_builtin(system: Option<&str>, user: &str) -> String {
    let mut s = String::from("<start_of_turn>user\n");
    if let Some(sys) = system.map(str::trim).filter(|s| !s.is_empty()) {
        s.push_str(sys);
        s.push_str("\n\n");
    }
    s.push_str(user.trim());
    s.push_str("<end_of_turn>\n<start_of_turn>model\n");
    s
}

#[cfg(test)]
mod tests {
    use super::gemma_builtin;

    #[test]
    fn gemma_builtin_merges_the_system_text_into_the_user_turn() {
        assert_eq!(
            gemma_builtin(None, " Hi \n"),
            "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            gemma_builtin(Some(" Be brief. "), "Hi"),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
        // An empty (after trimming) system text adds nothing, as in llama.cpp.
        assert_eq!(gemma_builtin(Some(" \n"), "Hi"), gemma_builtin(None, "Hi"));
    }
}

/// How a `--memory` budget is spent.
#[derive(Debug, Clone, Copy)]
struct Ledger {
    budget: u64,
    /// Resident after loading, above the process's start (tokenizer, metadata, header pages).
    loaded: u64,
    outside: u64,
    kv: u64,
    scratch: u64,
    /// A head-only draft's shortlist and scratch (bounded for the whole generation).
    draft: u64,
    experts_total: u64,
    experts_budget: Option<u64>,
    /// A dense model's block projections, and what they page within when the whole does
    /// not fit.
    layers_total: u64,
    layers_budget: Option<u64>,
}

/// `--json`'s `escalation` object of an exact-escalation run: its settings and counts.
fn exact_json(
    draft: &super::load::DraftArgs,
    st: &synapse_runtime::escalation::EscalationStats,
) -> serde_json::Value {
    serde_json::json!({
        "mode": "exact",
        "max_k": draft.draft_k,
        "adaptive": !draft.fixed_k,
        "drafted": st.drafted,
        "accepted": st.accepted,
        "acceptance": st.acceptance(),
        "rounds": st.rounds,
        "plain_rounds": st.plain_rounds,
        "draft_s": st.draft_s,
        "verify_s": st.verify_s,
    })
}

/// Checks that `budget` runs the model and sets the expert pager with what remains (see
/// `--memory`).
#[allow(clippy::too_many_arguments)]
fn budget_memory(
    budget: u64,
    baseline_rss: u64,
    model: &synapse_runtime::Model,
    kv: u64,
    draft: u64,
    chunk: usize,
    ctx: usize,
    threads: usize,
    exec: &mut Executor,
) -> anyhow::Result<Ledger> {
    let loaded = proc_status_bytes("VmRSS:").saturating_sub(baseline_rss);
    let experts_total = model.expert_bytes() as u64;
    let outside = model.weight_bytes() as u64 - experts_total;
    let scratch = model.pass_scratch_bytes(chunk, 1, ctx, threads);
    let fixed = loaded + outside + kv + scratch + draft;
    let mb = |b: u64| b as f64 / 1e6;
    let what = format!(
        "loading left {:.1} MB, the weights outside the experts take {:.1} MB, the KV cache \
         for {ctx} positions {:.1} MB, compute scratch {:.1} MB and a draft's shortlist {:.1} MB",
        mb(loaded),
        mb(outside),
        mb(kv),
        mb(scratch),
        mb(draft)
    );
    let mut ledger = Ledger {
        budget,
        loaded,
        outside,
        kv,
        scratch,
        draft,
        experts_total,
        experts_budget: None,
        layers_total: 0,
        layers_budget: None,
    };
    if experts_total == 0 {
        let layers_total = LayerPager::pageable_bytes(model, 0..model.layers.len());
        ledger.layers_total = layers_total;
        if fixed <= budget {
            return Ok(ledger);
        }
        // A dense model that does not fit whole pages its blocks within what the rest leaves
        // (the embedding and head stay mapped, each with its folio slack).
        let slack = LayerPager::mapped_slack(model);
        let fixed = fixed - layers_total + slack;
        let left = budget.saturating_sub(fixed);
        ledger.layers_budget = Some(left);
        exec.page_layers(Some(left)).map_err(|e| {
            anyhow::anyhow!(
                "--memory {:.1} MB cannot run this model: {what} ({:.1} MB of it its blocks' \
                 projections, which page; the embedding and head's mapped folios {:.1} MB \
                 more), leaving {:.1} MB for blocks ({e})",
                mb(budget),
                mb(layers_total),
                mb(slack),
                mb(left)
            )
        })?;
        // `SYNAPSE_BLOCK_STREAM=copy` streams through a copy slot even where the budget holds
        // a block's mapped extent (for `bench-paging --block-stream copy`).
        if std::env::var("SYNAPSE_BLOCK_STREAM").is_ok_and(|v| v == "copy")
            && let Some(p) = exec.layer_pager_mut()
        {
            p.set_stream_mapped(false);
        }
        return Ok(ledger);
    }
    let left = budget.saturating_sub(fixed);
    ledger.experts_budget = Some(left.min(experts_total));
    // When every expert fits they stay pages of the mapping (resident at most their bytes);
    // otherwise they page within what is left.
    if left < experts_total {
        exec.page_experts(Some(left)).map_err(|e| {
            anyhow::anyhow!(
                "--memory {:.1} MB cannot run this model: {what}, leaving {:.1} MB for its \
                 {:.1} MB of routed experts ({e})",
                mb(budget),
                mb(left),
                mb(experts_total)
            )
        })?;
    }
    Ok(ledger)
}
