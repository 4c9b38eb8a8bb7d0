//! The KV cache: one slot per session, per layer a key and a value buffer.
//!
//! - Global layers keep every position (`capacity` rows); sliding-window layers keep a ring of
//!   `window + max_chunk` rows, enough for a pass of up to `max_chunk` rows of one session to
//!   see every key its rows need. Position `p` lives at row `p` (global) or `p % ring`.
//! - Layout per layer, as llama.cpp's non-flash cache (so attention streams both): keys
//!   head-major, `K[kv_head][row][dim]` (a head's keys are one contiguous block); values
//!   transposed, `V[kv_head][dim][row]` (a value dimension's cells are one contiguous row,
//!   read by `P·V` as a dot over cells). [`LayerGeom`] owns the index arithmetic.
//! - Elements are f32 or f16, chosen when the cache is made.
//! - A slot remembers the tokens it holds, so a new turn of the same session reuses the longest
//!   common prefix ([`KvCache::reuse_prefix`]).
//! - The cache carries a [`KvIdentity`] (model fingerprint, precision-profile hash, element
//!   type): the executor refuses a cache made for another model. Each slot records the
//!   precision profile its positions were computed under (the identity's unless
//!   [`KvCache::set_profile`] changed it), and an executor runs rows only of slots of its own
//!   profile: one cache can hold sessions of several profiles of one model, never mixed.

use half::f16;
use synapse_kernels::OrderClass;

use crate::error::{Result, RuntimeError};
use crate::load::Model;
use crate::pages::Pages;

/// KV element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// 32-bit floats (exact; what the parity fixtures use).
    F32,
    /// 16-bit floats (half the memory).
    F16,
}

impl KvDtype {
    /// Name as shown in reports.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
        }
    }
}

/// What a cache's contents depend on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KvIdentity {
    /// The model IR fingerprint.
    pub model: String,
    /// The precision profile hash.
    pub profile: String,
    /// Element type.
    pub dtype: KvDtype,
}

impl std::fmt::Display for KvIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            &self.model[..self.model.len().min(12)],
            &self.profile[..self.profile.len().min(12)],
            self.dtype.name()
        )
    }
}

/// A session slot id.
pub type SlotId = u32;

#[derive(Debug)]
pub(crate) enum Buf {
    F32(Pages<f32>),
    F16(Pages<f16>),
}

impl Buf {
    /// `n` zeroed elements, on transparent huge pages when `n` fills one ([`Pages::zeroed`]).
    /// A slot's keys and values both take huge pages: a long-context decode step sweeps them
    /// all (SmolLM2, 6,000-token prompt, `decode_bench` median step over 4 alternated runs:
    /// 64.0 tok/s on small pages, 65 with huge-page keys only, 70 with both). Stored
    /// transposed, the values are written down every row by a session's first position, so
    /// on huge pages a slot's whole buffers are committed at its first pass (as llama.cpp's
    /// cache is at start); closed slots' buffers are kept for the next session
    /// ([`KvCache::close`]).
    fn new(dtype: KvDtype, n: usize) -> Self {
        match dtype {
            KvDtype::F32 => Buf::F32(Pages::zeroed(n)),
            KvDtype::F16 => Buf::F16(Pages::zeroed(n)),
        }
    }

    /// Commits every page now ([`Pages::commit`]).
    fn commit(&mut self) {
        match self {
            Buf::F32(p) => p.commit(),
            Buf::F16(p) => p.commit(),
        }
    }

    #[inline]
    pub(crate) fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Buf::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            Buf::F16(v) => {
                for (d, &s) in v[at..at + src.len()].iter_mut().zip(src) {
                    *d = f16::from_f32(s);
                }
            }
        }
    }

    /// `self[at + i·stride] = src[i]` (a cell's values into the transposed V rows).
    #[inline]
    pub(crate) fn write_strided(&mut self, at: usize, stride: usize, src: &[f32]) {
        match self {
            Buf::F32(v) => {
                for (i, &s) in src.iter().enumerate() {
                    v[at + i * stride] = s;
                }
            }
            Buf::F16(v) => {
                for (i, &s) in src.iter().enumerate() {
                    v[at + i * stride] = f16::from_f32(s);
                }
            }
        }
    }

    /// Copies `self[a..a + len]` into `dst` at the same place (same element type).
    fn copy_range_to(&self, dst: &mut Buf, a: usize, len: usize) {
        match (self, dst) {
            (Buf::F32(x), Buf::F32(y)) => y[a..a + len].copy_from_slice(&x[a..a + len]),
            (Buf::F16(x), Buf::F16(y)) => y[a..a + len].copy_from_slice(&x[a..a + len]),
            _ => unreachable!("one cache has one element type"),
        }
    }
}

