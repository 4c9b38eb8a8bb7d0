//! Weights resident under a byte budget: a mixture of experts' routed experts
//! ([`ExpertPager`]), or a dense model's blocks ([`LayerPager`], see its module). Both copy
//! the file's bytes into slots made once and reused, read through the file ([`fill_slot`]);
//! a dense model may also stream blocks straight from the mapping. What follows describes
//! the experts'.
//!
//! Routed experts resident under a byte budget: an expert pages in when a pass routes rows to
//! it, and others page out when the budget would be exceeded. A frequency filter decides
//! whether a miss pages anything out ([`ExpertPager::set_admission`]): each expert's recent
//! uses are counted (halved every ten uses per expert), and a missed expert used no more
//! often than the least used resident one is read into a scratch slot of its own and runs
//! from there, leaving the resident set alone; otherwise that least used expert (ties: the
//! LRU-2 one) is paged out for it. On the synthetic MoE the filter paged out 353 experts
//! instead of 2,134 at the same hit rate, and a bypassed miss (written into a slot the CPU's
//! caches keep warm) took 391 µs against 541 µs for a copy into a victim's slot. Without the
//! filter, LRU-2: the expert whose use before its last is oldest (an expert used once goes
//! first; measured hit rate 0.829 vs plain LRU's 0.820 at 50%, 0.586 vs 0.520 at 25% of the
//! synthetic MoE's experts).
//!
//! The model's experts stay byte ranges of its memory-mapped file (a GGUF's stacked
//! `ffn_*_exps`), never kept mapped while a budget is set: **in** reads an expert's three
//! projections into a slot — three buffers made once, at most `budget / expert bytes` of
//! them, reused — through the file (`pread` on the kernel pool's threads: the kernel copies
//! from its page cache, and no page of the mapping is touched, so none becomes mapped);
//! **out** hands the victim's slot to the next. Slots are never freed, so paging neither
//! grows the heap nor leaves freed memory behind in the allocator: what the pager holds, the
//! scratch slot included, is at most the budget. The MoE room runs a paged expert from its
//! copy, which holds the file's bytes: residency never changes a result, only where the bytes
//! come from and what a miss costs. A source without a file read (or a failed read) copies from the
//! mapping instead and then drops the mapping's pages of those ranges again
//! (`madvise(MADV_DONTNEED)` rounded out to 2 MiB, within the file mapping they lie in).
//!
//! Measured on the synthetic MoE (32 × 1024×1024 Q8_0 experts, 12 layers, top-4, 2
//! threads, 256 decoded): at 50% of the experts resident, copying from the mapping ran at
//! 0.75× the fully resident speed, reading through the file at 0.96× (25%: 0.55× → 0.63×):
//! a copy from the mapping faulted the source pages in each time, a read does not.
//!
//! Why copies rather than mapped pages: the page cache may hold an expert's bytes in 2 MiB
//! folios, and the kernel maps a large folio whole on first touch (measured here: the mapped
//! size moved in 2 MiB steps, ignored `MADV_NOHUGEPAGE`, and reached 48 of 54 MB under a
//! 13.6 MB budget), so the mapping's resident size cannot be held to a budget by advice
//! alone. A copy's pages are exactly its bytes.
//!
//! Invariant: the pager knows byte ranges, shapes and use order, nothing about what the
//! bytes mean; the MoE room asks for an expert right before its group runs and holds nothing
//! after.

use std::sync::Arc;

use synapse_kernels::{KernelCtx, QuantMatrix, WeightSource};

use crate::error::{Result, RuntimeError};
use crate::load::{ExpertW, FfnW, Model};

mod layers;
pub use layers::{LayerPager, Stream};

