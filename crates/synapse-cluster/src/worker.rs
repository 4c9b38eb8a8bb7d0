//! A worker process: it serves the worker protocol, registers under a lease, measures
//! itself and its links, takes part in the leader election, and runs what the plan gives it.
//!
//! Roles (from the plan, [`ClusterPlan::stage_of`]):
//! - **replica**: the whole model in one engine; `Generate` calls run on it.
//! - **head**: a pipeline's first stage: the engine ([`Engine::start_pipeline`]) runs the
//!   embedding and its layers and steps the rest through a [`GrpcStageLink`] to the next stage.
//! - **stage**: a later stage: each `Step` stream from the previous stage gets a fresh
//!   [`StageRunner`] (its cache starts empty, as the head's did when it opened the stream) and,
//!   unless it is the last stage, its own link to the next one.
//!
//! A worker keeps its role across plan publications that leave its pipeline exactly as it
//! was (hysteresis: a replica added elsewhere disturbs nothing); otherwise it tears the role
//! down at once — running sessions of a torn-down head fail, and the router resumes them on
//! the new plan — and builds the new one. Packets and requests carry the plan they were made
//! under; another plan's are refused.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::Stream;
use synapse_runtime::engine::{Engine, EngineConfig, PipelineHead, TokenPieces};
use synapse_runtime::pipeline::{StageCache, StageRunner, StepPacket};
use synapse_runtime::{KvDtype, Model};
use tokio::sync::watch;
use tonic::{Request as TRequest, Response, Status, Streaming};

use crate::error::{ClusterError, Result};
use crate::link::GrpcStageLink;
use crate::membership::{self, Keys};
use crate::plan::{ClusterPlan, EngineShape, PipelinePlan};
use crate::profile::{
    LinkMeasure, ModelSpec, WorkerProfile, available_memory, measure, measure_synthetic,
};
use crate::proto::worker_server::{Worker, WorkerServer};
use crate::proto::{self, worker_client::WorkerClient};
use crate::wire;

/// How a worker is started.
pub struct WorkerConfig {
    /// Its id in the cluster.
    pub id: String,
    /// Cluster name (the etcd key prefix).
    pub cluster: String,
    /// etcd endpoints.
    pub etcd: String,
    /// Where to listen for the worker protocol.
    pub listen: SocketAddr,
    /// The address peers and the router use (default: `http://<listen>`).
    pub advertise: Option<String>,
    /// The model: loaded whole, or a package whose roles load their own layers.
    pub model: WorkerModel,
    /// Token text for the engine (stop strings, streamed text).
    pub pieces: Arc<dyn TokenPieces>,
    /// Compute threads.
    pub threads: usize,
    /// Memory for weights and KV (default: the machine's available memory).
    pub memory: Option<u64>,
    /// The engine shape this worker proposes when it leads.
    pub shape: EngineShape,
    /// Lease TTL, seconds.
    pub lease_ttl_s: i64,
    /// Bytes streamed per encoding when measuring rates at start (at least).
    pub measure_bytes: u64,
    /// Seconds per encoding when measuring rates at start (at least).
    pub measure_secs: f64,
    /// A pipeline step not answered within this fails.
    pub step_timeout: Duration,
    /// How this worker places layers when it leads.
    pub placement: crate::plan::Placement,
    /// The content-addressed store whose packages and objects this worker serves to peers
    /// that lack them (`Fetch`); `None`: it serves none.
    pub store: Option<std::path::PathBuf>,
    /// Builds structured-output constraints from their specs (requests routed here with
    /// one); `None`: such requests are refused.
    pub constraints: Option<Constraints>,
    /// A replica runs one warm-up pass ([`Scheduler::warm_up`](synapse_runtime::engine::Scheduler::warm_up))
    /// when it takes its role, before the router sends it requests: the weights its first
    /// request would fault in (or page in within its budget) are read then.
    pub warmup: bool,
}

/// The model a worker serves.
#[derive(Clone)]
pub enum WorkerModel {
    /// Loaded whole at start (weights mapped, resident as used): every role runs on it.
    Loaded(Arc<Model>),
    /// A package whose tensors this worker's store may lack: each role loads the layers it
    /// runs — their tensors fetched from peers first when the store lacks them, each
    /// verified by its hash — so a pipeline stage holds (and fetches) its own layers only.
    Staged(Arc<StagedPackage>),
}

/// A package a worker loads role by role ([`WorkerModel::Staged`]).
#[derive(Debug)]
pub struct StagedPackage {
    /// The package hash.
    pub hash: synapse_cas::ObjectId,
    /// The store it is (partly) in, where fetched objects are written.
    pub store: std::path::PathBuf,
    /// Its graph (from the manifest).
    pub ir: synapse_model::ModelIr,
}

impl WorkerModel {
    /// The model's graph.
    pub fn ir(&self) -> &synapse_model::ModelIr {
        match self {
            WorkerModel::Loaded(m) => &m.ir,
            WorkerModel::Staged(p) => &p.ir,
        }
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.ir().hparams.vocab_size as usize
    }
}

/// Builds an engine [`Constraint`](synapse_runtime::engine::Constraint) from its spec
/// (`Constraint::spec`, made by the front end's builder): the port through which a worker
/// serves structured outputs without knowing how grammars are compiled.
pub type Constraints = Arc<
    dyn Fn(&str) -> std::result::Result<Box<dyn synapse_runtime::engine::Constraint>, String>
        + Send
        + Sync,
>;

