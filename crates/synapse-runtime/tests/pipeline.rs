//! Layer pipelines in one process: a model's layers split over two or three stages (the
//! first stage's executor and cache, then `StageRunner`s linked in process) give every
//! logit bit for bit what one executor gives, through ragged passes of several sessions,
//! truncations, prefix copies and reopened slots; an engine whose scheduler is a pipeline's
//! first stage gives every session's tokens and log-probability bits of its solo run on one
//! executor. Also: a resumed request (`Request::forced`) equals the uninterrupted run.

mod common;

use std::sync::Arc;

use synapse_runtime::engine::{EngineConfig, Event, PipelineHead, Request, Scheduler, TokenPieces};
use synapse_runtime::pipeline::{StageCache, StageLink, StageRunner, StepPacket};
use synapse_runtime::{Executor, KvCache, KvDtype, Model, OrderClass, Row, argmax, prompt_order};

const UB: usize = 8;
const CTX: usize = 96;
const SLOTS: usize = 3;

/// One executor and its cache: the whole model, or a pipeline's first stage.
struct Runner {
    ex: Executor,
    kv: KvCache,
}

impl Runner {
    fn whole(model: &Arc<Model>) -> Self {
        Runner {
            ex: Executor::new(model.clone(), 2).unwrap(),
            kv: KvCache::new(model, KvDtype::F32, SLOTS, CTX, UB).unwrap(),
        }
    }

    /// Stages cut at `cuts` (ascending, inside `1..n_layers`).
    fn pipeline(model: &Arc<Model>, cuts: &[usize]) -> Self {
        let models = vec![model.clone(); cuts.len() + 1];
        Self::pipeline_of(&models, cuts)
    }

    /// Stages cut at `cuts`, stage `i` running on `models[i]` (the whole model, or one
    /// loaded for that stage alone).
    fn pipeline_of(models: &[Arc<Model>], cuts: &[usize]) -> Self {
        let model = &models[0];
        let n = model.layers.len();
        let cache = StageCache {
            slots: SLOTS,
            ctx: CTX,
            max_chunk: UB,
            dtype: KvDtype::F32,
        };
        // Build from the last stage backwards, each linked to the next.
        let mut bounds = vec![0];
        bounds.extend_from_slice(cuts);
        bounds.push(n);
        let mut next: Option<StageRunner> = None;
        for (i, w) in bounds.windows(2).enumerate().skip(1).rev() {
            let mut st = StageRunner::new(models[i].clone(), w[0]..w[1], 1, cache).unwrap();
            if let Some(nx) = next.take() {
                st.set_downstream(Box::new(nx)).unwrap();
            }
            next = Some(st);
        }
        let mut ex = Executor::for_stage(model.clone(), 2, 0..cuts[0]).unwrap();
        ex.set_downstream(Box::new(next.unwrap())).unwrap();
        let mut kv = KvCache::for_layers(model, KvDtype::F32, SLOTS, CTX, UB, 0..cuts[0]).unwrap();
        kv.set_journal(true);
        Runner { ex, kv }
    }

    fn pass(&mut self, rows: &[Row]) -> Vec<f32> {
        self.ex.forward(&mut self.kv, rows).unwrap().to_vec()
    }
}

