//! A dense model's blocks resident under a byte budget: each block's seven projections (q, k,
//! v, o, gate, up, down) page in right before the block runs, into slots made once and
//! reused, the way routed experts do (see the parent module: reads through the file, never
//! the mapping's pages; the mapped pages dropped when the pager is made).
//!
//! A pass walks the blocks in order, every pass: under that cyclic use, LRU (or LRU-2) keeps
//! nothing — each block is evicted just before it is used again. The best a replacement
//! policy can do there is keep some blocks for good and stream the rest (Belady's choice on a
//! cycle): the first `kept` blocks of the pager's span own a slot each (they page in once, on
//! first use, and stay), and the others stream, one at a time. When every block fits, each
//! has its own slot and nothing is read after the first pass.
//!
//! Streaming runs a block **from the mapping** where the budget holds its mapped extent
//! ([`Stream::Mapped`]: the block's byte span rounded out to the page cache's 2 MiB folios,
//! which the kernel maps whole; its pages dropped again as soon as the next block is asked
//! for, so at most one streamed block is mapped at a time), otherwise through one copy slot
//! ([`Stream::Copy`]). The mapped way reads a streamed block once, where a copy reads it,
//! writes it and reads it again (Gemma 3 270M with a quarter of its blocks kept: measured in
//! README); the copy way needs only a block's own bytes.
//!
//! Invariant: a paged block holds the file's bytes of its projections, and its norms and
//! biases are the model's: residency never changes a result.

use std::sync::Arc;

use synapse_kernels::{KernelCtx, QuantMatrix};

use super::{PagingStats, SlotBuf, extent, fill_slot, page_size, unmap_pages, will_need};
use crate::error::{Result, RuntimeError};
use crate::load::{FfnW, LayerW, LinearW, Model};

/// Projections of a block the pager moves.
const N: usize = 7;

/// A dense block's projections, in the pager's order (`None` for a mixture-of-experts block).
fn linears(l: &LayerW) -> Option<[&LinearW; N]> {
    match &l.ffn {
        FfnW::Dense { gate, up, down, .. } => Some([&l.q, &l.k, &l.v, &l.o, gate, up, down]),
        FfnW::Moe(_) => None,
    }
}

/// As [`linears`], mutable.
fn linears_mut(l: &mut LayerW) -> Option<[&mut LinearW; N]> {
    match &mut l.ffn {
        FfnW::Dense { gate, up, down, .. } => {
            Some([&mut l.q, &mut l.k, &mut l.v, &mut l.o, gate, up, down])
        }
        FfnW::Moe(_) => None,
    }
}

fn refuse(reason: impl Into<String>) -> RuntimeError {
    RuntimeError::InvalidParam {
        name: "memory",
        reason: reason.into(),
    }
}

/// One block: the model's (mapped) weights, and its copy while resident.
#[derive(Debug)]
struct Unit {
    mapped: LayerW,
    bytes: u64,
    /// The block over its slot's buffers (norms and biases the model's) while resident.
    copy: Option<LayerW>,
    /// Its reads were advised ahead since it last ran.
    advised: bool,
}

/// Room for one resident block: seven buffers (made once, reused), and the block they hold.
type Slot = ([Arc<SlotBuf>; N], Option<usize>);

/// How blocks beyond the kept ones run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Every block is kept: nothing streams.
    None,
    /// Through one copy slot (read through the file each time).
    Copy,
    /// From the mapping, its pages dropped when the next block is asked for.
    Mapped,
}

/// The dense blocks of one model (or of one pipeline stage's span) under a byte budget (see
/// the module docs).
#[derive(Debug)]
pub struct LayerPager {
    /// Blocks `first..first + units.len()`.
    units: Vec<Unit>,
    first: usize,
    slot_caps: [usize; N],
    slot_bytes: u64,
    /// Slots made on first use (one per kept block, and the copy stream's), with the block
    /// each holds.
    slots: Vec<Option<Slot>>,
    budget: u64,
    /// Blocks `0..kept` (of the span) own a slot.
    kept: usize,
    stream: Stream,
    /// The largest mapped extent of a block (what mapped streaming reserves).
    reserve: u64,
    /// The block streamed from the mapping whose pages are mapped now.
    pending: Option<usize>,
    resident: u64,
    page: usize,
    read_file: bool,
    /// A miss advises the reads of the block after it ([`LayerPager::set_prefetch`]).
    prefetch: bool,
    stats: PagingStats,
}