/// Counters of an [`ExpertPager`] or a [`LayerPager`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PagingStats {
    /// Uses (of an expert, or a block) that found it resident.
    pub hits: u64,
    /// Uses that paged it in.
    pub misses: u64,
    /// Experts (blocks) paged out to make room.
    pub evictions: u64,
    /// Bytes paged in.
    pub bytes_in: u64,
    /// Reads advised ahead of use ([`ExpertPager::prefetch`]): experts (blocks) whose file
    /// bytes the kernel was asked to bring into its page cache before they were needed.
    pub prefetches: u64,
    /// Misses whose reads had been advised ahead (the read then finds the page cache warm
    /// when the advice was early enough).
    pub prefetched_misses: u64,
    /// Experts the router lookahead predicted for a later layer ([`ExpertPager::predict`]).
    pub predicted: u64,
    /// Of those, the ones the layer then routed rows to.
    pub predicted_used: u64,
    /// Misses the frequency filter did not admit ([`ExpertPager::set_admission`]): read
    /// into the pager's scratch slot and run from there, the resident experts left in place.
    pub bypassed: u64,
}

impl std::ops::AddAssign for PagingStats {
    /// Counters of two pagers (or of one pager's whole life across executors) added up.
    fn add_assign(&mut self, o: PagingStats) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.evictions += o.evictions;
        self.bytes_in += o.bytes_in;
        self.prefetches += o.prefetches;
        self.prefetched_misses += o.prefetched_misses;
        self.predicted += o.predicted;
        self.predicted_used += o.predicted_used;
        self.bypassed += o.bypassed;
    }
}

impl PagingStats {
    /// Hits over uses (1 when nothing was used).
    pub fn hit_rate(&self) -> f64 {
        let uses = self.hits + self.misses;
        if uses == 0 {
            1.0
        } else {
            self.hits as f64 / uses as f64
        }
    }
}

/// One expert: where its bytes live in the mapping, and the slot holding its copy while
/// resident.
#[derive(Debug)]
struct Unit {
    /// The model's (mapped) projections: gate, up, down.
    mapped: ExpertW,
    /// Bytes of the three projections.
    bytes: u64,
    /// `(slot, the copy's matrices over the slot's buffers)` while resident.
    copy: Option<(usize, ExpertW)>,
    last_use: u64,
    /// The use before `last_use` (0: none), kept while paged out too.
    prev_use: u64,
    /// Uses, all halved every ten uses per expert of the model (a recent frequency), kept
    /// while paged out too.
    freq: u32,
    /// Its reads were advised ahead since its layer last ran.
    advised: bool,
    /// The router lookahead predicted it for its layer's next run.
    predicted: bool,
}

/// A buffer a paged expert projection is copied into, lent to its matrix (64-byte aligned;
/// `len` is the current projection's size).
#[derive(Debug)]
struct SlotBuf {
    raw: Vec<u8>,
    off: usize,
    len: usize,
}

impl SlotBuf {
    fn new(cap: usize) -> Self {
        let raw = vec![0u8; cap + 64];
        let off = raw.as_ptr().align_offset(64).min(64);
        SlotBuf { raw, off, len: 0 }
    }
}

impl WeightSource for SlotBuf {
    fn bytes(&self) -> &[u8] {
        &self.raw[self.off..self.off + self.len]
    }
}

/// Room for one resident expert: three buffers, allocated once and reused (so paging
/// neither grows the heap nor faults fresh pages in).
#[derive(Debug)]
struct Slot {
    bufs: [Arc<SlotBuf>; 3],
}

/// Routed experts of one model under a byte budget (see the module docs).
#[derive(Debug)]
pub struct ExpertPager {
    /// Units by (MoE layer, expert): `layer * n_expert + expert`.
    units: Vec<Unit>,
    n_expert: usize,
    /// Bytes of one slot (the largest expert's three projections).
    slot_bytes: u64,
    /// Projection capacities of a slot.
    slot_caps: [usize; 3],
    /// Slots that exist (made on demand, at most `max_slots = budget / slot_bytes`; once
    /// all exist, a miss takes the LRU-2 victim's).
    slots: Vec<Slot>,
    max_slots: usize,
    resident: u64,
    clock: u64,
    page: usize,
    /// Misses read through the file (`pread`) rather than copying from the mapping.
    read_file: bool,
    /// Reads of experts about to be used are advised ahead ([`Self::prefetch`]).
    prefetch: bool,
    /// Misses pass the frequency filter to be copied into a slot ([`Self::set_admission`]).
    admission: bool,
    budget: u64,
    /// Uses of any expert since the frequencies were last halved, and how many between
    /// halvings.
    uses: u64,
    decay_every: u64,
    /// The slot a miss that is not admitted is read into (made on its first use, counted
    /// in the budget), and that expert's matrices over it until the next such miss.
    scratch: Option<Slot>,
    scratch_copy: Option<ExpertW>,
    stats: PagingStats,
}

