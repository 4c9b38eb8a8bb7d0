//! Attention against a naive f64 reference: GQA, causal and sliding-window masks, f32/f16 KV,
//! one and many query rows, on every supported path.

mod common;

use half::f16;
use synapse_kernels::{AttentionParams, KernelCtx, KernelPath, KvView, attention};

fn reference(
    p: &AttentionParams,
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
            let vis: Vec<usize> = (0..kv_len)
                .filter(|&j| j <= pos && p.window.is_none_or(|w| pos - j < w))
                .collect();
            let s: Vec<f64> = vis
                .iter()
                .map(|&j| {
                    let kr = &k[(j * p.n_kv_heads + kvh) * hd..][..hd];
                    qh.iter()
                        .zip(kr)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * p.scale as f64
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

#[test]
fn attention_matches_reference_on_every_path() {
    let cases = [
        // (n_heads, n_kv_heads, head_dim, window, kv_len, query positions)
        (4, 1, 256, None, 7, vec![6]),
        (4, 1, 256, Some(3), 9, vec![8]),
        (4, 2, 64, None, 20, (10..20).collect::<Vec<_>>()),
        (2, 2, 30, Some(5), 12, (0..12).collect()),
        (4, 1, 256, Some(512), 40, (0..40).collect()),
    ];
    for path in KernelPath::supported() {
        for (n_heads, n_kv_heads, head_dim, window, kv_len, q_pos) in cases.clone() {
            let p = AttentionParams {
                n_heads,
                n_kv_heads,
                head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
                window,
            };
            let q = common::generate_data(0.3, q_pos.len() * n_heads * head_dim, 1.0);
            let k: Vec<f32> = common::generate_data(1.7, kv_len * n_kv_heads * head_dim, 1.0)
                .into_iter()
                .map(|x| f16::from_f32(x).to_f32())
                .collect();
            let v: Vec<f32> = common::generate_data(2.9, kv_len * n_kv_heads * head_dim, 1.0)
                .into_iter()
                .map(|x| f16::from_f32(x).to_f32())
                .collect();
            let want = reference(&p, &q, &q_pos, &k, &v, kv_len);
            let (k16, v16): (Vec<f16>, Vec<f16>) = (
                k.iter().map(|&x| f16::from_f32(x)).collect(),
                v.iter().map(|&x| f16::from_f32(x)).collect(),
            );
            for threads in [1, 2] {
                let mut ctx = KernelCtx::with_path_and_threads(path, threads).unwrap();
                for (kv, vv) in [
                    (KvView::F32(&k), KvView::F32(&v)),
                    (KvView::F16(&k16), KvView::F16(&v16)),
                ] {
                    let mut out = vec![f32::NAN; q.len()];
                    attention(&p, &q, &q_pos, kv, vv, kv_len, &mut out, &mut ctx).unwrap();
                    for (i, (g, w)) in out.iter().zip(&want).enumerate() {
                        assert!(
                            (g - w).abs() < 1e-4,
                            "{path} {p:?} threads={threads} [{i}]: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn attention_rejects_bad_shapes() {
    let p = AttentionParams {
        n_heads: 3,
        n_kv_heads: 2,
        head_dim: 4,
        scale: 1.0,
        window: None,
    };
    let mut ctx = KernelCtx::with_path_and_threads(KernelPath::Scalar, 1).unwrap();
    let mut out = vec![0.0; 12];
    assert!(
        attention(
            &p,
            &[0.0; 12],
            &[0],
            KvView::F32(&[0.0; 8]),
            KvView::F32(&[0.0; 8]),
            1,
            &mut out,
            &mut ctx
        )
        .is_err()
    );
    let p = AttentionParams {
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 4,
        scale: 1.0,
        window: None,
    };
    let mut out = vec![0.0; 8];
    assert!(
        attention(
            &p,
            &[0.0; 8],
            &[1],
            KvView::F32(&[0.0; 4]),
            KvView::F32(&[0.0; 8]),
            2,
            &mut out,
            &mut ctx
        )
        .is_err()
    );
}