/// What a worker serves besides its roles.
#[derive(Default)]
struct Serving {
    store: Option<std::path::PathBuf>,
    constraints: Option<Constraints>,
    /// etcd endpoints and cluster name (where a staged model's tensors come from).
    cluster: Option<(String, String)>,
    /// Replicas warm up when they take their role ([`WorkerConfig::warmup`]).
    warmup: bool,
}

impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConfig")
            .field("id", &self.id)
            .field("cluster", &self.cluster)
            .field("listen", &self.listen)
            .field("threads", &self.threads)
            .finish()
    }
}

/// What the worker runs now.
enum Role {
    Idle,
    Replica {
        engine: Arc<Engine>,
    },
    Head {
        engine: Arc<Engine>,
    },
    Stage {
        layers: std::ops::Range<usize>,
        next: Option<String>,
        model: Arc<Model>,
    },
}

impl Role {
    fn name(&self) -> &'static str {
        match self {
            Role::Idle => "idle",
            Role::Replica { .. } => "replica",
            Role::Head { .. } => "head",
            Role::Stage { .. } => "stage",
        }
    }
}

struct Current {
    role: Role,
    /// The pipeline the role belongs to, and the plan it was set up under.
    pipeline: Option<PipelinePlan>,
    since_epoch: u64,
    since_hash: String,
    /// The newest plan seen.
    plan: Option<ClusterPlan>,
}

/// State the gRPC handlers share.
struct Node {
    id: String,
    model: WorkerModel,
    /// Where a staged model's tensors are fetched from (etcd endpoints and cluster name).
    cluster: Option<(String, String)>,
    /// The last model loaded for a role of a staged package, and its layers.
    loaded: tokio::sync::Mutex<Option<(std::ops::Range<usize>, Arc<Model>)>>,
    pieces: Arc<dyn TokenPieces>,
    threads: usize,
    step_timeout: Duration,
    /// Replicas warm up when they take their role.
    warmup: bool,
    cur: Mutex<Current>,
    /// Bumped whenever the role changes.
    role_changes: watch::Sender<u64>,
    /// As a stage: logits rows answered whole, as their argmax token, as a token sampled
    /// or chosen here.
    whole_rows: Arc<std::sync::atomic::AtomicU64>,
    argmax_rows: Arc<std::sync::atomic::AtomicU64>,
    sampled_rows: Arc<std::sync::atomic::AtomicU64>,
    /// The store served to peers, and the constraint builder.
    store: Option<std::path::PathBuf>,
    constraints: Option<Constraints>,
}

/// How long a request waits for a head or replica that is setting up.
const ROLE_WAIT: Duration = Duration::from_secs(30);

fn unavailable(m: impl Into<String>) -> Status {
    Status::unavailable(m.into())
}

type EventStream =
    Pin<Box<dyn Stream<Item = std::result::Result<proto::GenerateEvent, Status>> + Send>>;
type ReplyStream =
    Pin<Box<dyn Stream<Item = std::result::Result<proto::StepReply, Status>> + Send>>;
type ChunkStream =
    Pin<Box<dyn Stream<Item = std::result::Result<proto::FetchChunk, Status>> + Send>>;

struct Service(Arc<Node>);

#[tonic::async_trait]
impl Worker for Service {
    type GenerateStream = EventStream;
    type StepStream = ReplyStream;
    type FetchStream = ChunkStream;

