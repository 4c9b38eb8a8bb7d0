//! The serving engine: continuous batching of many sessions over one executor.
//!
//! [`Engine::start`] moves a [`Scheduler`] (executor + KV cache + sessions) onto its own
//! thread. [`Engine::submit`] validates a [`Request`] and hands it over; the returned
//! [`Session`] streams [`Event`]s back (`Admitted`, `Token`s, then `Done` or `Error`).
//! Dropping a `Session` cancels it: a client that goes away frees its slot at the next step.
//!
//! Admission goes through a memory ledger: the weights are counted once, each slot's KV for
//! its full context (`EngineConfig::ctx`), and `Engine::start` refuses a configuration that
//! does not fit `EngineConfig::memory`. Requests beyond the free slots wait in a bounded
//! queue; past it [`Engine::submit`] answers [`SubmitError::QueueFull`] (the server's 503).
//! A prompt that does not fit the context is refused ([`SubmitError::PromptTooLong`]), never
//! truncated.
//!
//! Architecture invariant: the engine knows token ids, never text encodings or HTTP; text
//! comes through the [`TokenPieces`] port, constraints through [`Constraint`].

mod api;
mod head;
mod scheduler;
mod session;
mod stats;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Instant;

pub use api::{
    Canceller, Constraint, EngineConfig, EngineInfo, EngineStats, Event, FinishReason, Finished,
    Logprob, MemoryLedger, Request, Session, SessionSink, SubmitError, TokenEvent, TokenPieces,
};
pub use scheduler::{MAX_TOP_LOGPROBS, PipelineHead, Scheduler, kv_and_scratch_bytes, validate};

use crate::error::Result;
use crate::load::Model;
use session::Waiting;
use stats::SharedStats;

enum Cmd {
    Submit(Box<Waiting>),
    /// Install a precision profile of the running model; the result goes back.
    Install(Arc<Model>, mpsc::Sender<Result<()>>),
    Stop,
}