/// The largest page-cache folio a read may map whole.
const FOLIO: usize = 2 << 20;

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// The whole pages of the file mapping `m`'s bytes lie in ([`QuantMatrix::mapping`]: a
/// mapping starts on a page and covers whole pages), within which its mapped pages may be
/// dropped; `None` for a matrix that is not a file mapping's (nothing of it may be advised:
/// `MADV_DONTNEED` zeroes anonymous memory).
fn extent(m: &QuantMatrix, page: usize) -> Option<(usize, usize)> {
    let all = m.mapping()?;
    let a = all.as_ptr() as usize;
    Some((a / page * page, (a + all.len()).div_ceil(page) * page))
}

/// Drops the mapping's pages over `bytes`, rounded outward to 2 MiB: reading the range may
/// have mapped the page cache's large folios whole (up to 2 MiB), neighbours' bytes
/// included, and those must go too. A later read faults the file's bytes back in.
/// `span` bounds the rounding: the extent of the file mapping the bytes lie in
/// ([`extent`]); `None` advises nothing.
fn unmap_pages(bytes: &[u8], page: usize, span: Option<(usize, usize)>) {
    let Some(span) = span else { return };
    let start = bytes.as_ptr() as usize;
    let fold = FOLIO.max(page);
    let lo = (start / fold * fold).max(span.0);
    let hi = ((start + bytes.len()).div_ceil(fold) * fold).min(span.1);
    if hi > lo {
        // SAFETY: [lo, hi) covers whole pages inside one live read-only file mapping (the
        // caller holds a matrix borrowing it); MADV_DONTNEED drops
        // page-table entries only, and the pages it takes from neighbouring tensors of the
        // same file fault back in unchanged.
        unsafe {
            libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_DONTNEED);
        }
    }
}

/// Drops the pages of `m`'s file mapping its bytes lie in (rounded out as [`unmap_pages`]
/// does), for a matrix read whole that the running model no longer reads (the source of a
/// re-encoded tensor, hashed or decoded for its variant): its bytes stay in the page cache,
/// a later read maps them again; only the process's resident size changes. Nothing for an
/// owned matrix.
pub(crate) fn release_mapped(m: &QuantMatrix) {
    let page = page_size();
    unmap_pages(m.raw_bytes(), page, extent(m, page));
}

/// Asks the kernel to read `m`'s bytes into its page cache ahead of use (`MADV_WILLNEED`,
/// rounded out to whole pages within the extent of the file mapping they lie in —
/// [`extent`]): for a file mapping it starts readahead and returns at once, mapping nothing.
/// `false` (nothing advised) for a matrix that is not a file mapping's.
fn will_need(m: &QuantMatrix, page: usize) -> bool {
    let bytes = m.raw_bytes();
    let Some(span) = extent(m, page) else {
        return false;
    };
    let start = bytes.as_ptr() as usize;
    let lo = (start / page * page).max(span.0);
    let hi = ((start + bytes.len()).div_ceil(page) * page).min(span.1);
    if hi <= lo {
        return false;
    }
    // SAFETY: [lo, hi) covers whole pages inside one live read-only file mapping (the
    // caller holds a matrix borrowing it); MADV_WILLNEED only schedules readahead of the
    // file's pages into the page cache.
    unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_WILLNEED) == 0 }
}

