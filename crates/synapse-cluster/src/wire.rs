//! Between the engine's types and the wire's: requests and events, slot operations, rows
//! and hidden states (exact little-endian `f32`).

use synapse_runtime::engine::{Event, FinishReason, Finished, Logprob, Request, TokenEvent};
use synapse_runtime::pipeline::{NO_TOKEN, RowRead};
use synapse_runtime::sampling::ChooseAt;
use synapse_runtime::{KvOp, OrderClass, Row, SampleAt, SamplingParams};

use crate::error::{ClusterError, Result};
use crate::proto;

fn invalid(what: &'static str, reason: impl Into<String>) -> ClusterError {
    ClusterError::Invalid {
        what,
        reason: reason.into(),
    }
}

/// A request as a worker receives it (a constraint cannot travel: refused before).
pub fn request_to_wire(r: &Request, epoch: u64, plan_hash: &str) -> proto::GenerateRequest {
    let s = &r.sampling;
    proto::GenerateRequest {
        epoch,
        plan_hash: plan_hash.to_string(),
        prompt: r.prompt.clone(),
        max_tokens: r.max_tokens as u64,
        sampling: Some(proto::Sampling {
            temperature: s.temperature,
            top_k: s.top_k.min(u32::MAX as usize) as u32,
            top_p: s.top_p,
            min_p: s.min_p,
            repeat_penalty: s.repetition_penalty,
            repeat_last_n: s.penalty_last_n.min(u32::MAX as usize) as u32,
            frequency_penalty: s.frequency_penalty,
            presence_penalty: s.presence_penalty,
            seed: s.seed,
        }),
        logit_bias: r
            .logit_bias
            .iter()
            .map(|&(token, bias)| proto::LogitBias { token, bias })
            .collect(),
        stop: r.stop.clone(),
        stop_at_eog: r.stop_at_eog,
        logprobs: r
            .logprobs
            .map_or(0, |k| k.min(u32::MAX as usize - 1) as u32 + 1),
        forced: r.forced.clone(),
        constraint: r
            .constraint
            .as_ref()
            .and_then(|c| c.spec())
            .unwrap_or_default(),
    }
}

/// The engine request of a wire request (the engine validates the values).
pub fn request_from_wire(g: proto::GenerateRequest) -> Request {
    let s = g.sampling.unwrap_or_default();
    let mut r = Request::greedy(g.prompt, g.max_tokens.min(usize::MAX as u64) as usize);
    r.sampling = SamplingParams {
        temperature: s.temperature,
        top_k: s.top_k as usize,
        top_p: s.top_p,
        min_p: s.min_p,
        repetition_penalty: s.repeat_penalty,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        penalty_last_n: s.repeat_last_n as usize,
        seed: s.seed,
    };
    r.logit_bias = g.logit_bias.iter().map(|b| (b.token, b.bias)).collect();
    r.stop = g.stop;
    r.stop_at_eog = g.stop_at_eog;
    r.logprobs = (g.logprobs > 0).then(|| g.logprobs as usize - 1);
    r.forced = g.forced;
    r
}

/// An engine event on the wire.
pub fn event_to_wire(e: &Event) -> proto::GenerateEvent {
    use proto::generate_event::Event as E;
    let ev = match e {
        Event::Admitted { cached_tokens } => E::AdmittedCached(*cached_tokens as u64),
        Event::Token(t) => E::Token(proto::TokenEvent {
            id: t.id,
            text: t.text.clone(),
            has_logprob: t.logprob.is_some(),
            logprob: t.logprob.as_ref().map_or(0.0, |l| l.logprob),
            top: t.logprob.as_ref().map_or(Vec::new(), |l| {
                l.top
                    .iter()
                    .map(|&(token, logprob)| proto::TopLogprob { token, logprob })
                    .collect()
            }),
        }),
        Event::Done(d) => E::Done(proto::Finished {
            reason: d.reason.as_str().to_string(),
            prompt_tokens: d.prompt_tokens as u64,
            cached_tokens: d.cached_tokens as u64,
            completion_tokens: d.completion_tokens as u64,
            tail: d.tail.clone(),
        }),
        Event::Error(m) => E::Error(m.clone()),
    };
    proto::GenerateEvent { event: Some(ev) }
}

