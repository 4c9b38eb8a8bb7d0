//! TEMPORARY STUB of the engine (synapse-server's branch only; replaced by the lead's engine
//! on merge): one worker thread runs requests one at a time through [`crate::generate`].
//! No logprobs, no constraints, no logit bias, no cancellation mid-run.

mod api;

pub use api::*;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

use crate::{Executor, GenerateParams, KvCache, Model, StopReason};

struct Job {
    req: Request,
    tx: UnboundedSender<Event>,
    cancel: Arc<AtomicBool>,
}

#[derive(Default)]
struct Counters {
    queued: AtomicUsize,
    active: AtomicUsize,
    requests: AtomicU64,
    rejected: AtomicU64,
    cancelled: AtomicU64,
    prompt_tokens: AtomicU64,
    prefix_hit_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    steps: AtomicU64,
}

/// The engine (stub).
pub struct Engine {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    counters: Arc<Counters>,
    next_id: AtomicU64,
    cfg: EngineConfig,
    info: EngineInfo,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish()
    }
}

impl Engine {
    /// Starts the worker.
    pub fn start(
        model: Arc<Model>,
        pieces: Arc<dyn TokenPieces>,
        cfg: EngineConfig,
    ) -> crate::Result<Engine> {
        let mut exec = Executor::new(model.clone(), cfg.threads)?;
        let chunk = cfg.ubatch.min(cfg.ctx).max(1);
        let mut kv = KvCache::new(&model, cfg.kv_dtype, 1, cfg.ctx, chunk)?;
        let info = EngineInfo {
            slots: cfg.slots,
            ctx: cfg.ctx,
            vocab: model.vocab(),
            fingerprint: model.ir.fingerprint.clone(),
            weight_bytes: model.weight_bytes() as u64,
            kernel_path: exec.kernel_path().name().to_string(),
        };
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        let (tx, rx) = mpsc::channel::<Job>();
        let worker = std::thread::spawn(move || {
            while let Ok(job) = rx.recv() {
                c.queued.fetch_sub(1, Ordering::Relaxed);
                if job.cancel.load(Ordering::Relaxed) {
                    c.cancelled.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                c.active.fetch_add(1, Ordering::Relaxed);
                let _ = job.tx.send(Event::Admitted { cached_tokens: 0 });
                let params = GenerateParams {
                    max_tokens: job.req.max_tokens,
                    sampling: job.req.sampling.clone(),
                    stop: job.req.stop.clone(),
                    prefill_chunk: chunk,
                    stop_at_eog: job.req.stop_at_eog,
                };
                let pending: std::cell::RefCell<Option<TokenEvent>> = Default::default();
                let tx = job.tx.clone();
                let flush = |tx: &UnboundedSender<Event>| {
                    if let Some(t) = pending.borrow_mut().take() {
                        let _ = tx.send(Event::Token(t));
                    }
                };
                let mut piece = |id: u32| {
                    flush(&tx);
                    *pending.borrow_mut() = Some(TokenEvent {
                        id,
                        text: String::new(),
                        logprob: None,
                    });
                    String::from_utf8_lossy(&pieces.piece(id)).into_owned()
                };
                let mut on_text = |s: &str| {
                    if let Some(t) = pending.borrow_mut().as_mut() {
                        t.text.push_str(s);
                    }
                };
                let r = crate::generate(
                    &mut exec,
                    &mut kv,
                    0,
                    &job.req.prompt,
                    &params,
                    &mut piece,
                    &mut on_text,
                );
                flush(&tx);
                match r {
                    Ok(g) => {
                        c.requests.fetch_add(1, Ordering::Relaxed);
                        c.prompt_tokens
                            .fetch_add(job.req.prompt.len() as u64, Ordering::Relaxed);
                        c.prefix_hit_tokens
                            .fetch_add(g.reused_prefix as u64, Ordering::Relaxed);
                        c.generated_tokens
                            .fetch_add(g.tokens.len() as u64, Ordering::Relaxed);
                        c.steps.fetch_add(1, Ordering::Relaxed);
                        let reason = match g.stop {
                            StopReason::Eog | StopReason::StopString => FinishReason::Stop,
                            _ => FinishReason::Length,
                        };
                        let _ = job.tx.send(Event::Done(Finished {
                            reason,
                            prompt_tokens: job.req.prompt.len(),
                            cached_tokens: g.reused_prefix,
                            completion_tokens: g.tokens.len(),
                            tail: String::new(),
                        }));
                    }
                    Err(e) => {
                        let _ = job.tx.send(Event::Error(e.to_string()));
                    }
                }
                c.active.fetch_sub(1, Ordering::Relaxed);
            }
        });
        Ok(Engine {
            tx: Mutex::new(Some(tx)),
            worker: Mutex::new(Some(worker)),
            counters,
            next_id: AtomicU64::new(1),
            cfg,
            info,
        })
    }

    /// Submits a request.
    pub fn submit(&self, req: Request) -> Result<Session, SubmitError> {
        if req.prompt.len() + 1 > self.cfg.ctx {
            return Err(SubmitError::PromptTooLong {
                tokens: req.prompt.len(),
                limit: self.cfg.ctx,
            });
        }
        let guard = self.tx.lock().unwrap();
        let Some(tx) = guard.as_ref() else {
            return Err(SubmitError::Stopped);
        };
        let q = self.counters.queued.load(Ordering::Relaxed);
        let busy = q + self.counters.active.load(Ordering::Relaxed);
        if busy >= self.cfg.queue + self.cfg.slots {
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(SubmitError::QueueFull {
                queued: q,
                retry_after_s: 1,
            });
        }
        self.counters.queued.fetch_add(1, Ordering::Relaxed);
        let (etx, erx) = unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        tx.send(Job {
            req,
            tx: etx,
            cancel: cancel.clone(),
        })
        .map_err(|_| SubmitError::Stopped)?;
        Ok(Session {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            events: erx,
            cancel,
        })
    }

    /// Statistics.
    pub fn stats(&self) -> EngineStats {
        let c = &self.counters;
        EngineStats {
            queued: c.queued.load(Ordering::Relaxed),
            active: c.active.load(Ordering::Relaxed),
            slots: self.cfg.slots,
            requests: c.requests.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            cancelled: c.cancelled.load(Ordering::Relaxed),
            prompt_tokens: c.prompt_tokens.load(Ordering::Relaxed),
            prefix_hit_tokens: c.prefix_hit_tokens.load(Ordering::Relaxed),
            generated_tokens: c.generated_tokens.load(Ordering::Relaxed),
            steps: c.steps.load(Ordering::Relaxed),
            kv_bytes: 0,
            kv_budget_bytes: 0,
        }
    }

    /// Fixed facts.
    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// Stops accepting; waits for the worker.
    pub fn shutdown(&self) {
        self.tx.lock().unwrap().take();
        if let Some(w) = self.worker.lock().unwrap().take() {
            let _ = w.join();
        }
    }
}
