//! Perplexity as llama.cpp's `llama-perplexity` computes it (`tools/perplexity`): the text's
//! tokens (BOS first when the vocabulary adds one) are cut into chunks of `ctx` tokens; each
//! chunk runs in a fresh cache, its first token replaced by BOS, in passes of at most
//! `batch` rows, and asks logits for the positions from `ctx / 2` on; the second half of each
//! chunk is scored: token `t + 1` by the log-softmax of row `t` (`max` in f32, `Σ expf(l − max)`
//! in f64, `l_tok − max − ln Σ`), the negative log-likelihoods summed in f64;
//! `ppl = exp(Σ nll / count)`. Fewer than `2·ctx` tokens is an error, as there.

use crate::error::{Result, RuntimeError};
use crate::executor::{Executor, Row, prompt_order};
use crate::kv::{KvCache, KvDtype};

/// How to run [`perplexity`].
#[derive(Debug, Clone, Copy)]
pub struct PerplexityParams {
    /// Tokens per chunk (llama.cpp's `-c`).
    pub ctx: usize,
    /// Rows per pass (llama.cpp's micro-batch; at most `ctx`).
    pub batch: usize,
    /// At most this many chunks (`None`: all that fit).
    pub max_chunks: Option<usize>,
    /// The BOS id each chunk starts with (`None`: the chunk's own first token).
    pub bos: Option<u32>,
}

/// The result of [`perplexity`].
#[derive(Debug, Clone, PartialEq)]
pub struct PerplexityResult {
    /// `exp(mean nll)` over every scored token.
    pub ppl: f64,
    /// Mean negative log-likelihood (nats per token).
    pub nll: f64,
    /// Tokens scored.
    pub count: usize,
    /// The running perplexity after each chunk (llama.cpp's `[i]x.xxxx` line).
    pub running: Vec<f64>,
    /// Standard error of `ppl` (llama.cpp's `+/-`).
    pub ppl_err: f64,
    /// Mean KL divergence `KL(p_reference ‖ p_model)` of the next-token distribution over the
    /// scored rows, when a reference ran beside ([`perplexity_against`]).
    pub kl: Option<f64>,
}

/// `KL(p ‖ q)` of the softmaxes of two logit rows, in f64.
pub fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let lse = |r: &[f32]| {
        let m = r.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        m + r.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln()
    };
    let (lp, lq) = (lse(p_logits), lse(q_logits));
    p_logits
        .iter()
        .zip(q_logits)
        .map(|(&a, &b)| {
            let la = a as f64 - lp;
            la.exp() * (la - (b as f64 - lq))
        })
        .sum::<f64>()
        .max(0.0)
}

/// llama.cpp's `log_softmax(n_vocab, logits, tok).log_softmax`.
pub fn log_softmax(logits: &[f32], tok: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    f64::from(logits[tok] - max) - sum.ln()
}

/// Runs one chunk of `p.ctx` tokens through `exec` in slot 0 of `kv` (opened afresh), in passes
/// of at most `p.batch` rows, its first token replaced by `p.bos`, and writes the logits of the
/// rows from `ctx / 2` on into `out` (`(ctx − ctx / 2) · vocab` values). `rows` is scratch.
pub(crate) fn chunk_logits(
    exec: &mut Executor,
    kv: &mut KvCache,
    chunk: &[u32],
    p: &PerplexityParams,
    rows: &mut Vec<Row>,
    out: &mut [f32],
) -> Result<()> {
    let ctx = p.ctx;
    let batch = p.batch.clamp(1, ctx);
    let first = ctx / 2;
    kv.open(0)?;
    let mut got = 0;
    for b0 in (0..ctx).step_by(batch) {
        let b1 = (b0 + batch).min(ctx);
        rows.clear();
        rows.extend((b0..b1).map(|pos| Row {
            slot: 0,
            pos: pos as u32,
            token: match (pos, p.bos) {
                (0, Some(bos)) => bos,
                _ => chunk[pos],
            },
            logits: pos >= first,
            order: prompt_order(pos, ctx, batch),
        }));
        let o = exec.forward(kv, rows)?;
        out[got..got + o.len()].copy_from_slice(o);
        got += o.len();
    }
    Ok(())
}

