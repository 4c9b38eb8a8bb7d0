//! Routed experts resident under a byte budget: an expert pages in when a pass routes rows to
//! it, and the least recently used ones page out when the budget would be exceeded.
//!
//! The model's experts stay byte ranges of its memory-mapped file (a GGUF's stacked
//! `ffn_*_exps`), never kept mapped while a budget is set: **in** copies an expert's three
//! projections from the mapping into matrices of their own (heap memory, counted exactly)
//! and then drops the mapping's pages of those ranges again (`madvise(MADV_DONTNEED)`: the
//! file's bytes stay in the kernel's page cache, or on disk under memory pressure); **out**
//! frees the copies. The MoE room runs a paged expert from its copy, which holds the file's
//! bytes: residency never changes a result, only where the bytes come from and what a miss
//! costs.
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

use synapse_kernels::QuantMatrix;

use crate::error::{Result, RuntimeError};
use crate::load::{ExpertW, FfnW, Model};

/// Counters of an [`ExpertPager`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PagingStats {
    /// Expert uses whose expert was resident.
    pub hits: u64,
    /// Expert uses that paged the expert in.
    pub misses: u64,
    /// Experts paged out to make room.
    pub evictions: u64,
    /// Bytes paged in.
    pub bytes_in: u64,
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

/// One expert: where its bytes live in the mapping, and its copy while resident.
#[derive(Debug)]
struct Unit {
    /// The model's (mapped) projections: gate, up, down.
    mapped: ExpertW,
    /// Bytes of the three projections.
    bytes: u64,
    copy: Option<ExpertW>,
    last_use: u64,
}

/// Routed experts of one model under a byte budget (see the module docs).
#[derive(Debug)]
pub struct ExpertPager {
    /// Units by (MoE layer, expert): `layer * n_expert + expert`.
    units: Vec<Unit>,
    n_expert: usize,
    budget: u64,
    resident: u64,
    clock: u64,
    page: usize,
    stats: PagingStats,
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// Drops the mapping's pages over `bytes` (rounded outward to pages): a later read faults
/// the file's bytes back in.
fn unmap_pages(bytes: &[u8], page: usize) {
    let start = bytes.as_ptr() as usize;
    let lo = start / page * page;
    let hi = (start + bytes.len()).div_ceil(page) * page;
    if hi > lo {
        // SAFETY: [lo, hi) covers whole pages of a live read-only file mapping (the caller
        // holds a matrix borrowing it); MADV_DONTNEED drops page-table entries only, and the
        // edge pages it may take from neighbouring tensors fault back in unchanged.
        unsafe {
            libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_DONTNEED);
        }
    }
}

/// An owned copy of a borrowed matrix.
fn copy_of(m: &QuantMatrix) -> Result<Arc<QuantMatrix>> {
    let ty = m.ggml_type().ok_or_else(|| RuntimeError::InvalidParam {
        name: "memory",
        reason: "a paged expert must be in a ggml encoding".into(),
    })?;
    Ok(Arc::new(QuantMatrix::from_ggml(
        ty,
        m.raw_bytes(),
        m.rows(),
        m.cols(),
    )?))
}

impl ExpertPager {
    /// A pager over `model`'s routed experts with `budget` bytes for the resident ones. Every
    /// expert starts paged out (its mapped pages dropped). Errors when the model has no
    /// experts, an expert is not a borrowed range of a mapping (a copied model holds its
    /// experts anyway), or the budget holds less than the largest expert.
    pub fn new(model: &Model, budget: u64) -> Result<Self> {
        let page = page_size();
        let mut units = Vec::new();
        let mut n_expert = 0;
        for l in &model.layers {
            let FfnW::Moe(m) = &l.ffn else { continue };
            n_expert = m.experts.len();
            for e in &m.experts {
                let mut bytes = 0u64;
                for mat in [&e.gate, &e.up, &e.down] {
                    if !mat.is_borrowed() || mat.ggml_type().is_none() {
                        return Err(RuntimeError::InvalidParam {
                            name: "memory",
                            reason: "routed experts page only from a memory-mapped GGUF \
                                     (this model's experts were copied at load)"
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
                });
            }
        }
        if units.is_empty() {
            return Err(RuntimeError::InvalidParam {
                name: "memory",
                reason: "the model has no routed experts to page".into(),
            });
        }
        let largest = units.iter().map(|u| u.bytes).max().unwrap_or(0);
        if budget < largest {
            return Err(RuntimeError::InvalidParam {
                name: "memory",
                reason: format!(
                    "{budget} B for routed experts holds no expert (the largest takes \
                     {largest} B)"
                ),
            });
        }
        for u in &units {
            for mat in [&u.mapped.gate, &u.mapped.up, &u.mapped.down] {
                unmap_pages(mat.raw_bytes(), page);
            }
        }
        Ok(ExpertPager {
            units,
            n_expert,
            budget,
            resident: 0,
            clock: 0,
            page,
            stats: PagingStats::default(),
        })
    }

    /// Bytes of every routed expert, resident or not.
    pub fn total_bytes(&self) -> u64 {
        self.units.iter().map(|u| u.bytes).sum()
    }

    /// Bytes of the experts resident now (their copies).
    pub fn resident_bytes(&self) -> u64 {
        self.resident
    }

    /// The budget for resident experts.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// The counters.
    pub fn stats(&self) -> PagingStats {
        self.stats
    }

    /// Expert `expert` of MoE layer `layer` (the model's MoE layers counted from 0), made
    /// resident — paging out the least recently used experts as the budget needs — or `None`
    /// for an index the model does not have.
    pub fn acquire(&mut self, layer: usize, expert: usize) -> Result<Option<&ExpertW>> {
        let i = layer * self.n_expert + expert;
        if i >= self.units.len() {
            return Ok(None);
        }
        self.clock += 1;
        if self.units[i].copy.is_some() {
            self.stats.hits += 1;
            self.units[i].last_use = self.clock;
            return Ok(self.units[i].copy.as_ref());
        }
        self.stats.misses += 1;
        let need = self.units[i].bytes;
        while self.resident + need > self.budget {
            let victim = self
                .units
                .iter()
                .enumerate()
                .filter(|(j, u)| u.copy.is_some() && *j != i)
                .min_by_key(|(_, u)| u.last_use)
                .map(|(j, _)| j);
            let Some(j) = victim else { break };
            self.units[j].copy = None;
            self.resident -= self.units[j].bytes;
            self.stats.evictions += 1;
        }
        let page = self.page;
        let u = &mut self.units[i];
        let copy = ExpertW {
            gate: copy_of(&u.mapped.gate)?,
            up: copy_of(&u.mapped.up)?,
            down: copy_of(&u.mapped.down)?,
        };
        for mat in [&u.mapped.gate, &u.mapped.up, &u.mapped.down] {
            unmap_pages(mat.raw_bytes(), page);
        }
        u.copy = Some(copy);
        u.last_use = self.clock;
        self.resident += need;
        self.stats.bytes_in += need;
        Ok(self.units[i].copy.as_ref())
    }
}