/// How `budget` divides over `blocks` blocks of `slot` bytes: (kept, stream), mapped
/// streaming when allowed and the budget holds `reserve` beside the kept copies.
fn plan(budget: u64, blocks: usize, slot: u64, reserve: u64, mapped: bool) -> (usize, Stream) {
    if blocks as u64 * slot <= budget {
        (blocks, Stream::None)
    } else if mapped && budget >= reserve {
        (
            ((budget - reserve) / slot).min(blocks as u64 - 1) as usize,
            Stream::Mapped,
        )
    } else {
        (((budget / slot) as usize).saturating_sub(1), Stream::Copy)
    }
}

/// What reading `ms` from their mappings can keep mapped: per mapping they lie in, their span
/// rounded out to 2 MiB folios (within the mapping's extent).
fn mapped_extent(ms: &[&QuantMatrix], page: usize) -> u64 {
    let fold = super::FOLIO.max(page);
    let mut spans: Vec<((usize, usize), usize, usize)> = Vec::new();
    for m in ms {
        let Some(ext) = extent(m, page) else { continue };
        let b = m.raw_bytes();
        let (lo, hi) = (b.as_ptr() as usize, b.as_ptr() as usize + b.len());
        match spans.iter_mut().find(|s| s.0 == ext) {
            Some(s) => {
                s.1 = s.1.min(lo);
                s.2 = s.2.max(hi);
            }
            None => spans.push((ext, lo, hi)),
        }
    }
    spans
        .iter()
        .map(|&(ext, lo, hi)| {
            let lo = (lo / fold * fold).max(ext.0);
            let hi = (hi.div_ceil(fold) * fold).min(ext.1);
            hi.saturating_sub(lo) as u64
        })
        .sum()
}

impl LayerPager {
    /// A pager over `model`'s blocks `layers` with `budget` bytes for their projections.
    /// Every block starts paged out (its mapped pages dropped). Errors when a block is a
    /// mixture of experts (those page their experts instead), a projection is not a borrowed
    /// range of a mapping (a model copied at load holds its weights anyway), the range holds
    /// a block the model does not, or the budget holds less than the largest block.
    pub fn new(model: &Model, layers: std::ops::Range<usize>, budget: u64) -> Result<Self> {
        if layers.is_empty() || layers.end > model.layers.len() {
            return Err(refuse(format!(
                "blocks {}..{} of a model with {}",
                layers.start,
                layers.end,
                model.layers.len()
            )));
        }
        if layers.start < model.present.start || layers.end > model.present.end {
            return Err(refuse(format!(
                "blocks {}..{} are not all held (the model holds {}..{})",
                layers.start, layers.end, model.present.start, model.present.end
            )));
        }
        if model.resident {
            return Err(refuse(
                "the model's weights were read into memory at load (resident); dense blocks \
                 page only from a memory-mapped file",
            ));
        }
        let page = page_size();
        let mut units = Vec::with_capacity(layers.len());
        for il in layers.clone() {
            let l = &model.layers[il];
            let Some(ls) = linears(l) else {
                return Err(refuse(
                    "a mixture of experts pages its routed experts, not its blocks",
                ));
            };
            let mut bytes = 0u64;
            for lin in &ls {
                if !lin.m.is_borrowed() {
                    return Err(refuse(
                        "dense blocks page only from a memory-mapped file (a GGUF, a package, \
                         or the variant cache of a precision profile); this model's weights \
                         were copied at load, or re-encoded without a variant cache",
                    ));
                }
                bytes += lin.m.weight_bytes() as u64;
            }
            units.push(Unit {
                mapped: l.clone(),
                bytes,
                copy: None,
                advised: false,
            });
        }
        let mut slot_caps = [0usize; N];
        for u in &units {
            let ls = linears(&u.mapped).expect("checked dense");
            for (c, lin) in slot_caps.iter_mut().zip(ls) {
                *c = (*c).max(lin.m.weight_bytes());
            }
        }
        let slot_bytes = slot_caps.iter().sum::<usize>() as u64;
        if budget < slot_bytes {
            return Err(RuntimeError::MemoryBudget {
                budget,
                reason: format!(
                    "{budget} B for the blocks holds none (the largest takes {slot_bytes} B)"
                ),
            });
        }
        for u in &units {
            for lin in linears(&u.mapped).expect("checked dense") {
                unmap_pages(lin.m.raw_bytes(), page, extent(&lin.m, page));
            }
        }
        let reserve = units
            .iter()
            .map(|u| {
                let ls = linears(&u.mapped).expect("checked dense");
                mapped_extent(&ls.map(|l| &*l.m), page)
            })
            .max()
            .unwrap_or(0);
        let (kept, stream) = plan(budget, units.len(), slot_bytes, reserve, true);
        Ok(LayerPager {
            first: layers.start,
            slots: Vec::new(),
            units,
            slot_caps,
            slot_bytes,
            budget,
            kept,
            stream,
            reserve,
            pending: None,
            resident: 0,
            page,
            read_file: true,
            prefetch: true,
            stats: PagingStats::default(),
        })
    }