/// `dst` filled with `m`'s encoded bytes on the kernel pool's threads, each reading its
/// chunks through the file (`pread`: the kernel copies from its page cache, and nothing of
/// the mapping is touched, so no page of it becomes mapped and none has to be dropped
/// again). `false` when the matrix's source has no file path (or a read failed): the
/// caller copies from the mapping instead.
fn read_parallel(dst: &mut [u8], m: &QuantMatrix, ctx: &mut KernelCtx) -> bool {
    use std::sync::atomic::{AtomicBool, Ordering};
    const CHUNK: usize = 512 << 10;
    let len = dst.len();
    let n = len.div_ceil(CHUNK);
    let d = SyncPtr(dst.as_mut_ptr());
    let ok = AtomicBool::new(true);
    ctx.parallel_for(n, len, &|c0, c1| {
        let (a, b) = (c0 * CHUNK, (c1 * CHUNK).min(len));
        // SAFETY: chunks c0..c1 of `dst` belong to this call alone; `dst` outlives the
        // parallel section, which returns only when every chunk is done.
        let dst = unsafe { std::slice::from_raw_parts_mut(d.get().add(a), b - a) };
        match m.read_raw_at(a, dst) {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                tracing::warn!(
                    "weight read through the file failed ({e}); copying from the mapping"
                );
                ok.store(false, Ordering::Relaxed);
            }
            None => ok.store(false, Ordering::Relaxed),
        }
    });
    ok.load(Ordering::Relaxed)
}

/// `dst.copy_from_slice(src)` on the kernel pool's threads (the fallback for a source
/// without a file read: a copy at memory speed, one thread reaching about half of what two
/// do).
fn copy_parallel(dst: &mut [u8], src: &[u8], ctx: &mut KernelCtx) {
    const CHUNK: usize = 256 << 10;
    let n = src.len().div_ceil(CHUNK);
    let d = SyncPtr(dst.as_mut_ptr());
    let len = dst.len().min(src.len());
    ctx.parallel_for(n, len, &|c0, c1| {
        let (a, b) = (c0 * CHUNK, (c1 * CHUNK).min(len));
        // SAFETY: chunks c0..c1 of `dst` belong to this call alone; `dst` outlives the
        // parallel section, which returns only when every chunk is done.
        let dst = unsafe { std::slice::from_raw_parts_mut(d.get().add(a), b - a) };
        dst.copy_from_slice(&src[a..b]);
    });
}

/// `m`'s bytes copied into `buf` (read through the file, or copied from the mapping and its
/// pages dropped again; see the module docs), and `m`'s matrix over the copy (the same
/// encoding, a ggml type or a codec's). Errors when the buffer is still lent to a matrix.
fn fill_slot(
    buf: &mut Arc<SlotBuf>,
    m: &QuantMatrix,
    read_file: bool,
    page: usize,
    ctx: &mut KernelCtx,
) -> Result<Arc<QuantMatrix>> {
    let b = Arc::get_mut(buf).ok_or_else(|| RuntimeError::InvalidParam {
        name: "memory",
        reason: "a paging slot is still lent out".into(),
    })?;
    let n = m.weight_bytes();
    b.len = n;
    let dst = &mut b.raw[b.off..b.off + n];
    if !(read_file && read_parallel(dst, m, ctx)) {
        let src = m.raw_bytes();
        copy_parallel(dst, src, ctx);
        unmap_pages(src, page, extent(m, page));
    }
    Ok(Arc::new(m.over_copy(buf.clone() as Arc<dyn WeightSource>)?))
}

/// An expert's three projections copied into `slot` ([`fill_slot`]), and its matrices over
/// the copies.
fn fill_expert(
    slot: &mut Slot,
    mapped: &ExpertW,
    read_file: bool,
    page: usize,
    ctx: &mut KernelCtx,
) -> Result<ExpertW> {
    let [g, u, d] = &mut slot.bufs;
    Ok(ExpertW {
        gate: fill_slot(g, &mapped.gate, read_file, page, ctx)?,
        up: fill_slot(u, &mapped.up, read_file, page, ctx)?,
        down: fill_slot(d, &mapped.down, read_file, page, ctx)?,
    })
}

#[derive(Clone, Copy)]
struct SyncPtr(*mut u8);
impl SyncPtr {
    fn get(self) -> *mut u8 {
        self.0
    }
}
// SAFETY: the chunks written through it are disjoint.
unsafe impl Send for SyncPtr {}
// SAFETY: as above.
unsafe impl Sync for SyncPtr {}