/// The engine event of a wire event.
pub fn event_from_wire(g: proto::GenerateEvent) -> Result<Event> {
    use proto::generate_event::Event as E;
    Ok(match g.event.ok_or_else(|| invalid("event", "empty"))? {
        E::AdmittedCached(c) => Event::Admitted {
            cached_tokens: c as usize,
        },
        E::Token(t) => Event::Token(TokenEvent {
            id: t.id,
            text: t.text,
            logprob: t.has_logprob.then(|| Logprob {
                logprob: t.logprob,
                top: t.top.iter().map(|x| (x.token, x.logprob)).collect(),
            }),
        }),
        E::Done(d) => Event::Done(Finished {
            reason: match d.reason.as_str() {
                "stop" => FinishReason::Stop,
                "length" => FinishReason::Length,
                "cancelled" => FinishReason::Cancelled,
                other => return Err(invalid("finish reason", other.to_string())),
            },
            prompt_tokens: d.prompt_tokens as usize,
            cached_tokens: d.cached_tokens as usize,
            completion_tokens: d.completion_tokens as usize,
            tail: d.tail,
        }),
        E::Error(m) => Event::Error(m),
    })
}

/// A slot operation on the wire.
pub fn op_to_wire(op: &KvOp) -> proto::KvOp {
    use proto::kv_op::Kind;
    let mut w = proto::KvOp::default();
    match op {
        KvOp::Open(s) => {
            w.set_kind(Kind::Open);
            w.slot = *s;
        }
        KvOp::Close(s) => {
            w.set_kind(Kind::Close);
            w.slot = *s;
        }
        KvOp::SetProfile(s, p) => {
            w.set_kind(Kind::SetProfile);
            w.slot = *s;
            w.profile = p.clone();
        }
        KvOp::Truncate(s, n) => {
            w.set_kind(Kind::Truncate);
            w.slot = *s;
            w.n = *n;
        }
        KvOp::CopyPrefix { src, dst, n } => {
            w.set_kind(Kind::CopyPrefix);
            w.src = *src;
            w.slot = *dst;
            w.n = *n;
        }
    }
    w
}

/// The slot operation of a wire one.
pub fn op_from_wire(w: &proto::KvOp) -> Result<KvOp> {
    use proto::kv_op::Kind;
    let kind = Kind::try_from(w.kind).map_err(|_| invalid("kv op", format!("kind {}", w.kind)))?;
    Ok(match kind {
        Kind::Open => KvOp::Open(w.slot),
        Kind::Close => KvOp::Close(w.slot),
        Kind::SetProfile => KvOp::SetProfile(w.slot, w.profile.clone()),
        Kind::Truncate => KvOp::Truncate(w.slot, w.n),
        Kind::CopyPrefix => KvOp::CopyPrefix {
            src: w.src,
            dst: w.slot,
            n: w.n,
        },
    })
}

fn order_code(o: OrderClass) -> u8 {
    match o {
        OrderClass::One => 0,
        OrderClass::Few => 1,
        OrderClass::Many => 2,
    }
}