    /// Whether a miss advises the reads of the block after it (on by default): a pass walks
    /// blocks in order, so while block `i` runs, the kernel reads block `i + 1`'s bytes
    /// into its page cache (`MADV_WILLNEED`: readahead, nothing mapped) and its miss does not
    /// wait for the disk. The same results either way.
    pub fn set_prefetch(&mut self, on: bool) {
        self.prefetch = on;
    }

    /// Advises the reads of the block after `i` in a pass's cyclic order (after the last:
    /// the first block that is not kept), when it is not resident and not advised already.
    fn prefetch_after(&mut self, i: usize) {
        let n = self.units.len();
        if !self.prefetch || n == 0 {
            return;
        }
        let next = if i + 1 < n {
            i + 1
        } else {
            self.kept.min(n - 1)
        };
        let page = self.page;
        let u = &mut self.units[next];
        if u.copy.is_some() || u.advised || next == i {
            return;
        }
        let mut any = false;
        for l in linears(&u.mapped).expect("checked dense") {
            any |= will_need(&l.m, page);
        }
        if any {
            u.advised = true;
            self.stats.prefetches += 1;
        }
    }

    /// Bytes of the projections of `model`'s dense blocks `layers` (what a pager over them
    /// pages; a mixture-of-experts block counts none).
    pub fn pageable_bytes(model: &Model, layers: std::ops::Range<usize>) -> u64 {
        model
            .layers
            .get(layers)
            .unwrap_or(&[])
            .iter()
            .filter_map(linears)
            .flat_map(|ls| ls.map(|l| l.m.weight_bytes() as u64))
            .sum()
    }

    /// What the tensors a paged model still reads from its mapping (the token embedding, the
    /// LM head) may keep mapped beyond their own bytes: the page cache maps its large folios
    /// whole, so each such tensor's two ends can drag in up to 2 MiB of their neighbours.
    pub fn mapped_slack(model: &Model) -> u64 {
        let tied = Arc::ptr_eq(&model.embd, &model.head.m);
        let n = [Some(&model.embd), (!tied).then_some(&model.head.m)]
            .into_iter()
            .flatten()
            .filter(|m| m.is_borrowed())
            .count() as u64;
        n * 2 * super::FOLIO as u64
    }

    /// Whether a miss reads the block through the file (the default) or copies it from the
    /// mapping and drops the mapped pages again. Both hold the same bytes.
    pub fn set_file_reads(&mut self, on: bool) {
        self.read_file = on;
    }

    /// Bytes of every paged block's projections, resident or not.
    pub fn total_bytes(&self) -> u64 {
        self.units.iter().map(|u| u.bytes).sum()
    }

    /// Bytes of the blocks resident now.
    pub fn resident_bytes(&self) -> u64 {
        self.resident
    }