/// A scripted run: two sessions' prompts in 3-row cuts beside each other's decode rows, a
/// truncation and re-decode (a rejected draft), a prefix copied into a third slot that then
/// goes on, a slot closed and reopened for a new prompt. Every logits row, in order.
fn script(r: &mut Runner, vocab: usize, prompts: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let mut out: Vec<Vec<f32>> = Vec::new();
    let mut last: Vec<Option<Vec<f32>>> = vec![None; SLOTS];
    let mut pos = vec![0usize; SLOTS];
    let run = |r: &mut Runner,
               rows: Vec<Row>,
               last: &mut Vec<Option<Vec<f32>>>,
               pos: &mut Vec<usize>,
               out: &mut Vec<Vec<f32>>| {
        let l = r.pass(&rows);
        for row in &rows {
            pos[row.slot as usize] = row.pos as usize + 1;
        }
        for (at, row) in rows.iter().filter(|x| x.logits).enumerate() {
            let v = l[at * vocab..(at + 1) * vocab].to_vec();
            last[row.slot as usize] = Some(v.clone());
            out.push(v);
        }
    };
    let decode = |slot: u32, pos: &[usize], last: &[Option<Vec<f32>>]| Row {
        slot,
        pos: pos[slot as usize] as u32,
        token: argmax(last[slot as usize].as_ref().unwrap()),
        logits: true,
        order: OrderClass::One,
    };
    let prompt_rows = |slot: u32, p: &[u32], from: usize, to: usize| -> Vec<Row> {
        (from..to)
            .map(|q| Row {
                slot,
                pos: q as u32,
                token: p[q],
                logits: q + 1 == p.len(),
                order: prompt_order(q, p.len(), UB),
            })
            .collect()
    };
    r.kv.open(0).unwrap();
    r.kv.open(1).unwrap();
    // Sessions 0 and 1: prompts in 3-row cuts, decode rows of a session past its prompt.
    let (p0, p1) = (&prompts[0], &prompts[1]);
    let mut done = [0usize; 2];
    while done[0] < 4 || done[1] < 4 {
        let mut rows = Vec::new();
        for (s, p) in [(0u32, p0), (1u32, p1)] {
            let at = pos[s as usize];
            if at < p.len() {
                rows.extend(prompt_rows(s, p, at, (at + 3).min(p.len())));
            } else if done[s as usize] < 4 {
                rows.push(decode(s, &pos, &last));
                done[s as usize] += 1;
            }
        }
        run(r, rows, &mut last, &mut pos, &mut out);
    }
    // Session 0 drops its last two positions and decodes them again (its own logits of
    // position len - 3 decide the token).
    let keep = pos[0] - 2;
    r.kv.truncate(0, keep).unwrap();
    pos[0] = keep;
    for _ in 0..3 {
        let rows = vec![decode(0, &pos, &last), decode(1, &pos, &last)];
        run(r, rows, &mut last, &mut pos, &mut out);
    }
    // Session 2 starts from session 1's first 5 positions, then the rest of p1 as a
    // prompt and two decode steps (the prompt rows keep p1's order classes, so the copied
    // positions are the ones a fresh run computes).
    // (0 when a sliding-window ring no longer holds what position 5 needs.)
    let got = r.kv.copy_prefix(1, 2, 5).unwrap();
    pos[2] = got;
    for from in (got..p1.len()).step_by(UB) {
        let rows = prompt_rows(2, p1, from, (from + UB).min(p1.len()));
        run(r, rows, &mut last, &mut pos, &mut out);
    }
    for _ in 0..2 {
        let rows = vec![decode(2, &pos, &last), decode(0, &pos, &last)];
        run(r, rows, &mut last, &mut pos, &mut out);
    }
    // Slot 0 closed, reopened for a third prompt beside session 2's decode.
    r.kv.close(0);
    r.kv.open(0).unwrap();
    pos[0] = 0;
    let p2 = &prompts[2];
    let mut rows = prompt_rows(0, p2, 0, p2.len().min(UB));
    rows.push(decode(2, &pos, &last));
    run(r, rows, &mut last, &mut pos, &mut out);
    if p2.len() > UB {
        let rows = prompt_rows(0, p2, UB, p2.len());
        run(r, rows, &mut last, &mut pos, &mut out);
    }
    let rows = vec![decode(0, &pos, &last)];
    run(r, rows, &mut last, &mut pos, &mut out);
    out
}

fn same_bits(a: &[Vec<f32>], b: &[Vec<f32>]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            x.iter()
                .zip(y)
                .filter(|(p, q)| p.to_bits() != q.to_bits())
                .count()
        })
        .sum()
}

