//! `cargo xtask`: project automation. One module per task; each documents what it regenerates.

mod oracle_env;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "xtask", about = "Synapse project automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create (or reuse) the oracle Python venv with gguf, numpy and llama-cpp-python.
    OracleEnv(oracle_env::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::OracleEnv(a) => oracle_env::run(a),
    }
}
