//! The router: the OpenAI front end's [`Backend`] when the model runs on a cluster.
//!
//! It watches the published plan (no coordination-service call per request or token) and
//! sends each session to a replica or pipeline head: the head that served the longest
//! prefix of the prompt recently (prefix-cache affinity, in 16-token blocks) unless it is
//! full, else the one with the most free capacity for its measured speed. Events stream back
//! from the worker's `Generate` call.
//!
//! Failures: when the worker's stream breaks (the process died, a link went down) or a pass
//! failed on a pipeline, the session is resumed on another replica at once or, with no
//! other, on the plan the leader publishes once the lost worker's lease expires: the new
//! request carries the tokens already streamed as `forced`, the worker runs them as the
//! decode steps they were (checking each is chosen again) and the router skips their
//! events. The client sees one uninterrupted stream whose tokens equal an uninterrupted run.
//! What is claimed and what is not: `docs/cluster.md`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use synapse_runtime::engine::{
    Backend, EngineInfo, EngineStats, Event, Request, Session, SessionSink, SubmitError,
};
use tokio::sync::watch;
use tonic::transport::Channel;

use crate::error::Result;
use crate::membership::{self, Keys};
use crate::plan::ClusterPlan;
use crate::proto::worker_client::WorkerClient;
use crate::wire;

/// How the router runs.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// etcd endpoints.
    pub etcd: String,
    /// Cluster name.
    pub cluster: String,
    /// The served model's facts (vocabulary, fingerprint, profile, weights) as the front end
    /// read them from its copy; slots and context come from the plan.
    pub info: EngineInfo,
    /// Requests that may wait per pipeline beyond its slots.
    pub queue: usize,
    /// How long a session may wait for a worker (no plan yet, or resuming after a failure).
    pub resume_timeout: Duration,
    /// Most attempts per session (the first included).
    pub attempts: usize,
}

/// Prefix blocks remembered per routed prompt (affinity).
const BLOCK: usize = 16;
const REMEMBERED: usize = 4096;
/// How long a session whose every head failed waits for a new plan before trying the same
/// heads again.
const REPLAN_WAIT: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    rejected: AtomicU64,
    cancelled: AtomicU64,
    prompt_tokens: AtomicU64,
    generated: AtomicU64,
    resumed: AtomicU64,
}

/// Routes sessions to the cluster's workers.
pub struct ClusterRouter {
    cfg: RouterConfig,
    rt: tokio::runtime::Handle,
    plan: watch::Receiver<Option<ClusterPlan>>,
    clients: Mutex<HashMap<String, WorkerClient<Channel>>>,
    /// (head worker, prefix block hashes) of recent sessions, newest last.
    recent: Mutex<VecDeque<(String, Vec<u64>)>>,
    /// Sessions in flight per head worker.
    inflight: Mutex<HashMap<String, usize>>,
    counters: Counters,
    next_id: AtomicU64,
    stopping: AtomicBool,
    watcher: tokio::task::JoinHandle<()>,
    me: std::sync::Weak<ClusterRouter>,
}

impl std::fmt::Debug for ClusterRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterRouter")
            .field("cluster", &self.cfg.cluster)
            .field("plan", &self.plan.borrow().as_ref().map(|p| p.epoch))
            .finish()
    }
}

/// Hashes of a prompt's whole 16-token blocks, each covering all blocks before it.
fn prefix_blocks(prompt: &[u32]) -> Vec<u64> {
    let mut h = blake3::Hasher::new();
    prompt
        .chunks_exact(BLOCK)
        .map(|c| {
            for t in c {
                h.update(&t.to_le_bytes());
            }
            let d = h.clone().finalize();
            u64::from_le_bytes(d.as_bytes()[..8].try_into().unwrap_or([0; 8]))
        })
        .collect()
}