/// Every cut of every tiny family (dense and MoE, F32 and Q8_0) into two stages, and one
/// three-stage cut: every logit bit-identical to one executor.
#[test]
fn pipeline_stages_give_the_logits_of_one_executor() {
    for family in ["llama", "qwen2", "gemma3", "mixtral", "qwen2moe"] {
        let dir = common::workspace_root().join("fixtures/tiny").join(family);
        if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
            return;
        }
        let mut prompts = common::tiny_sequences(&dir);
        while prompts.len() < 3 {
            prompts.push(prompts[0][1..].to_vec());
        }
        for file in ["model.f32.gguf", "model.q8_0.gguf"] {
            let model = Arc::new(Model::load(&dir.join(file)).unwrap());
            let n = model.layers.len();
            let vocab = model.vocab();
            let want = script(&mut Runner::whole(&model), vocab, &prompts);
            let mut cuts: Vec<Vec<usize>> = (1..n).map(|a| vec![a]).collect();
            if n >= 3 {
                cuts.push(vec![1, n - 1]);
            }
            for c in &cuts {
                let got = script(&mut Runner::pipeline(&model, c), vocab, &prompts);
                let differ = same_bits(&want, &got);
                assert_eq!(
                    differ, 0,
                    "{family} {file} cut at {c:?}: {differ} logits differ"
                );
            }
            eprintln!(
                "{family} {file}: {} layers, cuts {cuts:?}: {} logit rows bit-identical",
                n,
                want.len()
            );
        }
    }
}

