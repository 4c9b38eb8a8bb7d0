//! The plain streaming read the kernel benches pair each timed call with (shared by
//! `kbench_ggml` and `kbench_a8` through `#[path]`).

/// The streaming read's prefetch distance in bytes (`KBENCH_STREAM_PREFETCH`, default 6144,
/// the one-row GEMVs' distance).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn stream_prefetch() -> usize {
    static D: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *D.get_or_init(|| {
        std::env::var("KBENCH_STREAM_PREFETCH")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(6144)
    })
}

/// XOR of every byte of `b`: 512-bit loads into four independent chains with software
/// prefetch [`stream_prefetch`] bytes ahead (no arithmetic to speak of: the rate a
/// bandwidth-bound kernel can at best reach).
pub fn read_all(b: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F.
        return unsafe { read_all_avx512(b) };
    }
    b.chunks(8).fold(0u64, |a, c| {
        a ^ c.iter().fold(0u64, |x, &v| (x << 8) | v as u64)
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn read_all_avx512(b: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    let d = stream_prefetch();
    let mut chunks = b.chunks_exact(256);
    for c in &mut chunks {
        // SAFETY: 256 bytes at c; prefetch of any address is allowed.
        unsafe {
            for k in 0..4 {
                _mm_prefetch::<_MM_HINT_T0>(c.as_ptr().wrapping_add(d + 64 * k).cast());
            }
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm512_xor_si512(*a, _mm512_loadu_si512(c.as_ptr().add(64 * k).cast()));
            }
        }
    }
    let v = _mm512_xor_si512(
        _mm512_xor_si512(acc[0], acc[1]),
        _mm512_xor_si512(acc[2], acc[3]),
    );
    let mut w = [0u64; 8];
    // SAFETY: 64 bytes to a local array.
    unsafe { _mm512_storeu_si512(w.as_mut_ptr().cast(), v) };
    chunks
        .remainder()
        .iter()
        .fold(w.iter().fold(0, |a, x| a ^ x), |a, &v| a ^ v as u64)
}
