//! `cargo xtask`: project automation. One module per task; each documents what it regenerates.

mod bench_cluster;
mod bench_engine;
mod bench_escalation;
mod bench_kernels_vs_ggml;
mod bench_moe_paging;
mod bench_precision;
mod bench_selective;
mod bench_server;
mod bench_vs_llama;
mod ggml_kernel_fixtures;
mod hf_tokenizer_fixtures;
mod i2s_fixture;
mod import;
mod iq_tables;
mod membw;
mod oracle_env;
mod oracle_fixtures;
mod parity_fixtures;
mod perplexity_fixtures;
mod quant_models;
mod requant_digests;
mod synthetic_bitnet;
mod synthetic_moe;
mod test;
mod text_corpus;
mod tiny_models;
mod tokenizer_fixtures;
mod vocab_suite;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "xtask", about = "Synapse project automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure streaming read bandwidth with 1 and 2 threads (the decode GEMV's physical limit).
    Membw(membw::Args),
    /// Create (or reuse) the oracle Python venv with gguf, numpy and llama-cpp-python.
    OracleEnv(oracle_env::Args),
    /// Import a GGUF file or safetensors checkpoint as a Synapse package (as `synapse-cli import`).
    Import(import::Args),
    /// Fetch llama.cpp's tokenizer test suite (ggml-vocab-*.gguf + .inp/.out) into the cache.
    VocabSuite(vocab_suite::Args),
    /// Regenerate fixtures/tokenizer: Gemma 3 tokenizations by llama.cpp, chat templates by transformers.
    TokenizerFixtures(tokenizer_fixtures::Args),
    /// Regenerate fixtures/tokenizer/hf: tokenizer.json files written by transformers, with its ids.
    HfTokenizerFixtures(hf_tokenizer_fixtures::Args),
    /// Generate crates/synapse-formats/src/decode/iq_tables.rs from ggml-common.h.
    IqTables(iq_tables::Args),
    /// Regenerate fixtures/decode/ (decoder oracle: ggml's own to_float) with the oracle venv.
    OracleFixtures(oracle_fixtures::Args),
    /// Regenerate fixtures/parity: llama.cpp's greedy outputs on the real models.
    ParityFixtures(parity_fixtures::Args),
    /// Regenerate fixtures/tiny: tiny random-weight models of every family with oracle logits.
    TinyModels(tiny_models::Args),
    /// Benchmark Synapse against llama.cpp side by side (prefill, decode, load time, peak RSS).
    BenchVsLlama(bench_vs_llama::Args),
    /// Aggregate decode tok/s of Synapse's batching engine vs llama.cpp's batched decode at
    /// 1, 2, 4, 8, 16 streams (same GGUF, same threads, alternating runs).
    BenchEngine(bench_engine::Args),
    /// `synapse-cli serve` vs llama.cpp's `llama-server`, end to end over HTTP: throughput,
    /// TTFT and inter-token latency at several client counts.
    BenchServer(bench_server::Args),
    /// Build llama.cpp's `llama-server` from the llama-cpp-python sdist (for bench-server).
    BuildLlamaServer(bench_server::BuildArgs),
    /// Regenerate fixtures/ggml-kernels: ggml's mul_mat outputs and activation quantizers.
    GgmlKernelFixtures(ggml_kernel_fixtures::Args),
    /// llama.cpp's pure re-quantization of a real model to each ggml legacy type, as
    /// per-tensor digests (`fixtures/requant/`).
    RequantDigests(requant_digests::Args),
    /// Regenerate fixtures/quant: one model in every ggml type no real model holds, by llama.cpp.
    QuantModels(quant_models::Args),
    /// Time Synapse's quantized matmul against ggml's on Gemma 3 270M's shapes, side by side.
    BenchKernelsVsGgml(bench_kernels_vs_ggml::Args),
    /// Budgeted precision on a real model: uniform profiles vs the importance-driven profile
    /// at the same weight bytes (perplexity, KL vs source, decode tok/s, greedy agreement).
    BenchPrecision(bench_precision::Args),
    /// Single-stream greedy decode, plain vs exact escalation (drafts verified by the source).
    BenchEscalation(bench_escalation::Args),
    /// Selective escalation (approximate) on a sealed prompt suite: margin tuned on the tuning
    /// part, agreement and speed against the source and exact escalation on the sealed part.
    BenchSelective(bench_selective::Args),
    /// Decode on the synthetic MoE with its routed experts held to 100/50/25/12.5% of their
    /// bytes (`generate --memory`), alternating with unbudgeted runs: tok/s, hit rate, load
    /// time, first-token latency. With `--model` a dense GGUF: its blocks' projections held
    /// so instead (also as `bench-paging`).
    #[command(alias = "bench-paging")]
    BenchMoePaging(bench_moe_paging::Args),
    /// Placement by measured speed against placement by memory share on a 2:1 pair of
    /// cluster workers (etcd, workers and the front end as processes): aggregate tok/s.
    BenchCluster(bench_cluster::Args),
    /// Write a mixture-of-experts GGUF of realistic size with random weights (a Mixtral-layout
    /// `llama` file both engines run), for paging and speed benchmarks.
    SyntheticMoe(synthetic_moe::Args),
    /// Write a BitNet b1.58 GGUF of the 2B4T shape with random ternary weights (llama.cpp's
    /// `bitnet` layout, TQ2_0), for end-to-end speed benchmarks beside llama.cpp.
    SyntheticBitnet(synthetic_bitnet::Args),
    /// Regenerate fixtures/tiny/bitnet-packed/model.i2_s.gguf: the packed tiny BitNet as
    /// bitnet.cpp's I2_S GGUF, packed by bitnet.cpp's own converter function.
    I2sFixture(i2s_fixture::Args),
    /// Regenerate fixtures/perplexity: llama.cpp's perplexity of the held-out text.
    PerplexityFixtures(perplexity_fixtures::Args),
    /// Fetch the calibration / held-out evaluation text (Debian's python3.11-doc), split by
    /// document.
    TextCorpus(text_corpus::Args),
    /// The test command: fetch the test data (.ci/fetch-test-data), then the workspace's
    /// tests (nextest) and doctests; fails if any step fails.
    Test(test::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Membw(a) => membw::run(a),
        Command::OracleEnv(a) => oracle_env::run(a),
        Command::Import(a) => import::run(a),
        Command::VocabSuite(a) => vocab_suite::run(a),
        Command::TokenizerFixtures(a) => tokenizer_fixtures::run(a),
        Command::HfTokenizerFixtures(a) => hf_tokenizer_fixtures::run(a),
        Command::IqTables(a) => iq_tables::run(a),
        Command::OracleFixtures(a) => oracle_fixtures::run(a),
        Command::ParityFixtures(a) => parity_fixtures::run(a),
        Command::TinyModels(a) => tiny_models::run(a),
        Command::BenchVsLlama(a) => bench_vs_llama::run(a),
        Command::BenchEngine(a) => bench_engine::run(a),
        Command::BenchServer(a) => bench_server::run(a),
        Command::BuildLlamaServer(a) => bench_server::build(a),
        Command::GgmlKernelFixtures(a) => ggml_kernel_fixtures::run(a),
        Command::RequantDigests(a) => requant_digests::run(a),
        Command::QuantModels(a) => quant_models::run(a),
        Command::BenchKernelsVsGgml(a) => bench_kernels_vs_ggml::run(a),
        Command::TextCorpus(a) => text_corpus::run(a),
        Command::PerplexityFixtures(a) => perplexity_fixtures::run(a),
        Command::BenchPrecision(a) => bench_precision::run(a),
        Command::BenchEscalation(a) => bench_escalation::run(a),
        Command::BenchSelective(a) => bench_selective::run(a),
        Command::Test(a) => test::run(a),
        Command::BenchMoePaging(a) => bench_moe_paging::run(a),
        Command::BenchCluster(a) => bench_cluster::run(a),
        Command::SyntheticMoe(a) => synthetic_moe::run(a).map(|_| ()),
        Command::SyntheticBitnet(a) => synthetic_bitnet::run(a).map(|_| ()),
        Command::I2sFixture(a) => i2s_fixture::run(a),
    }
}
