//! Layer pipelines: one model's layers split into contiguous stages, each with its own
//! executor and the KV of its own layers.
//!
//! The first stage runs the scheduler (a [`crate::engine::Engine`] started with
//! [`crate::engine::Engine::start_pipeline`]), the token embedding and its layers; each pass it
//! hands a [`StepPacket`] — the pass's rows, the slot operations its cache recorded since the
//! last pass ([`KvOp`]) and the rows' hidden states — to its [`StageLink`]. A later stage
//! ([`StageRunner`]) replays the slot operations on its own cache, runs its layers on the
//! hidden states, and either goes on to its own downstream or, as the last stage, computes the
//! logits of the rows that want them; the logits travel back the same way.
//!
//! Architecture invariant: a row's float order is the same whichever stage runs its layers
//! (the rows and their order classes travel unchanged, hidden states as exact `f32`), so a
//! pipeline's logits are bit-identical to one executor's (`tests/pipeline.rs`). The runtime
//! knows no transport: a link is a trait; the cluster crate implements it over gRPC, the
//! tests in process.
//!
//! Every stage checks every row against its own cache (position = the slot's next position,
//! slot of this profile), so stages that fall out of step fail the pass instead of computing
//! from the wrong K/V.

use std::sync::Arc;

use crate::error::{Result, RuntimeError};
use crate::executor::{Executor, Row, StageOut};
use crate::kv::{KvCache, KvDtype, KvOp};
use crate::load::Model;

/// One pass as the next stage receives it.
#[derive(Debug, Clone, Copy)]
pub struct StepPacket<'a> {
    /// Slot operations to replay on the stage's cache before the rows run.
    pub ops: &'a [KvOp],
    /// The pass's rows (slot, position, token, logits wanted, order class).
    pub rows: &'a [Row],
    /// The rows' hidden states after the previous stage's last layer (`rows × hidden`).
    pub hidden: &'a [f32],
    /// Per logits row (in row order): what the first stage reads of it ([`RowRead`]), so
    /// a transport may send a token id back instead of the row; empty: every row whole.
    pub reads: &'a [RowRead],
}

/// What the first stage reads of a logits row.
///
/// A link that answers a row by its token hands the first stage the one-hot row of that id
/// (0 there, `-inf` elsewhere): its greedy choice is that token, and a sampled choice from
/// it — the session's sampler drawing the same variate — too. A sampled row with nothing to
/// draw (every logit NaN) comes back as an all-NaN row, from which the sampler draws
/// nothing, as from the real one.
#[derive(Debug, Clone, PartialEq)]
pub enum RowRead {
    /// The whole row (a session verifying drafts).
    Whole,
    /// Only its argmax (a greedy session with nothing modifying its logits).
    Argmax,
    /// Only the token drawn with these parameters and variate (a sampled session with
    /// nothing modifying its logits): the last stage samples.
    Sample(crate::sampling::SampleAt),
    /// Only the token (and log-probabilities) chosen as the session would with its bias,
    /// constraint, penalties and sampling ([`ChooseAt`](crate::sampling::ChooseAt)): the
    /// last stage chooses. The first stage's session then chooses again from the token's
    /// one-hot row (its bias, ban and penalties leave that token the only one it can
    /// choose, and it draws the same variate) and takes the log-probabilities the link
    /// hands over ([`StageLink::take_logprobs`]).
    Choose(Box<crate::sampling::ChooseAt>),
}

impl RowRead {
    /// The token this read takes from `row` (`None` for [`RowRead::Whole`], and for a
    /// sample with nothing to draw: [`NO_TOKEN`] on the wire).
    pub fn token(&self, row: &[f32], cand: &mut Vec<(u32, f32)>) -> Option<u32> {
        match self {
            RowRead::Whole | RowRead::Choose(_) => None,
            RowRead::Argmax => Some(crate::sampling::argmax(row)),
            RowRead::Sample(s) => s.choose(row, cand),
        }
    }
}

/// The token id a link sends for a sampled row with nothing to draw.
pub const NO_TOKEN: u32 = u32::MAX;

/// The next stage of a pipeline, as a stage sees it.
///
/// Packets are answered in the order they were sent: a stage may [`StageLink::send`] a
/// second packet before it [`StageLink::recv`]s the first one's logits (two batches in
/// flight keep both sides of a hop busy).
pub trait StageLink: Send {
    /// Hands `packet` to the rest of the pipeline without waiting for its logits.
    fn send(&mut self, packet: &StepPacket<'_>) -> Result<()>;
    /// The logits of the oldest packet sent and not yet received: `logits` is cleared and
    /// filled with the logits of its rows that want them, in row order, `vocab` values each.
    fn recv(&mut self, logits: &mut Vec<f32>) -> Result<()>;
    /// Runs `packet` on the rest of the pipeline and returns its logits (nothing else in
    /// flight).
    fn step(&mut self, packet: &StepPacket<'_>, logits: &mut Vec<f32>) -> Result<()> {
        self.send(packet)?;
        self.recv(logits)
    }
    /// The log-probabilities the last stage reported with the packet last received, per
    /// logits row in row order (`Some` for rows read as [`RowRead::Choose`] asking for
    /// them); `out` left empty by a link that answers such rows whole (the first stage
    /// then computes them from the row). Required of every link: a wrapper must hand on its
    /// inner link's, or a token's one-hot row would be read as the log-probabilities.
    fn take_logprobs(&mut self, out: &mut Vec<Option<RowLogprob>>);
}

/// A chosen token's log-probability and the most likely alternatives with theirs.
pub type RowLogprob = (f32, Vec<(u32, f32)>);

/// A stage after the first: its executor (its layers, maybe a downstream) and its cache.
#[derive(Debug)]
pub struct StageRunner {
    exec: Executor,
    kv: KvCache,
    /// Logits of packets run by [`StageLink::send`] and not yet taken by
    /// [`StageLink::recv`] (an in-process link), and spare buffers.
    answered: std::collections::VecDeque<Vec<f32>>,
    spare: Vec<Vec<f32>>,
    /// The slot operations of the last [`StageRunner::run_through`].
    ops: Vec<KvOp>,
}

/// What a stage's cache looks like (the first stage's engine settings, which every stage of
/// a pipeline must share).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageCache {
    /// Session slots.
    pub slots: usize,
    /// Positions per slot.
    pub ctx: usize,
    /// Most rows of one session per pass (the engine's `ubatch`).
    pub max_chunk: usize,
    /// KV element type.
    pub dtype: KvDtype,
}