    async fn fetch(
        &self,
        req: TRequest<proto::FetchRequest>,
    ) -> std::result::Result<Response<ChunkStream>, Status> {
        let Some(store) = self.0.store.clone() else {
            return Err(Status::not_found("this worker serves no store"));
        };
        let r = req.into_inner();
        // Read (and re-hashed) off the async threads.
        let bytes = tokio::task::spawn_blocking(move || crate::fetch::read_local(&store, &r))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::not_found(e.to_string()))?;
        let total = bytes.len() as u64;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let mut chunks = bytes.chunks(crate::fetch::CHUNK).peekable();
            if chunks.peek().is_none() {
                let _ = tx
                    .send(Ok(proto::FetchChunk {
                        total,
                        data: Vec::new(),
                    }))
                    .await;
            }
            for c in chunks {
                let m = proto::FetchChunk {
                    total,
                    data: c.to_vec(),
                };
                if tx.send(Ok(m)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn generate(
        &self,
        req: TRequest<proto::GenerateRequest>,
    ) -> std::result::Result<Response<EventStream>, Status> {
        let mut g = req.into_inner();
        // A head or replica the plan names may still be setting up (its next stage takes
        // the plan first): wait for it rather than refuse.
        let mut roles = self.0.role_changes.subscribe();
        let t0 = Instant::now();
        let engine = loop {
            {
                let cur = self
                    .0
                    .cur
                    .lock()
                    .map_err(|_| Status::internal("poisoned"))?;
                let have = cur.plan.as_ref().map(|p| (p.epoch, p.hash.clone()));
                if have.as_ref().map(|h| h.1.as_str()) != Some(g.plan_hash.as_str()) {
                    return Err(Status::failed_precondition(format!(
                        "stale plan: request under {} ({}), worker at {:?}",
                        g.epoch, g.plan_hash, have
                    )));
                }
                let coming = cur
                    .plan
                    .as_ref()
                    .and_then(|p| p.stage_of(&self.0.id))
                    .is_some_and(|(_, i, _)| i == 0);
                match &cur.role {
                    Role::Replica { engine } | Role::Head { engine } => break engine.clone(),
                    Role::Idle if coming && t0.elapsed() < ROLE_WAIT => {}
                    other => {
                        return Err(unavailable(format!("this worker is a {}", other.name())));
                    }
                }
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), roles.changed()).await;
        };
        let spec = std::mem::take(&mut g.constraint);
        let mut r = wire::request_from_wire(g);
        if !spec.is_empty() {
            let Some(build) = self.0.constraints.as_ref() else {
                return Err(Status::invalid_argument(
                    "this worker serves no structured outputs",
                ));
            };
            let b = build.clone();
            let c = tokio::task::spawn_blocking(move || b(&spec))
                .await
                .map_err(|e| Status::internal(e.to_string()))?
                .map_err(|e| Status::invalid_argument(format!("response_format: {e}")))?;
            r.constraint = Some(c);
        }
        let session = match engine.submit(r) {
            Ok(s) => s,
            Err(e @ synapse_runtime::engine::SubmitError::QueueFull { .. }) => {
                return Err(Status::resource_exhausted(e.to_string()));
            }
            Err(synapse_runtime::engine::SubmitError::Stopped) => {
                return Err(unavailable("the engine is stopping"));
            }
            Err(e) => return Err(Status::invalid_argument(e.to_string())),
        };
        // Dropping the stream (the router went away) drops the session: cancelled.
        let stream = futures_util::stream::unfold(Some(session), |st| async move {
            let mut s = st?;
            let e = s.next().await?;
            let last = matches!(
                e,
                synapse_runtime::engine::Event::Done(_) | synapse_runtime::engine::Event::Error(_)
            );
            Some((
                Ok(wire::event_to_wire(&e)),
                if last { None } else { Some(s) },
            ))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn step(
        &self,
        req: TRequest<Streaming<proto::StepPacket>>,
    ) -> std::result::Result<Response<ReplyStream>, Status> {
        let (layers, next, epoch, hash) = {
            let cur = self
                .0
                .cur
                .lock()
                .map_err(|_| Status::internal("poisoned"))?;
            match &cur.role {
                Role::Stage {
                    layers,
                    next,
                    model,
                } => (
                    (layers.clone(), model.clone()),
                    next.clone(),
                    cur.since_epoch,
                    cur.since_hash.clone(),
                ),
                other => return Err(unavailable(format!("this worker is a {}", other.name()))),
            }
        };
        let shape = {
            let cur = self
                .0
                .cur
                .lock()
                .map_err(|_| Status::internal("poisoned"))?;
            cur.plan.as_ref().map(|p| p.shape)
        }
        .ok_or_else(|| unavailable("no plan"))?;
        let cache = StageCache {
            slots: shape.slots,
            ctx: shape.ctx,
            max_chunk: shape.ubatch.min(shape.ctx),
            dtype: KvDtype::F32,
        };
        let (layers, model) = layers;
        let mut runner = StageRunner::new(model, layers, self.0.threads, cache)
            .map_err(|e| Status::internal(e.to_string()))?;
        // A middle stage hands each packet on as soon as its layers ran and its replies back
        // up as they come (its reply pump), so several packets can be in flight through it.
        let down = match &next {
            Some(addr) => {
                // The next stage may still be taking the plan (the head waited for this
                // stage only): wait for it the same way.
                wait_for_stage(addr, &hash, epoch, Duration::from_secs(30))
                    .await
                    .map_err(|e| unavailable(e.to_string()))?;
                let link = GrpcStageLink::connect(
                    addr,
                    epoch,
                    &hash,
                    self.0.model.vocab(),
                    self.0.step_timeout,
                )
                .await
                .map_err(|e| unavailable(format!("next stage {addr}: {e}")))?;
                runner.set_journal(true);
                Some(link.into_ends())
            }
            None => None,
        };
        let mut inbound = req.into_inner();
        let (ptx, prx) = std::sync::mpsc::channel::<proto::StepPacket>();
        let (rtx, rrx) =
            tokio::sync::mpsc::channel::<std::result::Result<proto::StepReply, Status>>(4);
        // Packets off the stream in order.
        let rtx2 = rtx.clone();
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(p)) => {
                        if ptx.send(p).is_err() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(s) => {
                        let _ = rtx2.send(Err(s)).await;
                        break;
                    }
                }
            }
        });
        let vocab = self.0.model.vocab();
        let counters = Counters {
            whole: self.0.whole_rows.clone(),
            argmax: self.0.argmax_rows.clone(),
            sampled: self.0.sampled_rows.clone(),
            vocab,
        };
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map(|_| ())
                .map_err(|e| Status::internal(e.to_string()))
        };
        match down {
            None => {
                // The last stage: each packet's logits (or tokens) back in order.
                spawn(
                    "synapse-stage",
                    Box::new(move || {
                        let mut scratch = PacketScratch::default();
                        while let Ok(p) = prx.recv() {
                            let reply = run_packet(&mut runner, &p, epoch, &hash, &mut scratch);
                            counters.count(&reply, scratch.sampled());
                            let failed = !reply.error.is_empty();
                            if rtx.blocking_send(Ok(reply)).is_err() || failed {
                                break;
                            }
                        }
                    }),
                )?;
            }
            Some((down_tx, down_rx)) => {
                let (otx, orx) = std::sync::mpsc::channel::<Order>();
                let dtype = shape.link;
                spawn(
                    "synapse-stage",
                    Box::new(move || {
                        let mut scratch = PacketScratch::default();
                        while let Ok(p) = prx.recv() {
                            match run_middle(&mut runner, &p, epoch, &hash, dtype, &mut scratch) {
                                Ok(dp) => {
                                    let sampled = scratch.sampled();
                                    if otx.send(Order::Forwarded(p.step, sampled)).is_err()
                                        || down_tx.blocking_send(dp).is_err()
                                    {
                                        break;
                                    }
                                }
                                Err(reply) => {
                                    let _ = otx.send(Order::Failed(reply));
                                    break;
                                }
                            }
                        }
                    }),
                )?;
                let timeout = self.0.step_timeout;
                spawn(
                    "synapse-stage-replies",
                    Box::new(move || {
                        while let Ok(o) = orx.recv() {
                            let (reply, sampled) = match o {
                                Order::Forwarded(step, sampled) => (
                                    GrpcStageLink::recv_reply(&down_rx, timeout, step)
                                        .unwrap_or_else(|error| proto::StepReply {
                                            step,
                                            error,
                                            ..Default::default()
                                        }),
                                    sampled,
                                ),
                                Order::Failed(r) => (r, 0),
                            };
                            counters.count(&reply, sampled);
                            let failed = !reply.error.is_empty();
                            if rtx.blocking_send(Ok(reply)).is_err() || failed {
                                break;
                            }
                        }
                    }),
                )?;
            }
        }
        let out = tokio_stream::wrappers::ReceiverStream::new(rrx);
        Ok(Response::new(Box::pin(out)))
    }

    async fn ping(
        &self,
        req: TRequest<proto::PingRequest>,
    ) -> std::result::Result<Response<proto::PingReply>, Status> {
        Ok(Response::new(proto::PingReply {
            payload: req.into_inner().payload,
        }))
    }

    async fn status(
        &self,
        _: TRequest<proto::StatusRequest>,
    ) -> std::result::Result<Response<proto::StatusReply>, Status> {
        let cur = self
            .0
            .cur
            .lock()
            .map_err(|_| Status::internal("poisoned"))?;
        let (active, queued, slots, generated) = match &cur.role {
            Role::Replica { engine } | Role::Head { engine } => {
                let s = engine.stats();
                (s.active, s.queued, s.slots, s.generated_tokens)
            }
            _ => (0, 0, 0, 0),
        };
        Ok(Response::new(proto::StatusReply {
            worker: self.0.id.clone(),
            epoch: cur.plan.as_ref().map_or(0, |p| p.epoch),
            plan_hash: cur.plan.as_ref().map_or(String::new(), |p| p.hash.clone()),
            role: cur.role.name().to_string(),
            active: active as u64,
            queued: queued as u64,
            slots: slots as u64,
            generated_tokens: generated,
            whole_rows: self.0.whole_rows.load(std::sync::atomic::Ordering::Relaxed),
            argmax_rows: self
                .0
                .argmax_rows
                .load(std::sync::atomic::Ordering::Relaxed),
            sampled_rows: self
                .0
                .sampled_rows
                .load(std::sync::atomic::Ordering::Relaxed),
        }))
    }
}

