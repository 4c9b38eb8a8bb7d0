//! `synapse-cli worker`: one worker of a cluster (etcd membership, a replica or a layer
//! range of a pipeline, served over gRPC). See `docs/cluster.md`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args as ClapArgs;
use synapse_cluster::plan::EngineShape;
use synapse_cluster::worker::{StagedPackage, WorkerConfig, WorkerModel, run as run_worker};
use synapse_server::TokenizerPieces;

use super::load::{load_model, package_tokenizer};
use super::serve::parse_bytes;

/// Arguments of `worker`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// etcd endpoints (`http://127.0.0.1:2379`, comma-separated).
    #[arg(long)]
    etcd: String,
    /// Address to serve the worker protocol on (`127.0.0.1:0`: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The address peers and the router reach this worker at (default: `http://<listen>`).
    #[arg(long)]
    advertise: Option<String>,
    /// The model (as `serve -m`; every worker of a cluster serves the same model).
    #[arg(long, short = 'm', env = "SYNAPSE_MODEL")]
    model: Option<PathBuf>,
    /// The store package hashes are looked up in (default: the user store), and whose
    /// packages this worker serves to peers; a package hash it lacks is fetched from the
    /// registered workers, verified by hash.
    #[arg(long)]
    store: Option<PathBuf>,
    /// How a model given as a whole package hash is loaded: `stage` (each role loads only
    /// the layers it runs, their tensors fetched from the registered workers when the
    /// store lacks them, verified by hash: a pipeline stage holds and fetches its own
    /// layers only) or `whole` (the whole package is made whole in the store at start and
    /// loaded). A model given as a file or directory is always loaded whole.
    #[arg(long, default_value = "stage")]
    fetch: String,
    /// This worker's id (default: `worker-<pid>`).
    #[arg(long)]
    id: Option<String>,
    /// The cluster's name (its etcd key prefix).
    #[arg(long = "cluster-name", default_value = "default")]
    cluster_name: String,
    /// Compute threads.
    #[arg(long, short = 't', default_value_t = 2)]
    threads: usize,
    /// Memory for weights and KV this worker offers, e.g. `300M` (default: the machine's
    /// available memory). Smaller than the model and its KV: the model is split over workers.
    #[arg(long)]
    memory: Option<String>,
    /// Positions per session (the plan's, when this worker leads).
    #[arg(long = "ctx-size", short = 'c', default_value_t = 4096)]
    ctx: usize,
    /// Sessions per pipeline at once (the plan's, when this worker leads).
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Prompt batch rows (llama.cpp's n_ubatch).
    #[arg(long, default_value_t = 512)]
    ubatch: usize,
    /// Lease TTL in seconds: a worker silent this long is considered gone.
    #[arg(long, default_value_t = 3)]
    lease_ttl: i64,
    /// Skip the warm-up pass a replica runs when it takes its role (by default a two-token
    /// prompt and one decode step, so that its first request does not pay for faulting in
    /// the weights, as `serve` does at start).
    #[arg(long)]
    no_warmup: bool,
    /// Seconds a pipeline step may take before the next stage counts as lost.
    #[arg(long, default_value_t = 10)]
    step_timeout: u64,
    /// MiB streamed per encoding (at least) when measuring this worker's rates at start.
    #[arg(long, default_value_t = 256)]
    measure_mib: u64,
    /// Seconds per encoding (at least) when measuring this worker's rates at start: a
    /// sustained rate, which is what a CPU quota or a busy machine gives.
    #[arg(long, default_value_t = 1.0)]
    measure_secs: f64,
    /// How layers are placed when this worker leads and the model must be split: `speed`
    /// (measured speed, memory and links) or `memory-share` (in proportion to memory, as
    /// llama.cpp's RPC backend does; for comparison).
    #[arg(long, default_value = "speed")]
    placement: String,
    /// How hidden states cross pipeline links when this worker leads: `f32` (exact: tokens
    /// bit-identical to one machine), or `f16` / `bf16` (half the bytes; an approximation,
    /// its error measured in docs/cluster.md).
    #[arg(long, default_value = "f32")]
    link_dtype: String,
    /// Passes a pipeline's first stage keeps in flight when this worker leads: 2 (a second
    /// batch of sessions runs on one stage while the first runs on the next; stages are
    /// balanced by speed) or 1 (one pass at a time; stages placed for the least latency).
    #[arg(long, default_value_t = 2)]
    in_flight: usize,
}

