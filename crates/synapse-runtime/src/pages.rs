//! Zeroed element buffers on transparent huge pages where the buffer is large enough to hold
//! one: the KV cache's buffers and a model's resident weight image ([`crate::Model::load_resident`]).
//!
//! A decode step at long context streams every key and value of its session once: SmolLM2 at
//! 8,000 cells reads 372 MB of f32 cache per token, four times its weights. On 4 KiB pages
//! such a sweep takes a TLB miss every 4 KiB and the hardware prefetchers stop at every page
//! boundary; on 2 MiB pages it does neither. Zen 4, one thread, 134 MB of keys (attention
//! scores of 3 queries × 8,000 keys × 64 heads, `examples/attn_bench`, medians of 8 passes,
//! THP `madvise` against `always`, alternated 4×): scores 13.2–17.9 → 18.3–22.5 GB/s, a plain
//! read 19.3–22.5 → 26.3–31.2.
//!
//! A buffer of at least [`HUGE`] bytes (on Linux) is its own anonymous mapping, started on a
//! 2 MiB boundary, whose whole 2 MiB blocks are advised `MADV_HUGEPAGE` (honoured when the
//! system's THP mode is `madvise` or `always`; nothing changes under `never`). Its tail past
//! the last whole block stays on small pages, so it commits no memory beyond the buffer. A
//! fresh mapping reads as zeros and is committed as it is first written, as `calloc` memory
//! is. Smaller buffers, and other systems, are plain zeroed vectors.

use bytemuck::Pod;

/// The huge page size this module aligns to and the smallest buffer it maps (2 MiB, x86-64
/// and arm64's PMD size with 4 KiB base pages).
pub(crate) const HUGE: usize = 2 << 20;

/// A fixed-length zeroed buffer of `T` (see the module docs for where it lives).
pub(crate) struct Pages<T: Pod> {
    store: Store<T>,
}

enum Store<T: Pod> {
    Vec(Vec<T>),
    #[cfg(target_os = "linux")]
    Map(Mapping<T>),
}

/// An anonymous mapping of `map_len` bytes at `base`; the elements start at `data`, the
/// first 2 MiB boundary in it.
#[cfg(target_os = "linux")]
struct Mapping<T> {
    base: *mut libc::c_void,
    map_len: usize,
    data: std::ptr::NonNull<T>,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone (like a `Vec`'s allocation): it is
// unmapped once, on drop, and reached only through `&self` / `&mut self`.
#[cfg(target_os = "linux")]
unsafe impl<T: Send> Send for Mapping<T> {}
// SAFETY: as above; shared access only reads.
#[cfg(target_os = "linux")]
unsafe impl<T: Sync> Sync for Mapping<T> {}

impl<T: Pod> Pages<T> {
    /// `len` zeroed elements.
    ///
    /// # Panics
    /// As `vec![T::zeroed(); len]` does when the size overflows or memory is exhausted.
    pub(crate) fn zeroed(len: usize) -> Self {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .expect("buffer size overflows");
        #[cfg(target_os = "linux")]
        if bytes >= HUGE
            && let Some(m) = Mapping::new(len, bytes)
        {
            return Self {
                store: Store::Map(m),
            };
        }
        let _ = bytes;
        Self {
            store: Store::Vec(vec![T::zeroed(); len]),
        }
    }

    /// Commits every page now (one zero written per 4 KiB: a huge page is committed whole
    /// by its first write), so that the first writes of real data fault nothing.
    pub(crate) fn commit(&mut self) {
        let step = (4096 / std::mem::size_of::<T>().max(1)).max(1);
        let p = self.as_mut_ptr();
        for i in (0..self.len()).step_by(step) {
            // SAFETY: `i < len`, inside the buffer; volatile so the store of a zero into
            // memory the compiler may know to be zero (a fresh `calloc`) is not elided.
            unsafe { std::ptr::write_volatile(p.add(i), T::zeroed()) };
        }
    }

    /// Whether the buffer is a mapping advised onto huge pages.
    #[cfg(test)]
    pub(crate) fn is_mapped(&self) -> bool {
        match &self.store {
            Store::Vec(_) => false,
            #[cfg(target_os = "linux")]
            Store::Map(_) => true,
        }
    }
}

#[cfg(target_os = "linux")]
impl<T: Pod> Mapping<T> {
    /// A mapping for `len` elements (`bytes` bytes, at least [`HUGE`]), or `None` if the
    /// system refuses it (the caller falls back to a vector, which fails as any allocation
    /// does when memory is truly out).
    fn new(len: usize, bytes: usize) -> Option<Self> {
        // The slack lets the data start on a 2 MiB boundary wherever the mapping lands.
        let map_len = bytes.checked_add(HUGE)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let skip = (HUGE - base as usize % HUGE) % HUGE;
        // SAFETY: `skip < HUGE`, so the data and its `bytes` lie inside the mapping.
        let data = unsafe { base.cast::<u8>().add(skip) };
        let whole = bytes / HUGE * HUGE;
        // SAFETY: `data..data + whole` lies inside the mapping; advice changes no contents,
        // and its failure (no THP in this kernel) only leaves small pages.
        unsafe { libc::madvise(data.cast(), whole, libc::MADV_HUGEPAGE) };
        Some(Self {
            base,
            map_len,
            // SAFETY: inside a successful mapping, so not null; page-aligned, so aligned
            // for any `Pod` element.
            data: unsafe { std::ptr::NonNull::new_unchecked(data.cast::<T>()) },
            len,
        })
    }
}

#[cfg(target_os = "linux")]
impl<T> Drop for Mapping<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; no reference into it outlives
        // `self`.
        unsafe { libc::munmap(self.base, self.map_len) };
    }
}