/// The checks [`perplexity_against`] makes of `p` against a text of `n_tokens`: a chunk of at
/// least 2 tokens, and at least two chunks' worth of text.
pub(crate) fn check_chunks(p: &PerplexityParams, n_tokens: usize) -> Result<()> {
    let ctx = p.ctx;
    if ctx < 2 {
        return Err(RuntimeError::InvalidParam {
            name: "ctx",
            reason: format!("{ctx}: a chunk needs at least 2 tokens"),
        });
    }
    if n_tokens < 2 * ctx {
        return Err(RuntimeError::InvalidParam {
            name: "ctx",
            reason: format!(
                "the text has {n_tokens} tokens; perplexity with a context of {ctx} needs at least {}",
                2 * ctx
            ),
        });
    }
    Ok(())
}

/// Runs `tokens` through `exec` chunk by chunk and scores them (see the module docs);
/// `on_chunk(i, running_ppl)` after each chunk.
pub fn perplexity(
    exec: &mut Executor,
    tokens: &[u32],
    p: &PerplexityParams,
    on_chunk: impl FnMut(usize, f64),
) -> Result<PerplexityResult> {
    perplexity_against(exec, None, tokens, p, on_chunk)
}

/// [`perplexity`], and with a `reference` executor (the source precision of the same model)
/// the mean KL divergence of `exec`'s next-token distribution from the reference's over the
/// scored rows.
pub fn perplexity_against(
    exec: &mut Executor,
    mut reference: Option<&mut Executor>,
    tokens: &[u32],
    p: &PerplexityParams,
    mut on_chunk: impl FnMut(usize, f64),
) -> Result<PerplexityResult> {
    let ctx = p.ctx;
    check_chunks(p, tokens.len())?;
    let batch = p.batch.clamp(1, ctx);
    let vocab = exec.model().vocab();
    let n_chunk = (tokens.len() / ctx).min(p.max_chunks.unwrap_or(usize::MAX));
    let first = ctx / 2;
    let model = exec.model().clone();
    let mut kv = KvCache::new(&model, KvDtype::F32, 1, ctx, batch)?;
    let mut ref_kv = match reference.as_deref() {
        Some(r) => {
            // The same model at another precision, or another file of it (a re-quantization):
            // the same vocabulary, token for token, is what a KL divergence needs.
            if r.model().vocab() != vocab {
                return Err(RuntimeError::InvalidParam {
                    name: "reference",
                    reason: format!(
                        "the reference has {} tokens, the model {vocab}: not the same vocabulary",
                        r.model().vocab()
                    ),
                });
            }
            Some(KvCache::new(r.model(), KvDtype::F32, 1, ctx, batch)?)
        }
        None => None,
    };
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let mut kl_sum = 0f64;
    let mut running = Vec::with_capacity(n_chunk);
    let mut logits = vec![0f32; (ctx - first) * vocab];
    let mut ref_logits = if reference.is_some() {
        vec![0f32; (ctx - first) * vocab]
    } else {
        Vec::new()
    };
    let mut rows = Vec::with_capacity(batch);
    for c in 0..n_chunk {
        let chunk = &tokens[c * ctx..(c + 1) * ctx];
        chunk_logits(exec, &mut kv, chunk, p, &mut rows, &mut logits)?;
        if let (Some(r), Some(k)) = (reference.as_deref_mut(), ref_kv.as_mut()) {
            chunk_logits(r, k, chunk, p, &mut rows, &mut ref_logits)?;
        }
        for i in 0..ctx - 1 - first {
            let row = &logits[i * vocab..(i + 1) * vocab];
            let v = -log_softmax(row, chunk[first + i + 1] as usize);
            nll += v;
            nll2 += v * v;
            if !ref_logits.is_empty() {
                kl_sum += kl_divergence(&ref_logits[i * vocab..(i + 1) * vocab], row);
            }
        }
        count += ctx - 1 - first;
        let r = (nll / count as f64).exp();
        running.push(r);
        on_chunk(c, r);
    }
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    let ppl_err = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    Ok(PerplexityResult {
        ppl,
        nll: mean,
        count,
        running,
        ppl_err,
        kl: reference.is_some().then(|| kl_sum / count as f64),
    })
}
