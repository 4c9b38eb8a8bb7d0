//! `synapse-cli serve`: the OpenAI-compatible HTTP server (llama-server's flag names).

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args as ClapArgs;
use synapse_runtime::KvDtype;
use synapse_runtime::engine::{Engine, EngineConfig};
use synapse_runtime::promotion::{
    BudgetDriver, Demand, FollowPolicy, MemoryReading, PrecisionController, PromotionPolicy,
    follow_budget,
};
use synapse_server::{AppState, ServerConfig, TokenizerPieces};

use super::load::{default_model, load_model};

/// Arguments of `serve`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// A GGUF file, a safetensors checkpoint directory, a Synapse package directory, a
    /// package hash in the store, or a published model's name (`smollm2-135m-instruct`,
    /// `qwen2.5-coder-0.5b-instruct`: fetched once) (default: Gemma 3 270M Q4_K_M from the
    /// model cache).
    #[arg(long, short = 'm', env = "SYNAPSE_MODEL")]
    model: Option<PathBuf>,
    /// The store package hashes are looked up in.
    #[arg(long)]
    store: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the line `listening on` shows which).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Total context positions, divided over the slots (default: 4096 × --parallel).
    #[arg(long = "ctx-size", short = 'c')]
    ctx_size: Option<usize>,
    /// Sessions that run at once (slots; also `-np`).
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Compute threads.
    #[arg(long, short = 't', default_value_t = 2)]
    threads: usize,
    /// The name the model is served under (default: its file name).
    #[arg(long)]
    alias: Option<String>,
    /// Require `Authorization: Bearer <key>` on every route but /health.
    #[arg(long = "api-key", env = "SYNAPSE_API_KEY")]
    api_key: Option<String>,
    /// `max_tokens` of a request that gives none (-1: until the context is full).
    #[arg(long = "n-predict", short = 'n', default_value_t = -1, allow_negative_numbers = true)]
    n_predict: i64,
    /// Requests that may wait for a slot (more are answered 503).
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Memory budget over the process's growth from its start, e.g. `2G`, `512M`: what
    /// loading leaves (tokenizer, metadata), resident weights, KV and compute scratch; a
    /// mixture of experts that does not fit whole pages its routed experts within it.
    #[arg(long)]
    memory: Option<String>,
    /// Allow cross-origin requests from any origin.
    #[arg(long)]
    cors: bool,
    /// Skip the warm-up pass at start (by default a two-token prompt and one decode step run
    /// before the server listens, so that the first request does not pay for faulting in
    /// the weights; under `--memory` the pass pages blocks or experts within the budget as
    /// any request does).
    #[arg(long)]
    no_warmup: bool,
    /// Borrow the weights from the model file's mapping (pages read in as they are first
    /// used, shared with the page cache) instead of reading them into memory at start.
    /// Without `--memory` and in the source precision a GGUF's weights are read into the
    /// process's memory, on huge pages where the system allows (decode ran 11–14% faster
    /// on the three real models here); with `--memory`, `--budget` or `--profile` they are always borrowed.
    #[arg(long)]
    mmap: bool,
    #[command(flatten)]
    precision: super::load::PrecisionArgs,
    /// A draft for requests that ask for exact escalation (`"escalation": "exact"`): with
    /// `--draft-profile` or `--draft-budget`, each such request's tokens are drafted at that
    /// profile and verified by the served one (the same output, possibly sooner).
    #[command(flatten)]
    draft: super::load::DraftArgs,
    /// KV cache element type: f32 or f16.
    #[arg(long, default_value = "f32")]
    kv: String,
    /// Seconds a request may take to its response head (streams are not limited).
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// With `--budget`: least seconds between a precision change and the next promotion
    /// when `POST /v1/precision` raises the budget (a lower budget demotes at once).
    #[arg(long, default_value_t = 30)]
    promotion_cooldown: u64,
    /// With `--budget free`: memory left free for the rest of the machine (beside the KV
    /// cache and compute scratch, which are counted whole), e.g. `1G`.
    #[arg(long, default_value = "1G")]
    free_reserve: String,
    /// With `--budget free`: seconds between readings of free memory.
    #[arg(long, default_value_t = 5.0)]
    free_interval: f64,
    /// Serve a cluster instead of a local engine: etcd endpoints of the workers
    /// (`synapse-cli worker`) that run the model; this process only routes (it reads the
    /// model's tokenizer and facts from `-m`, the same model the workers run).
    #[arg(long)]
    cluster: Option<String>,
    /// The cluster's name (its etcd key prefix).
    #[arg(long = "cluster-name", default_value = "default")]
    cluster_name: String,
    /// With `--cluster`: seconds a session may wait for a worker (no plan yet, or resuming
    /// after a worker was lost).
    #[arg(long, default_value_t = 60)]
    resume_timeout: u64,
}