/// A stage's model loaded from a store that holds its tensors' objects alone (plus the
/// package's manifest, graph and metadata): dense and MoE, tied and untied heads, GGUF and
/// safetensors sources, two and three stages — every logit bit-identical to one executor on
/// the whole model; a stage's model holds no other layer's weights and refuses to run them.
#[test]
fn stages_loaded_from_their_own_tensors_give_the_logits_of_one_executor() {
    use synapse_cas::{Package, Store};
    use synapse_import::progress::Silent;
    use synapse_import::{Destination, PackageModel, import};
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for family in ["llama", "qwen2", "gemma3", "mixtral"] {
        let dir = common::workspace_root().join("fixtures/tiny").join(family);
        if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
            return;
        }
        let mut prompts = common::tiny_sequences(&dir);
        while prompts.len() < 3 {
            prompts.push(prompts[0][1..].to_vec());
        }
        for src in [dir.join("model.q8_0.gguf"), dir.clone()] {
            let full = tmp.path().join(format!("full-{checked}"));
            let rep = import(&src, &Destination::Store(full.clone()), &Silent).unwrap();
            let full_store = Store::open(&full).unwrap();
            let pkg = Package::open_in_store(&full_store, &rep.package.hex()).unwrap();
            let model = Arc::new(
                Model::load_package(&PackageModel::from_package(pkg.clone()).unwrap()).unwrap(),
            );
            let n = model.layers.len();
            let vocab = model.vocab();
            let want = script(&mut Runner::whole(&model), vocab, &prompts);
            let mut cuts = vec![vec![n / 2]];
            if n >= 3 {
                cuts.push(vec![1, n - 1]);
            }
            for c in &cuts {
                let mut bounds = vec![0];
                bounds.extend_from_slice(c);
                bounds.push(n);
                let mut models = Vec::new();
                for w in bounds.windows(2) {
                    let layers = w[0]..w[1];
                    let names = Model::stage_tensor_names(&model.ir, layers.clone());
                    let wanted = PackageModel::objects_for(&pkg, &names).unwrap();
                    // A store of its own: the manifest and the stage's objects only.
                    let part = tmp.path().join(format!("part-{checked}-{}", w[0]));
                    let store = Store::open(&part).unwrap();
                    let rel = std::path::Path::new("packages")
                        .join(format!("{}.toml", rep.package.hex()));
                    let text = std::fs::read(full.join(&rel)).unwrap();
                    store.session().unwrap().write_file(&rel, &text).unwrap();
                    for id in &wanted {
                        let o = full_store.get(id).unwrap();
                        store.session().unwrap().put_with_id(*id, &o).unwrap();
                    }
                    let all = pkg.manifest().objects();
                    assert!(
                        wanted.len() < all.len(),
                        "{family} {layers:?} needs every object"
                    );
                    let p = Package::open_in_store(&store, &rep.package.hex()).unwrap();
                    // The whole model cannot be opened from this store; the stage can.
                    assert!(PackageModel::from_package(p.clone()).is_err());
                    let pm = PackageModel::from_package_only(p, &names).unwrap();
                    let m = Model::load_package_stage(&pm, layers.clone()).unwrap();
                    assert_eq!(m.present, layers);
                    assert_eq!(
                        m.weight_bytes(),
                        model.stage_weight_bytes(layers.clone()),
                        "{family}: a stage's model holds its weights only"
                    );
                    let m = Arc::new(m);
                    assert!(Executor::new(m.clone(), 1).is_err());
                    if layers.start > 0 {
                        assert!(Executor::for_stage(m.clone(), 1, 0..layers.end).is_err());
                    }
                    models.push(m);
                }
                let got = script(&mut Runner::pipeline_of(&models, c), vocab, &prompts);
                let differ = same_bits(&want, &got);
                assert_eq!(
                    differ,
                    0,
                    "{family} {} cut at {c:?}: {differ} logits differ",
                    src.display()
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 8);
}

/// A stage refuses rows its cache is not in step with (a position gap), and a head
/// without a downstream that does not end at the last layer refuses to give logits.
#[test]
fn stages_out_of_step_fail_the_pass() {
    let dir = common::workspace_root().join("fixtures/tiny/llama");
    if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
        return;
    }
    let model = Arc::new(Model::load(&dir.join("model.f32.gguf")).unwrap());
    let n = model.layers.len();
    let cache = StageCache {
        slots: 1,
        ctx: 16,
        max_chunk: 4,
        dtype: KvDtype::F32,
    };
    let mut st = StageRunner::new(model.clone(), 1..n, 1, cache).unwrap();
    let hd = model.hidden();
    let rows = [Row::decode(0, 0, 1)];
    let hidden = vec![0.5f32; hd];
    let mut out = Vec::new();
    // No slot opened on the stage: refused.
    let p = synapse_runtime::pipeline::StepPacket {
        ops: &[],
        rows: &rows,
        hidden: &hidden,
        reads: &[],
    };
    assert!(st.run(&p, &mut out).is_err());
    // Opened, position 0 runs; position 2 next is a gap.
    let ops = [synapse_runtime::KvOp::Open(0)];
    let p = synapse_runtime::pipeline::StepPacket {
        ops: &ops,
        rows: &rows,
        hidden: &hidden,
        reads: &[],
    };
    st.run(&p, &mut out).unwrap();
    assert_eq!(out.len(), model.vocab());
    let rows = [Row::decode(0, 2, 1)];
    let p = synapse_runtime::pipeline::StepPacket {
        ops: &[],
        rows: &rows,
        hidden: &hidden,
        reads: &[],
    };
    let e = st.run(&p, &mut out).unwrap_err().to_string();
    assert!(e.contains("position"), "{e}");
    // Wrong hidden width.
    let rows = [Row::decode(0, 1, 1)];
    let p = synapse_runtime::pipeline::StepPacket {
        ops: &[],
        rows: &rows,
        hidden: &hidden[1..],
        reads: &[],
    };
    assert!(st.run(&p, &mut out).is_err());
    // A head without downstream.
    let mut ex = Executor::for_stage(model.clone(), 1, 0..1).unwrap();
    let mut kv = KvCache::for_layers(&model, KvDtype::F32, 1, 16, 4, 0..1).unwrap();
    kv.open(0).unwrap();
    assert!(ex.forward(&mut kv, &[Row::decode(0, 0, 1)]).is_err());
    // Ranges outside the model are refused.
    assert!(Executor::for_stage(model.clone(), 1, 0..n + 1).is_err());
    assert!(StageRunner::new(model.clone(), 0..1, 1, cache).is_err());
}

struct Ids;
impl TokenPieces for Ids {
    fn piece(&self, token: u32) -> Vec<u8> {
        format!("<{token}>").into_bytes()
    }
}

fn drain(s: &mut synapse_runtime::engine::Session) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(e) = s.try_next() {
        out.push(e);
    }
    out
}

use common::bits;

fn request(prompt: Vec<u32>, n: usize, i: usize) -> Request {
    let mut r = Request::greedy(prompt, n);
    r.logprobs = Some(4);
    r.stop_at_eog = false;
    if i % 2 == 1 {
        r.sampling.temperature = 0.9;
        r.sampling.seed = 77 + i as u64;
    }
    r
}