/// A stage thread's reused buffers.
#[derive(Default)]
struct PacketScratch {
    rows: Vec<synapse_runtime::Row>,
    hidden: Vec<f32>,
    ops: Vec<synapse_runtime::KvOp>,
    reads: Vec<synapse_runtime::pipeline::RowRead>,
    logits: Vec<f32>,
    choose: wire::ChooseScratch,
    body: wire::ReplyBody,
}

impl PacketScratch {
    /// Sampled rows among the packet's reads.
    fn sampled(&self) -> u64 {
        self.reads
            .iter()
            .filter(|r| {
                matches!(
                    r,
                    synapse_runtime::pipeline::RowRead::Sample(_)
                        | synapse_runtime::pipeline::RowRead::Choose(_)
                )
            })
            .count() as u64
    }
}

/// What a middle stage's reply pump answers next, in packet order.
enum Order {
    /// The packet of this step (with this many sampled rows) went on downstream: its reply
    /// is the downstream's.
    Forwarded(u64, u64),
    /// The packet failed here: this error reply.
    Failed(proto::StepReply),
}

/// A worker's counts of logits rows answered whole, as their argmax and as a sampled token.
struct Counters {
    whole: Arc<std::sync::atomic::AtomicU64>,
    argmax: Arc<std::sync::atomic::AtomicU64>,
    sampled: Arc<std::sync::atomic::AtomicU64>,
    vocab: usize,
}

impl Counters {
    /// Counts `reply`, whose packet had `sampled` sampled rows.
    fn count(&self, reply: &proto::StepReply, sampled: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        if !reply.error.is_empty() {
            return;
        }
        let whole = (reply.logits.len() / 4 / self.vocab.max(1)) as u64;
        self.whole.fetch_add(whole, Relaxed);
        let tokens = reply.tokens.len() as u64;
        self.argmax
            .fetch_add(tokens.saturating_sub(sampled), Relaxed);
        self.sampled.fetch_add(sampled.min(tokens), Relaxed);
    }
}

/// Checks a packet's plan and reads it into `sc` (rows, hidden states, slot operations,
/// argmax flags).
fn read_packet(
    p: &proto::StepPacket,
    epoch: u64,
    hash: &str,
    sc: &mut PacketScratch,
) -> Result<()> {
    if p.epoch != epoch || p.plan_hash != hash {
        return Err(ClusterError::StalePlan {
            got_epoch: p.epoch,
            got_hash: p.plan_hash.clone(),
            have_epoch: epoch,
            have_hash: hash.to_string(),
        });
    }
    wire::rows_from_wire(p, &mut sc.rows)?;
    wire::hidden_from_wire(&p.hidden, p.hidden_dtype, &mut sc.hidden)?;
    sc.ops.clear();
    for o in &p.ops {
        sc.ops.push(wire::op_from_wire(o)?);
    }
    wire::reads_from_wire(p, &mut sc.reads)?;
    let nl = sc.rows.iter().filter(|r| r.logits).count();
    if !sc.reads.is_empty() && sc.reads.len() != nl {
        return Err(ClusterError::Invalid {
            what: "step packet",
            reason: format!("{} row reads for {nl} logits rows", sc.reads.len()),
        });
    }
    Ok(())
}

