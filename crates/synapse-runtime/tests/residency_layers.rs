//! A dense model's blocks under a byte budget (`Executor::page_layers`) on SmolLM2-135M (a
//! memory-mapped GGUF, 30 blocks): the same logits bit for bit as the model run from its
//! mapping, at budgets that hold every block, half of them, and one; the pager's counters
//! (with `k` slots for `L` blocks, `k − 1` stay and the rest stream through one slot); the
//! model file's mapped pages — read from `/proc/self/smaps` after every pass — within the
//! tensors outside the blocks' projections; an engine under a `memory` budget below its
//! weights gives the same tokens; what cannot page is refused with a typed error.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use synapse_runtime::residency::{LayerPager, Stream};
use synapse_runtime::{Executor, KvCache, KvDtype, Model, Row, RuntimeError, argmax};

fn smollm() -> Option<(Arc<Model>, PathBuf)> {
    let path = common::known_model("smollm2-135m-instruct");
    if !common::require(&path, "SmolLM2-135M-Instruct") {
        return None;
    }
    Some((Arc::new(Model::load(&path).unwrap()), path))
}

/// Whether a GGUF tensor is one of the projections a block pager moves.
fn is_projection(name: &str) -> bool {
    name.starts_with("blk.")
        && [
            ".attn_q.weight",
            ".attn_k.weight",
            ".attn_v.weight",
            ".attn_output.weight",
            ".ffn_gate.weight",
            ".ffn_up.weight",
            ".ffn_down.weight",
        ]
        .iter()
        .any(|s| name.ends_with(s))
}

/// Bytes of `file` outside the blocks' projections: its header and the other tensors (the
/// embedding, read by row, and the tied head, read whole; the norms, copied at load).
fn outside_bytes(file: &Path) -> u64 {
    let g = synapse_formats::gguf::GgufFile::open(file).unwrap();
    let header = g.tensors().iter().map(|t| t.offset).min().unwrap_or(0);
    header
        + g.tensors()
            .iter()
            .filter(|t| !is_projection(&t.name))
            .map(|t| t.n_bytes)
            .sum::<u64>()
}

const PROMPT: [u32; 12] = [1, 40, 77, 300, 12, 9, 451, 38, 200, 17, 64, 5];

/// Greedy decode of `steps` tokens after `prompt`: every pass's logits, and the largest
/// resident size of `file`'s mappings seen after any pass.
fn run(ex: &mut Executor, steps: usize, file: &Path) -> (Vec<Vec<f32>>, u64) {
    let m = ex.model().clone();
    let mut kv = KvCache::new(&m, KvDtype::F32, 1, 128, 64).unwrap();
    kv.open(0).unwrap();
    let mut out = vec![
        ex.forward(&mut kv, &common::prompt_rows(&PROMPT))
            .unwrap()
            .to_vec(),
    ];
    let mut peak = common::mapped_rss(file);
    for s in 0..steps {
        let next = argmax(out.last().unwrap());
        let row = Row::decode(0, (PROMPT.len() + s) as u32, next);
        out.push(ex.forward(&mut kv, &[row]).unwrap().to_vec());
        peak = peak.max(common::mapped_rss(file));
    }
    (out, peak)
}