fn cfg() -> EngineConfig {
    EngineConfig {
        slots: 3,
        ctx: 128,
        ubatch: 16,
        step_tokens: 24,
        threads: 2,
        ..EngineConfig::default()
    }
}

/// Each request alone on one executor.
fn solo(model: &Arc<Model>, req: Request) -> Vec<Event> {
    let mut c = cfg();
    c.slots = 1;
    let mut s = Scheduler::new(model.clone(), Arc::new(Ids), c).unwrap();
    let mut sess = s.submit(req).unwrap();
    while s.step() {}
    drain(&mut sess)
}

/// A link that counts the passes in flight on it (sent, logits not yet taken).
struct Counting {
    inner: StageRunner,
    now: Arc<std::sync::atomic::AtomicUsize>,
    most: Arc<std::sync::atomic::AtomicUsize>,
}

impl StageLink for Counting {
    fn send(&mut self, p: &StepPacket<'_>) -> synapse_runtime::Result<()> {
        let now = self.now.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        self.most
            .fetch_max(now, std::sync::atomic::Ordering::Relaxed);
        self.inner.send(p)
    }
    fn recv(&mut self, logits: &mut Vec<f32>) -> synapse_runtime::Result<()> {
        self.now.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.recv(logits)
    }
    fn take_logprobs(&mut self, out: &mut Vec<Option<synapse_runtime::pipeline::RowLogprob>>) {
        self.inner.take_logprobs(out)
    }
}

/// A pipeline head over in-process stages cut at `cuts`, `in_flight` passes at once; the
/// returned counter holds the most passes ever in flight on the first hop.
fn head(
    model: &Arc<Model>,
    cuts: &[usize],
    c: &EngineConfig,
    in_flight: usize,
) -> (PipelineHead, Arc<std::sync::atomic::AtomicUsize>) {
    let (h, most, _) = head_counted(model, cuts, c, in_flight);
    (h, most)
}

/// [`head`], and a counter of the passes in flight now.
#[allow(clippy::type_complexity)]
fn head_counted(
    model: &Arc<Model>,
    cuts: &[usize],
    c: &EngineConfig,
    in_flight: usize,
) -> (
    PipelineHead,
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    let n = model.layers.len();
    let cache = StageCache {
        slots: c.slots,
        ctx: c.ctx,
        max_chunk: c.ubatch.min(c.ctx),
        dtype: c.kv_dtype,
    };
    let mut bounds = cuts.to_vec();
    bounds.push(n);
    let mut next: Option<StageRunner> = None;
    for w in bounds.windows(2).rev() {
        let mut st = StageRunner::new(model.clone(), w[0]..w[1], 1, cache).unwrap();
        if let Some(nx) = next.take() {
            st.set_downstream(Box::new(nx)).unwrap();
        }
        next = Some(st);
    }
    let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let now = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let link = Counting {
        inner: next.unwrap(),
        now: now.clone(),
        most: most.clone(),
    };
    (
        PipelineHead {
            layers: cuts[0],
            link: Box::new(link),
            in_flight,
        },
        most,
        now,
    )
}