impl ExpertPager {
    /// A pager over `model`'s routed experts with `budget` bytes for the resident ones. Every
    /// expert starts paged out (its mapped pages dropped). Errors when the model has no
    /// experts, an expert is not a borrowed range of a mapping (a copied model holds its
    /// experts anyway), or the budget holds less than the largest expert.
    pub fn new(model: &Model, budget: u64) -> Result<Self> {
        if model.resident {
            return Err(RuntimeError::InvalidParam {
                name: "memory",
                reason: "the model's weights were read into memory at load (resident); routed \
                         experts page only from a memory-mapped file"
                    .into(),
            });
        }
        let page = page_size();
        let mut units = Vec::new();
        let mut n_expert = 0;
        for l in &model.layers {
            let FfnW::Moe(m) = &l.ffn else { continue };
            n_expert = m.experts.len();
            for e in &m.experts {
                let mut bytes = 0u64;
                for mat in [&e.gate, &e.up, &e.down] {
                    if !mat.is_borrowed() {
                        return Err(RuntimeError::InvalidParam {
                            name: "memory",
                            reason: "routed experts page only from a memory-mapped file (a \
                                     GGUF, a package, or the variant cache of a precision \
                                     profile); this model's experts were copied at load, or \
                                     re-encoded without a variant cache"
                                .into(),
                        });
                    }
                    bytes += mat.weight_bytes() as u64;
                }
                units.push(Unit {
                    mapped: e.clone(),
                    bytes,
                    copy: None,
                    last_use: 0,
                    prev_use: 0,
                    freq: 0,
                    advised: false,
                    predicted: false,
                });
            }
        }
        if units.is_empty() {
            return Err(RuntimeError::InvalidParam {
                name: "memory",
                reason: "the model has no routed experts to page".into(),
            });
        }
        let mut slot_caps = [0usize; 3];
        for u in &units {
            for (c, m) in slot_caps
                .iter_mut()
                .zip([&u.mapped.gate, &u.mapped.up, &u.mapped.down])
            {
                *c = (*c).max(m.weight_bytes());
            }
        }
        let largest = slot_caps.iter().sum::<usize>() as u64;
        if budget < largest {
            return Err(RuntimeError::MemoryBudget {
                budget,
                reason: format!(
                    "{budget} B for routed experts holds no expert (the largest takes \
                     {largest} B)"
                ),
            });
        }
        for u in &units {
            for mat in [&u.mapped.gate, &u.mapped.up, &u.mapped.down] {
                unmap_pages(mat.raw_bytes(), page, extent(mat, page));
            }
        }
        let decay_every = 10 * units.len() as u64;
        let mut pager = ExpertPager {
            units,
            n_expert,
            slot_bytes: largest,
            slot_caps,
            slots: Vec::new(),
            max_slots: 0,
            resident: 0,
            clock: 0,
            page,
            read_file: true,
            prefetch: true,
            admission: true,
            budget,
            uses: 0,
            decay_every,
            scratch: None,
            scratch_copy: None,
            stats: PagingStats::default(),
        };
        pager.max_slots = pager.slots_allowed();
        Ok(pager)
    }

    /// Whether misses may bypass the slots: the filter on, and the budget holding the
    /// scratch slot beside at least one slot but not a slot for every expert.
    fn bypasses(&self) -> bool {
        self.admission
            && self.budget >= 2 * self.slot_bytes
            && self.budget / self.slot_bytes < self.units.len() as u64
    }

    /// Slots the budget holds beside the scratch slot, when there is one.
    fn slots_allowed(&self) -> usize {
        let scratch = if self.bypasses() { self.slot_bytes } else { 0 };
        (((self.budget - scratch) / self.slot_bytes) as usize).min(self.units.len())
    }

    /// Whether a miss must pass a frequency filter to take a slot (on by default). Each
    /// expert's recent uses are counted (all counts halved every ten uses per expert of
    /// the model); when no slot is free, a missed expert used no more often than the least
    /// used resident one is read into a scratch slot of its own and runs from there, so
    /// the experts that recur stay resident, and the scratch slot, written over and over,
    /// stays in the CPU's caches (one miss measured 391 µs against 541 µs for a copy into
    /// a victim's slot on the synthetic MoE's 3.3 MB experts). Otherwise the least used
    /// resident expert (then the LRU-2 one) is paged out for it. Off, every miss takes the
    /// LRU-2 victim's slot and the budget holds one slot more. Either way the same bytes
    /// run. Set before the first use (slots made before are kept; the filter is then off
    /// where they leave no room for the scratch slot).
    pub fn set_admission(&mut self, on: bool) {
        self.admission = on;
        if self.slots.len() > self.slots_allowed() {
            self.admission = false;
        }
        self.max_slots = self.slots_allowed();
    }