/// Per-layer geometry of a slot.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LayerGeom {
    /// Row width (`n_kv_heads × head_dim`).
    pub width: usize,
    /// Rows held (capacity or ring size).
    pub rows: usize,
    /// The buffers' pitch in cells ([`pitch`]): a key head spans `stride` rows, a value row
    /// `stride` cells (the first `rows` of them used).
    pub stride: usize,
    /// Whether rows are a ring (sliding window).
    pub ring: bool,
    /// Values per KV head.
    pub head_dim: usize,
}

/// The pitch of `rows` cells: rounded up to whole 16-element groups (a 64-byte line of
/// f32), and one group more when that makes an even number of them. A head's value rows lie
/// one pitch apart; at a pitch of 2^k lines they would all fall in the same few sets of a
/// physically indexed cache once the buffer is on 2 MiB pages (there the physical address
/// keeps the virtual one's low 21 bits), and a prompt pass writes a cell's values down
/// 64–256 of them. An odd number of lines spreads the rows over every set. (A precaution:
/// its effect was inside this VM's noise — decode P·V at 4,096 against 4,112 cells, and
/// SmolLM2's prefill of 2,048 tokens in a 4,096-cell cache.)
pub(crate) fn pitch(rows: usize) -> usize {
    let groups = rows.div_ceil(16);
    16 * (groups + 1 - groups % 2)
}

/// One zeroed buffer per layer, each `stride × width` elements (a slot's keys, or its
/// values).
fn layer_bufs(geom: &[LayerGeom], dtype: KvDtype) -> Vec<Buf> {
    geom.iter()
        .map(|g| Buf::new(dtype, g.stride * g.width))
        .collect()
}

impl LayerGeom {
    #[inline]
    pub(crate) fn row_of(&self, pos: usize) -> usize {
        if self.ring { pos % self.rows } else { pos }
    }

    /// Index of key `row`'s first value for KV head `kvh` (head-major keys).
    #[inline]
    pub(crate) fn k_at(&self, kvh: usize, row: usize) -> usize {
        (kvh * self.stride + row) * self.head_dim
    }

    /// Index of value row `c` (= `kvh·head_dim + dim`), cell 0 (transposed values: cell
    /// `row` of it at `+ row`).
    #[inline]
    pub(crate) fn v_row(&self, c: usize) -> usize {
        c * self.stride
    }

    /// The rows of positions `from..to` as at most two runs of consecutive rows, in
    /// position order (a ring wraps once at most: `to − from ≤ rows`).
    pub(crate) fn runs(
        &self,
        from: usize,
        to: usize,
    ) -> ([synapse_kernels::ggml_f32::PvtRun; 2], usize) {
        use synapse_kernels::ggml_f32::PvtRun;
        let none = PvtRun { col: 0, len: 0 };
        if from >= to {
            return ([none; 2], 0);
        }
        debug_assert!(!self.ring || to - from <= self.rows, "ring span");
        let a = self.row_of(from);
        let n = to - from;
        if a + n <= self.rows {
            ([PvtRun { col: a, len: n }, none], 1)
        } else {
            let first = self.rows - a;
            (
                [
                    PvtRun { col: a, len: first },
                    PvtRun {
                        col: 0,
                        len: n - first,
                    },
                ],
                2,
            )
        }
    }
}

#[derive(Debug)]
pub(crate) struct Slot {
    pub k: Vec<Buf>,
    pub v: Vec<Buf>,
    /// Tokens held, position by position.
    pub tokens: Vec<u32>,
    /// The float order each position was computed in (its K/V bits depend on it).
    pub orders: Vec<OrderClass>,
    /// The precision profile (hash) the positions were computed under.
    pub profile: String,
}

/// The KV cache of one executor.
#[derive(Debug)]
pub struct KvCache {
    identity: KvIdentity,
    pub(crate) geom: Vec<LayerGeom>,
    capacity: usize,
    max_chunk: usize,
    pub(crate) slots: Vec<Option<Slot>>,
    /// The layers whose K/V this cache holds (a pipeline stage holds its own range; the
    /// other layers' buffers are empty, their geometry kept so slot decisions match).
    layers: std::ops::Range<usize>,
    /// Slot operations recorded for the later stages of a pipeline (`None`: not recording).
    journal: Option<Vec<KvOp>>,
    /// Reusable prefixes end on a multiple of this many positions (1, or `max_chunk` for
    /// a model whose rows depend on their whole prompt batch: [`KvCache::set_prefix_batches`]).
    prefix_granule: usize,
    /// The key and value buffers of closed slots, taken by the next slot opened: a fresh
    /// buffer is committed — and, on huge pages, zeroed 2 MiB at a time — again as it is
    /// first written, which a reused one is not.
    spare: Vec<(Vec<Buf>, Vec<Buf>)>,
}