/// The engine as a pipeline's first stage: more sessions than slots (some wait), greedy and
/// sampled, a later second turn that reuses a finished session's prefix — every session's
/// events equal its solo run on one executor, log-probability bits included; with one pass
/// at a time and with two in flight (sessions shared out over the two).
#[test]
fn an_engine_over_a_pipeline_equals_one_executor() {
    for (family, in_flight) in [
        ("llama", 1),
        ("gemma3", 1),
        ("mixtral", 1),
        ("llama", 2),
        ("gemma3", 2),
        ("mixtral", 2),
    ] {
        let dir = common::workspace_root().join("fixtures/tiny").join(family);
        if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
            return;
        }
        let model = Arc::new(Model::load(&dir.join("model.q8_0.gguf")).unwrap());
        let n = model.layers.len();
        let seqs = common::tiny_sequences(&dir);
        let mut reqs: Vec<(Vec<u32>, usize)> = seqs.iter().map(|s| (s.clone(), 12)).collect();
        reqs.push((seqs[0][..seqs[0].len() / 2].to_vec(), 20));
        reqs.push((seqs.concat(), 6));
        let cuts: Vec<usize> = if n >= 3 { vec![1, n - 1] } else { vec![1] };
        let c = cfg();
        let (h, most) = head(&model, &cuts, &c, in_flight);
        let mut s = Scheduler::new_pipeline(model.clone(), Arc::new(Ids), c.clone(), h).unwrap();
        let mut sessions: Vec<_> = reqs
            .iter()
            .enumerate()
            .map(|(i, (p, k))| s.submit(request(p.clone(), *k, i)).unwrap())
            .collect();
        while s.step() {}
        // A second turn of the last session: its prompt, its output, more tokens.
        let li = reqs.len() - 1;
        let lastout = bits(&drain(&mut sessions[li]));
        let mut turn2 = reqs[li].0.clone();
        turn2.extend(lastout.iter().map(|t| t.0));
        turn2.extend_from_slice(&seqs[1][..4]);
        let mut t2 = s.submit(request(turn2.clone(), 8, li)).unwrap();
        while s.step() {}
        let got2 = drain(&mut t2);
        let cached = got2.iter().find_map(|e| match e {
            Event::Admitted { cached_tokens } => Some(*cached_tokens),
            _ => None,
        });
        // (Sliding-window rings cannot rewind far: gemma3 may recompute.)
        if family != "gemma3" {
            assert!(
                cached > Some(0),
                "{family}: the second turn reuses the prefix"
            );
        }
        assert_eq!(
            bits(&got2),
            bits(&solo(&model, request(turn2, 8, li))),
            "{family} turn 2"
        );
        let (p, k) = &reqs[li];
        assert_eq!(
            lastout,
            bits(&solo(&model, request(p.clone(), *k, li))),
            "{family} last"
        );
        for (i, (sess, (p, k))) in sessions.iter_mut().zip(&reqs).enumerate().take(li) {
            let got = bits(&drain(sess));
            assert_eq!(got.len(), *k, "{family} session {i}");
            assert_eq!(
                got,
                bits(&solo(&model, request(p.clone(), *k, i))),
                "{family} session {i}"
            );
        }
        let most = most.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(most, in_flight, "{family}: passes in flight at once");
        eprintln!(
            "{family}: {} sessions over stages cut at {cuts:?}, {most} passes in flight at \
             most, equal their solo runs",
            reqs.len() + 1
        );
    }
}

/// A request resumed with the tokens an earlier run already produced (`forced`) streams
/// the same events as the uninterrupted run, greedy and sampled; a wrong known token is an
/// error at the step that does not choose it.
#[test]
fn a_resumed_request_equals_the_uninterrupted_run() {
    let dir = common::workspace_root().join("fixtures/tiny/qwen2");
    if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
        return;
    }
    let model = Arc::new(Model::load(&dir.join("model.q8_0.gguf")).unwrap());
    let prompt = common::tiny_sequences(&dir)[0].clone();
    for i in 0..2 {
        let whole = solo(&model, request(prompt.clone(), 16, i));
        let toks: Vec<u32> = bits(&whole).iter().map(|t| t.0).collect();
        for k in [1, 7, 15] {
            let mut r = request(prompt.clone(), 16, i);
            r.forced = toks[..k].to_vec();
            let resumed = solo(&model, r);
            assert_eq!(
                bits(&resumed),
                bits(&whole),
                "request {i} resumed after {k}"
            );
            assert_eq!(resumed.last(), whole.last());
        }
        let mut r = request(prompt.clone(), 16, i);
        r.forced = toks[..5].to_vec();
        r.forced[3] = (toks[3] + 1) % model.vocab() as u32;
        let bad = solo(&model, r);
        assert_eq!(bits(&bad).len(), 3, "three tokens before the divergence");
        assert!(
            bad.iter()
                .any(|e| matches!(e, Event::Error(m) if m.contains("diverged at output token 3"))),
            "{bad:?}"
        );
        // Known tokens that leave nothing to generate are refused.
        let mut r = request(prompt.clone(), 4, i);
        r.forced = toks[..4].to_vec();
        let mut s = Scheduler::new(model.clone(), Arc::new(Ids), cfg()).unwrap();
        assert!(s.submit(r).is_err());
    }
}