impl ClusterRouter {
    /// Connects to etcd and starts watching the plan (inside a Tokio runtime).
    pub async fn start(cfg: RouterConfig) -> Result<Arc<Self>> {
        let client = membership::connect(&cfg.etcd).await?;
        let keys = Keys::new(&cfg.cluster);
        let (tx, rx) = watch::channel(None);
        let watcher = tokio::spawn(async move {
            loop {
                if let Err(e) =
                    membership::watch_plan(client.clone(), keys.clone(), tx.clone()).await
                {
                    tracing::warn!(error = %e, "plan watch failed; retrying");
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Ok(Arc::new_cyclic(|me| ClusterRouter {
            me: me.clone(),
            cfg,
            rt: tokio::runtime::Handle::current(),
            plan: rx,
            clients: Mutex::new(HashMap::new()),
            recent: Mutex::new(VecDeque::new()),
            inflight: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            next_id: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            watcher,
        }))
    }

    /// The newest plan seen.
    pub fn plan(&self) -> Option<ClusterPlan> {
        self.plan.borrow().clone()
    }

    /// Sessions resumed on another worker after a failure.
    pub fn resumed(&self) -> u64 {
        self.counters.resumed.load(Ordering::Relaxed)
    }

    fn capacity(&self) -> usize {
        match self.plan.borrow().as_ref() {
            Some(p) => p.pipelines.len() * (p.shape.slots + self.cfg.queue),
            None => self.cfg.queue,
        }
    }

    fn total_inflight(&self) -> usize {
        self.inflight.lock().map_or(0, |m| m.values().sum())
    }

    /// The head to send `blocks` to on `plan`, avoiding `avoid`.
    fn choose(
        &self,
        plan: &ClusterPlan,
        blocks: &[u64],
        avoid: &[String],
    ) -> Option<(String, String)> {
        let inflight = self.inflight.lock().ok()?;
        let heads: Vec<(&str, &str, f64)> = plan
            .pipelines
            .iter()
            .filter_map(|p| {
                p.stages
                    .first()
                    .map(|s| (s.worker.as_str(), s.addr.as_str(), p.tokens_per_s))
            })
            .filter(|(w, _, _)| !avoid.iter().any(|a| a == w))
            .collect();
        let slots = plan.shape.slots.max(1);
        let load = |w: &str| inflight.get(w).copied().unwrap_or(0);
        // Affinity: the longest remembered prefix on a head with a free slot.
        if !blocks.is_empty()
            && let Ok(recent) = self.recent.lock()
        {
            let mut best: Option<(usize, &str, &str)> = None;
            for (w, bs) in recent.iter().rev() {
                let common = bs.iter().zip(blocks).take_while(|(a, b)| a == b).count();
                if common == 0 {
                    continue;
                }
                if let Some(&(hw, ha, _)) = heads.iter().find(|h| h.0 == w.as_str())
                    && load(hw) < slots
                    && best.is_none_or(|b| common > b.0)
                {
                    best = Some((common, hw, ha));
                }
            }
            if let Some((_, w, a)) = best {
                return Some((w.to_string(), a.to_string()));
            }
        }
        // Else the most free capacity for its speed.
        heads
            .iter()
            .min_by(|a, b| {
                let la = (load(a.0) + 1) as f64 / a.2.max(1e-9);
                let lb = (load(b.0) + 1) as f64 / b.2.max(1e-9);
                la.total_cmp(&lb).then_with(|| a.0.cmp(b.0))
            })
            .map(|(w, a, _)| (w.to_string(), a.to_string()))
    }

    async fn client(&self, addr: &str) -> Result<WorkerClient<Channel>> {
        if let Some(c) = self.clients.lock().ok().and_then(|m| m.get(addr).cloned()) {
            return Ok(c);
        }
        let ch = tonic::transport::Endpoint::from_shared(addr.to_string())?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .connect()
            .await?;
        let c = WorkerClient::new(ch);
        if let Ok(mut m) = self.clients.lock() {
            m.insert(addr.to_string(), c.clone());
        }
        Ok(c)
    }

    fn forget_client(&self, addr: &str) {
        if let Ok(mut m) = self.clients.lock() {
            m.remove(addr);
        }
    }

    /// A plan to route on: the newest, once it is not `older_than` (the epoch a failure was
    /// seen on, when no other head is left there); waits until `deadline`.
    async fn wait_plan(&self, avoid_epoch: Option<u64>, deadline: Instant) -> Option<ClusterPlan> {
        let mut rx = self.plan.clone();
        loop {
            if let Some(p) = rx.borrow_and_update().clone()
                && avoid_epoch.is_none_or(|e| p.epoch > e)
            {
                return Some(p);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            if tokio::time::timeout(left, rx.changed()).await.is_err() {
                return None;
            }
        }
    }

    async fn drive(self: Arc<Self>, req: crate::proto::GenerateRequest, sink: SessionSink) {
        let blocks = prefix_blocks(&req.prompt);
        let mut delivered: Vec<u32> = Vec::new();
        let mut admitted = false;
        let mut failed: Vec<String> = Vec::new();
        let mut failed_epoch: Option<u64> = None;
        let mut last_error = String::from("no worker took the request");
        let deadline = Instant::now() + self.cfg.resume_timeout;
        for attempt in 0..self.cfg.attempts.max(1) {
            if sink.cancelled() {
                self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
                return;
            }
            // On the plan of the failure, another head if there is one; else a newer plan.
            let plan = match self.wait_plan(None, deadline).await {
                Some(p) if failed_epoch != Some(p.epoch) => {
                    failed.clear();
                    p
                }
                Some(p) if self.choose(&p, &blocks, &failed).is_some() => p,
                // Every head of the failure's plan failed: a newer plan (the leader replans
                // once the lost worker's lease expires), or, if none comes within
                // REPLAN_WAIT, this plan's heads again (the failure may have been passing).
                Some(p) => {
                    let until = deadline.min(Instant::now() + REPLAN_WAIT);
                    failed.clear();
                    self.wait_plan(failed_epoch, until).await.unwrap_or(p)
                }
                None => break,
            };
            let Some((head, addr)) = self.choose(&plan, &blocks, &failed) else {
                last_error = format!("plan {} has no pipeline", plan.epoch);
                failed_epoch = Some(plan.epoch);
                continue;
            };
            if attempt > 0 {
                self.counters.resumed.fetch_add(1, Ordering::Relaxed);
                tracing::info!(%head, epoch = plan.epoch, known = delivered.len(), "resuming a session");
            }
            if let Ok(mut r) = self.recent.lock() {
                if r.len() >= REMEMBERED {
                    r.pop_front();
                }
                r.push_back((head.clone(), blocks.clone()));
            }
            if let Ok(mut m) = self.inflight.lock() {
                *m.entry(head.clone()).or_default() += 1;
            }
            let outcome = self
                .attempt(&req, &plan, &addr, &mut delivered, &mut admitted, &sink)
                .await;
            if let Ok(mut m) = self.inflight.lock()
                && let Some(n) = m.get_mut(&head)
            {
                *n = n.saturating_sub(1);
            }
            match outcome {
                Attempt::Finished => return,
                Attempt::Fatal(m) => {
                    let _ = sink.send(Event::Error(m));
                    return;
                }
                Attempt::Retry(m) => {
                    tracing::warn!(%head, error = %m, "session lost its worker");
                    self.forget_client(&addr);
                    last_error = m;
                    failed.push(head);
                    failed_epoch = Some(plan.epoch);
                    tokio::time::sleep(Duration::from_millis(100 << attempt.min(4))).await;
                }
            }
        }
        let _ = sink.send(Event::Error(format!(
            "the cluster could not finish the request: {last_error}"
        )));
    }

    async fn attempt(
        &self,
        req: &crate::proto::GenerateRequest,
        plan: &ClusterPlan,
        addr: &str,
        delivered: &mut Vec<u32>,
        admitted: &mut bool,
        sink: &SessionSink,
    ) -> Attempt {
        let mut g = req.clone();
        g.epoch = plan.epoch;
        g.plan_hash = plan.hash.clone();
        g.forced = delivered.clone();
        let mut client = match self.client(addr).await {
            Ok(c) => c,
            Err(e) => return Attempt::Retry(e.to_string()),
        };
        let mut stream = match client.generate(g).await {
            Ok(s) => s.into_inner(),
            Err(s) => {
                return match s.code() {
                    tonic::Code::InvalidArgument => Attempt::Fatal(s.message().to_string()),
                    _ => Attempt::Retry(format!("{}: {}", addr, s.message())),
                };
            }
        };
        let mut skip = delivered.len();
        loop {
            let m = tokio::select! {
                _ = sink.closed() => {
                    self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
                    return Attempt::Finished;
                }
                m = stream.message() => m,
            };
            let ev = match m {
                Ok(Some(ev)) => match wire::event_from_wire(ev) {
                    Ok(e) => e,
                    Err(e) => return Attempt::Retry(e.to_string()),
                },
                Ok(None) => return Attempt::Retry(format!("{addr}: the stream ended early")),
                Err(s) => return Attempt::Retry(format!("{addr}: {}", s.message())),
            };
            match ev {
                Event::Admitted { .. } => {
                    if !*admitted {
                        *admitted = true;
                        let _ = sink.send(ev);
                    }
                }
                Event::Token(t) => {
                    if skip > 0 {
                        skip -= 1;
                    } else {
                        delivered.push(t.id);
                        self.counters.generated.fetch_add(1, Ordering::Relaxed);
                        if !sink.send(Event::Token(t)) {
                            self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
                            return Attempt::Finished;
                        }
                    }
                }
                Event::Done(_) => {
                    let _ = sink.send(ev);
                    return Attempt::Finished;
                }
                Event::Error(m) => {
                    // A failed pass (a lost stage) is retried; anything else is the answer.
                    return if m.starts_with("engine error") {
                        Attempt::Retry(m)
                    } else {
                        Attempt::Fatal(m)
                    };
                }
            }
        }
    }
}

enum Attempt {
    Finished,
    Retry(String),
    Fatal(String),
}

impl Backend for ClusterRouter {
    fn submit(&self, req: Request) -> std::result::Result<Session, SubmitError> {
        if self.stopping.load(Ordering::Relaxed) {
            return Err(SubmitError::Stopped);
        }
        if req.constraint.as_ref().is_some_and(|c| c.spec().is_none()) {
            return Err(SubmitError::Invalid {
                param: "response_format",
                reason: "this constraint cannot be sent to a worker".into(),
            });
        }
        if req.escalation {
            return Err(SubmitError::Invalid {
                param: "escalation",
                reason: "a cluster has no draft profile".into(),
            });
        }
        let info = self.info();
        synapse_runtime::engine::validate(&req, info.ctx, info.vocab)?;
        let inflight = self.total_inflight();
        if inflight >= self.capacity() {
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(SubmitError::QueueFull {
                queued: inflight,
                retry_after_s: 1,
            });
        }
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        self.counters
            .prompt_tokens
            .fetch_add(req.prompt.len() as u64, Ordering::Relaxed);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (session, sink) = Session::remote(id);
        let me = self.me.upgrade().ok_or(SubmitError::Stopped)?;
        self.rt
            .spawn(me.drive(wire::request_to_wire(&req, 0, ""), sink));
        Ok(session)
    }

    fn stats(&self) -> EngineStats {
        let (slots, pipelines) = self
            .plan
            .borrow()
            .as_ref()
            .map_or((0, 0), |p| (p.shape.slots, p.pipelines.len()));
        let (mut active, mut queued) = (0, 0);
        if let Ok(m) = self.inflight.lock() {
            for &n in m.values() {
                active += n.min(slots);
                queued += n.saturating_sub(slots);
            }
        }
        let c = &self.counters;
        EngineStats {
            queued,
            active,
            slots: slots * pipelines,
            requests: c.requests.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            cancelled: c.cancelled.load(Ordering::Relaxed),
            prompt_tokens: c.prompt_tokens.load(Ordering::Relaxed),
            generated_tokens: c.generated.load(Ordering::Relaxed),
            ..EngineStats::default()
        }
    }

    fn info(&self) -> EngineInfo {
        let mut i = self.cfg.info.clone();
        if let Some(p) = self.plan.borrow().as_ref() {
            i.slots = p.shape.slots * p.pipelines.len();
            i.ctx = p.shape.ctx;
        }
        i.kernel_path = "cluster".into();
        i
    }

    fn shutdown(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        let t0 = Instant::now();
        while self.total_inflight() > 0 && t0.elapsed() < Duration::from_secs(600) {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.watcher.abort();
    }
}