#[test]
fn paged_blocks_give_the_same_logits() {
    let Some((m, path)) = smollm() else { return };
    let blocks = m.layers.len();
    let (want, _) = run(&mut Executor::new(m.clone(), 2).unwrap(), 8, &path);
    let total = LayerPager::pageable_bytes(&m, 0..blocks);
    let block = total / blocks as u64;
    let passes = 9u64;
    // (blocks' worth of budget, file reads, stream from the mapping)
    for (slots, file_reads, mapped) in [
        (blocks, true, true),
        (blocks / 2, true, true),
        (blocks / 2, true, false),
        (1, true, false),
        (blocks / 2, false, false),
        (3, true, true),
    ] {
        let budget = block * slots as u64 + block / 2;
        let mut ex = Executor::new(m.clone(), 2).unwrap();
        ex.page_layers(Some(budget)).unwrap();
        let p = ex.layer_pager_mut().unwrap();
        p.set_file_reads(file_reads);
        p.set_stream_mapped(mapped);
        assert_eq!(p.total_bytes(), total);
        let (kept, stream) = (p.kept_blocks(), p.stream());
        let reserve = p.stream_reserve();
        // Mapped streaming reserves a block's mapped extent; a copy stream one slot.
        match stream {
            Stream::None => assert_eq!(kept, blocks),
            Stream::Mapped => {
                assert!(mapped && reserve >= block);
                assert_eq!(kept as u64, (budget - reserve) / block);
            }
            Stream::Copy => assert_eq!(kept, slots - 1),
        }
        let (got, _) = run(&mut ex, 8, &path);
        let what = format!("{slots} blocks' budget, {stream:?}, file reads {file_reads}");
        assert!(got == want, "{what}: other logits");
        let p = ex.layer_pager().unwrap();
        let st = p.stats();
        let l = blocks as u64;
        assert_eq!(st.hits + st.misses, l * passes);
        assert!(p.held_bytes() <= budget && p.resident_bytes() <= budget);
        // Every block fits: each pages in once. Otherwise the kept ones stay and the rest
        // stream (each pass's streamed ones miss; the one mapped last stays until the next
        // block is asked for).
        let streamed = l - kept as u64;
        let misses = l + streamed * (passes - 1);
        assert_eq!(st.misses, misses, "{what}: {st:?}");
        let evictions = match stream {
            Stream::None => 0,
            Stream::Copy => misses - (kept as u64 + 1),
            Stream::Mapped => streamed * passes - 1,
        };
        assert_eq!(st.evictions, evictions, "{what}: {st:?}");
        assert_eq!(st.bytes_in, misses * block, "uniform blocks");
        // Each miss advised the next block's reads (a pass walks blocks in order): every
        // miss but the very first was advised ahead.
        assert_eq!(st.prefetched_misses, misses - 1, "{what}: {st:?}");
        assert!(
            st.prefetches >= st.prefetched_misses && st.prefetches <= misses,
            "{what}: {st:?}"
        );
        eprintln!(
            "{what} ({:.1} of {:.1} MB): {kept} kept, hit rate {:.3}, {} misses, {} \
             evictions, {:.1} MB paged in",
            budget as f64 / 1e6,
            total as f64 / 1e6,
            st.hit_rate(),
            st.misses,
            st.evictions,
            st.bytes_in as f64 / 1e6
        );
    }
    // A pipeline stage pages its own blocks only.
    let mut stage = Executor::for_stage(m.clone(), 2, 0..blocks / 3).unwrap();
    stage.page_layers(Some(2 * block)).unwrap();
    assert_eq!(
        stage.layer_pager().unwrap().total_bytes(),
        LayerPager::pageable_bytes(&m, 0..blocks / 3)
    );
}