impl<T: Pod> std::ops::Deref for Pages<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.store {
            Store::Vec(v) => v,
            // SAFETY: `len` initialised (zero-filled) elements at `data`, owned by `self`.
            #[cfg(target_os = "linux")]
            Store::Map(m) => unsafe { std::slice::from_raw_parts(m.data.as_ptr(), m.len) },
        }
    }
}

impl<T: Pod> std::ops::DerefMut for Pages<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.store {
            Store::Vec(v) => v,
            // SAFETY: as for `deref`, borrowed mutably through `&mut self`.
            #[cfg(target_os = "linux")]
            Store::Map(m) => unsafe { std::slice::from_raw_parts_mut(m.data.as_ptr(), m.len) },
        }
    }
}

impl<T: Pod> std::fmt::Debug for Pages<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pages")
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_are_zeroed_aligned_mappings_and_small_ones_vectors() {
        // Just under, at, and past one huge page, and a few of them with a tail.
        for len in [HUGE / 4 - 1, HUGE / 4, HUGE / 4 + 3, 5 * HUGE / 4 + 1000] {
            let mut p = Pages::<f32>::zeroed(len);
            assert_eq!(p.len(), len);
            assert!(p.iter().all(|&x| x.to_bits() == 0), "len {len}: not zeroed");
            let mapped = cfg!(target_os = "linux") && len * 4 >= HUGE;
            assert_eq!(p.is_mapped(), mapped, "len {len}");
            if mapped {
                assert_eq!(
                    p.as_ptr() as usize % HUGE,
                    0,
                    "len {len}: not on a 2 MiB line"
                );
            }
            // Every element is writable and reads back, first and last included.
            for (i, x) in p.iter_mut().enumerate() {
                *x = i as f32;
            }
            assert!(p.iter().enumerate().all(|(i, &x)| x == i as f32));
        }
        let h = Pages::<half::f16>::zeroed(HUGE);
        assert_eq!(h.len(), HUGE);
        assert!(h.iter().all(|x| x.to_bits() == 0));
    }
}