/// A slot operation, as a pipeline's first stage replays it on the caches of the later
/// stages ([`KvCache::take_journal`], [`KvCache::apply`]): with the rows of each pass they
/// keep every stage's slots in the state of the first stage's, position for position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvOp {
    /// [`KvCache::open`].
    Open(SlotId),
    /// [`KvCache::close`].
    Close(SlotId),
    /// [`KvCache::set_profile`].
    SetProfile(SlotId, String),
    /// Keep the first `keep` positions ([`KvCache::truncate`], [`KvCache::reuse_prefix`]).
    Truncate(SlotId, u32),
    /// [`KvCache::copy_prefix`] of `n` positions from `src` to `dst`.
    CopyPrefix {
        /// Source slot.
        src: SlotId,
        /// Destination slot.
        dst: SlotId,
        /// Positions asked for.
        n: u32,
    },
}

impl KvCache {
    /// A cache for `model` with room for `n_slots` sessions of up to `capacity` positions,
    /// processing at most `max_chunk` rows of one session per pass.
    pub fn new(
        model: &Model,
        dtype: KvDtype,
        n_slots: usize,
        capacity: usize,
        max_chunk: usize,
    ) -> Result<Self> {
        Self::for_layers(
            model,
            dtype,
            n_slots,
            capacity,
            max_chunk,
            0..model.layers.len(),
        )
    }

    /// [`KvCache::new`] holding the K/V of `layers` only (a pipeline stage's range): the
    /// other layers take no memory; slot bookkeeping (tokens, orders, ring decisions) is the
    /// whole model's, so every stage decides as the first one does.
    pub fn for_layers(
        model: &Model,
        dtype: KvDtype,
        n_slots: usize,
        capacity: usize,
        max_chunk: usize,
        layers: std::ops::Range<usize>,
    ) -> Result<Self> {
        if layers.start >= layers.end || layers.end > model.layers.len() {
            return Err(RuntimeError::InvalidParam {
                name: "kv layers",
                reason: format!(
                    "layer range {}..{} is empty or outside the model's {} layers",
                    layers.start,
                    layers.end,
                    model.layers.len()
                ),
            });
        }
        if capacity == 0 || max_chunk == 0 {
            return Err(RuntimeError::InvalidParam {
                name: "kv capacity",
                reason: "capacity and max_chunk must be positive".into(),
            });
        }
        let geom = model
            .layers
            .iter()
            .enumerate()
            .map(|(il, l)| {
                let width = if layers.contains(&il) {
                    l.n_kv_heads * l.head_dim
                } else {
                    0
                };
                match l.window {
                    Some(w) if w + max_chunk < capacity => LayerGeom {
                        width,
                        rows: w + max_chunk,
                        stride: pitch(w + max_chunk),
                        ring: true,
                        head_dim: l.head_dim,
                    },
                    _ => LayerGeom {
                        width,
                        rows: capacity,
                        stride: pitch(capacity),
                        ring: false,
                        head_dim: l.head_dim,
                    },
                }
            })
            .collect();
        Ok(KvCache {
            identity: KvIdentity {
                model: model.ir.fingerprint.clone(),
                profile: model.profile.hash(),
                dtype,
            },
            geom,
            capacity,
            max_chunk,
            slots: (0..n_slots).map(|_| None).collect(),
            layers,
            journal: None,
            prefix_granule: 1,
            spare: Vec::new(),
        })
    }

    /// The layers whose K/V this cache holds.
    pub fn layers(&self) -> std::ops::Range<usize> {
        self.layers.clone()
    }

    /// Whether a reusable prefix must end on a prompt-batch boundary (a multiple of
    /// `max_chunk`): where a row's bits depend on its whole prompt batch (a mixture of experts
    /// whose experts ggml tiles), a batch is reused only whole, having been computed with the
    /// same rows a fresh prefill gives it.
    pub fn set_prefix_batches(&mut self, on: bool) {
        self.prefix_granule = if on { self.max_chunk.max(1) } else { 1 };
    }

