//! `cargo xtask iq-tables`: generates `crates/synapse-formats/src/decode/iq_tables.rs`, the
//! lookup tables of the i-quants (IQ2/IQ3/IQ1 grids, sign tables, the IQ4_NL and FP4 value
//! tables), by parsing the `GGML_TABLE_BEGIN … GGML_TABLE_END` data blocks of ggml's
//! `ggml-common.h`. Only data is carried over; the output is deterministic for a given header.
//!
//! The header comes from the llama.cpp sources vendored in the llama-cpp-python sdist
//! (`pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36`), found via
//! `--ggml-common PATH` or `$SYNAPSE_GGML_COMMON_H`.

use anyhow::{Context, Result, bail};
use std::fmt::Write as _;
use std::path::PathBuf;

/// Arguments of `iq-tables`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Path to ggml's `ggml-common.h` (vendor/llama.cpp/ggml/src/ggml-common.h of the
    /// llama-cpp-python 0.3.36 sdist).
    #[arg(long, env = "SYNAPSE_GGML_COMMON_H")]
    ggml_common: PathBuf,
    /// Where to write the generated module.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Only check that the committed file is up to date (exit non-zero if not).
    #[arg(long)]
    check: bool,
}

/// One table to carry over: ggml's name, the Rust name and element type, the expected length.
struct Spec {
    c_name: &'static str,
    rust_name: &'static str,
    rust_ty: &'static str,
    len: usize,
    doc: &'static str,
}

const SPECS: &[Spec] = &[
    Spec {
        c_name: "kmask_iq2xs",
        rust_name: "KMASK_IQ2XS",
        rust_ty: "u8",
        len: 8,
        doc: "Bit masks selecting the sign bit of element `j` in a sign byte.",
    },
    Spec {
        c_name: "ksigns_iq2xs",
        rust_name: "KSIGNS_IQ2XS",
        rust_ty: "u8",
        len: 128,
        doc: "7-bit sign index to an 8-bit sign byte with even parity.",
    },
    Spec {
        c_name: "iq2xxs_grid",
        rust_name: "IQ2XXS_GRID",
        rust_ty: "u64",
        len: 256,
        doc: "IQ2_XXS lattice: 8 unsigned magnitudes (bytes, little-endian) per entry.",
    },
    Spec {
        c_name: "iq2xs_grid",
        rust_name: "IQ2XS_GRID",
        rust_ty: "u64",
        len: 512,
        doc: "IQ2_XS lattice: 8 unsigned magnitudes (bytes, little-endian) per entry.",
    },
    Spec {
        c_name: "iq2s_grid",
        rust_name: "IQ2S_GRID",
        rust_ty: "u64",
        len: 1024,
        doc: "IQ2_S lattice: 8 unsigned magnitudes (bytes, little-endian) per entry.",
    },
    Spec {
        c_name: "iq3xxs_grid",
        rust_name: "IQ3XXS_GRID",
        rust_ty: "u32",
        len: 256,
        doc: "IQ3_XXS lattice: 4 unsigned magnitudes (bytes, little-endian) per entry.",
    },
    Spec {
        c_name: "iq3s_grid",
        rust_name: "IQ3S_GRID",
        rust_ty: "u32",
        len: 512,
        doc: "IQ3_S lattice: 4 unsigned magnitudes (bytes, little-endian) per entry.",
    },
    Spec {
        c_name: "iq1s_grid",
        rust_name: "IQ1S_GRID",
        rust_ty: "u64",
        len: 2048,
        doc: "IQ1_S / IQ1_M lattice: 8 signed values in {-1, 0, 1} (i8 bytes, little-endian) per entry.",
    },
    Spec {
        c_name: "kvalues_iq4nl",
        rust_name: "KVALUES_IQ4NL",
        rust_ty: "i8",
        len: 16,
        doc: "IQ4_NL / IQ4_XS non-linear 4-bit code book.",
    },
    Spec {
        c_name: "kvalues_fp4",
        rust_name: "KVALUES_FP4",
        rust_ty: "i8",
        len: 16,
        doc: "E2M1 (FP4) values doubled, shared by MXFP4 and NVFP4.",
    },
];

