//! ggml's attention primitives (`ggml_f32::scores_f32` → `softmax_cells` → `pv_t_f32` over
//! transposed values, in both P·V orders) composed as the executor composes them, against a naive f64
//! `softmax(q·Kᵀ·scale)·V`: GQA cache layouts, causal and sliding-window spans, head dims
//! below, at and off multiples of 16, one and many query positions.

mod common;

use synapse_kernels::ggml_f32::{self, PvOrder, PvtQuery, PvtRun};

/// Shape and masking of one case.
#[derive(Debug, Clone, Copy)]
struct Params {
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    scale: f32,
    window: Option<usize>,
}

/// The KV cells a query at `pos` sees: `j ≤ pos`, `j < kv_len`, inside the window.
fn visible(p: &Params, pos: usize, kv_len: usize) -> std::ops::RangeInclusive<usize> {
    let hi = pos.min(kv_len - 1);
    let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    lo..=hi
}

fn reference(
    p: &Params,
    q: &[f32],
    q_pos: &[usize],
    k: &[f32],
    v: &[f32],
    kv_len: usize,
) -> Vec<f32> {
    let hd = p.head_dim;
    let mut out = vec![0f32; q.len()];
    for (i, &pos) in q_pos.iter().enumerate() {
        for h in 0..p.n_heads {
            let kvh = h / (p.n_heads / p.n_kv_heads);
            let qh = &q[(i * p.n_heads + h) * hd..][..hd];
            let vis: Vec<usize> = visible(p, pos, kv_len).collect();
            let s: Vec<f64> = vis
                .iter()
                .map(|&j| {
                    common::dot64(qh, &k[(j * p.n_kv_heads + kvh) * hd..][..hd]) * p.scale as f64
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..hd {
                let acc: f64 = vis
                    .iter()
                    .zip(&e)
                    .map(|(&j, w)| w / z * v[(j * p.n_kv_heads + kvh) * hd + d] as f64)
                    .sum();
                out[(i * p.n_heads + h) * hd + d] = acc as f32;
            }
        }
    }
    out
}

/// The executor's composition of the primitives, one (query, head) at a time.
fn ggml_attention(
    p: &Params,
    q: &[f32],
    q_pos: &[usize],
    k: &[f32],
    v: &[f32],
    kv_len: usize,
    order: PvOrder,
) -> Vec<f32> {
    let hd = p.head_dim;
    let kvrow = p.n_kv_heads * hd;
    // The executor's value layout: V[kv_head][dim][cell].
    let mut vt = vec![0f32; v.len()];
    for j in 0..kv_len {
        for c in 0..kvrow {
            vt[c * kv_len + j] = v[j * kvrow + c];
        }
    }
    let mut out = vec![f32::NAN; q.len()];
    let mut state = Vec::new();
    for (i, &pos) in q_pos.iter().enumerate() {
        for h in 0..p.n_heads {
            let kvh = h / (p.n_heads / p.n_kv_heads);
            let qh = &q[(i * p.n_heads + h) * hd..][..hd];
            let cells = visible(p, pos, kv_len);
            let lo = *cells.start();
            let offs: Vec<usize> = cells.map(|j| j * kvrow + kvh * hd).collect();
            let mut sc = vec![0f32; offs.len()];
            ggml_f32::scores_f32(k, &offs, qh, p.scale, &mut sc);
            ggml_f32::softmax_cells(&mut sc, lo);
            let o = &mut out[(i * p.n_heads + h) * hd..][..hd];
            let head = &vt[kvh * hd * kv_len..(kvh + 1) * hd * kv_len];
            let run = PvtRun {
                col: lo,
                len: offs.len(),
            };
            let mut qs = [PvtQuery { p: &sc, out: o }];
            ggml_f32::pv_t_f32(order, head, kv_len, &[run], lo, &mut qs, &mut state);
        }
    }
    out
}

#[test]
fn attention_primitives_match_reference() {
    let cases = [
        // (n_heads, n_kv_heads, head_dim, window, kv_len, query positions)
        (4, 1, 256, None, 7, vec![6]),
        (4, 1, 256, Some(3), 9, vec![8]),
        (4, 2, 64, None, 20, (10..20).collect::<Vec<_>>()),
        (2, 2, 30, Some(5), 12, (0..12).collect()),
        (4, 1, 256, Some(512), 40, (0..40).collect()),
        (2, 1, 80, None, 150, vec![0, 63, 64, 149]),
    ];
    for (n_heads, n_kv_heads, head_dim, window, kv_len, q_pos) in cases {
        let p = Params {
            n_heads,
            n_kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window,
        };
        let q = common::generate_data(0.3, q_pos.len() * n_heads * head_dim, 1.0);
        let k = common::generate_data(1.7, kv_len * n_kv_heads * head_dim, 1.0);
        let v = common::generate_data(2.9, kv_len * n_kv_heads * head_dim, 1.0);
        let want = reference(&p, &q, &q_pos, &k, &v, kv_len);
        for order in [PvOrder::VecDot, PvOrder::Gemm] {
            let got = ggml_attention(&p, &q, &q_pos, &k, &v, kv_len, order);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((g - w).abs() < 1e-4, "{p:?} {order:?} [{i}]: {g} vs {w}");
            }
        }
    }
}

#[test]
#[should_panic(expected = "key offset out of range")]
fn scores_reject_a_key_past_the_cache() {
    let mut sc = [0f32; 2];
    ggml_f32::scores_f32(&[0.0; 8], &[0, 5], &[0.0; 4], 1.0, &mut sc);
}

#[test]
#[should_panic(expected = "value run out of range")]
fn pv_rejects_a_value_past_the_cache() {
    let mut out = [0f32; 4];
    let p = [0.5f32, 0.5];
    let mut qs = [PvtQuery {
        p: &p,
        out: &mut out,
    }];
    // Four value rows of 2 cells each: row 3 ends at 8, a run at column 1 of length 2 passes it.
    ggml_f32::pv_t_f32(
        PvOrder::Gemm,
        &[0.0; 8],
        2,
        &[PvtRun { col: 1, len: 2 }],
        0,
        &mut qs,
        &mut Vec::new(),
    );
}