/// The last stage runs a packet: its reply holds the logits (argmax-only rows as tokens).
fn run_packet(
    runner: &mut StageRunner,
    p: &proto::StepPacket,
    epoch: u64,
    hash: &str,
    sc: &mut PacketScratch,
) -> proto::StepReply {
    let mut reply = proto::StepReply {
        step: p.step,
        ..Default::default()
    };
    let r: Result<()> = read_packet(p, epoch, hash, sc).and_then(|()| {
        runner.run(
            &StepPacket {
                ops: &sc.ops,
                rows: &sc.rows,
                hidden: &sc.hidden,
                reads: &sc.reads,
            },
            &mut sc.logits,
        )?;
        Ok(())
    });
    match r {
        // Rows read as a token go back as their token (argmax or sampled here).
        Ok(()) => match wire::compress_logits(
            &sc.logits,
            runner.executor().model().vocab(),
            &sc.reads,
            &mut sc.body,
            &mut sc.choose,
        ) {
            Ok(_) => {
                std::mem::swap(&mut reply.logits, &mut sc.body.bytes);
                std::mem::swap(&mut reply.tokens, &mut sc.body.tokens);
                std::mem::swap(&mut reply.logprobs, &mut sc.body.logprobs);
            }
            Err(e) => reply.error = e.to_string(),
        },
        Err(e) => reply.error = e.to_string(),
    }
    reply
}

/// A middle stage runs a packet: the packet for the next stage (same plan and step), or
/// the error reply.
fn run_middle(
    runner: &mut StageRunner,
    p: &proto::StepPacket,
    epoch: u64,
    hash: &str,
    dtype: crate::plan::LinkDtype,
    sc: &mut PacketScratch,
) -> std::result::Result<proto::StepPacket, proto::StepReply> {
    let r: Result<proto::StepPacket> = read_packet(p, epoch, hash, sc).and_then(|()| {
        let (ops, hidden) = runner.run_through(&StepPacket {
            ops: &sc.ops,
            rows: &sc.rows,
            hidden: &sc.hidden,
            reads: &sc.reads,
        })?;
        let out = StepPacket {
            ops,
            rows: &sc.rows,
            hidden,
            reads: &sc.reads,
        };
        Ok(crate::link::packet_to_wire(
            epoch, hash, p.step, &out, dtype,
        ))
    });
    r.map_err(|e| proto::StepReply {
        step: p.step,
        error: e.to_string(),
        ..Default::default()
    })
}

