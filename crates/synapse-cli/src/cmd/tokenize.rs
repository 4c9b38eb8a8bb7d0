//! `synapse-cli tokenize`: a model's tokenizer on a piece of text (ids and pieces).

use anyhow::Context;
use clap::Args as ClapArgs;
use std::path::PathBuf;
use synapse_formats::gguf::GgufFile;
use synapse_tokenizer::Tokenizer;

/// Arguments of `tokenize`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The model: a GGUF file, a HF `tokenizer.json`, or a published model's name.
    #[arg(long)]
    model: PathBuf,
    /// The text to tokenize.
    text: String,
    /// Print JSON (`[{"id": …, "piece": …}]`) instead of a table.
    #[arg(long)]
    json: bool,
    /// Do not add BOS/EOS even where the model asks for them.
    #[arg(long)]
    no_bos: bool,
    /// Recognise control tokens written in the text (`<start_of_turn>`).
    #[arg(long)]
    special: bool,
}

/// Loads the tokenizer and prints the tokenization.
pub fn run(args: Args) -> anyhow::Result<()> {
    let model = super::load::source_path(&args.model)?;
    let tok = if model.extension().is_some_and(|e| e == "json") {
        Tokenizer::from_hf_tokenizer_json(&model)?
    } else {
        let f = GgufFile::open(&model).with_context(|| format!("opening {}", model.display()))?;
        Tokenizer::from_gguf(&f)?
    };
    let ids = tok.encode(&args.text, !args.no_bos, args.special)?;
    let rows: Vec<(u32, String)> = ids
        .iter()
        .map(|&id| {
            let piece = tok
                .token_to_piece(id, true)
                .map(|p| String::from_utf8_lossy(p).into_owned());
            piece.map(|p| (id, p))
        })
        .collect::<Result<_, _>>()?;
    if args.json {
        let v: Vec<_> = rows
            .iter()
            .map(|(id, p)| serde_json::json!({"id": id, "piece": p, "text": tok.token_text(*id)}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{} tokens", ids.len());
        for (id, p) in &rows {
            println!("{id:>7}  {p:?}");
        }
    }
    Ok(())
}