impl StageRunner {
    /// A stage running `layers` of `model` (not starting at layer 0) with `threads`
    /// threads, its cache shaped as `cache`.
    pub fn new(
        model: Arc<Model>,
        layers: std::ops::Range<usize>,
        threads: usize,
        cache: StageCache,
    ) -> Result<Self> {
        if layers.start == 0 {
            return Err(RuntimeError::InvalidParam {
                name: "stage layers",
                reason: "the first stage runs the engine, not a stage runner".into(),
            });
        }
        let kv = KvCache::for_layers(
            &model,
            cache.dtype,
            cache.slots,
            cache.ctx,
            cache.max_chunk,
            layers.clone(),
        )?;
        let exec = Executor::for_stage(model, threads, layers)?;
        Ok(StageRunner {
            exec,
            kv,
            answered: Default::default(),
            spare: Vec::new(),
            ops: Vec::new(),
        })
    }

    /// Sends this stage's passes on to `link` (a stage that does not end at the last layer).
    pub fn set_downstream(&mut self, link: Box<dyn StageLink>) -> Result<()> {
        self.kv.set_journal(true);
        self.exec.set_downstream(link)
    }

    /// Records the slot operations this stage's passes apply, for a caller that hands them on
    /// itself ([`StageRunner::run_through`]) instead of through [`StageRunner::set_downstream`].
    pub fn set_journal(&mut self, on: bool) {
        self.kv.set_journal(on);
    }

    /// Runs one packet on a stage that does not end at the last layer and has no downstream
    /// link: returns the slot operations to hand on (those it applied, when the journal is
    /// on; see [`StageRunner::set_journal`]) and the rows' hidden states after its last
    /// layer — what the caller sends to the next stage itself (a transport that keeps
    /// several packets in flight through a middle stage).
    pub fn run_through(&mut self, packet: &StepPacket<'_>) -> Result<(&[KvOp], &[f32])> {
        for op in packet.ops {
            self.kv.apply(op)?;
        }
        match self
            .exec
            .forward_stage(&mut self.kv, packet.rows, Some(packet.hidden))?
        {
            StageOut::Hidden(h) => {
                self.kv.take_journal(&mut self.ops);
                Ok((&self.ops, h))
            }
            StageOut::Logits(_) => Err(RuntimeError::InvalidParam {
                name: "stage",
                reason: "run_through is for a stage before the last, without a downstream".into(),
            }),
        }
    }

    /// The executor.
    pub fn executor(&self) -> &Executor {
        &self.exec
    }

    /// The cache.
    pub fn cache(&self) -> &KvCache {
        &self.kv
    }

    /// Bytes of K/V one slot of this stage holds.
    pub fn slot_bytes(&self) -> usize {
        self.kv.slot_bytes()
    }

    /// Runs one packet: replays its slot operations, then its rows.
    pub fn run(&mut self, packet: &StepPacket<'_>, logits: &mut Vec<f32>) -> Result<()> {
        for op in packet.ops {
            self.kv.apply(op)?;
        }
        logits.clear();
        self.exec.set_row_reads(packet.reads);
        match self
            .exec
            .forward_stage(&mut self.kv, packet.rows, Some(packet.hidden))?
        {
            StageOut::Logits(l) => logits.extend_from_slice(l),
            StageOut::Hidden(_) => {
                return Err(RuntimeError::InvalidParam {
                    name: "stage",
                    reason: "a middle stage has no downstream".into(),
                });
            }
        }
        Ok(())
    }
}

/// An in-process link: `send` runs the packet at once and keeps its logits for `recv`.
impl StageLink for StageRunner {
    fn send(&mut self, packet: &StepPacket<'_>) -> Result<()> {
        let mut l = self.spare.pop().unwrap_or_default();
        self.run(packet, &mut l)?;
        self.answered.push_back(l);
        Ok(())
    }

    fn recv(&mut self, logits: &mut Vec<f32>) -> Result<()> {
        let Some(l) = self.answered.pop_front() else {
            return Err(RuntimeError::Stage("recv with no packet in flight".into()));
        };
        logits.clear();
        logits.extend_from_slice(&l);
        self.spare.push(l);
        Ok(())
    }

    fn step(&mut self, packet: &StepPacket<'_>, logits: &mut Vec<f32>) -> Result<()> {
        self.run(packet, logits)
    }

    /// Rows are answered whole in process: the first stage computes log-probabilities.
    fn take_logprobs(&mut self, out: &mut Vec<Option<RowLogprob>>) {
        out.clear();
    }
}