/// The default real model (Gemma 3 270M, 18 layers) over three stages cut at 5 and 12:
/// concurrent greedy and sampled sessions, two passes in flight, equal their solo runs on
/// one executor.
#[test]
fn gemma3_270m_over_three_stages_equals_one_executor() {
    let path = common::default_model();
    if !common::require(&path, "the default model (Gemma 3 270M Q4_K_M)") {
        return;
    }
    let model = Arc::new(Model::load(&path).unwrap());
    let f = synapse_formats::gguf::GgufFile::open(&path).unwrap();
    let tok = synapse_tokenizer::Tokenizer::from_gguf(&f).unwrap();
    let prompts: Vec<Vec<u32>> = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a small village at the edge of a great forest, there lived",
        "1, 2, 3, 4,",
    ]
    .iter()
    .map(|t| tok.encode(t, true, false).unwrap())
    .collect();
    let c = cfg();
    let (h, most) = head(&model, &[5, 12], &c, 2);
    let mut s = Scheduler::new_pipeline(model.clone(), Arc::new(Ids), c.clone(), h).unwrap();
    let mut sessions: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| s.submit(request(p.clone(), 16, i)).unwrap())
        .collect();
    while s.step() {}
    for (i, (sess, p)) in sessions.iter_mut().zip(&prompts).enumerate() {
        let got = bits(&drain(sess));
        assert_eq!(got.len(), 16);
        assert_eq!(
            got,
            bits(&solo(&model, request(p.clone(), 16, i))),
            "session {i}"
        );
    }
    assert_eq!(most.load(std::sync::atomic::Ordering::Relaxed), 2);
}

/// Two passes in flight, sessions cancelled while their pass is downstream and while
/// waiting: the slot is freed once the pass is back, a later session reuses it, and every
/// session that runs to the end — plain sampled ones too, whose rows come back as tokens —
/// equals its solo run.
#[test]
fn a_session_cancelled_in_flight_frees_its_slot_safely() {
    let dir = common::workspace_root().join("fixtures/tiny/llama");
    if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
        return;
    }
    let model = Arc::new(Model::load(&dir.join("model.q8_0.gguf")).unwrap());
    let seqs = common::tiny_sequences(&dir);
    // Plain requests (no logprobs): greedy ones read the argmax, sampled ones a drawn token.
    let plain = |p: &[u32], n: usize, i: usize| {
        let mut r = request(p.to_vec(), n, i);
        r.logprobs = None;
        r
    };
    // Steady decode alternates the two sessions' passes, one in flight between steps:
    // cancelling after an even and after an odd number of steps catches A in flight once.
    for steps in [8, 9] {
        let mut c = cfg();
        c.slots = 2;
        let (h, most, now) = head_counted(&model, &[1], &c, 2);
        let mut s = Scheduler::new_pipeline(model.clone(), Arc::new(Ids), c, h).unwrap();
        let a = s.submit(plain(&seqs[0], 40, 0)).unwrap();
        let mut b = s.submit(plain(&seqs[1], 24, 1)).unwrap();
        let waiting = s.submit(plain(&seqs[2], 8, 2)).unwrap();
        for _ in 0..steps {
            assert!(s.step());
        }
        assert_eq!(
            now.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "a pass in flight"
        );
        drop(a);
        drop(waiting);
        let mut c2 = s.submit(plain(&seqs[2], 20, 3)).unwrap();
        while s.step() {}
        assert_eq!(most.load(std::sync::atomic::Ordering::Relaxed), 2);
        let ids = |ev: &[Event]| -> Vec<u32> {
            ev.iter()
                .filter_map(|e| match e {
                    Event::Token(t) => Some(t.id),
                    _ => None,
                })
                .collect()
        };
        let gb = ids(&drain(&mut b));
        let gc = ids(&drain(&mut c2));
        assert_eq!(gb, ids(&solo(&model, plain(&seqs[1], 24, 1))));
        assert_eq!(gc, ids(&solo(&model, plain(&seqs[2], 20, 3))));
        assert_eq!((gb.len(), gc.len()), (24, 20));
        assert!(s.is_idle());
    }
}