    /// Bytes the pager holds: the slots made so far, and while streaming from the mapping
    /// its reservation for the streamed block's mapped pages (at most the budget).
    pub fn held_bytes(&self) -> u64 {
        self.slots.iter().flatten().count() as u64 * self.slot_bytes
            + if self.stream == Stream::Mapped {
                self.reserve
            } else {
                0
            }
    }

    /// Blocks kept resident (the first of the span; all when everything fits).
    pub fn kept_blocks(&self) -> usize {
        self.kept
    }

    /// How the other blocks run.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// The largest mapped extent of a block: what streaming from the mapping reserves.
    pub fn stream_reserve(&self) -> u64 {
        self.reserve
    }

    /// Whether blocks may stream from the mapping (the default, where the budget holds a
    /// block's mapped extent) or only through a copy slot. Clears what is resident.
    pub fn set_stream_mapped(&mut self, on: bool) {
        self.release_pending();
        for u in &mut self.units {
            u.copy = None;
        }
        self.slots.clear();
        self.resident = 0;
        (self.kept, self.stream) = plan(
            self.budget,
            self.units.len(),
            self.slot_bytes,
            self.reserve,
            on,
        );
    }

    /// Drops the mapped pages of the block streamed last (it was used; the next one is
    /// asked for).
    fn release_pending(&mut self) {
        if let Some(j) = self.pending.take() {
            for lin in linears(&self.units[j].mapped).expect("checked dense") {
                unmap_pages(lin.m.raw_bytes(), self.page, extent(&lin.m, self.page));
            }
            self.stats.evictions += 1;
        }
    }

    /// The counters.
    pub fn stats(&self) -> PagingStats {
        self.stats
    }

    /// The slot block `i` (counted from the pager's first) pages into: its own when kept,
    /// else the copy stream's.
    fn slot_of(&self, i: usize) -> usize {
        i.min(self.kept)
    }

    /// Block `il` (the model's index), resident: paged in (the block its slot held paged
    /// out) unless it already is.
    pub fn acquire(&mut self, il: usize, ctx: &mut KernelCtx) -> Result<&LayerW> {
        let Some(i) = il.checked_sub(self.first).filter(|&i| i < self.units.len()) else {
            return Err(refuse(format!(
                "block {il} is outside the pager's {}..{}",
                self.first,
                self.first + self.units.len()
            )));
        };
        if self.pending == Some(i) {
            self.stats.hits += 1;
            return Ok(&self.units[i].mapped);
        }
        self.release_pending();
        if self.units[i].copy.is_some() {
            self.stats.hits += 1;
            return Ok(self.units[i].copy.as_ref().expect("resident"));
        }
        self.stats.misses += 1;
        if std::mem::take(&mut self.units[i].advised) {
            self.stats.prefetched_misses += 1;
        }
        self.prefetch_after(i);
        if i >= self.kept && self.stream == Stream::Mapped {
            self.pending = Some(i);
            self.stats.bytes_in += self.units[i].bytes;
            return Ok(&self.units[i].mapped);
        }
        let s = self.slot_of(i);
        if self.slots.len() <= s {
            self.slots.resize_with(s + 1, || None);
        }
        let caps = self.slot_caps;
        let slot =
            self.slots[s].get_or_insert_with(|| (caps.map(|c| Arc::new(SlotBuf::new(c))), None));
        if let Some(j) = slot.1.take() {
            // Dropping the copy's matrices leaves the slot's buffers to the pager alone.
            self.units[j].copy = None;
            self.resident -= self.units[j].bytes;
            self.stats.evictions += 1;
        }
        let (page, read_file) = (self.page, self.read_file);
        let u = &mut self.units[i];
        let mut copy = u.mapped.clone();
        let src = linears(&u.mapped).expect("checked dense");
        let dst = linears_mut(&mut copy).expect("checked dense");
        for ((buf, m), out) in slot.0.iter_mut().zip(src).zip(dst) {
            out.m = fill_slot(buf, &m.m, read_file, page, ctx)?;
        }
        slot.1 = Some(i);
        u.copy = Some(copy);
        self.resident += u.bytes;
        self.stats.bytes_in += u.bytes;
        Ok(self.units[i].copy.as_ref().expect("just paged in"))
    }
}