/// Waits until the worker at `addr` runs plan `hash` (epoch `epoch`) as a pipeline stage (it
/// applies plans on its own schedule), up to `timeout`; fails at once when it already runs a
/// newer plan (this one is superseded: waiting would only delay the newer one here).
async fn wait_for_stage(addr: &str, hash: &str, epoch: u64, timeout: Duration) -> Result<()> {
    let t0 = Instant::now();
    let mut last = String::new();
    while t0.elapsed() < timeout {
        match WorkerClient::connect(addr.to_string()).await {
            Ok(mut c) => match c.status(proto::StatusRequest {}).await {
                Ok(r) => {
                    let r = r.into_inner();
                    if r.plan_hash == hash && r.role == "stage" {
                        return Ok(());
                    }
                    // The peer already runs a newer plan: this one is superseded (the newer
                    // one is applied next), so stop waiting for it.
                    if r.epoch > epoch {
                        return Err(ClusterError::NoWorker(format!(
                            "plan {hash} (epoch {epoch}) is superseded: {addr} runs epoch {}",
                            r.epoch
                        )));
                    }
                    last = format!("at plan {} as {}", r.plan_hash, r.role);
                }
                Err(s) => last = s.message().to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(ClusterError::NoWorker(format!(
        "the next stage {addr} did not take plan {hash} within {timeout:?} ({last})"
    )))
}

/// Measures the link to a peer: latency from small pings (half the median round trip),
/// bandwidth from 1 MiB pings (both directions counted).
pub async fn measure_link(addr: &str) -> Result<LinkMeasure> {
    let channel = tonic::transport::Endpoint::from_shared(addr.to_string())?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .connect()
        .await?;
    let mut c = WorkerClient::new(channel)
        .max_decoding_message_size(16 << 20)
        .max_encoding_message_size(16 << 20);
    let mut rtts = Vec::new();
    for _ in 0..7 {
        let t0 = Instant::now();
        c.ping(proto::PingRequest {
            payload: vec![0; 64],
        })
        .await?;
        rtts.push(t0.elapsed().as_secs_f64());
    }
    rtts.sort_by(f64::total_cmp);
    let rtt = rtts[rtts.len() / 2];
    let big = vec![0x5au8; 1 << 20];
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t0 = Instant::now();
        c.ping(proto::PingRequest {
            payload: big.clone(),
        })
        .await?;
        best = best.min(t0.elapsed().as_secs_f64());
    }
    Ok(LinkMeasure {
        latency_s: rtt / 2.0,
        bandwidth_bytes_per_s: (2 << 20) as f64 / (best - rtt).max(1e-6),
    })
}

fn engine_config(shape: EngineShape, threads: usize) -> EngineConfig {
    EngineConfig {
        slots: shape.slots,
        ctx: shape.ctx,
        ubatch: shape.ubatch,
        step_tokens: shape.ubatch.max(shape.slots + 1),
        threads,
        ..EngineConfig::default()
    }
}

impl Node {
    /// Loads `plan`: keeps the role when this worker's pipeline is unchanged, else tears it
    /// down and builds the new one.
    async fn apply(&self, plan: ClusterPlan) -> Result<()> {
        let mine = plan
            .stage_of(&self.id)
            .map(|(p, i, _)| (plan.pipelines[p].clone(), i));
        let old = {
            let mut cur = self.cur.lock().map_err(|_| ClusterError::LeaseLost)?;
            cur.plan = Some(plan.clone());
            let same = match (&cur.pipeline, &mine) {
                (Some(a), Some((b, _))) => a.stages == b.stages,
                (None, None) => true,
                _ => false,
            };
            if same {
                tracing::info!(
                    epoch = plan.epoch,
                    role = cur.role.name(),
                    "plan leaves this worker's role as it is"
                );
                return Ok(());
            }
            cur.pipeline = None;
            std::mem::replace(&mut cur.role, Role::Idle)
        };
        // The old role ends: running sessions finish (a head whose next stage is gone fails
        // them at its next pass; the router resumes them on the new plan).
        if let Role::Replica { engine } | Role::Head { engine } = old {
            tokio::task::spawn_blocking(move || engine.shutdown());
        }
        let Some((pipeline, idx)) = mine else {
            tracing::info!(epoch = plan.epoch, "not in the plan: idle");
            return Ok(());
        };
        let stage = pipeline.stages[idx].clone();
        let cfg = engine_config(plan.shape, self.threads);
        let model = self.model_for(stage.layers.clone()).await?;
        let role = if pipeline.stages.len() == 1 {
            // A replica answers whole requests: its first one should not pay for reading
            // the weights in. (A pipeline's head does not warm up: its rows go downstream.)
            let cfg = EngineConfig {
                warmup: self.warmup,
                ..cfg
            };
            let pieces = self.pieces.clone();
            let e = tokio::task::spawn_blocking(move || Engine::start(model, pieces, cfg))
                .await
                .map_err(|e| ClusterError::Invalid {
                    what: "starting a replica",
                    reason: e.to_string(),
                })??;
            Role::Replica {
                engine: Arc::new(e),
            }
        } else if idx == 0 {
            // The later stages first take the plan; then this head opens the stream.
            let next = &pipeline.stages[1].addr;
            // Mark the plan before waiting, so the router sees a head that is coming up.
            wait_for_stage(next, &plan.hash, plan.epoch, Duration::from_secs(30)).await?;
            let link = GrpcStageLink::connect(
                next,
                plan.epoch,
                &plan.hash,
                self.model.vocab(),
                self.step_timeout,
            )
            .await?
            .with_dtype(plan.shape.link);
            let head = PipelineHead {
                layers: stage.layers.end,
                link: Box::new(link),
                in_flight: plan.shape.in_flight,
            };
            let e = Engine::start_pipeline(model, self.pieces.clone(), cfg, head)?;
            Role::Head {
                engine: Arc::new(e),
            }
        } else {
            Role::Stage {
                layers: stage.layers.clone(),
                next: pipeline.stages.get(idx + 1).map(|s| s.addr.clone()),
                model,
            }
        };
        tracing::info!(
            epoch = plan.epoch,
            role = role.name(),
            layers = ?stage.layers,
            stages = pipeline.stages.len(),
            "took a role"
        );
        let mut cur = self.cur.lock().map_err(|_| ClusterError::LeaseLost)?;
        // A newer plan may have come meanwhile: then this role is replaced at its turn.
        cur.role = role;
        cur.pipeline = Some(pipeline);
        cur.since_epoch = plan.epoch;
        cur.since_hash = plan.hash.clone();
        drop(cur);
        self.role_changes.send_modify(|n| *n += 1);
        Ok(())
    }

    /// The model a role running `layers` runs on: the loaded model, or `layers` of the staged
    /// package — its tensors fetched from the registered workers when the store lacks them
    /// (verified by hash), then loaded. The last one loaded is kept while roles keep its
    /// layers; a new one replaces it (the old is freed as its role ends).
    async fn model_for(&self, layers: std::ops::Range<usize>) -> Result<Arc<Model>> {
        let p = match &self.model {
            WorkerModel::Loaded(m) => return Ok(m.clone()),
            WorkerModel::Staged(p) => p.clone(),
        };
        let mut loaded = self.loaded.lock().await;
        if let Some((l, m)) = loaded.as_ref()
            && *l == layers
        {
            return Ok(m.clone());
        }
        *loaded = None;
        let names = Model::stage_tensor_names(&p.ir, layers.clone());
        let (etcd, cluster) = self.cluster.clone().ok_or_else(|| ClusterError::Invalid {
            what: "staged model",
            reason: "no cluster to fetch tensors from".into(),
        })?;
        let rep = crate::fetch::fetch_package_part(
            &etcd,
            &cluster,
            &p.hash,
            &p.store,
            &self.id,
            Some(&names),
        )
        .await?;
        tracing::info!(
            layers = ?layers,
            tensors = names.len(),
            fetched = rep.fetched,
            of = rep.objects,
            bytes = rep.bytes,
            peers = ?rep.peers,
            seconds = rep.seconds,
            "a stage's tensors are in the store"
        );
        let l2 = layers.clone();
        let m = tokio::task::spawn_blocking(move || -> Result<Model> {
            let store = synapse_cas::Store::open_existing(&p.store)?;
            let pkg = synapse_cas::Package::open_in_store(&store, &p.hash.hex())?;
            let pm = synapse_import::PackageModel::from_package_only(pkg, &names)?;
            Ok(Model::load_package_stage(&pm, l2)?)
        })
        .await
        .map_err(|e| ClusterError::Invalid {
            what: "loading a stage",
            reason: e.to_string(),
        })??;
        tracing::info!(layers = ?layers, weight_bytes = m.weight_bytes(), "loaded a stage's layers");
        let m = Arc::new(m);
        *loaded = Some((layers, m.clone()));
        Ok(m)
    }

    /// Out of the cluster (its lease is gone): no role, no plan, so no request or packet is
    /// taken until a new membership loads a plan again.
    fn leave(&self) {
        self.teardown();
        if let Ok(mut cur) = self.cur.lock() {
            cur.plan = None;
            cur.since_epoch = 0;
            cur.since_hash.clear();
        }
        self.role_changes.send_modify(|n| *n += 1);
    }

    fn teardown(&self) {
        if let Ok(mut cur) = self.cur.lock() {
            cur.pipeline = None;
            if let Role::Replica { engine } | Role::Head { engine } =
                std::mem::replace(&mut cur.role, Role::Idle)
            {
                std::thread::spawn(move || engine.shutdown());
            }
        }
    }
}

/// A node in no role, serving the worker protocol on `listener`.
fn start_node(
    id: &str,
    model: WorkerModel,
    pieces: Arc<dyn TokenPieces>,
    threads: usize,
    step_timeout: Duration,
    listener: tokio::net::TcpListener,
    serving: Serving,
) -> (
    Arc<Node>,
    tokio::task::JoinHandle<std::result::Result<(), tonic::transport::Error>>,
) {
    let node = Arc::new(Node {
        id: id.to_string(),
        model,
        cluster: serving.cluster,
        loaded: Default::default(),
        pieces,
        threads,
        step_timeout,
        warmup: serving.warmup,
        cur: Mutex::new(Current {
            role: Role::Idle,
            pipeline: None,
            since_epoch: 0,
            since_hash: String::new(),
            plan: None,
        }),
        role_changes: watch::channel(0).0,
        whole_rows: Default::default(),
        argmax_rows: Default::default(),
        sampled_rows: Default::default(),
        store: serving.store,
        constraints: serving.constraints,
    });
    let svc = WorkerServer::new(Service(node.clone()))
        .max_decoding_message_size(1 << 30)
        .max_encoding_message_size(1 << 30);
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (node, server)
}

/// Runs a worker until `shutdown` resolves (then it leaves the cluster: its lease is
/// revoked, so the leader replans at once) or its lease is lost (an error: it stops
/// serving, as its peers already consider it gone).
pub async fn run(cfg: WorkerConfig, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
    let local = listener.local_addr()?;
    let addr = cfg
        .advertise
        .clone()
        .unwrap_or_else(|| format!("http://{local}"));
    let (node, server) = start_node(
        &cfg.id,
        cfg.model.clone(),
        cfg.pieces.clone(),
        cfg.threads,
        cfg.step_timeout,
        listener,
        Serving {
            store: cfg.store.clone(),
            constraints: cfg.constraints.clone(),
            cluster: Some((cfg.etcd.clone(), cfg.cluster.clone())),
            warmup: cfg.warmup,
        },
    );
    tracing::info!(id = %cfg.id, %addr, %local, "worker listening; measuring");
    let model = cfg.model.clone();
    let (threads, mb, ms) = (cfg.threads, cfg.measure_bytes, cfg.measure_secs);
    let (rates, overhead) = tokio::task::spawn_blocking(move || match &model {
        WorkerModel::Loaded(m) => measure(m, threads, mb, ms),
        // No weight is held yet: measured on synthetic ones of the model's shapes.
        WorkerModel::Staged(p) => measure_synthetic(&p.ir, threads, mb, ms),
    })
    .await
    .map_err(|e| ClusterError::Invalid {
        what: "measurement",
        reason: e.to_string(),
    })??;
    let spec = match &cfg.model {
        WorkerModel::Loaded(m) => ModelSpec::of(m),
        WorkerModel::Staged(p) => ModelSpec::of_ir(&p.ir),
    };
    let mut profile = WorkerProfile {
        id: cfg.id.clone(),
        addr: addr.clone(),
        model: spec.fingerprint.clone(),
        memory_bytes: cfg.memory.or_else(available_memory).unwrap_or(0),
        threads: cfg.threads,
        stream_rate: rates,
        dispatch_overhead_s: overhead,
        links: Default::default(),
        started_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    tracing::info!(rates = ?profile.stream_rate, overhead_s = profile.dispatch_overhead_s, memory = profile.memory_bytes, "measured");
    let keys = Keys::new(&cfg.cluster);
    tokio::pin!(shutdown);
    // A worker whose lease is lost (etcd unreachable for a TTL, or this process stopped
    // that long) stops serving at once, then joins again under a new lease.
    let result = loop {
        let session = member(&cfg, &keys, &node, &mut profile, &spec, &mut shutdown).await;
        match session {
            Ok(()) => break Ok(()),
            Err(ClusterError::LeaseLost) => {
                tracing::warn!("the lease is lost: serving stopped; joining again");
                node.leave();
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot reach the cluster; retrying");
                node.leave();
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    node.teardown();
    server.abort();
    result
}

/// One membership of the cluster: registered under a fresh lease until `shutdown` (then the
/// lease is revoked, so the leader replans at once: `Ok`) or the lease is lost (`LeaseLost`).
async fn member(
    cfg: &WorkerConfig,
    keys: &Keys,
    node: &Arc<Node>,
    profile: &mut WorkerProfile,
    spec: &ModelSpec,
    shutdown: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Result<()> {
    let joined = async {
        let mut client = membership::connect(&cfg.etcd).await?;
        let campaigner = membership::connect_with(&cfg.etcd, None).await?;
        let reg = membership::register(&mut client, keys, profile, cfg.lease_ttl_s).await?;
        Ok::<_, ClusterError>((client, campaigner, reg))
    };
    let (mut client, campaigner, reg) = tokio::select! {
        _ = &mut *shutdown => return Ok(()),
        r = joined => r?,
    };
    tracing::info!(lease = reg.lease, "registered");
    // The leader campaign, the plan and membership watches outlive etcd restarts and
    // dropped connections: each is retried while the lease lives.
    let leader = {
        let (c, cc, k, id, lease, shape, placement, spec) = (
            client.clone(),
            campaigner,
            keys.clone(),
            cfg.id.clone(),
            reg.lease,
            cfg.shape,
            cfg.placement,
            spec.clone(),
        );
        tokio::spawn(async move {
            loop {
                let r = membership::lead(
                    c.clone(),
                    k.clone(),
                    membership::Candidate {
                        id: id.clone(),
                        lease,
                        spec: spec.clone(),
                        shape,
                        placement,
                        campaign_client: Some(cc.clone()),
                    },
                )
                .await;
                if let Err(e) = r {
                    tracing::warn!(error = %e, "leadership ended; campaigning again");
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let (ptx, mut prx) = watch::channel(None);
    let plans = {
        let (c, k) = (client.clone(), keys.clone());
        tokio::spawn(async move {
            loop {
                if let Err(e) = membership::watch_plan(c.clone(), k.clone(), ptx.clone()).await {
                    tracing::warn!(error = %e, "plan watch failed; watching again");
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let (wtx, mut wrx) = watch::channel(Default::default());
    let members = {
        let (c, k) = (client.clone(), keys.clone());
        tokio::spawn(async move {
            loop {
                if let Err(e) = membership::watch_workers(c.clone(), k.clone(), wtx.clone()).await {
                    tracing::warn!(error = %e, "membership watch failed; watching again");
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let mut lost = reg.lost.clone();
    let mut retry: Option<(ClusterPlan, u32)> = None;
    let result = loop {
        tokio::select! {
            _ = &mut *shutdown => break Ok(()),
            r = lost.changed() => {
                if r.is_err() || *lost.borrow() {
                    break Err(ClusterError::LeaseLost);
                }
            }
            r = prx.changed() => {
                if r.is_err() {
                    break Err(ClusterError::NoWorker("the plan watch ended".into()));
                }
                let p = prx.borrow_and_update().clone();
                retry = None;
                if let Some(p) = p
                    && let Err(e) = node.apply(p.clone()).await
                {
                    tracing::error!(error = %e, "could not take the plan's role; trying again");
                    retry = Some((p, 1));
                }
            }
            // A role not taken (a peer not ready, a connection refused) is tried again
            // while its plan is the current one.
            _ = tokio::time::sleep(Duration::from_secs(1)), if retry.is_some() => {
                if let Some((p, n)) = retry.take()
                    && prx.borrow().as_ref().is_some_and(|q| q.hash == p.hash && q.epoch == p.epoch)
                    && let Err(e) = node.apply(p.clone()).await
                {
                    tracing::error!(error = %e, attempt = n + 1, "could not take the plan's role");
                    if n < 30 {
                        retry = Some((p, n + 1));
                    }
                }
            }
            r = wrx.changed() => {
                if r.is_err() {
                    break Err(ClusterError::NoWorker("the membership watch ended".into()));
                }
                let peers: Vec<(String, String)> = wrx
                    .borrow_and_update()
                    .values()
                    .filter(|w| w.id != profile.id && !profile.links.contains_key(&w.id))
                    .map(|w| (w.id.clone(), w.addr.clone()))
                    .collect();
                let mut changed = false;
                for (id, a) in peers {
                    match measure_link(&a).await {
                        Ok(l) => {
                            tracing::info!(peer = %id, latency_s = l.latency_s, bandwidth = l.bandwidth_bytes_per_s, "measured a link");
                            profile.links.insert(id, l);
                            changed = true;
                        }
                        Err(e) => tracing::warn!(peer = %id, error = %e, "link not measured"),
                    }
                }
                if changed
                    && let Err(e) = membership::put_profile(&mut client, keys, profile, reg.lease).await
                {
                    tracing::warn!(error = %e, "profile not updated");
                }
            }
        }
    };
    leader.abort();
    plans.abort();
    members.abort();
    if result.is_ok() {
        let _ = client.lease_revoke(reg.lease).await;
    }
    result
}

/// Starts serving the worker protocol for a fixed role without etcd (tests and tools): a
/// replica, or a pipeline stage of `layers`. Returns the bound address.
#[doc(hidden)]
pub async fn serve_fixed(
    model: Arc<Model>,
    pieces: Arc<dyn TokenPieces>,
    threads: usize,
    plan: ClusterPlan,
    id: &str,
) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    serve_fixed_at(listener, model, pieces, threads, plan, id).await
}

/// [`serve_fixed`] on a listener the caller bound (so a plan can name its address before
/// the worker serves it).
pub async fn serve_fixed_at(
    listener: tokio::net::TcpListener,
    model: Arc<Model>,
    pieces: Arc<dyn TokenPieces>,
    threads: usize,
    plan: ClusterPlan,
    id: &str,
) -> Result<SocketAddr> {
    let local = listener.local_addr()?;
    let (node, _server) = start_node(
        id,
        WorkerModel::Loaded(model),
        pieces,
        threads,
        Duration::from_secs(30),
        listener,
        Serving::default(),
    );
    let n = node.clone();
    tokio::spawn(async move {
        if let Err(e) = n.apply(plan).await {
            tracing::error!(error = %e, "fixed role failed");
        }
    });
    Ok(local)
}