    /// Whether misses pass the frequency filter ([`Self::set_admission`]).
    pub fn admitting(&self) -> bool {
        self.admission
    }

    /// One use of unit `i` counted in its recent frequency.
    fn count_use(&mut self, i: usize) {
        self.units[i].freq = self.units[i].freq.saturating_add(1);
        self.uses += 1;
        if self.uses >= self.decay_every {
            self.uses = 0;
            for u in &mut self.units {
                u.freq /= 2;
            }
        }
    }

    /// Whether reads of experts about to be used are advised ahead ([`Self::prefetch`]; on by
    /// default). Off, only the misses' own reads fetch: the same results either way.
    pub fn set_prefetch(&mut self, on: bool) {
        self.prefetch = on;
    }

    /// Whether reads are advised ahead ([`Self::set_prefetch`]).
    pub fn prefetching(&self) -> bool {
        self.prefetch
    }

    /// Asks the kernel to bring expert `expert` of MoE layer `layer` into its page cache ahead
    /// of use, when it is not resident and not advised since its layer last ran:
    /// `MADV_WILLNEED` over its three projections in the file mapping starts their
    /// readahead and returns at once; nothing becomes mapped, so the process's resident
    /// size does not change. A miss then reads from the page cache instead of waiting for
    /// the disk. Returns whether a read was advised (never with prefetching off, or for an
    /// expert outside a file mapping).
    pub fn prefetch(&mut self, layer: usize, expert: usize) -> bool {
        let i = layer * self.n_expert + expert;
        let page = self.page;
        let Some(u) = self.units.get_mut(i) else {
            return false;
        };
        if !self.prefetch || u.copy.is_some() || u.advised {
            return false;
        }
        let mut any = false;
        for m in [&u.mapped.gate, &u.mapped.up, &u.mapped.down] {
            any |= will_need(m, page);
        }
        if any {
            u.advised = true;
            self.stats.prefetches += 1;
        }
        any
    }

    /// The router lookahead predicts that MoE layer `layer` will route rows to `expert`: its
    /// reads are advised ahead ([`Self::prefetch`]) and the prediction is counted (scored
    /// when the layer runs, [`Self::settle`]).
    pub fn predict(&mut self, layer: usize, expert: usize) {
        let i = layer * self.n_expert + expert;
        if let Some(u) = self.units.get_mut(i)
            && !u.predicted
        {
            u.predicted = true;
            self.stats.predicted += 1;
        }
        self.prefetch(layer, expert);
    }

    /// MoE layer `layer` has routed (`routed(e)`: whether expert `e` got rows): predictions
    /// for it are scored and cleared, and advice for experts it does not use is forgotten
    /// (it may be stale by the layer's next run).
    pub fn settle(&mut self, layer: usize, routed: impl Fn(usize) -> bool) {
        let base = layer * self.n_expert;
        for e in 0..self.n_expert {
            let Some(u) = self.units.get_mut(base + e) else {
                return;
            };
            let used = routed(e);
            if u.predicted && used {
                self.stats.predicted_used += 1;
            }
            u.predicted = false;
            if !used {
                u.advised = false;
            }
        }
    }

    /// Whether a miss reads the expert through the file (`pread`, the default: nothing gets
    /// mapped) or copies it from the mapping and drops the mapped pages again (the path a
    /// source without a file takes). Both hold the same bytes.
    pub fn set_file_reads(&mut self, on: bool) {
        self.read_file = on;
    }

    /// Bytes of every routed expert, resident or not.
    pub fn total_bytes(&self) -> u64 {
        self.units.iter().map(|u| u.bytes).sum()
    }

