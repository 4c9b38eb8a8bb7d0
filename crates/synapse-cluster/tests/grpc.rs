//! The worker protocol in one process, over real gRPC on 127.0.0.1: a pipeline head's
//! scheduler stepping a remote stage gives the logits of one executor, bit for bit; a packet
//! or request under another plan is refused at the receiver.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use synapse_cluster::link::GrpcStageLink;
use synapse_cluster::plan::{ClusterPlan, EngineShape, PipelinePlan, StagePlan};
use synapse_cluster::proto;
use synapse_runtime::engine::{EngineConfig, Event, PipelineHead, Request, Scheduler, TokenPieces};
use synapse_runtime::pipeline::{StageLink, StepPacket};
use synapse_runtime::{Model, Row};

struct Ids;
impl TokenPieces for Ids {
    fn piece(&self, token: u32) -> Vec<u8> {
        format!("<{token}>").into_bytes()
    }
}

fn tiny(family: &str) -> Option<(Arc<Model>, Vec<Vec<u32>>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tiny")
        .join(family);
    if !synapse_testdata::require(&dir.join("oracle.json"), "tiny-model fixture") {
        return None;
    }
    let seqs = synapse_testdata::tiny_sequences(&dir);
    Some((
        Arc::new(Model::load(&dir.join("model.q8_0.gguf")).unwrap()),
        seqs,
    ))
}

const SHAPE: EngineShape = EngineShape {
    slots: 2,
    ctx: 96,
    ubatch: 16,
    link: synapse_cluster::plan::LinkDtype::F32,
    in_flight: 1,
};

fn plan(model: &Model, addr: &str, cut: usize) -> ClusterPlan {
    let n = model.layers.len();
    let mut p = ClusterPlan::new(
        &model.ir.fingerprint,
        SHAPE,
        vec![PipelinePlan {
            stages: vec![
                StagePlan {
                    worker: "head".into(),
                    addr: "http://unused".into(),
                    layers: 0..cut,
                },
                StagePlan {
                    worker: "tail".into(),
                    addr: addr.into(),
                    layers: cut..n,
                },
            ],
            tokens_per_s: 1.0,
        }],
        "pipeline",
    );
    p.epoch = 7;
    p
}

fn cfg() -> EngineConfig {
    EngineConfig {
        slots: SHAPE.slots,
        ctx: SHAPE.ctx,
        ubatch: SHAPE.ubatch,
        step_tokens: 24,
        threads: 1,
        ..EngineConfig::default()
    }
}

fn events(s: &mut Scheduler, reqs: Vec<Request>) -> Vec<Vec<Event>> {
    let mut sessions: Vec<_> = reqs.into_iter().map(|r| s.submit(r).unwrap()).collect();
    while s.step() {}
    sessions
        .iter_mut()
        .map(|x| {
            let mut v = Vec::new();
            while let Some(e) = x.try_next() {
                v.push(e);
            }
            v
        })
        .collect()
}

fn requests(seqs: &[Vec<u32>]) -> Vec<Request> {
    let mut out: Vec<Request> = seqs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut r = Request::greedy(s.clone(), 10);
            r.logprobs = Some(3);
            r.stop_at_eog = false;
            if i % 2 == 1 {
                r.sampling.temperature = 0.7;
                r.sampling.seed = 5;
            }
            r
        })
        .collect();
    // Sessions whose choice reads more than the row: bias, penalties and a constraint,
    // greedy and sampled, with and without log-probabilities (chosen at the last stage).
    for (i, s) in seqs.iter().enumerate() {
        let mut r = Request::greedy(s.clone(), 12);
        r.stop_at_eog = false;
        r.logit_bias = vec![(s[0], 1.5), (s[s.len() - 1], -2.0)];
        r.sampling.repetition_penalty = 1.3;
        r.sampling.presence_penalty = 0.2;
        r.sampling.frequency_penalty = 0.1;
        r.sampling.penalty_last_n = 8;
        r.constraint = Some(Box::new(Ban { step: i as u32 }));
        if i % 2 == 0 {
            r.logprobs = Some(2);
            r.sampling.temperature = 0.9;
            r.sampling.seed = 9 + i as u64;
        }
        out.push(r);
    }
    out
}