#[test]
fn mapped_blocks_stay_outside_the_mapping() {
    let Some((m, path)) = smollm() else { return };
    let total = LayerPager::pageable_bytes(&m, 0..m.layers.len());
    for (file_reads, mapped) in [(true, true), (true, false), (false, false)] {
        let mut ex = Executor::new(m.clone(), 2).unwrap();
        let budget = total / 4;
        ex.page_layers(Some(budget)).unwrap();
        let p = ex.layer_pager_mut().unwrap();
        p.set_file_reads(file_reads);
        p.set_stream_mapped(mapped);
        assert_eq!(
            p.stream(),
            if mapped { Stream::Mapped } else { Stream::Copy }
        );
        let reserve = if mapped { p.stream_reserve() } else { 0 };
        // The mapping keeps the bytes outside the projections, and the 2 MiB folios the
        // embedding/head's ends share with neighbours (`mapped_slack`; the header's too).
        // Reading misses through the file maps nothing more; copying from the mapping touches
        // at most the folio at either end of each of a block's seven ranges while it is being
        // copied (dropped right after); streaming from the mapping holds one block's mapped
        // extent at a time (`stream_reserve`). The projections alone are 66 MB.
        let allowed = outside_bytes(&path)
            + LayerPager::mapped_slack(&m)
            + (2 << 20)
            + reserve
            + if file_reads { 0 } else { 14 * (2 << 20) };
        let (_, peak) = run(&mut ex, 16, &path);
        let p = ex.layer_pager().unwrap();
        let st = p.stats();
        eprintln!(
            "{:?}, file reads {file_reads}: model file mapped (smaps): peak {:.1} MB, allowed \
             {:.1} MB; the pager holds {:.1} MB of a {:.1} MB budget (blocks in all {:.1} \
             MB); {} misses, {} evictions",
            p.stream(),
            peak as f64 / 1e6,
            allowed as f64 / 1e6,
            p.held_bytes() as f64 / 1e6,
            budget as f64 / 1e6,
            total as f64 / 1e6,
            st.misses,
            st.evictions
        );
        assert!(p.held_bytes() <= budget);
        assert!(
            peak <= allowed,
            "file reads {file_reads}: the model file's mapped pages peaked at {peak} B; \
             allowed {allowed}"
        );
    }
}

/// A package borrows its objects' mappings as a GGUF does its file's: loading leaves the
/// blocks unmapped (verification's pages are dropped again), and its blocks page under a
/// budget with the GGUF's logits bit for bit, its objects' mapped pages within the bytes
/// outside the projections.
#[test]
fn a_package_pages_its_blocks_as_its_gguf_does() {
    let Some((m, path)) = smollm() else { return };
    let (want, _) = run(&mut Executor::new(m.clone(), 2).unwrap(), 8, &path);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pkg");
    common::import_dir(&path, &dir);
    let p = Arc::new(Model::load(&dir).unwrap());
    assert!(p.layers[0].q.m.is_borrowed() && p.embd.is_borrowed());
    let allowed = outside_bytes(&path) + LayerPager::mapped_slack(&p) + (2 << 20);
    let loaded = common::mapped_rss(&dir);
    eprintln!(
        "package loaded: objects mapped {:.1} MB (bytes outside the projections {:.1} MB)",
        loaded as f64 / 1e6,
        outside_bytes(&path) as f64 / 1e6
    );
    assert!(
        loaded <= allowed,
        "loading left {loaded} B of objects mapped"
    );
    let total = LayerPager::pageable_bytes(&p, 0..p.layers.len());
    let mut ex = Executor::new(p.clone(), 2).unwrap();
    ex.page_layers(Some(total / 3)).unwrap();
    let (got, peak) = run(&mut ex, 8, &dir);
    assert!(got == want, "the package's paged blocks: other logits");
    let st = ex.layer_pager().unwrap().stats();
    eprintln!(
        "package, a third of the blocks: objects mapped peak {:.1} MB (allowed {:.1}), {} \
         misses, {} evictions",
        peak as f64 / 1e6,
        allowed as f64 / 1e6,
        st.misses,
        st.evictions
    );
    assert!(st.evictions > 0);
    assert!(
        peak <= allowed,
        "the package's mapped pages peaked at {peak} B"
    );
}