    /// Bytes of the experts resident now (their copies).
    pub fn resident_bytes(&self) -> u64 {
        self.resident
    }

    /// Bytes of the slots allocated so far, the scratch slot among them (what the pager
    /// holds: at most the budget).
    pub fn held_bytes(&self) -> u64 {
        (self.slots.len() + usize::from(self.scratch.is_some())) as u64 * self.slot_bytes
    }

    /// The counters.
    pub fn stats(&self) -> PagingStats {
        self.stats
    }

    /// Expert `expert` of MoE layer `layer` (the model's MoE layers counted from 0), made
    /// resident — paging out the LRU-2 victim when no slot is free — or `None`
    /// for an index the model does not have.
    pub fn acquire(
        &mut self,
        layer: usize,
        expert: usize,
        ctx: &mut KernelCtx,
    ) -> Result<Option<&ExpertW>> {
        let i = layer * self.n_expert + expert;
        if i >= self.units.len() {
            return Ok(None);
        }
        self.clock += 1;
        self.count_use(i);
        if self.units[i].copy.is_some() {
            self.stats.hits += 1;
            self.units[i].prev_use = self.units[i].last_use;
            self.units[i].last_use = self.clock;
            return Ok(self.units[i].copy.as_ref().map(|c| &c.1));
        }
        self.stats.misses += 1;
        if std::mem::take(&mut self.units[i].advised) {
            self.stats.prefetched_misses += 1;
        }
        let slot = match () {
            () if self.slots.len() < self.max_slots => {
                let caps = self.slot_caps;
                self.slots.push(Slot {
                    bufs: caps.map(|c| Arc::new(SlotBuf::new(c))),
                });
                self.slots.len() - 1
            }
            () => {
                let resident = self
                    .units
                    .iter()
                    .enumerate()
                    .filter(|(_, u)| u.copy.is_some());
                // With the filter, the least used recently (then LRU-2) goes; without, LRU-2.
                let victim = if self.admission {
                    resident
                        .min_by_key(|(_, u)| (u.freq, u.prev_use, u.last_use))
                        .map(|(j, _)| j)
                } else {
                    resident
                        .min_by_key(|(_, u)| (u.prev_use, u.last_use))
                        .map(|(j, _)| j)
                };
                let Some(j) = victim else {
                    return Err(RuntimeError::InvalidParam {
                        name: "memory",
                        reason: "no expert slot to page into".into(),
                    });
                };
                if self.bypasses() && self.units[i].freq <= self.units[j].freq {
                    return self.bypass(i, ctx);
                }
                // Dropping the copy's matrices leaves the slot's buffers to the pager alone.
                let Some((s, copy)) = self.units[j].copy.take() else {
                    unreachable!("the victim is resident");
                };
                drop(copy);
                self.resident -= self.units[j].bytes;
                self.stats.evictions += 1;
                s
            }
        };
        let u = &mut self.units[i];
        let copy = fill_expert(
            &mut self.slots[slot],
            &u.mapped,
            self.read_file,
            self.page,
            ctx,
        )?;
        u.copy = Some((slot, copy));
        u.prev_use = u.last_use;
        u.last_use = self.clock;
        self.resident += u.bytes;
        self.stats.bytes_in += u.bytes;
        Ok(self.units[i].copy.as_ref().map(|c| &c.1))
    }

    /// A miss not admitted: unit `i` read into the scratch slot (the previous bypassed
    /// expert's matrices over it dropped first), the resident experts untouched.
    fn bypass(&mut self, i: usize, ctx: &mut KernelCtx) -> Result<Option<&ExpertW>> {
        self.stats.bypassed += 1;
        self.scratch_copy = None;
        let caps = self.slot_caps;
        let slot = self.scratch.get_or_insert_with(|| Slot {
            bufs: caps.map(|c| Arc::new(SlotBuf::new(c))),
        });
        let u = &mut self.units[i];
        let copy = fill_expert(slot, &u.mapped, self.read_file, self.page, ctx)?;
        u.prev_use = u.last_use;
        u.last_use = self.clock;
        self.stats.bytes_in += u.bytes;
        self.scratch_copy = Some(copy);
        Ok(self.scratch_copy.as_ref())
    }
}
