//! Throughput of the f32 attention primitives over a long context (out of cache):
//! `attn_bench [CELLS] [HEAD_DIM] [QUERIES] [REPS]`. Prints the GB/s of K read by the scores
//! (head-major keys), of V read by the transposed P·V, and of a plain streaming sum over the
//! same bytes (what one core's memory path gives).
//! `ATTN_HEADS` (default 64) sets how many heads of K and V are swept (1: in cache);
//! `ATTN_ORDER=gemm` sums P·V in tinyBLAS's order (a prompt pass).
use std::time::Instant;
use synapse_kernels::ggml_f32::{self, PvOrder, PvtQuery, PvtRun};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let n: usize = a.get(1).and_then(|s| s.parse().ok()).unwrap_or(8192);
    let hd: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
    let nq: usize = a.get(3).and_then(|s| s.parse().ok()).unwrap_or(3);
    // 64 heads' worth of K and V, so one pass over them does not fit in the caches.
    let heads: usize = std::env::var("ATTN_HEADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    // ATTN_ALIGN=1: K, V and the scores start on a 64-byte line; else one float past one.
    let aligned = std::env::var("ATTN_ALIGN").is_ok_and(|s| s == "1");
    let at = |v: &[f32]| (16 - (v.as_ptr() as usize / 4) % 16) % 16 + usize::from(!aligned);
    let kbuf: Vec<f32> = (0..heads * n * hd + 32)
        .map(|i| ((i * 7919) % 1000) as f32 * 1e-3)
        .collect();
    let vbuf = kbuf.clone();
    let k = &kbuf[at(&kbuf)..][..heads * n * hd];
    let v = &vbuf[at(&vbuf)..][..heads * n * hd];
    let q: Vec<Vec<f32>> = (0..nq).map(|i| vec![0.01 * i as f32; hd]).collect();
    let qs: Vec<&[f32]> = q.iter().map(|x| x.as_slice()).collect();
    let mut scbuf = vec![0f32; nq * n + 32];
    let o = at(&scbuf);
    let sc = &mut scbuf[o..][..nq * n];
    let mut outs = vec![vec![0f32; hd]; nq];
    let mut state = Vec::new();
    // ATTN_ORDER=gemm: tinyBLAS's 16 lanes (a prompt pass), else vec_dot's 64 (a decode step).
    let order = match std::env::var("ATTN_ORDER").as_deref() {
        Ok("gemm") => PvOrder::Gemm,
        _ => PvOrder::VecDot,
    };
    let reps: usize = a.get(4).and_then(|s| s.parse().ok()).unwrap_or(5);
    for rep in 0..reps {
        let t = Instant::now();
        for h in 0..heads {
            let offs: Vec<usize> = (0..n).map(|j| (h * n + j) * hd).collect();
            ggml_f32::scores_f32_multi(k, &offs, &qs, 0.125, sc);
        }
        let ts = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for h in 0..heads {
            let head = &v[h * n * hd..(h + 1) * n * hd];
            let mut pq: Vec<PvtQuery<'_>> = outs
                .iter_mut()
                .enumerate()
                .map(|(i, o)| PvtQuery {
                    p: &sc[i * n..(i + 1) * n],
                    out: o,
                })
                .collect();
            ggml_f32::pv_t_f32(
                order,
                head,
                n,
                &[PvtRun { col: 0, len: n }],
                0,
                &mut pq,
                &mut state,
            );
        }
        let tp = t.elapsed().as_secs_f64();
        let bytes = (heads * n * hd * 4) as f64;
        let t = Instant::now();
        let mut acc = [0f32; 16];
        for c in k.chunks_exact(16) {
            for (a, x) in acc.iter_mut().zip(c) {
                *a += x;
            }
        }
        let tr = t.elapsed().as_secs_f64();
        std::hint::black_box(acc);
        println!(
            "rep {rep}: scores {:.1} GB/s, pv {:.1} GB/s, plain read {:.1} GB/s",
            bytes / ts / 1e9,
            bytes / tp / 1e9,
            bytes / tr / 1e9
        );
    }
}
