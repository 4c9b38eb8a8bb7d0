//! `synapse-cli`: the command-line adapter. Glue only: every command calls into a ring.
//!
//! Each subcommand lives in its own module under `cmd/`.

mod cmd;

use clap::{Parser, Subcommand};

/// Synapse: an LLM inference engine for CPUs.
#[derive(Parser, Debug)]
#[command(name = "synapse-cli", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show a model file's format, metadata and tensor table.
    Types(cmd::types::Args),
    /// Import a GGUF file or safetensors checkpoint as a Synapse package.
    Import(cmd::import::Args),
    /// The content-addressed store: stats, verify, export, gc.
    Cas(cmd::cas::Args),
    /// Tokenize text with a model's tokenizer and print ids and pieces.
    Tokenize(cmd::tokenize::Args),
    /// Show a GGUF or safetensors model's format, metadata, tensor table and type histogram.
    Inspect(cmd::inspect::Args),
    /// Write one tensor decoded to little-endian f32 (row-major, the file's dimension order).
    Tensor(cmd::tensor::Args),
    /// List the published models Synapse can fetch by name, their size and whether cached.
    Models(cmd::models::Args),
    /// Fetch (once) and verify a published model (default: the default model); print its path.
    FetchModel(cmd::fetch_model::Args),
    /// Generate text from a prompt (default model: Gemma 3 270M Q4_K_M).
    Generate(cmd::generate::Args),
    /// A text's perplexity, computed as llama.cpp's llama-perplexity does.
    Perplexity(cmd::perplexity::Args),
    /// Measure every tensor's importance on calibration text (an importance map, JSON).
    Importance(cmd::importance::Args),
    /// Validate an importance map by ablation: demote one tensor group at a time, measure the
    /// KL divergence from the source on held-out text, rank-correlate with the prediction.
    Ablate(cmd::ablate::Args),
    /// Show the precision profile `--budget` / `--profile` selects, tensor by tensor.
    Profile(cmd::profile::Args),
    /// Refine a budget's profile by the KL divergence it measures on calibration text, and save
    /// it for `--profile FILE`.
    Refine(cmd::refine::Args),
    /// Write a precision profile of ggml types (`--budget`, `--profile uniform:ggml.…`) as a
    /// GGUF that llama.cpp loads.
    ExportGguf(cmd::export_gguf::Args),
    /// Serve the model over an OpenAI-compatible HTTP API (llama-server's flags).
    Serve(cmd::serve::Args),
    /// Join a cluster as a worker: register on etcd, run the plan's replica or layer range.
    Worker(cmd::worker::Args),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SYNAPSE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse_from(cmd::serve::llama_args(std::env::args_os()));
    match cli.command {
        Command::Types(a) => cmd::types::run(a),
        Command::Import(a) => cmd::import::run(a),
        Command::Cas(a) => cmd::cas::run(a),
        Command::Tokenize(a) => cmd::tokenize::run(a),
        Command::Inspect(a) => cmd::inspect::run(a),
        Command::Tensor(a) => cmd::tensor::run(a),
        Command::Models(a) => cmd::models::run(a),
        Command::FetchModel(a) => cmd::fetch_model::run(a),
        Command::Generate(a) => cmd::generate::run(a),
        Command::Perplexity(a) => cmd::perplexity::run(a),
        Command::Importance(a) => cmd::importance::run(a),
        Command::Ablate(a) => cmd::ablate::run(a),
        Command::Profile(a) => cmd::profile::run(a),
        Command::Refine(a) => cmd::refine::run(a),
        Command::ExportGguf(a) => cmd::export_gguf::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Worker(a) => cmd::worker::run(a),
    }
}