/// A running engine (cheap to share: `Send + Sync`).
pub struct Engine {
    tx: Mutex<mpsc::Sender<Cmd>>,
    stats: Arc<SharedStats>,
    info: EngineInfo,
    cfg: EngineConfig,
    next_id: AtomicU64,
    stopping: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("info", &self.info)
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl Engine {
    /// Starts the scheduler thread for `model`.
    pub fn start(
        model: Arc<Model>,
        pieces: Arc<dyn TokenPieces>,
        cfg: EngineConfig,
    ) -> Result<Engine> {
        let sched = Scheduler::new(model.clone(), pieces, cfg.clone())?;
        Self::spawn(model, sched, cfg)
    }

    /// Starts the scheduler thread of a layer pipeline's first stage
    /// ([`Scheduler::new_pipeline`]).
    pub fn start_pipeline(
        model: Arc<Model>,
        pieces: Arc<dyn TokenPieces>,
        cfg: EngineConfig,
        head: PipelineHead,
    ) -> Result<Engine> {
        let sched = Scheduler::new_pipeline(model.clone(), pieces, cfg.clone(), head)?;
        Self::spawn(model, sched, cfg)
    }

    fn spawn(model: Arc<Model>, mut sched: Scheduler, cfg: EngineConfig) -> Result<Engine> {
        if cfg.warmup {
            sched.warm_up()?;
        }
        let stats = sched.stats.clone();
        let info = EngineInfo {
            slots: cfg.slots,
            ctx: cfg.ctx,
            vocab: model.vocab(),
            fingerprint: model.ir.fingerprint.clone(),
            weight_bytes: model.weight_bytes() as u64,
            kernel_path: sched.executor().kernel_path().name().to_string(),
            profile: model.profile.hash().to_string(),
            draft_profile: cfg
                .draft
                .as_ref()
                .map(|d| d.profile.hash())
                .or(sched.head_shortlist_base().map(|n| format!("head:{n}"))),
            source_profile: crate::PrecisionProfile::source(&model.ir).hash(),
            memory: sched.ledger(),
        };
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("synapse-engine".into())
            .spawn(move || run(sched, rx))
            .map_err(|e| crate::RuntimeError::InvalidParam {
                name: "engine thread",
                reason: e.to_string(),
            })?;
        Ok(Engine {
            tx: Mutex::new(tx),
            stats,
            info,
            cfg,
            next_id: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Validates `req` and queues it; never blocks on the engine.
    pub fn submit(&self, req: Request) -> std::result::Result<Session, SubmitError> {
        if self.stopping.load(Ordering::Relaxed) {
            return Err(SubmitError::Stopped);
        }
        scheduler::validate(&req, self.cfg.ctx, self.info.vocab)?;
        let s = &self.stats;
        // Reserve a place first, then read the active count: the scheduler raises `active`
        // before it lowers `pending`, so this order never sees an admitted session in neither
        // (and two submitters cannot both take the last place).
        let pending = s.pending.fetch_add(1, Ordering::SeqCst) as usize;
        let free = self
            .cfg
            .slots
            .saturating_sub(s.active.load(Ordering::SeqCst) as usize);
        if pending >= self.cfg.queue + free {
            s.pending.fetch_sub(1, Ordering::SeqCst);
            s.rejected.fetch_add(1, Ordering::Relaxed);
            // Expected wait: the queue ahead over the slots, a couple of seconds each.
            let retry_after_s = (1 + pending / self.cfg.slots.max(1)).min(60) as u32;
            return Err(SubmitError::QueueFull {
                queued: pending,
                retry_after_s,
            });
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        s.requests.fetch_add(1, Ordering::Relaxed);
        let w = Waiting {
            id,
            req,
            tx: etx,
            cancel: cancel.clone(),
            since: Instant::now(),
        };
        let sent = match self.tx.lock() {
            Ok(tx) => tx.send(Cmd::Submit(Box::new(w))).is_ok(),
            Err(_) => false,
        };
        if !sent {
            s.pending.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::Stopped);
        }
        Ok(Session {
            id,
            events: erx,
            cancel,
        })
    }

    /// Current counters and gauges.
    pub fn stats(&self) -> EngineStats {
        self.stats.snapshot()
    }

    /// Facts about the engine: fixed ones, and the precision profile new sessions get now.
    pub fn info(&self) -> EngineInfo {
        let (profile, weight_bytes) = self.stats.profile();
        EngineInfo {
            profile,
            weight_bytes,
            ..self.info.clone()
        }
    }

    /// Installs `model` — the running model at another precision profile (e.g. a
    /// [`crate::promotion::Transition`]'s) — for the sessions admitted from now on; running
    /// sessions finish on their own profile. Blocks until the engine thread has installed it
    /// (or refused it: another model, or over `EngineConfig::memory` where its weights
    /// cannot page).
    pub fn install(&self, model: Arc<Model>) -> Result<()> {
        let (rtx, rrx) = mpsc::channel();
        let sent = match self.tx.lock() {
            Ok(tx) => tx.send(Cmd::Install(model, rtx)).is_ok(),
            Err(_) => false,
        };
        let stopped = || crate::RuntimeError::InvalidParam {
            name: "install",
            reason: "the engine has stopped".into(),
        };
        if !sent {
            return Err(stopped());
        }
        rrx.recv().map_err(|_| stopped())?
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Stops accepting requests, lets queued and running sessions finish, and returns once
    /// the engine thread has ended. Calling it again is a no-op.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        if let Ok(tx) = self.tx.lock() {
            let _ = tx.send(Cmd::Stop);
        }
        let handle = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What serves sessions, as the OpenAI front end sees it: an [`Engine`] in this process, or
/// a cluster's router that sends each session to a worker (the cluster crate). The port
/// that keeps the server free of where the model runs.
pub trait Backend: Send + Sync {
    /// Validates `req` and queues it; never blocks.
    fn submit(&self, req: Request) -> std::result::Result<Session, SubmitError>;
    /// Counters and gauges now.
    fn stats(&self) -> EngineStats;
    /// Facts about what serves (slots, context, vocabulary, profile, …).
    fn info(&self) -> EngineInfo;
    /// Stops accepting, lets running sessions finish, returns when they have.
    fn shutdown(&self);
}

impl Backend for Engine {
    fn submit(&self, req: Request) -> std::result::Result<Session, SubmitError> {
        Engine::submit(self, req)
    }
    fn stats(&self) -> EngineStats {
        Engine::stats(self)
    }
    fn info(&self) -> EngineInfo {
        Engine::info(self)
    }
    fn shutdown(&self) {
        Engine::shutdown(self)
    }
}

/// The engine thread: take commands, step while there is work, sleep on the channel when
/// there is none.
fn run(mut sched: Scheduler, rx: mpsc::Receiver<Cmd>) {
    let mut stopping = false;
    loop {
        if sched.is_idle() {
            if stopping {
                break;
            }
            match rx.recv() {
                Ok(Cmd::Submit(w)) => sched.enqueue(*w),
                Ok(Cmd::Install(m, r)) => {
                    let _ = r.send(sched.install(m));
                }
                Ok(Cmd::Stop) | Err(_) => stopping = true,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(Cmd::Submit(w)) => sched.enqueue(*w),
                Ok(Cmd::Install(m, r)) => {
                    let _ = r.send(sched.install(m));
                }
                Ok(Cmd::Stop) => stopping = true,
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    stopping = true;
                    break;
                }
            }
        }
        sched.step();
    }
    tracing::debug!("engine thread ends");
}