    /// Starts (`true`) or stops recording slot operations for later pipeline stages.
    pub fn set_journal(&mut self, on: bool) {
        self.journal = on.then(Vec::new);
    }

    /// Moves the slot operations recorded since the last call into `out` (cleared first).
    pub fn take_journal(&mut self, out: &mut Vec<KvOp>) {
        out.clear();
        if let Some(j) = self.journal.as_mut() {
            std::mem::swap(j, out);
        }
    }

    fn record(&mut self, op: KvOp) {
        if let Some(j) = self.journal.as_mut() {
            j.push(op);
        }
    }

    /// Replays a slot operation recorded by another stage's cache.
    pub fn apply(&mut self, op: &KvOp) -> Result<()> {
        match op {
            KvOp::Open(s) => self.open(*s),
            KvOp::Close(s) => {
                self.slot_index(*s)?;
                self.close(*s);
                Ok(())
            }
            KvOp::SetProfile(s, p) => self.set_profile(*s, p),
            KvOp::Truncate(s, keep) => self.truncate(*s, *keep as usize),
            KvOp::CopyPrefix { src, dst, n } => {
                self.copy_prefix(*src, *dst, *n as usize).map(|_| ())
            }
        }
    }

    fn slot_index(&self, slot: SlotId) -> Result<usize> {
        if (slot as usize) < self.slots.len() {
            Ok(slot as usize)
        } else {
            Err(RuntimeError::UnknownSlot(slot))
        }
    }

    /// The identity this cache was made for.
    pub fn identity(&self) -> &KvIdentity {
        &self.identity
    }

    /// Positions per session.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Most rows of one session in one pass.
    pub fn max_chunk(&self) -> usize {
        self.max_chunk
    }

    /// Bytes one session slot takes.
    pub fn slot_bytes(&self) -> usize {
        let el = match self.identity.dtype {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        };
        self.geom.iter().map(|g| 2 * g.stride * g.width * el).sum()
    }

    /// Opens (or clears) a session slot; its buffers are allocated here, once.
    pub fn open(&mut self, slot: SlotId) -> Result<()> {
        self.slot_index(slot)?;
        self.record(KvOp::Open(slot));
        let dtype = self.identity.dtype;
        let s = self
            .slots
            .get_mut(slot as usize)
            .ok_or(RuntimeError::UnknownSlot(slot))?;
        match s {
            Some(existing) => {
                existing.tokens.clear();
                existing.orders.clear();
            }
            None => {
                // A closed slot's buffers when there are some (their stale rows are never
                // read: attention reads only the positions a session holds, each written by
                // it first), else new ones.
                let (k, v) = self.spare.pop().unwrap_or_else(|| {
                    (layer_bufs(&self.geom, dtype), layer_bufs(&self.geom, dtype))
                });
                *s = Some(Slot {
                    k,
                    v,
                    tokens: Vec::with_capacity(self.capacity),
                    orders: Vec::with_capacity(self.capacity),
                    profile: self.identity.profile.clone(),
                })
            }
        }
        Ok(())
    }

    /// The precision profile an open slot's positions belong to.
    pub fn slot_profile(&self, slot: SlotId) -> Option<&str> {
        self.slot(slot).ok().map(|s| s.profile.as_str())
    }

    /// Makes an open slot belong to `profile`; positions computed under another profile are
    /// dropped (they are not this profile's K/V).
    pub fn set_profile(&mut self, slot: SlotId, profile: &str) -> Result<()> {
        let s = self
            .slots
            .get_mut(slot as usize)
            .and_then(|s| s.as_mut())
            .ok_or(RuntimeError::UnknownSlot(slot))?;
        if let Some(j) = self.journal.as_mut() {
            j.push(KvOp::SetProfile(slot, profile.to_string()));
        }
        if s.profile != profile {
            s.tokens.clear();
            s.orders.clear();
            s.profile = profile.to_string();
        }
        Ok(())
    }

    /// Allocates the buffers of every slot not yet holding any and commits their pages now
    /// (as llama.cpp clears its whole cache when its context is made), so that no session's
    /// first pass pays for faulting — and on huge pages zeroing — a slot's buffers in. The
    /// engine calls it at start: it holds the cache its ledger reserves.
    pub fn commit_slots(&mut self) {
        let dtype = self.identity.dtype;
        let open = self.slots.iter().filter(|s| s.is_some()).count();
        while open + self.spare.len() < self.slots.len() {
            let mut set = (layer_bufs(&self.geom, dtype), layer_bufs(&self.geom, dtype));
            set.0.iter_mut().chain(&mut set.1).for_each(Buf::commit);
            self.spare.push(set);
        }
    }