/// Runs `worker` until SIGTERM/SIGINT (it leaves the cluster) or its lease is lost.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.parallel == 0 || args.ctx < 2 || args.ubatch == 0 {
        bail!("--parallel, --ubatch and --ctx-size ≥ 2 must be positive");
    }
    let memory = args.memory.as_deref().map(parse_bytes).transpose()?;
    let id = args
        .id
        .clone()
        .unwrap_or_else(|| format!("worker-{}", std::process::id()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let store = args
        .store
        .clone()
        .unwrap_or_else(synapse_cas::default_store_dir);
    let staged = match args.fetch.as_str() {
        "stage" => true,
        "whole" => false,
        other => bail!("--fetch {other:?}: expected `stage` or `whole`"),
    };
    let package_hash = args
        .model
        .as_deref()
        .filter(|m| !m.exists())
        .and_then(|m| m.to_str().and_then(synapse_cluster::fetch::full_hash));
    if staged && let Some(hash) = package_hash {
        return run_staged(args, hash, store, memory, id, rt);
    }
    // A package named by its whole hash that the store lacks (or holds in part) comes
    // from the workers already registered, each object verified by its hash.
    if let Some(m) = args.model.as_deref()
        && !m.exists()
        && let Some(hash) = m.to_str().and_then(synapse_cluster::fetch::full_hash)
        && synapse_cluster::fetch::missing(&hash, &store)? != Some(0)
    {
        eprintln!(
            "package {hash} is not whole in {}: fetching it from peers",
            store.display()
        );
        let rep = rt
            .block_on(synapse_cluster::fetch::fetch_package(
                &args.etcd,
                &args.cluster_name,
                &hash,
                &store,
                &id,
            ))
            .with_context(|| format!("fetching package {hash} from the cluster's workers"))?;
        eprintln!(
            "fetched package {}: manifest {}, {} of {} objects, {} bytes from {:?} in {:.1} s",
            rep.package,
            manifest_origin(&rep),
            rep.fetched,
            rep.objects,
            rep.bytes,
            rep.peers,
            rep.seconds
        );
    }
    let (model, tok) = load_model(args.model.as_deref(), Some(&store), false)?;
    serve(
        args,
        WorkerModel::Loaded(Arc::new(model)),
        tok,
        id,
        memory,
        store,
        rt,
    )
}

/// A worker whose model is the package `hash`: the manifest and the package's small objects
/// (graph, metadata, tokenizer) made present in the store at start — from peers when it
/// lacks them — and each role's layers fetched and loaded when a plan gives it one.
fn run_staged(
    args: Args,
    hash: synapse_cas::ObjectId,
    store: PathBuf,
    memory: Option<u64>,
    id: String,
    rt: tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    let none = std::collections::BTreeSet::new();
    let rep = rt
        .block_on(synapse_cluster::fetch::fetch_package_part(
            &args.etcd,
            &args.cluster_name,
            &hash,
            &store,
            &id,
            Some(&none),
        ))
        .with_context(|| {
            format!("fetching package {hash}'s manifest from the cluster's workers")
        })?;
    eprintln!(
        "package {}: manifest {}, {} of {} graph/metadata objects fetched; tensors come per role",
        rep.package,
        manifest_origin(&rep),
        rep.fetched,
        rep.objects,
    );
    let st = synapse_cas::Store::open_existing(&store)?;
    let pkg = synapse_cas::Package::open_in_store(&st, &hash.hex())?;
    let pm = synapse_import::PackageModel::from_package_only(pkg, &none)?;
    let tok = package_tokenizer(&pm)?;
    let model = WorkerModel::Staged(Arc::new(StagedPackage {
        hash,
        store: store.clone(),
        ir: pm.ir().clone(),
    }));
    drop(pm);
    serve(args, model, tok, id, memory, store, rt)
}

/// Where a fetch found the package's manifest.
fn manifest_origin(rep: &synapse_cluster::fetch::FetchReport) -> &'static str {
    if rep.manifest_fetched {
        "fetched"
    } else {
        "local"
    }
}

/// Serves as a worker until SIGTERM/SIGINT or a lost lease.
fn serve(
    args: Args,
    model: WorkerModel,
    tok: synapse_tokenizer::Tokenizer,
    id: String,
    memory: Option<u64>,
    store: PathBuf,
    rt: tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    let tok_arc = Arc::new(tok);
    let cfg = WorkerConfig {
        id,
        cluster: args.cluster_name.clone(),
        etcd: args.etcd.clone(),
        listen: args.listen,
        advertise: args.advertise.clone(),
        model,
        pieces: Arc::new(TokenizerPieces(tok_arc.clone())),
        threads: args.threads.max(1),
        memory,
        shape: EngineShape {
            slots: args.parallel,
            ctx: args.ctx,
            ubatch: args.ubatch,
            link: args.link_dtype.parse()?,
            in_flight: args.in_flight.clamp(1, 2),
        },
        lease_ttl_s: args.lease_ttl,
        measure_bytes: args.measure_mib << 20,
        measure_secs: args.measure_secs.max(0.0),
        step_timeout: Duration::from_secs(args.step_timeout.max(1)),
        placement: args.placement.parse()?,
        store: Some(store),
        constraints: Some(constraints(tok_arc.clone())),
        warmup: !args.no_warmup,
    };
    rt.block_on(async move {
        run_worker(cfg, synapse_server::shutdown_signal())
            .await
            .context("worker")
    })?;
    eprintln!("worker stopped");
    Ok(())
}

/// Structured outputs on this worker: the server's grammar builder (llguidance), made on
/// first use (its token tables take about a second on a large vocabulary).
fn constraints(tok: Arc<synapse_tokenizer::Tokenizer>) -> synapse_cluster::worker::Constraints {
    let grammars: Arc<std::sync::OnceLock<Result<synapse_server::constraint::Grammars, String>>> =
        Arc::new(std::sync::OnceLock::new());
    Arc::new(move |spec: &str| {
        let g = grammars.get_or_init(|| {
            synapse_server::constraint::Grammars::new(tok.clone()).map_err(|e| e.to_string())
        });
        match g {
            Ok(g) => g.from_spec(spec).map_err(|e| e.to_string()),
            Err(e) => Err(e.clone()),
        }
    })
}