/// Rewrites llama-server's two-letter short flags (`-np`) to their long names.
pub fn llama_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    args.into_iter()
        .map(|a| {
            if a == "-np" {
                OsString::from("--parallel")
            } else {
                a
            }
        })
        .collect()
}

/// `2G`, `512M`, `1.5GiB`, `1000000` → bytes.
pub fn parse_bytes(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .with_context(|| format!("{s:?} is not a size like 2G or 512M"))?;
    let mult: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        u => bail!("unknown size unit {u:?} in {s:?} (K, M, G, T)"),
    };
    if !v.is_finite() || v < 0.0 {
        bail!("{s:?} is not a size");
    }
    Ok((v * mult as f64) as u64)
}

/// Runs `serve`.
pub fn run(mut args: Args) -> anyhow::Result<()> {
    if args.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    let kv_dtype = match args.kv.as_str() {
        "f32" => KvDtype::F32,
        "f16" => KvDtype::F16,
        other => bail!("--kv must be f32 or f16, not {other:?}"),
    };
    let memory = args.memory.as_deref().map(parse_bytes).transpose()?;
    // `--memory` bounds the process's growth from here: what loading leaves (tokenizer,
    // metadata) is taken off the engine's share of it.
    let baseline_rss = synapse_server::metrics::proc_status_bytes("VmRSS:");
    let ctx_total = args.ctx_size.unwrap_or(4096 * args.parallel);
    let ctx = ctx_total / args.parallel;
    if ctx < 2 {
        bail!(
            "--ctx-size {ctx_total} over {} slots leaves no room",
            args.parallel
        );
    }
    let default_max_tokens = match args.n_predict {
        n if n < 0 => None,
        0 => bail!("--n-predict must be positive or -1"),
        n => Some(n as usize),
    };
    let model_path = match &args.model {
        Some(p) => p.clone(),
        None => default_model()?,
    };
    // A cluster front end given a whole package hash reads only the package's manifest,
    // graph and tokenizer: its store may hold none of the tensors (the workers fetch theirs).
    let graph_only = args
        .cluster
        .as_ref()
        .filter(|_| !model_path.exists())
        .and_then(|_| {
            model_path
                .to_str()
                .and_then(synapse_cluster::fetch::full_hash)
        });
    if let (Some(etcd), Some(hash)) = (args.cluster.clone(), graph_only) {
        let store = args
            .store
            .clone()
            .unwrap_or_else(synapse_cas::default_store_dir);
        let st = synapse_cas::Store::open_existing(&store)?;
        let pkg = synapse_cas::Package::open_in_store(&st, &hash.hex())?;
        let pm = synapse_import::PackageModel::from_package_only(pkg, &Default::default())?;
        let tok = super::load::package_tokenizer(&pm)?;
        let ir = pm.ir();
        let info = synapse_runtime::engine::EngineInfo {
            slots: 0,
            ctx,
            vocab: ir.hparams.vocab_size as usize,
            fingerprint: ir.fingerprint.clone(),
            weight_bytes: ir.weights.iter().map(|w| w.n_bytes).sum(),
            kernel_path: "cluster".into(),
            profile: synapse_runtime::PrecisionProfile::source(ir).hash(),
            draft_profile: None,
            source_profile: synapse_runtime::PrecisionProfile::source(ir).hash(),
            memory: None,
        };
        let cfg = server_config(&args, &model_path, ir.family.name(), default_max_tokens);
        check_cluster_flags(&args, memory)?;
        return serve_cluster(args, etcd, info, tok, cfg);
    }
    // Without a memory budget, in the source precision, the weights are read into memory
    // (`--mmap` borrows them from the file's mapping instead).
    let resident = memory.is_none() && args.precision.is_source() && !args.mmap;
    let (model, tok) = load_model(Some(&model_path), args.store.as_deref(), resident)?;
    let server_cfg = server_config(
        &args,
        &model_path,
        model.ir.family.name(),
        default_max_tokens,
    );
    if let Some(etcd) = args.cluster.clone() {
        check_cluster_flags(&args, memory)?;
        let info = synapse_runtime::engine::EngineInfo {
            slots: 0,
            ctx,
            vocab: model.vocab(),
            fingerprint: model.ir.fingerprint.clone(),
            weight_bytes: model.weight_bytes() as u64,
            kernel_path: "cluster".into(),
            profile: model.profile.hash(),
            draft_profile: None,
            source_profile: synapse_runtime::PrecisionProfile::source(&model.ir).hash(),
            memory: None,
        };
        // The front end only reads the tokenizer and these facts; the weights stay unmapped.
        drop(model);
        return serve_cluster(args, etcd, info, tok, server_cfg);
    }
    let source = Arc::new(model);
    // The engine's KV cache and compute scratch, as it will count them (the source's shapes:
    // the precision does not change them).
    let kv_and_scratch = || {
        let probe = EngineConfig {
            slots: args.parallel,
            ctx,
            kv_dtype,
            threads: args.threads,
            ..EngineConfig::default()
        };
        synapse_runtime::engine::kv_and_scratch_bytes(&source, &probe, source.layers.len())
    };
    // `--budget fit`: what --memory leaves beside them and what loading left.
    args.precision = args.precision.fit_into(memory, || {
        let (kv, scratch) = kv_and_scratch()?;
        let loaded =
            synapse_server::metrics::proc_status_bytes("VmRSS:").saturating_sub(baseline_rss);
        Ok(loaded + kv + scratch)
    })?;
    // `--budget free`: the budget free memory allows now; a follower moves it while serving.
    let follow = if args.precision.follows_free_memory() {
        let reserve = parse_bytes(&args.free_reserve)?;
        if !(args.free_interval.is_finite() && args.free_interval >= 0.01) {
            bail!("--free-interval must be at least 0.01 s");
        }
        let (kv, scratch) = kv_and_scratch()?;
        let source_bytes = source.weight_bytes() as u64;
        // Within --memory: what it leaves beside the KV, scratch and what loading left.
        let cap = match memory {
            Some(m) => {
                let loaded = synapse_server::metrics::proc_status_bytes("VmRSS:")
                    .saturating_sub(baseline_rss);
                let room = m.saturating_sub(loaded + kv + scratch);
                if room == 0 {
                    bail!(
                        "--budget free: --memory {m} B leaves no room for weights beside {kv} B \
                         of KV cache, {scratch} B of compute scratch and {loaded} B that \
                         loading left"
                    );
                }
                room.min(source_bytes)
            }
            None => source_bytes,
        };
        let policy = FollowPolicy {
            reserve: reserve + scratch,
            cap,
            interval: Duration::from_secs_f64(args.free_interval),
        };
        let reading = MemoryReading::read().context("--budget free reads the free memory")?;
        let demand = Demand {
            weights: 0,
            kv_total: kv,
            kv_open: 0,
        };
        let budget = follow_budget(reading.free(), &demand, &policy, 0);
        if budget == 0 {
            bail!(
                "--budget free: {:.1} MB free leave no room for weights beside the reserve \
                 ({:.1} MB with compute scratch) and the KV cache ({:.1} MB)",
                reading.free() as f64 / 1e6,
                policy.reserve as f64 / 1e6,
                kv as f64 / 1e6
            );
        }
        eprintln!(
            "--budget free: {budget} B for weights now ({} B free, {} B reserved, {kv} B of \
             KV cache; at most {cap} B), followed every {} s",
            reading.free(),
            policy.reserve,
            args.free_interval
        );
        args.precision = args.precision.with_budget(budget);
        Some(policy)
    } else {
        None
    };
    // With --budget the engine runs under a precision controller, so later budgets
    // (`POST /v1/precision`) only promote or only demote from where it starts.
    let controller =
        match args
            .precision
            .budget_and_map(&source, Some(&model_path), args.store.as_deref())?
        {
            Some((budget, map)) => {
                let source_bytes = source.weight_bytes() as u64;
                let mut policy = PromotionPolicy::for_source_bytes(source_bytes);
                policy.cooldown = Duration::from_secs(args.promotion_cooldown);
                let c = PrecisionController::new(
                    &source,
                    &map,
                    budget.bytes(source_bytes),
                    policy,
                    std::time::Instant::now(),
                );
                Some(match (c, &follow) {
                    (Ok(c), _) => c,
                    (Err(e), Some(_)) => bail!(
                        "--budget free: what is free, less --free-reserve and the KV cache, is \
                         too little for this model: {e}"
                    ),
                    (Err(e), None) => return Err(e.into()),
                })
            }
            None => None,
        };
    let cache = args.precision.variant_cache(args.store.as_deref())?;
    let model = match &controller {
        Some(c) => c.model(c.profile(), cache.as_ref())?.0,
        None => {
            args.precision
                .apply(&source, Some(&model_path), args.store.as_deref())?
                .applied
                .model
        }
    };
    // A head-only draft (`--draft-profile head:N`, or chosen by `auto`): the shortlist's
    // base; the requests' prompts join it as they come.
    let mut head_draft = args
        .draft
        .head_shortlist()?
        .map(|n| super::load::head_base(&tok, n));
    let draft = if head_draft.is_some() {
        None
    } else if args.draft.auto() {
        // No request is known yet: the drafts are measured on a fixed probe text.
        let probe = tok.encode(super::load::PROBE_TEXT, true, false)?;
        let mut exec = synapse_runtime::Executor::new(model.clone(), args.threads)?;
        let extra = super::load::shortlist_extra(&tok, &probe);
        let a = args.draft.choose_auto(
            &model,
            &args.precision,
            Some(&model_path),
            args.store.as_deref(),
            &mut exec,
            kv_dtype,
            &probe,
            Some(&extra),
        )?;
        head_draft = a.head.map(|n| super::load::head_base(&tok, n));
        a.chosen.map(|c| c.1.applied.model)
    } else if args.draft.given() {
        let d = args.draft.apply(
            &model,
            &args.precision,
            Some(&model_path),
            args.store.as_deref(),
            super::load::DEFAULT_DRAFT_PROFILE,
        )?;
        Some(d.applied.model)
    } else {
        None
    };
    drop(source);
    let tok = Arc::new(tok);
    let memory = match memory {
        Some(budget) => {
            let loaded =
                synapse_server::metrics::proc_status_bytes("VmRSS:").saturating_sub(baseline_rss);
            if loaded >= budget {
                bail!(
                    "--memory {:.1} MB cannot run this model: loading alone left {:.1} MB",
                    budget as f64 / 1e6,
                    loaded as f64 / 1e6
                );
            }
            eprintln!(
                "memory: budget {budget} B over a baseline RSS of {baseline_rss} B; loading \
                 left {loaded} B, the engine holds weights, KV and scratch within {} B",
                budget - loaded
            );
            Some(budget - loaded)
        }
        None => None,
    };

    let cfg = EngineConfig {
        slots: args.parallel,
        ctx,
        queue: args.queue,
        kv_dtype,
        threads: args.threads,
        memory,
        draft,
        head_draft,
        draft_k: args.draft.draft_k,
        draft_adaptive: !args.draft.fixed_k,
        warmup: !args.no_warmup,
        ..EngineConfig::default()
    };
    let t0 = std::time::Instant::now();
    let engine = Arc::new(
        Engine::start(model, Arc::new(TokenizerPieces(tok.clone())), cfg)
            .context("starting the engine")?,
    );
    if !args.no_warmup {
        eprintln!(
            "engine started with a warm-up pass in {:.0} ms",
            t0.elapsed().as_secs_f64() * 1e3
        );
    }
    if let Some(l) = engine.info().memory {
        let pages = match (l.experts_budget, l.layers_budget) {
            (Some(b), _) => format!("experts page within {b} B"),
            (None, Some(b)) => format!("blocks page within {b} B"),
            (None, None) => "everything fits".to_string(),
        };
        eprintln!(
            "memory ledger: weights {} B (routed experts {} B, dense blocks {} B), KV {} B, \
             scratch {} B; {pages}",
            l.weights, l.experts, l.layers, l.kv, l.scratch,
        );
    }
    let state = AppState::new(engine.clone(), tok, server_cfg)?;
    let mut follower = None;
    let state = match controller {
        Some(c) => {
            let driver = Arc::new(BudgetDriver::new(c, engine, cache));
            if let Some(policy) = follow {
                follower = Some(driver.follow_memory(policy, MemoryReading::read));
            }
            state.with_precision(driver)?
        }
        None => state,
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("binding {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        eprintln!("listening on http://{addr}");
        synapse_server::serve(listener, state, synapse_server::shutdown_signal()).await?;
        eprintln!("server stopped");
        anyhow::Ok(())
    })?;
    drop(follower);
    Ok(())
}