    /// Ends a slot's session: its positions are forgotten and its buffers kept for the next
    /// slot opened (they stay committed, as the ledger reserves them; a new buffer would be
    /// committed and zeroed again at its first pass).
    pub fn close(&mut self, slot: SlotId) {
        if (slot as usize) < self.slots.len() {
            self.record(KvOp::Close(slot));
        }
        if let Some(s) = self.slots.get_mut(slot as usize)
            && let Some(old) = s.take()
        {
            self.spare.push((old.k, old.v));
        }
    }

    /// Positions a session holds.
    pub fn len(&self, slot: SlotId) -> Result<usize> {
        Ok(self.slot(slot)?.tokens.len())
    }

    /// Whether a session holds no positions.
    pub fn is_empty(&self, slot: SlotId) -> Result<bool> {
        Ok(self.len(slot)? == 0)
    }

    /// Tokens a session holds.
    pub fn tokens(&self, slot: SlotId) -> Result<&[u32]> {
        Ok(&self.slot(slot)?.tokens)
    }

    pub(crate) fn slot(&self, slot: SlotId) -> Result<&Slot> {
        self.slots
            .get(slot as usize)
            .and_then(|s| s.as_ref())
            .ok_or(RuntimeError::UnknownSlot(slot))
    }

    /// The float order each held position was computed in.
    pub fn orders(&self, slot: SlotId) -> Result<&[OrderClass]> {
        Ok(&self.slot(slot)?.orders)
    }

    /// Positions of the session that a run of `tokens` computed in `orders` (one per token)
    /// would reproduce bit for bit: the longest common prefix of (token, order) pairs (cut to
    /// whole prompt batches under [`KvCache::set_prefix_batches`]).
    pub fn common_prefix(&self, slot: SlotId, tokens: &[u32], orders: &[OrderClass]) -> usize {
        let n = match self.slot(slot) {
            Ok(s) => s
                .tokens
                .iter()
                .zip(&s.orders)
                .zip(tokens.iter().zip(orders))
                .take_while(|((a, oa), (b, ob))| a == b && oa == ob)
                .count(),
            Err(_) => 0,
        };
        n / self.prefix_granule * self.prefix_granule
    }

    /// Whether a slot that wrote `held` positions still has, in every sliding-window ring, the
    /// rows position `keep` needs (the `window` positions before it).
    fn rings_hold(&self, keep: usize, held: usize) -> bool {
        // A ring of `rows = window + max_chunk` rows that has seen `held` positions keeps
        // positions from `held - rows` on.
        self.geom.iter().filter(|g| g.ring).all(|g| {
            let window = g.rows - self.max_chunk;
            (keep + 1).saturating_sub(window) >= held.saturating_sub(g.rows)
        })
    }

    /// Drops every position of `slot` from `keep` on (a rejected draft's rows), keeping the
    /// first `keep`; the next row goes to position `keep`. An error, with nothing changed, if
    /// a sliding-window ring no longer holds the rows position `keep` needs (never when fewer
    /// than `max_chunk` positions are dropped).
    pub fn truncate(&mut self, slot: SlotId, keep: usize) -> Result<()> {
        let held = self.len(slot)?;
        if keep >= held {
            return Ok(());
        }
        if keep > 0 && !self.rings_hold(keep, held) {
            return Err(RuntimeError::InvalidParam {
                name: "kv truncate",
                reason: format!(
                    "slot {slot}: a sliding-window ring no longer holds the rows position {keep} \
                     needs ({held} positions written)"
                ),
            });
        }
        let s = self
            .slots
            .get_mut(slot as usize)
            .and_then(|s| s.as_mut())
            .ok_or(RuntimeError::UnknownSlot(slot))?;
        s.tokens.truncate(keep);
        s.orders.truncate(keep);
        self.record(KvOp::Truncate(slot, keep as u32));
        Ok(())
    }

    /// Whether a slot is open (holds buffers).
    pub fn is_open(&self, slot: SlotId) -> bool {
        self.slots.get(slot as usize).is_some_and(|s| s.is_some())
    }