/// A constraint that bans, at each step, every token whose id is `step` mod 3 (`step`
/// counting committed tokens): it never completes.
struct Ban {
    step: u32,
}

impl synapse_runtime::engine::Constraint for Ban {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        for (t, l) in logits.iter_mut().enumerate() {
            if t as u32 % 3 == self.step % 3 {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }
    fn commit(&mut self, token: u32) -> Result<bool, String> {
        if token % 3 == self.step % 3 {
            return Err(format!("token {token} was banned"));
        }
        self.step += 1;
        Ok(false)
    }
}

#[test]
fn a_head_over_grpc_equals_one_executor_and_stale_plans_are_refused() {
    let Some((model, seqs)) = tiny("qwen2") else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // The tail stage serves layer 1.. on an ephemeral port.
    let n = model.layers.len();
    let probe = plan(&model, "http://127.0.0.1:1", 1);
    let addr = rt
        .block_on(synapse_cluster::worker::serve_fixed(
            model.clone(),
            Arc::new(Ids),
            1,
            probe.clone(),
            "tail",
        ))
        .unwrap();
    // The tail knows itself by its id in the plan; the head stamps the plan's epoch and hash.
    let url = format!("http://{addr}");
    std::thread::sleep(Duration::from_millis(300));
    let link = rt
        .block_on(GrpcStageLink::connect(
            &url,
            probe.epoch,
            &probe.hash,
            model.vocab(),
            Duration::from_secs(10),
        ))
        .unwrap();
    let head = PipelineHead {
        layers: 1,
        link: Box::new(link),
        in_flight: 1,
    };
    let mut piped = Scheduler::new_pipeline(model.clone(), Arc::new(Ids), cfg(), head).unwrap();
    let mut whole = Scheduler::new(model.clone(), Arc::new(Ids), cfg()).unwrap();
    // Plus greedy sessions that read only the argmax and sampled ones that read only the
    // drawn token: their rows come back as tokens.
    let reqs = || {
        let mut r = requests(&seqs);
        for (i, s) in seqs.iter().enumerate() {
            let mut g = Request::greedy(s.clone(), 10);
            g.stop_at_eog = false;
            r.push(g);
            let mut x = Request::greedy(s.clone(), 12);
            x.stop_at_eog = false;
            x.sampling.temperature = 0.9;
            x.sampling.seed = 40 + i as u64;
            x.sampling.top_k = [0, 20][i % 2];
            x.sampling.top_p = [0.95, 1.0][i % 2];
            x.sampling.min_p = [0.0, 0.05][i % 2];
            r.push(x);
        }
        r
    };
    let got = events(&mut piped, reqs());
    let want = events(&mut whole, reqs());
    assert_eq!(
        got, want,
        "the pipeline over gRPC gives one executor's events"
    );
    assert!(got.iter().all(|e| matches!(e.last(), Some(Event::Done(_)))));
    eprintln!(
        "{} sessions over {n} layers cut at 1 equal one executor",
        got.len()
    );

    // A packet under another plan: refused by the stage.
    let mut stale = rt
        .block_on(GrpcStageLink::connect(
            &url,
            probe.epoch + 1,
            &probe.hash,
            model.vocab(),
            Duration::from_secs(10),
        ))
        .unwrap();
    let hidden = vec![0.0f32; model.hidden()];
    let rows = [Row::decode(0, 0, 1)];
    let ops = [synapse_runtime::KvOp::Open(0)];
    let mut out = Vec::new();
    let e = stale
        .step(
            &StepPacket {
                ops: &ops,
                rows: &rows,
                hidden: &hidden,
                reads: &[],
            },
            &mut out,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("stale plan"), "{e}");

    // A generation request to a stage, and one under another plan hash.
    let mut client = rt
        .block_on(proto::worker_client::WorkerClient::connect(url.clone()))
        .unwrap();
    let mut g = synapse_cluster::wire::request_to_wire(
        &Request::greedy(vec![1, 2], 2),
        probe.epoch,
        "other",
    );
    let s = rt.block_on(client.generate(g.clone())).unwrap_err();
    assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{s:?}");
    g.plan_hash = probe.hash.clone();
    let s = rt.block_on(client.generate(g)).unwrap_err();
    assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
    let st = rt
        .block_on(client.status(proto::StatusRequest {}))
        .unwrap()
        .into_inner();
    assert_eq!(
        (st.role.as_str(), st.epoch, st.plan_hash.clone()),
        ("stage", 7, probe.hash)
    );
    // No row came back whole: the plain greedy ones as their argmax, the others (sampled,
    // biased, penalised, constrained, with log-probabilities) as the token sampled or
    // chosen at the last stage.
    assert!(
        st.whole_rows == 0 && st.argmax_rows > 0 && st.sampled_rows > 0,
        "{st:?}"
    );
    eprintln!(
        "rows answered whole {}, as argmax tokens {}, sampled at the last stage {}",
        st.whole_rows, st.argmax_rows, st.sampled_rows
    );
}

/// Hidden states on f16 / bf16 links, the opt-in that halves link bytes: the logits of every
/// position of a prompt through a two-stage pipeline over gRPC, against one executor. `f32`
/// is exact; the 16-bit links' error is measured and printed (docs/cluster.md quotes it).
#[test]
fn sixteen_bit_links_have_a_measured_error_and_f32_none() {
    use synapse_cluster::plan::LinkDtype;
    use synapse_runtime::{Executor, KvCache, KvDtype};
    let path = synapse_testdata::model("smollm2-135m-instruct");
    if !synapse_testdata::require(&path, "SmolLM2-135M-Instruct") {
        return;
    }
    let model = Arc::new(Model::load(&path).unwrap());
    let n = model.layers.len();
    let cut = n / 2;
    let f = synapse_formats::gguf::GgufFile::open(&path).unwrap();
    let tok = synapse_tokenizer::Tokenizer::from_gguf(&f).unwrap();
    let prompt = tok
        .encode(
            "The history of the printing press begins in the fifteenth century, when",
            true,
            false,
        )
        .unwrap();
    let rows: Vec<Row> = prompt
        .iter()
        .enumerate()
        .map(|(i, &t)| Row {
            slot: 0,
            pos: i as u32,
            token: t,
            logits: true,
            order: synapse_runtime::OrderClass::of(prompt.len()),
        })
        .collect();
    let mut kv = KvCache::new(&model, KvDtype::F32, 1, 64, 64).unwrap();
    kv.open(0).unwrap();
    let want = Executor::new(model.clone(), 1)
        .unwrap()
        .forward(&mut kv, &rows)
        .unwrap()
        .to_vec();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut p = plan(&model, "http://127.0.0.1:1", cut);
    p.shape.ctx = 64;
    p.shape.ubatch = 64;
    let addr = rt
        .block_on(synapse_cluster::worker::serve_fixed(
            model.clone(),
            Arc::new(Ids),
            1,
            p.clone(),
            "tail",
        ))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let vocab = model.vocab();
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    for dtype in [LinkDtype::F32, LinkDtype::F16, LinkDtype::Bf16] {
        let link = rt
            .block_on(GrpcStageLink::connect(
                &format!("http://{addr}"),
                p.epoch,
                &p.hash,
                vocab,
                Duration::from_secs(30),
            ))
            .unwrap()
            .with_dtype(dtype);
        let mut ex = Executor::for_stage(model.clone(), 1, 0..cut).unwrap();
        ex.set_downstream(Box::new(link)).unwrap();
        let mut kv =
            KvCache::for_layers(&model, KvDtype::F32, SHAPE.slots, 64, 64, 0..cut).unwrap();
        kv.set_journal(true);
        kv.open(0).unwrap();
        let got = ex.forward(&mut kv, &rows).unwrap().to_vec();
        let differ = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let max = got
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        let agree = (0..rows.len())
            .filter(|&r| {
                synapse_runtime::argmax(&got[r * vocab..(r + 1) * vocab])
                    == synapse_runtime::argmax(&want[r * vocab..(r + 1) * vocab])
            })
            .count();
        eprintln!(
            "{dtype:?} link: {differ} of {} logits differ, max |Δ| {max:.3e} ({:.2e} of the largest logit), top-1 equal at {agree} of {} positions",
            got.len(),
            max / scale,
            rows.len()
        );
        match dtype {
            LinkDtype::F32 => assert_eq!(differ, 0),
            _ => {
                assert!(differ > 0, "{dtype:?} rounds the hidden states");
                assert!(max / scale < 0.05, "{dtype:?}: {max} of {scale}");
            }
        }
    }
}

/// Three stages over gRPC (head, a middle stage that hands packets on as soon as its layers
/// ran, a tail), the head keeping two passes in flight: every session's events equal one
/// executor's, and the tail saw two passes at once.
#[test]
fn three_stages_over_grpc_with_two_passes_in_flight_equal_one_executor() {
    let Some((model, seqs)) = tiny("gemma3") else {
        return;
    };
    let n = model.layers.len();
    assert!(n >= 3, "the tiny gemma3 has {n} layers");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (mid_l, tail_l) = rt.block_on(async {
        (
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        )
    });
    let mid_url = format!("http://{}", mid_l.local_addr().unwrap());
    let tail_url = format!("http://{}", tail_l.local_addr().unwrap());
    let shape = EngineShape {
        in_flight: 2,
        slots: 4,
        ..SHAPE
    };
    let (c1, c2) = (n / 3, 2 * n / 3);
    let mut p = ClusterPlan::new(
        &model.ir.fingerprint,
        shape,
        vec![PipelinePlan {
            stages: vec![
                StagePlan {
                    worker: "head".into(),
                    addr: "http://unused".into(),
                    layers: 0..c1,
                },
                StagePlan {
                    worker: "mid".into(),
                    addr: mid_url.clone(),
                    layers: c1..c2,
                },
                StagePlan {
                    worker: "tail".into(),
                    addr: tail_url.clone(),
                    layers: c2..n,
                },
            ],
            tokens_per_s: 1.0,
        }],
        "pipeline",
    );
    p.epoch = 3;
    for (l, id) in [(tail_l, "tail"), (mid_l, "mid")] {
        rt.block_on(synapse_cluster::worker::serve_fixed_at(
            l,
            model.clone(),
            Arc::new(Ids),
            1,
            p.clone(),
            id,
        ))
        .unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let link = rt
        .block_on(GrpcStageLink::connect(
            &mid_url,
            p.epoch,
            &p.hash,
            model.vocab(),
            Duration::from_secs(10),
        ))
        .unwrap();
    let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let head = PipelineHead {
        layers: c1,
        link: Box::new(Counting {
            inner: link,
            now: 0,
            most: most.clone(),
        }),
        in_flight: 2,
    };
    let mut c = cfg();
    c.slots = shape.slots;
    let mut piped = Scheduler::new_pipeline(model.clone(), Arc::new(Ids), c.clone(), head).unwrap();
    let mut whole = Scheduler::new(model.clone(), Arc::new(Ids), c).unwrap();
    let reqs = || {
        let mut r = requests(&seqs);
        for s in &seqs {
            let mut g = Request::greedy(s.clone(), 10);
            g.stop_at_eog = false;
            r.push(g);
        }
        r
    };
    let got = events(&mut piped, reqs());
    let want = events(&mut whole, reqs());
    assert_eq!(
        got, want,
        "three stages, two passes in flight, equal one executor"
    );
    assert!(got.iter().all(|e| matches!(e.last(), Some(Event::Done(_)))));
    assert_eq!(most.load(std::sync::atomic::Ordering::Relaxed), 2);
    eprintln!(
        "{} sessions over {n} layers cut at {c1} and {c2}, two passes in flight, equal one \
         executor",
        got.len()
    );
}

/// A link that counts the passes in flight on it.
struct Counting {
    inner: GrpcStageLink,
    now: usize,
    most: Arc<std::sync::atomic::AtomicUsize>,
}

impl StageLink for Counting {
    fn send(&mut self, p: &StepPacket<'_>) -> synapse_runtime::Result<()> {
        self.now += 1;
        self.most
            .fetch_max(self.now, std::sync::atomic::Ordering::Relaxed);
        self.inner.send(p)
    }
    fn recv(&mut self, logits: &mut Vec<f32>) -> synapse_runtime::Result<()> {
        self.now -= 1;
        self.inner.recv(logits)
    }
    fn take_logprobs(&mut self, out: &mut Vec<Option<synapse_runtime::pipeline::RowLogprob>>) {
        self.inner.take_logprobs(out)
    }
}