/// The server's settings: the model's id and aliases from its path, and the flags.
fn server_config(
    args: &Args,
    model_path: &std::path::Path,
    family: &str,
    default_max_tokens: Option<usize>,
) -> ServerConfig {
    let file_name = model_path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| model_path.to_string_lossy().into_owned());
    let mut aliases = vec![file_name.clone(), model_path.to_string_lossy().into_owned()];
    if let Some(stem) = model_path.file_stem() {
        aliases.push(stem.to_string_lossy().into_owned());
    }
    let model_id = args.alias.clone().unwrap_or(file_name);
    ServerConfig {
        model_id,
        model_aliases: aliases,
        family: family.to_string(),
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        default_max_tokens,
        cors: args.cors,
        request_timeout: Duration::from_secs(args.timeout.max(1)),
        ..ServerConfig::default()
    }
}

/// Precision and memory are set per worker, not on a cluster's front end.
fn check_cluster_flags(args: &Args, memory: Option<u64>) -> anyhow::Result<()> {
    if args.precision.budget.is_some()
        || args.precision.profile.is_some()
        || args.draft.given()
        || memory.is_some()
    {
        bail!("--budget/--profile, drafts and --memory are set per worker, not with --cluster");
    }
    Ok(())
}

/// `serve --cluster`: the same HTTP API, each session routed to a worker of the cluster.
fn serve_cluster(
    args: Args,
    etcd: String,
    info: synapse_runtime::engine::EngineInfo,
    tok: synapse_tokenizer::Tokenizer,
    server_cfg: ServerConfig,
) -> anyhow::Result<()> {
    use synapse_cluster::router::{ClusterRouter, RouterConfig};
    let tok = Arc::new(tok);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let router = ClusterRouter::start(RouterConfig {
            etcd,
            cluster: args.cluster_name.clone(),
            info,
            queue: args.queue,
            resume_timeout: Duration::from_secs(args.resume_timeout.max(1)),
            attempts: 16,
        })
        .await
        .context("connecting to the cluster")?;
        let state = AppState::new(router, tok, server_cfg)?;
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("binding {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        eprintln!("listening on http://{addr} (cluster {})", args.cluster_name);
        synapse_server::serve(listener, state, synapse_server::shutdown_signal()).await?;
        eprintln!("server stopped");
        anyhow::Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_flags() {
        assert_eq!(parse_bytes("2G").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("512M").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("1000").unwrap(), 1000);
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("2X").is_err());
        let a = llama_args(["x", "-np", "2"].map(OsString::from));
        assert_eq!(a[1], "--parallel");
    }
}