/// Extracts the numbers between `GGML_TABLE_BEGIN(type, name, size)` and `GGML_TABLE_END()`.
fn parse_table(header: &str, c_name: &str) -> Result<Vec<i128>> {
    let mut found = None;
    for (pos, _) in header.match_indices("GGML_TABLE_BEGIN(") {
        let rest = &header[pos + "GGML_TABLE_BEGIN(".len()..];
        let close = rest.find(')').context("unterminated GGML_TABLE_BEGIN")?;
        let args: Vec<&str> = rest[..close].split(',').map(str::trim).collect();
        if args.len() == 3 && args[1] == c_name {
            if found.is_some() {
                bail!("table {c_name} defined twice");
            }
            let body_start = close + 1;
            let end = rest[body_start..]
                .find("GGML_TABLE_END()")
                .context("missing GGML_TABLE_END")?;
            found = Some(&rest[body_start..body_start + end]);
        }
    }
    let body = found.with_context(|| format!("table {c_name} not found"))?;
    let mut out = Vec::new();
    for line in body.lines() {
        let line = line.split("//").next().unwrap_or("");
        for tok in line.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (neg, digits) = match tok.strip_prefix('-') {
                Some(d) => (true, d),
                None => (false, tok),
            };
            let v = if let Some(hex) = digits.strip_prefix("0x").or(digits.strip_prefix("0X")) {
                i128::from_str_radix(hex, 16)
            } else {
                digits.parse::<i128>()
            }
            .with_context(|| format!("bad number `{tok}` in {c_name}"))?;
            out.push(if neg { -v } else { v });
        }
    }
    Ok(out)
}

fn render(header: &str, source_desc: &str) -> Result<String> {
    let mut s = String::new();
    writeln!(
        s,
        "// @generated by `cargo xtask iq-tables`. Do not edit by hand."
    )?;
    writeln!(s, "//")?;
    writeln!(
        s,
        "// Source: {source_desc} (ggml's `ggml-common.h` as vendored by llama-cpp-python 0.3.36)."
    )?;
    writeln!(
        s,
        "// These lookup tables are data from ggml, Copyright (c) 2023-2026 The ggml authors,"
    )?;
    writeln!(
        s,
        "// released under the MIT License (see the LICENSE file of llama.cpp / ggml)."
    )?;
    writeln!(s)?;
    writeln!(
        s,
        "//! ggml's i-quant and FP4 lookup tables (generated data)."
    )?;
    for spec in SPECS {
        let vals = parse_table(header, spec.c_name)?;
        if vals.len() != spec.len {
            bail!(
                "{}: expected {} values, found {}",
                spec.c_name,
                spec.len,
                vals.len()
            );
        }
        let (per_line, width) = match spec.rust_ty {
            "u64" => (4, 0),
            "u32" => (8, 0),
            _ => (16, 4),
        };
        writeln!(s)?;
        writeln!(s, "/// {} (ggml: `{}`)", spec.doc, spec.c_name)?;
        writeln!(s, "#[rustfmt::skip]")?;
        writeln!(
            s,
            "pub static {}: [{}; {}] = [",
            spec.rust_name, spec.rust_ty, spec.len
        )?;
        for chunk in vals.chunks(per_line) {
            let items: Vec<String> = chunk
                .iter()
                .map(|&v| match spec.rust_ty {
                    "u64" => {
                        let v = u64::try_from(v).context("u64 out of range")?;
                        Ok(format!("0x{v:016x}"))
                    }
                    "u32" => {
                        let v = u32::try_from(v).context("u32 out of range")?;
                        Ok(format!("0x{v:08x}"))
                    }
                    "u8" => {
                        let v = u8::try_from(v).context("u8 out of range")?;
                        Ok(format!("{v:>width$}"))
                    }
                    "i8" => {
                        let v = i8::try_from(v).context("i8 out of range")?;
                        Ok(format!("{v:>width$}"))
                    }
                    other => bail!("unsupported type {other}"),
                })
                .collect::<Result<_>>()?;
            writeln!(s, "    {},", items.join(", "))?;
        }
        writeln!(s, "];")?;
    }
    Ok(s)
}

/// Generates (or checks) the tables module.
pub fn run(args: Args) -> Result<()> {
    let header = std::fs::read_to_string(&args.ggml_common)
        .with_context(|| format!("reading {}", args.ggml_common.display()))?;
    let out = args.out.unwrap_or_else(|| {
        crate::oracle_env::repo_root().join("crates/synapse-formats/src/decode/iq_tables.rs")
    });
    let text = render(&header, "ggml/src/ggml-common.h")?;
    if args.check {
        let current = std::fs::read_to_string(&out).unwrap_or_default();
        if current != text {
            bail!(
                "{} is out of date: run `cargo xtask iq-tables`",
                out.display()
            );
        }
        println!("{} is up to date", out.display());
        return Ok(());
    }
    std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_signed_and_hex() {
        let h = "GGML_TABLE_BEGIN(int8_t, t, 3)\n -1, 0x10, 7, // c\nGGML_TABLE_END()\n";
        assert_eq!(parse_table(h, "t").unwrap(), vec![-1, 16, 7]);
        assert!(parse_table(h, "u").is_err());
    }
}