/// Blocks re-encoded by a precision profile through the variant cache (each projection a
/// memory-mapped object) page as the file's own do: the same logits as the re-encoded model
/// run whole; re-encoded without a cache they are refused.
#[test]
fn re_encoded_blocks_page_from_the_variant_cache() {
    use synapse_runtime::precision::{Precision, apply};
    let Some((m, path)) = smollm() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let spec = "uniform:syn.q8.symmetric.g64.v1";
    let q8 = common::through_cache(&m, spec, tmp.path());
    let mut whole = Executor::new(q8.clone(), 2).unwrap();
    let (want, _) = run(&mut whole, 6, &path);
    let total = LayerPager::pageable_bytes(&q8, 0..q8.layers.len());
    let block = total / q8.layers.len() as u64;
    for (budget, file_reads) in [(total / 2, true), (3 * block, true), (3 * block, false)] {
        let mut ex = Executor::new(q8.clone(), 2).unwrap();
        ex.page_layers(Some(budget)).unwrap();
        ex.layer_pager_mut().unwrap().set_file_reads(file_reads);
        let (got, _) = run(&mut ex, 6, &path);
        assert_eq!(
            got, want,
            "q8 blocks in {budget} B (file reads {file_reads})"
        );
        let st = ex.layer_pager().unwrap().stats();
        assert!(st.misses > 0, "{st:?}");
    }
    let owned = apply(&m, &Precision::parse_profile(spec).unwrap(), None)
        .unwrap()
        .model;
    let mut ex = Executor::new(owned, 1).unwrap();
    let e = ex.page_layers(Some(u64::MAX)).unwrap_err().to_string();
    assert!(e.contains("without a variant cache"), "{e}");
}