    /// Number of slots.
    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    /// Makes slot `dst` hold the first `n` positions of slot `src` (their K/V rows, tokens and
    /// orders), opening `dst` if needed; returns how many positions it holds then (fewer than
    /// `n` when a sliding-window ring of `src` no longer has the rows position `n` needs:
    /// then nothing is copied and 0 is returned).
    pub fn copy_prefix(&mut self, src: SlotId, dst: SlotId, n: usize) -> Result<usize> {
        // Recorded as asked (a replay on a cache in the same state gives the same result);
        // the `open` inside is not recorded separately.
        self.slot_index(dst)?;
        if src != dst {
            self.len(src)?;
        }
        let journal = self.journal.take();
        let r = self.copy_prefix_inner(src, dst, n);
        self.journal = journal;
        if r.is_ok() {
            self.record(KvOp::CopyPrefix {
                src,
                dst,
                n: n.min(u32::MAX as usize) as u32,
            });
        }
        r
    }

    fn copy_prefix_inner(&mut self, src: SlotId, dst: SlotId, n: usize) -> Result<usize> {
        if src == dst {
            return Ok(n.min(self.len(src)?));
        }
        let src_len = self.len(src)?;
        let n = n.min(src_len);
        if !self.is_open(dst) {
            self.open(dst)?;
        }
        if !self.rings_hold(n, src_len) {
            if let Some(Some(d)) = self.slots.get_mut(dst as usize) {
                d.tokens.clear();
                d.orders.clear();
            }
            return Ok(0);
        }
        let (lo, hi) = if src < dst {
            let (a, b) = self.slots.split_at_mut(dst as usize);
            (a[src as usize].as_ref(), b[0].as_mut())
        } else {
            let (a, b) = self.slots.split_at_mut(src as usize);
            (b[0].as_ref(), a[dst as usize].as_mut())
        };
        let (Some(s), Some(d)) = (lo, hi) else {
            return Err(RuntimeError::UnknownSlot(src));
        };
        for (il, g) in self.geom.iter().enumerate() {
            let from = if g.ring { n.saturating_sub(g.rows) } else { 0 };
            let (runs, nr) = g.runs(from, n);
            for r in &runs[..nr] {
                for kvh in 0..g.width / g.head_dim.max(1) {
                    let a = g.k_at(kvh, r.col);
                    s.k[il].copy_range_to(&mut d.k[il], a, r.len * g.head_dim);
                }
                for c in 0..g.width {
                    s.v[il].copy_range_to(&mut d.v[il], g.v_row(c) + r.col, r.len);
                }
            }
        }
        d.tokens.clear();
        d.tokens.extend_from_slice(&s.tokens[..n]);
        d.orders.clear();
        d.orders.extend_from_slice(&s.orders[..n]);
        d.profile.clone_from(&s.profile);
        Ok(n)
    }

    /// Keeps the longest prefix of the session that `tokens` (to be computed in `orders`,
    /// one per token) starts with and that the cache can still serve, drops the rest, and
    /// returns its length. A position is kept only if it was computed in the order the new
    /// run would use, so the result is bit-identical to running `tokens` afresh. At least one
    /// token is always left to run, so that the caller gets fresh logits.
    pub fn reuse_prefix(
        &mut self,
        slot: SlotId,
        tokens: &[u32],
        orders: &[OrderClass],
    ) -> Result<usize> {
        let old = self.len(slot)?;
        let mut keep = self.common_prefix(slot, tokens, orders);
        if keep == tokens.len() {
            keep = keep.saturating_sub(1) / self.prefix_granule * self.prefix_granule;
        }
        // A ring layer can rewind only if the rows the next position needs (the `window`
        // positions before `keep`) were not overwritten by positions written after them.
        if keep > 0 && keep < old && !self.rings_hold(keep, old) {
            keep = 0;
        }
        let s = self
            .slots
            .get_mut(slot as usize)
            .and_then(|s| s.as_mut())
            .ok_or(RuntimeError::UnknownSlot(slot))?;
        s.tokens.truncate(keep);
        s.orders.truncate(keep);
        if keep < old {
            self.record(KvOp::Truncate(slot, keep as u32));
        }
        Ok(keep)
    }
}

#[cfg(test)]
mod tests {
    use super::pitch;

    #[test]
    fn a_pitch_is_an_odd_number_of_lines_holding_the_rows() {
        for rows in [1, 15, 16, 17, 32, 48, 100, 512, 528, 4096, 4160, 8128, 8192] {
            let p = pitch(rows);
            assert!(p >= rows, "{rows}: {p}");
            assert_eq!(p % 16, 0, "{rows}: {p}");
            assert_eq!((p / 16) % 2, 1, "{rows}: {p}");
            assert!(p < rows + 32, "{rows}: {p}");
        }
    }
}