/// `f32`s as little-endian bytes into `out` (cleared first).
pub fn f32s_to_bytes(v: &[f32], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// Little-endian bytes as `f32`s into `out` (cleared first); an error unless whole.
pub fn bytes_to_f32s(b: &[u8], out: &mut Vec<f32>) -> Result<()> {
    if !b.len().is_multiple_of(4) {
        return Err(invalid("f32 bytes", format!("{} bytes", b.len())));
    }
    out.clear();
    out.extend(
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
    );
    Ok(())
}

/// The rows of a pass into a packet's columns.
pub fn rows_to_wire(rows: &[Row], p: &mut proto::StepPacket) {
    p.slot = rows.iter().map(|r| r.slot).collect();
    p.pos = rows.iter().map(|r| r.pos).collect();
    p.token = rows.iter().map(|r| r.token).collect();
    p.logits = rows.iter().map(|r| r.logits as u8).collect();
    p.order = rows.iter().map(|r| order_code(r.order)).collect();
}

/// A packet's rows (its columns must agree in length; codes in their domains).
pub fn rows_from_wire(p: &proto::StepPacket, out: &mut Vec<Row>) -> Result<()> {
    let n = p.slot.len();
    if p.pos.len() != n || p.token.len() != n || p.logits.len() != n || p.order.len() != n {
        return Err(invalid("step packet", "row columns of different lengths"));
    }
    out.clear();
    for i in 0..n {
        let order = match p.order[i] {
            0 => OrderClass::One,
            1 => OrderClass::Few,
            2 => OrderClass::Many,
            c => return Err(invalid("step packet", format!("order code {c}"))),
        };
        out.push(Row {
            slot: p.slot[i],
            pos: p.pos[i],
            token: p.token[i],
            logits: match p.logits[i] {
                0 => false,
                1 => true,
                c => return Err(invalid("step packet", format!("logits flag {c}"))),
            },
            order,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_events_and_ops_round_trip() {
        let mut r = Request::greedy(vec![1, 2, 3], 7);
        r.sampling.temperature = 0.7;
        r.sampling.top_k = 40;
        r.sampling.seed = 99;
        r.logit_bias = vec![(5, -1.5)];
        r.stop = vec!["\n\n".into()];
        r.stop_at_eog = false;
        r.logprobs = Some(0);
        r.forced = vec![9, 8];
        let back = request_from_wire(request_to_wire(&r, 3, "h"));
        assert_eq!(format!("{:?}", back.sampling), format!("{:?}", r.sampling));
        assert_eq!(
            (
                back.prompt,
                back.max_tokens,
                back.logit_bias,
                back.stop,
                back.stop_at_eog,
                back.logprobs,
                back.forced
            ),
            (
                r.prompt,
                r.max_tokens,
                r.logit_bias,
                r.stop,
                r.stop_at_eog,
                r.logprobs,
                r.forced
            )
        );
        let evs = [
            Event::Admitted { cached_tokens: 4 },
            Event::Token(TokenEvent {
                id: 7,
                text: "é".into(),
                logprob: Some(Logprob {
                    logprob: -0.25,
                    top: vec![(7, -0.25), (3, -2.0)],
                }),
            }),
            Event::Token(TokenEvent {
                id: 8,
                text: String::new(),
                logprob: None,
            }),
            Event::Done(Finished {
                reason: FinishReason::Length,
                prompt_tokens: 3,
                cached_tokens: 0,
                completion_tokens: 2,
                tail: "x".into(),
            }),
            Event::Error("boom".into()),
        ];
        for e in evs {
            assert_eq!(event_from_wire(event_to_wire(&e)).unwrap(), e);
        }
        for op in [
            KvOp::Open(1),
            KvOp::Close(2),
            KvOp::SetProfile(0, "p".into()),
            KvOp::Truncate(3, 17),
            KvOp::CopyPrefix {
                src: 1,
                dst: 2,
                n: 9,
            },
        ] {
            assert_eq!(op_from_wire(&op_to_wire(&op)).unwrap(), op);
        }
        assert!(
            op_from_wire(&proto::KvOp {
                kind: 42,
                ..Default::default()
            })
            .is_err()
        );
    }

    #[test]
    fn rows_and_floats_round_trip_exactly() {
        let rows = vec![
            Row::decode(1, 5, 10),
            Row {
                slot: 0,
                pos: 0,
                token: 3,
                logits: false,
                order: OrderClass::Many,
            },
        ];
        let mut p = proto::StepPacket::default();
        rows_to_wire(&rows, &mut p);
        let mut back = Vec::new();
        rows_from_wire(&p, &mut back).unwrap();
        assert_eq!(back, rows);
        p.order[0] = 9;
        assert!(rows_from_wire(&p, &mut back).is_err());
        p.order.pop();
        assert!(rows_from_wire(&p, &mut back).is_err());
        let v = [
            1.0f32,
            -0.0,
            f32::MIN_POSITIVE,
            3.4e38,
            f32::from_bits(0x7fc0_0001),
        ];
        let mut b = Vec::new();
        f32s_to_bytes(&v, &mut b);
        let mut w = Vec::new();
        bytes_to_f32s(&b, &mut w).unwrap();
        assert!(v.iter().zip(&w).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert!(bytes_to_f32s(&b[1..], &mut w).is_err());
    }
}

/// A packet's row reads on the wire: a code per logits row, the sampled rows' parameters.
pub fn reads_to_wire(reads: &[RowRead], p: &mut proto::StepPacket) {
    p.reads.clear();
    p.samples.clear();
    p.chooses.clear();
    for r in reads {
        p.reads.push(match r {
            RowRead::Whole => 0,
            RowRead::Argmax => 1,
            RowRead::Sample(s) => {
                p.samples.push(proto::SampleAt {
                    temperature: s.temperature,
                    top_k: s.top_k,
                    top_p: s.top_p,
                    min_p: s.min_p,
                    u: s.u,
                });
                2
            }
            RowRead::Choose(c) => {
                p.chooses.push(choose_to_wire(c));
                3
            }
        });
    }
}

fn choose_to_wire(c: &ChooseAt) -> proto::ChooseAt {
    let mut banned = Vec::with_capacity(c.banned.len() * 8);
    for w in &c.banned {
        banned.extend_from_slice(&w.to_le_bytes());
    }
    let p = &c.params;
    proto::ChooseAt {
        bias_tokens: c.bias.iter().map(|b| b.0).collect(),
        bias_values: c.bias.iter().map(|b| b.1).collect(),
        banned,
        temperature: p.temperature,
        top_k: p.top_k.min(u32::MAX as usize) as u32,
        top_p: p.top_p,
        min_p: p.min_p,
        repetition_penalty: p.repetition_penalty,
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
        penalty_last_n: p.penalty_last_n.min(u32::MAX as usize) as u32,
        recent: c.recent.clone(),
        u: c.u,
        logprobs: c.logprobs.is_some(),
        top_logprobs: c.logprobs.unwrap_or(0),
    }
}

/// A choice's parameters off the wire, checked as a request's are (the sampler's own
/// validation; the variate in [0, 1); no more recent tokens than the penalty window).
fn choose_from_wire(c: &proto::ChooseAt) -> Result<ChooseAt> {
    if c.bias_tokens.len() != c.bias_values.len() || !c.banned.len().is_multiple_of(8) {
        return Err(invalid(
            "step packet",
            "malformed choice (bias pairs or ban bitset)",
        ));
    }
    let params = SamplingParams {
        temperature: c.temperature,
        top_k: c.top_k as usize,
        top_p: c.top_p,
        min_p: c.min_p,
        repetition_penalty: c.repetition_penalty,
        presence_penalty: c.presence_penalty,
        frequency_penalty: c.frequency_penalty,
        penalty_last_n: c.penalty_last_n as usize,
        ..SamplingParams::default()
    };
    params
        .validate()
        .map_err(|e| invalid("step packet", format!("choice parameters: {e}")))?;
    if !(0.0..1.0).contains(&c.u) || c.recent.len() > params.penalty_last_n {
        return Err(invalid(
            "step packet",
            format!(
                "choice variate {} or {} recent tokens for a window of {}",
                c.u,
                c.recent.len(),
                params.penalty_last_n
            ),
        ));
    }
    Ok(ChooseAt {
        bias: c
            .bias_tokens
            .iter()
            .copied()
            .zip(c.bias_values.iter().copied())
            .collect(),
        banned: c
            .banned
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect(),
        params,
        recent: c.recent.clone(),
        u: c.u,
        logprobs: c.logprobs.then_some(c.top_logprobs),
    })
}

/// A packet's row reads (codes in their domain, one sample per sampled row, parameters in
/// theirs).
pub fn reads_from_wire(p: &proto::StepPacket, out: &mut Vec<RowRead>) -> Result<()> {
    out.clear();
    let mut samples = p.samples.iter();
    let mut chooses = p.chooses.iter();
    for &c in &p.reads {
        out.push(match c {
            0 => RowRead::Whole,
            1 => RowRead::Argmax,
            2 => {
                let s = samples
                    .next()
                    .ok_or_else(|| invalid("step packet", "fewer samples than sampled rows"))?;
                let ok = s.temperature.is_finite()
                    && s.temperature > 0.0
                    && (0.0..=1.0).contains(&s.top_p)
                    && (0.0..=1.0).contains(&s.min_p)
                    && (0.0..1.0).contains(&s.u);
                if !ok {
                    return Err(invalid("step packet", format!("sample parameters {s:?}")));
                }
                RowRead::Sample(SampleAt {
                    temperature: s.temperature,
                    top_k: s.top_k,
                    top_p: s.top_p,
                    min_p: s.min_p,
                    u: s.u,
                })
            }
            3 => {
                let c = chooses
                    .next()
                    .ok_or_else(|| invalid("step packet", "fewer choices than chosen rows"))?;
                RowRead::Choose(Box::new(choose_from_wire(c)?))
            }
            c => return Err(invalid("step packet", format!("row read code {c}"))),
        });
    }
    if samples.next().is_some() || chooses.next().is_some() {
        return Err(invalid(
            "step packet",
            "more samples or choices than such rows",
        ));
    }
    Ok(())
}

/// A last stage's reply body: the logits rows (`vocab` values each) of rows read whole, and
/// the token of the others — the argmax (lowest id on ties, as greedy sampling chooses), the
/// sampled token ([`NO_TOKEN`] when nothing can be drawn), or the token chosen as its session
/// would (with its log-probabilities into `logprobs` when asked). Returns the rows sampled
/// or chosen here.
pub fn compress_logits(
    logits: &[f32],
    vocab: usize,
    reads: &[RowRead],
    out: &mut ReplyBody,
    sc: &mut ChooseScratch,
) -> Result<u64> {
    out.bytes.clear();
    out.tokens.clear();
    out.logprobs.clear();
    let mut sampled = 0;
    for (r, row) in logits.chunks_exact(vocab.max(1)).enumerate() {
        let read = reads.get(r).unwrap_or(&RowRead::Whole);
        match read {
            RowRead::Whole => {
                for x in row {
                    out.bytes.extend_from_slice(&x.to_le_bytes());
                }
            }
            RowRead::Choose(c) => {
                sampled += 1;
                let chosen = c
                    .choose(row, &mut sc.scratch, &mut sc.pre, &mut sc.cand)
                    .map_err(|e| invalid("step packet", format!("choice: {e}")))?;
                out.tokens.push(chosen.token);
                if let Some((lp, top)) = chosen.logprob {
                    out.logprobs.push(proto::RowLogprob {
                        chosen: lp,
                        top_tokens: top.iter().map(|t| t.0).collect(),
                        top_logprobs: top.iter().map(|t| t.1).collect(),
                    });
                }
            }
            _ => {
                sampled += matches!(read, RowRead::Sample(_)) as u64;
                out.tokens
                    .push(read.token(row, &mut sc.cand).unwrap_or(NO_TOKEN));
            }
        }
    }
    Ok(sampled)
}

/// A last stage's reply body ([`compress_logits`]).
#[derive(Debug, Default)]
pub struct ReplyBody {
    /// Whole rows, little-endian `f32`.
    pub bytes: Vec<u8>,
    /// Tokens of the rows read as tokens.
    pub tokens: Vec<u32>,
    /// Log-probabilities of the chosen rows that asked for them.
    pub logprobs: Vec<proto::RowLogprob>,
}

/// Buffers of [`compress_logits`].
#[derive(Debug, Default)]
pub struct ChooseScratch {
    scratch: Vec<f32>,
    pre: Vec<f32>,
    /// Candidates of a sampled choice.
    pub cand: Vec<(u32, f32)>,
}

/// The rows [`compress_logits`] made: whole rows as sent, a token row as its one-hot row
/// (0 at the token, `-inf` elsewhere: the same greedy choice, and the same sampled choice
/// with the same variate), [`NO_TOKEN`] of a sampled row as an all-NaN row (nothing to
/// draw, as from the real row). `rows` logits rows in all.
#[allow(clippy::too_many_arguments)]
pub fn expand_logits(
    bytes: &[u8],
    tokens: &[u32],
    logprobs: &[proto::RowLogprob],
    vocab: usize,
    reads: &[RowRead],
    rows: usize,
    out: &mut Vec<f32>,
    out_logprobs: &mut Vec<Option<synapse_runtime::pipeline::RowLogprob>>,
) -> Result<()> {
    let read = |r: usize| reads.get(r).unwrap_or(&RowRead::Whole);
    let whole = (0..rows).filter(|&r| *read(r) == RowRead::Whole).count();
    let asked = (0..rows)
        .filter(|&r| matches!(read(r), RowRead::Choose(c) if c.logprobs.is_some()))
        .count();
    if logprobs.len() != asked {
        return Err(invalid(
            "step reply",
            format!(
                "{} log-probability records for {asked} rows",
                logprobs.len()
            ),
        ));
    }
    out_logprobs.clear();
    let mut lps = logprobs.iter();
    if bytes.len() != whole * vocab * 4 || tokens.len() != rows - whole {
        return Err(invalid(
            "step reply",
            format!(
                "{} logits bytes and {} tokens for {rows} rows ({whole} whole) of {vocab}",
                bytes.len(),
                tokens.len()
            ),
        ));
    }
    out.clear();
    out.reserve(rows * vocab);
    let (mut b, mut t) = (bytes.chunks_exact(4), tokens.iter());
    for r in 0..rows {
        let rr = read(r);
        out_logprobs.push(match rr {
            RowRead::Choose(c) if c.logprobs.is_some() => {
                let l = lps
                    .next()
                    .ok_or_else(|| invalid("step reply", "log-probabilities"))?;
                if l.top_tokens.len() != l.top_logprobs.len()
                    || l.top_tokens.iter().any(|&t| t as usize >= vocab)
                {
                    return Err(invalid("step reply", "malformed log-probabilities"));
                }
                Some((
                    l.chosen,
                    l.top_tokens
                        .iter()
                        .copied()
                        .zip(l.top_logprobs.iter().copied())
                        .collect(),
                ))
            }
            _ => None,
        });
        if *rr == RowRead::Whole {
            out.extend(
                b.by_ref()
                    .take(vocab)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
            continue;
        }
        let id = *t.next().unwrap_or(&0);
        let at = out.len();
        if id == NO_TOKEN && matches!(rr, RowRead::Sample(_) | RowRead::Choose(_)) {
            out.resize(at + vocab, f32::NAN);
            continue;
        }
        if id as usize >= vocab {
            return Err(invalid("step reply", format!("token {id} of {vocab}")));
        }
        out.resize(at + vocab, f32::NEG_INFINITY);
        out[at + id as usize] = 0.0;
    }
    Ok(())
}

#[cfg(test)]
mod logits_tests {
    use super::*;

    fn compress(logits: &[f32], vocab: usize, reads: &[RowRead]) -> (ReplyBody, u64) {
        let mut body = ReplyBody::default();
        let n = compress_logits(
            logits,
            vocab,
            reads,
            &mut body,
            &mut ChooseScratch::default(),
        )
        .unwrap();
        (body, n)
    }

    type Lps = Vec<Option<synapse_runtime::pipeline::RowLogprob>>;

    fn expand(
        b: &ReplyBody,
        vocab: usize,
        reads: &[RowRead],
        rows: usize,
    ) -> Result<(Vec<f32>, Lps)> {
        let (mut out, mut lps) = (Vec::new(), Vec::new());
        expand_logits(
            &b.bytes,
            &b.tokens,
            &b.logprobs,
            vocab,
            reads,
            rows,
            &mut out,
            &mut lps,
        )?;
        Ok((out, lps))
    }

    fn body(tokens: &[u32]) -> ReplyBody {
        ReplyBody {
            tokens: tokens.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn argmax_rows_travel_as_tokens_and_choose_the_same() {
        let vocab = 7;
        let logits: Vec<f32> = (0..3 * vocab)
            .map(|i| ((i * 37) % 11) as f32 - 5.0)
            .collect();
        let mask = [RowRead::Argmax, RowRead::Whole, RowRead::Argmax];
        let (b, _) = compress(&logits, vocab, &mask);
        assert_eq!(b.bytes.len(), vocab * 4);
        assert_eq!(b.tokens.len(), 2);
        let (out, _) = expand(&b, vocab, &mask, 3).unwrap();
        for r in 0..3 {
            let (a, e) = (
                &logits[r * vocab..(r + 1) * vocab],
                &out[r * vocab..(r + 1) * vocab],
            );
            assert_eq!(synapse_runtime::argmax(a), synapse_runtime::argmax(e));
            if mask[r] == RowRead::Whole {
                assert!(a.iter().zip(e).all(|(x, y)| x.to_bits() == y.to_bits()));
            }
        }
        // Ties: the lowest id, as greedy sampling.
        let tie = [1.0f32, 3.0, 3.0, 0.0];
        let (b, _) = compress(&tie, 4, &[RowRead::Argmax]);
        assert_eq!(b.tokens, vec![1]);
        let one = [RowRead::Argmax];
        assert!(expand(&b, 4, &one, 2).is_err());
        assert!(expand(&body(&[9]), 4, &one, 1).is_err());
    }

    /// A row sampled at the last stage with the session's next variate gives the token the
    /// session's own sampler draws from the whole row; the session's sampler then chooses
    /// that token from its one-hot row and its stream moves as one machine's: over many
    /// draws, seeds and parameter sets, the two sessions' token sequences are equal.
    #[test]
    fn sampled_rows_travel_as_tokens_and_choose_the_same() {
        let vocab = 50;
        let params = [
            (0.7f32, 0, 1.0f32, 0.0f32),
            (1.3, 10, 1.0, 0.0),
            (0.9, 0, 0.9, 0.0),
            (1.0, 0, 1.0, 0.05),
            (0.5, 5, 0.8, 0.1),
        ];
        for (k, &(temperature, top_k, top_p, min_p)) in params.iter().enumerate() {
            let sp = SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                seed: 11 + k as u64,
                ..SamplingParams::default()
            };
            let mut here = synapse_runtime::Sampler::new(sp.clone()).unwrap();
            let mut there = synapse_runtime::Sampler::new(sp).unwrap();
            for step in 0..200 {
                let logits: Vec<f32> = (0..vocab)
                    .map(|i| (((i * 31 + step * 17) % 23) as f32 - 11.0) * 0.4)
                    .collect();
                let want = here.choose(&logits);
                let reads = [RowRead::Sample(SampleAt::of(&there))];
                let (b, n) = compress(&logits, vocab, &reads);
                assert_eq!((n, b.bytes.len(), b.tokens.as_slice()), (1, 0, &[want][..]));
                let (out, _) = expand(&b, vocab, &reads, 1).unwrap();
                assert_eq!(there.choose(&out), want, "params {k} step {step}");
                assert_eq!(here.peek_uniform(), there.peek_uniform());
            }
        }
        // Nothing to draw: an all-NaN row back, from which the sampler draws nothing.
        let nan = vec![f32::NAN; vocab];
        let sp = SamplingParams {
            temperature: 0.8,
            ..SamplingParams::default()
        };
        let s = synapse_runtime::Sampler::new(sp).unwrap();
        let reads = [RowRead::Sample(SampleAt::of(&s))];
        let (b, _) = compress(&nan, vocab, &reads);
        assert_eq!(b.tokens, vec![NO_TOKEN]);
        let (out, _) = expand(&b, vocab, &reads, 1).unwrap();
        assert!(out.iter().all(|x| x.is_nan()));
        // NO_TOKEN of an argmax row is out of range.
        assert!(expand(&b, vocab, &[RowRead::Argmax], 1).is_err());
    }

    #[test]
    fn row_reads_round_trip_and_bad_ones_are_refused() {
        let s = SampleAt {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            u: 0.25,
        };
        let reads = [
            RowRead::Whole,
            RowRead::Sample(s),
            RowRead::Argmax,
            RowRead::Sample(SampleAt { u: 0.5, ..s }),
        ];
        let mut p = proto::StepPacket::default();
        reads_to_wire(&reads, &mut p);
        let mut back = Vec::new();
        reads_from_wire(&p, &mut back).unwrap();
        assert_eq!(back, reads);
        let mut bad = p.clone();
        bad.samples.pop();
        assert!(reads_from_wire(&bad, &mut back).is_err());
        let mut bad = p.clone();
        bad.samples[0].u = 1.0;
        assert!(reads_from_wire(&bad, &mut back).is_err());
        let mut bad = p.clone();
        bad.reads[0] = 3;
        assert!(reads_from_wire(&bad, &mut back).is_err());
        let mut bad = p;
        bad.samples.push(bad.samples[0]);
        assert!(reads_from_wire(&bad, &mut back).is_err());
    }

    /// A chosen row's read round-trips; a malformed or out-of-range one is refused.
    #[test]
    fn chosen_reads_round_trip_and_bad_ones_are_refused() {
        let c = ChooseAt {
            bias: vec![(3, 1.5), (70, -2.0)],
            banned: vec![0b1010, 1 << 63],
            params: SamplingParams {
                temperature: 0.8,
                top_k: 5,
                repetition_penalty: 1.2,
                penalty_last_n: 4,
                ..SamplingParams::default()
            },
            recent: vec![1, 2, 2, 9],
            u: 0.375,
            logprobs: Some(2),
        };
        let reads = [RowRead::Argmax, RowRead::Choose(Box::new(c.clone()))];
        let mut p = proto::StepPacket::default();
        reads_to_wire(&reads, &mut p);
        let mut back = Vec::new();
        reads_from_wire(&p, &mut back).unwrap();
        assert_eq!(back, reads);
        assert!(c.is_banned(1) && c.is_banned(3) && c.is_banned(127) && !c.is_banned(2));
        for f in [
            |c: &mut proto::ChooseAt| c.u = 1.0,
            |c: &mut proto::ChooseAt| c.recent.push(5),
            |c: &mut proto::ChooseAt| c.banned.pop().map(|_| ()).unwrap_or(()),
            |c: &mut proto::ChooseAt| c.bias_values.pop().map(|_| ()).unwrap_or(()),
            |c: &mut proto::ChooseAt| c.temperature = f32::NAN,
            |c: &mut proto::ChooseAt| c.repetition_penalty = 0.0,
        ] {
            let mut bad = p.clone();
            f(&mut bad.chooses[0]);
            assert!(reads_from_wire(&bad, &mut back).is_err());
        }
        let mut bad = p.clone();
        bad.chooses.clear();
        assert!(reads_from_wire(&bad, &mut back).is_err());
        // Log-probabilities asked for must come back, one record per such row.
        let vocab = 130;
        let logits: Vec<f32> = (0..2 * vocab).map(|i| (i % 17) as f32 * 0.25).collect();
        let (b, n) = compress(&logits, vocab, &reads);
        assert_eq!((n, b.tokens.len(), b.logprobs.len()), (1, 2, 1));
        let (_, lps) = expand(&b, vocab, &reads, 2).unwrap();
        assert!(lps[0].is_none() && lps[1].as_ref().is_some_and(|l| l.1.len() == 2));
        let mut short = ReplyBody {
            bytes: b.bytes.clone(),
            tokens: b.tokens.clone(),
            logprobs: Vec::new(),
        };
        assert!(expand(&short, vocab, &reads, 2).is_err());
        short.logprobs = b.logprobs.clone();
        short.logprobs[0].top_tokens[0] = vocab as u32;
        assert!(expand(&short, vocab, &reads, 2).is_err());
    }
}

/// Hidden states on a link as `dtype` (`f32` exact; `f16`/`bf16` rounded to nearest even),
/// little-endian, into `out` (cleared first).
pub fn hidden_to_wire(v: &[f32], dtype: crate::plan::LinkDtype, out: &mut Vec<u8>) {
    use crate::plan::LinkDtype;
    match dtype {
        LinkDtype::F32 => f32s_to_bytes(v, out),
        LinkDtype::F16 => {
            out.clear();
            out.reserve(v.len() * 2);
            for x in v {
                out.extend_from_slice(&half::f16::from_f32(*x).to_le_bytes());
            }
        }
        LinkDtype::Bf16 => {
            out.clear();
            out.reserve(v.len() * 2);
            for x in v {
                out.extend_from_slice(&half::bf16::from_f32(*x).to_le_bytes());
            }
        }
    }
}

/// The code of a link dtype in a packet (`hidden_dtype`).
pub fn dtype_code(d: crate::plan::LinkDtype) -> u32 {
    match d {
        crate::plan::LinkDtype::F32 => 0,
        crate::plan::LinkDtype::F16 => 1,
        crate::plan::LinkDtype::Bf16 => 2,
    }
}

/// Hidden states from a packet whose `hidden_dtype` is `code`, widened to `f32`.
pub fn hidden_from_wire(b: &[u8], code: u32, out: &mut Vec<f32>) -> Result<()> {
    match code {
        0 => bytes_to_f32s(b, out),
        1 | 2 => {
            if !b.len().is_multiple_of(2) {
                return Err(invalid(
                    "hidden bytes",
                    format!("{} bytes of 16-bit values", b.len()),
                ));
            }
            out.clear();
            out.extend(b.chunks_exact(2).map(|c| {
                let bits = u16::from_le_bytes([c[0], c[1]]);
                if code == 1 {
                    half::f16::from_bits(bits).to_f32()
                } else {
                    half::bf16::from_bits(bits).to_f32()
                }
            }));
            Ok(())
        }
        c => Err(invalid("hidden dtype", format!("code {c}"))),
    }
}