#[test]
fn what_cannot_page_is_refused() {
    let Some((m, _)) = smollm() else { return };
    let total = LayerPager::pageable_bytes(&m, 0..m.layers.len());
    let mut ex = Executor::new(m.clone(), 1).unwrap();
    // Less than one block.
    let block = total / m.layers.len() as u64;
    match ex.page_layers(Some(block - 1)) {
        Err(RuntimeError::MemoryBudget { budget, reason }) => {
            assert_eq!(budget, block - 1);
            assert!(reason.contains("holds none"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(ex.layer_pager().is_none());
    // A mixture of experts pages its experts, not its blocks.
    let tmp = tempfile::tempdir().unwrap();
    let shape = synapse_testdata::synthetic_moe::MoeShape::small();
    let moe = tmp.path().join(shape.file_name());
    synapse_testdata::synthetic_moe::write(&shape, &moe).unwrap();
    let mut ex = Executor::new(Arc::new(Model::load(&moe).unwrap()), 1).unwrap();
    let e = ex.page_layers(Some(u64::MAX)).unwrap_err();
    assert!(e.to_string().contains("mixture of experts"), "{e}");
}

#[test]
fn an_engine_pages_blocks_under_its_memory_budget_with_the_same_tokens() {
    let Some((m, _)) = smollm() else { return };
    let (want, free) = common::engine_greedy(&m, None, 3, &PROMPT, 12);
    assert_eq!(free.block_misses, 0);
    let whole = m.weight_bytes() as u64;
    let blocks = LayerPager::pageable_bytes(&m, 0..m.layers.len());
    // The weights do not fit whole: the blocks page in what the rest leaves (about a third
    // of them).
    let kv = KvCache::new(&m, KvDtype::F32, 3, 128, 32)
        .unwrap()
        .slot_bytes() as u64
        * 3;
    let threads = synapse_runtime::engine::EngineConfig::default().threads;
    let scratch = m.pass_scratch_bytes(64, 4, 128, threads);
    let budget = whole + kv + scratch - blocks * 2 / 3;
    let (got, st) = common::engine_greedy(&m, Some(budget), 3, &PROMPT, 12);
    assert_eq!(
        got, want,
        "3 sessions under a {budget} B budget: other tokens"
    );
    assert!(st.block_misses > 0 && st.block_evictions > 0, "{st:?}");
    eprintln!(
        "engine, 3 sessions, {:.1} MB budget for {:.1} MB of weights ({:.1} MB in blocks): {} \
         block hits, {} misses, {} evictions",
        budget as f64 / 1e6,
        whole as f64 / 1e6,
        blocks as f64 / 1e6,
        st.block_hits,
        st.block_misses,
        st.block_evictions
    );
    // Too small for one block beside the rest: refused at start.
    let cfg = synapse_runtime::engine::EngineConfig {
        slots: 3,
        ctx: 128,
        ubatch: 32,
        step_tokens: 64,
        memory: Some(whole + kv + scratch - blocks),
        ..Default::default()
    };
    let Err(e) = synapse_runtime::engine::Scheduler::new(m, Arc::new(common::Ids), cfg) else {
        panic!("a budget without room for a block was taken");
    };
    assert!(
        matches!(e, synapse_runtime::RuntimeError::MemoryBudget { .. }),
        "{e}"
    );
}

/// The warm-up pass (`Scheduler::warm_up`, run by `Engine::start` with `warmup`, as `serve`
/// does): without a budget it faults the blocks' projections in from the mapping; under a
/// budget it pages them through the block pager and holds no more than the budget; either
/// way it leaves no trace — no request, token, step or open slot counted — and the sessions
/// after it get the tokens they get without it.
#[test]
fn a_warm_up_pass_faults_weights_in_within_the_budget_and_leaves_no_trace() {
    use synapse_runtime::engine::{Engine, EngineConfig, Scheduler};
    let Some((m, path)) = smollm() else { return };
    let (want, _) = common::engine_greedy(&m, None, 2, &PROMPT, 8);
    let projections = LayerPager::pageable_bytes(&m, 0..m.layers.len());
    let no_trace = |st: &synapse_runtime::engine::EngineStats| {
        assert_eq!(
            (st.requests, st.prompt_tokens, st.generated_tokens, st.steps),
            (0, 0, 0, 0),
            "{st:?}"
        );
        assert_eq!((st.active, st.queued, st.kv_bytes), (0, 0, 0), "{st:?}");
    };

    // No budget: a fresh model's projections are not mapped in until the warm-up reads them.
    let fresh = Arc::new(Model::load(&path).unwrap());
    let before = common::mapped_rss(&path);
    let cfg = EngineConfig {
        slots: 2,
        ctx: 128,
        ubatch: 32,
        step_tokens: 64,
        warmup: true,
        ..EngineConfig::default()
    };
    let engine = Engine::start(fresh.clone(), Arc::new(common::Ids), cfg.clone()).unwrap();
    let after = common::mapped_rss(&path);
    eprintln!(
        "no budget: the model file's mappings (the fresh model's and the first's) held {:.1} \
         MB before the warm-up, {:.1} MB after ({:.1} MB of projections)",
        before as f64 / 1e6,
        after as f64 / 1e6,
        projections as f64 / 1e6
    );
    assert!(
        after >= before + projections * 9 / 10,
        "the warm-up mapped {after} B (from {before} B); the projections are {projections} B"
    );
    no_trace(&engine.stats());
    engine.shutdown();
    drop(engine);

    // Under a budget that holds about a third of the blocks: paged, within the budget.
    let whole = m.weight_bytes() as u64;
    let kv = KvCache::new(&m, KvDtype::F32, 2, 128, 32)
        .unwrap()
        .slot_bytes() as u64
        * 2;
    let scratch = m.pass_scratch_bytes(64, 4, 128, cfg.threads);
    let cfg = EngineConfig {
        memory: Some(whole + kv + scratch - projections * 2 / 3),
        warmup: false,
        ..cfg
    };
    let mut s = Scheduler::new(m.clone(), Arc::new(common::Ids), cfg).unwrap();
    let budget = s.ledger().unwrap().layers_budget.unwrap();
    let took = s.warm_up().unwrap().expect("a local engine warms up");
    let st = s.stats();
    let held = s.executor().layer_pager().unwrap().held_bytes();
    eprintln!(
        "budget {:.1} MB for {:.1} MB of blocks: the warm-up took {:.1} ms, paged {} blocks \
         in ({} evictions), holds {:.1} MB",
        budget as f64 / 1e6,
        projections as f64 / 1e6,
        took.as_secs_f64() * 1e3,
        st.block_misses,
        st.block_evictions,
        held as f64 / 1e6
    );
    assert!(st.block_misses > 0 && st.block_evictions > 0, "{st:?}");
    assert!(
        held <= budget,
        "the pager holds {held} B of a {budget} B budget"
    );
    no_trace(&st);
    // Not once a session is in (it would take the session's slot).
    let pending = s
        .submit(synapse_runtime::engine::Request::greedy(PROMPT.to_vec(), 1))
        .unwrap();
    assert!(s.warm_up().is_err());
    drop(pending);
    let got = common::engine_greedy_on(&mut s, 2, &PROMPT, 8);
    assert_eq!(got, want, "the sessions after a warm-up got other tokens");
}

/// A safetensors checkpoint loads lazily too: its projections borrow the file's mapping (not
/// copied at load), a dense model's blocks page under a budget and a mixture of experts'
/// routed experts page, each with the logits of the whole model run from its mapping, bit
/// for bit.
#[test]
fn a_safetensors_checkpoint_loads_lazily_and_pages() {
    let root = common::workspace_root().join("fixtures/tiny");
    for family in ["llama", "olmoe"] {
        let dir = root.join(family);
        if !common::require(&dir.join("model.safetensors"), "tiny-model fixture") {
            return;
        }
        let m = Arc::new(Model::load(&dir).unwrap());
        let l = &m.layers[0];
        assert!(
            l.q.m.is_borrowed() && l.o.m.is_borrowed(),
            "{family}: projections copied at load"
        );
        let file = dir.join("model.safetensors");
        let (want, _) = run(&mut Executor::new(m.clone(), 2).unwrap(), 6, &file);
        let mut ex = Executor::new(m.clone(), 2).unwrap();
        if family == "llama" {
            let blocks = m.layers.len();
            let block = LayerPager::pageable_bytes(&m, 0..blocks) / blocks as u64;
            ex.page_layers(Some(block + block / 2)).unwrap();
        } else {
            ex.page_experts(Some(u64::MAX)).unwrap();
            let total = ex.expert_pager().unwrap().total_bytes();
            ex.page_experts(Some(total / 2)).unwrap();
        }
        let (got, _) = run(&mut ex, 6, &file);
        assert!(
            got == want,
            "{family}: paged from safetensors, other logits"
        );
        let st = ex
            .paging_stats()
            .or(ex.layer_pager().map(|p| p.stats()))
            .unwrap();
        assert!(st.misses > 0 && st.evictions > 0, "{family}: {st:?}");
        eprintln!("{family} safetensors paged: {st:?}");
    }
}

/// `Model::load_resident` reads the GGUF's tensors into the process's own memory: every
/// logit of a prompt pass equals the mapped model's bit for bit, the file's mapping gains no
/// page while it runs (only the metadata the parser read), and a budget that would page its
/// blocks is refused with a typed error (the pagers need the mapping).
#[test]
fn a_resident_model_runs_without_its_mapping_and_gives_the_same_logits() {
    let Some((m, path)) = smollm() else { return };
    let want = common::alone_logits(&m, &PROMPT);
    let projections = LayerPager::pageable_bytes(&m, 0..m.layers.len());
    let before = common::mapped_rss(&path);
    let r = Arc::new(Model::load_resident(&path).unwrap());
    let got = common::alone_logits(&r, &PROMPT);
    let after = common::mapped_rss(&path);
    eprintln!(
        "resident: the file's mappings held {:.1} MB before the resident model was loaded and \
         run, {:.1} MB after ({:.1} MB of projections)",
        before as f64 / 1e6,
        after as f64 / 1e6,
        projections as f64 / 1e6
    );
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "logit {i}: {g} vs {w}");
    }
    assert!(
        after < before + projections / 10,
        "running the resident model mapped {} B of the file",
        after.saturating_sub(before)
    );
    let mut exec = Executor::new(r.clone(), 1).unwrap();
    let err = exec.page_layers(Some(projections / 3)).unwrap_err();
    assert!(
        matches!(err, RuntimeError::InvalidParam { name: "memory", .. }),
        "{err}"
    );
    eprintln!("resident: a paging budget is refused: {err}");
}
