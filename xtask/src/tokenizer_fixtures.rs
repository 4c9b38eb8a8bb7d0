//! `cargo xtask tokenizer-fixtures`: regenerates `fixtures/tokenizer/`.
//!
//! - `gemma3_llamacpp.json`: 200+ varied strings tokenized by llama.cpp (llama-cpp-python's
//!   `llama_tokenize` on the default model's vocabulary, `vocab_only`), with and without BOS and
//!   special-token parsing, plus llama.cpp's `llama_detokenize` of each result.
//! - `chat_templates.json`: llama.cpp's `models/templates/*.jinja` rendered for a fixed
//!   conversation by transformers' own Jinja setup (`_compile_jinja_template` from
//!   `transformers.utils.chat_template_utils`, i.e. exactly what `apply_chat_template` renders
//!   with), `strftime_now` pinned to 2024-07-26.
//!
//! Needs the oracle venv (`SYNAPSE_ORACLE_VENV`, with llama-cpp-python and transformers), the
//! default model (`--model`) and the unpacked suite's templates (`--templates`, default: the
//! vocab-suite cache folder's `templates/`).

use anyhow::{Context, Result, bail};
use std::path::PathBuf;
use std::process::Command;

/// Arguments of `tokenizer-fixtures`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The Gemma 3 GGUF (default: `$SYNAPSE_MODEL_DIR` or the cache's models folder).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Folder of `*.jinja` chat templates (default: `<vocab-suite>/templates`).
    #[arg(long)]
    templates: Option<PathBuf>,
}

const GEMMA_PY: &str = r#####"
import ctypes, json, sys
import llama_cpp as L

model_path, out_path = sys.argv[1], sys.argv[2]

base = [
    "Hello world", " Hello world", "Hello World!", "hello, world.", "The capital of France is",
    "I'm here; you're there; they'll come, won't they?", "What's up?!", "e-mail: test@example.com",
    "https://example.com/path?q=1&r=2#frag", "C:\\Users\\name\\file.txt", "snake_case and camelCase and PascalCase",
    "3.14159 2.71828 1e-10 -42 +7 1,000,000", "0123456789", "12345678901234567890", "Version 1.2.3-beta+build.5",
    "2024-07-26T12:34:56Z", "$100.00 or €85,50 or £70 or ¥10000", "100%", "a+b=c; x*y/z",
    "Café naïve résumé coöperate façade", "Ünïcödé ÀÉÎÕÜ àéîõü ß ẞ", "Ελληνικά γράμματα", "Русский текст, привет мир!",
    "Українська мова", "עברית מימין לשמאל", "العربية من اليمين", "हिन्दी भाषा", "বাংলা ভাষা", "ภาษาไทย ไม่มีช่องว่าง",
    "日本語のテキストです。", "カタカナとひらがな", "中文文本，测试分词。", "繁體中文測試", "한국어 텍스트입니다", "Tiếng Việt có dấu",
    "Türkçe ğüşıöç", "Polski: zażółć gęślą jaźń", "Čeština: příliš žluťoučký kůň", "Română: ăâîșț", "Íslenska: þ ð æ ö",
    "Kiswahili ni lugha nzuri", "ქართული ენა", "Հայերեն լեզու", "አማርኛ ቋንቋ", "தமிழ் மொழி", "తెలుగు భాష", "ಕನ್ನಡ ಭಾಷೆ",
    "മലയാളം", "ગુજરાતી", "ਪੰਜਾਬੀ", "සිංහල", "ລາວ", "ខ្មែរ", "မြန်မာ", "Монгол хэл", "ᚠᚢᚦᚨᚱᚲ runes",
    "😀", "😀😃😄😁", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵🇺🇸", "❤️‍🔥", "🦀 Rust 🚀", "emoji in text 🙂 here", "☃★♠♣♥♦", "→ ← ↑ ↓ ⇒ ∀ ∃ ∈ ∑ ∫ √ ∞",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝛼𝛽𝛾", "𓀀𓀁 hieroglyphs", "\u200bzero\u200bwidth\u200b", "non\u00a0breaking\u00a0space", "soft\u00adhyphen",
    "tab\tseparated\tvalues", "line1\nline2\nline3", "windows\r\nline\r\nendings", "trailing spaces   ", "   leading spaces",
    "\n", "\n\n", "\n\n\n", "\t", "\t\t", " \n ", "\n \n", "  \n  \n  ", "\r", "\r\n",
    "def f(x):\n    return x * 2\n", "fn main() {\n    println!(\"hi\");\n}\n", "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
    "SELECT * FROM users WHERE id = 42;", "<div class=\"x\">Hello</div>", "{\"key\": [1, 2, {\"nested\": null}]}",
    "#include <stdio.h>\nint main(void) { return 0; }", "x = lambda a, b: a ** b  # comment", "    if (x) {\n        y();\n    }",
    "$ ls -la | grep '.rs' > out.txt", "// TODO: fix this\n/* block */", "<?php echo $x; ?>", "\\begin{equation} E = mc^2 \\end{equation}",
    "```python\nprint('hi')\n```", "| a | b |\n|---|---|\n| 1 | 2 |", "- item 1\n- item 2\n  - nested", "**bold** _italic_ `code`",
    "'s 't 're 've 'm 'll 'd", "'S 'T 'RE 'VE 'M 'LL 'D", "don't won't can't shouldn't", "...", "!!!???", "--", "—–-", "«quotes» “smart” ‘single’",
    "a", "A", "ab", "abc", "abcd", " a", "  a", "a ", "aa aa aa", "Aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "zzzzzzzzzzzzzzzzzz",
    "▁", "▁▁", "▁hello", "<0x0A>", "<0xFF>", "\x00", "\x01\x02", "\x7f", "\u00ff\u00fe", "\ufeffBOM",
]
specials = [
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n", "<bos>Hello", "Hello<eos>", "<pad><unk><mask>",
    "<start_of_turn>", "<end_of_turn>", "text<start_of_turn>text", "<start_of_image>", "<end_of_image>",
    "<unused0><unused1>", "[multimodal]", "<start_of_turn> user", " <end_of_turn> ", "<start_of_turn><start_of_turn>",
    "<<start_of_turn>>", "<start_of_turn\n>", "<bos><bos>", "<eos>", "a<bos>b<eos>c", "<b>bold</b> <i>it</i> <br/>",
    "<table><tr><td>1</td></tr></table>", "<h1>Title</h1>\n<p>Para</p>",
]
runs = []
for n in (1, 2, 3, 4, 5, 7, 8, 15, 16, 31, 32, 33):
    runs.append(" " * n)
    runs.append("x" + " " * n + "y")
for n in (1, 2, 4, 8, 16):
    runs.append("\t" * n + "z")
    runs.append("\n" * n + "w")
    runs.append(" \t" * n)
mixed = []
for i, s in enumerate(base[:60]):
    mixed.append(s + " " + base[(i * 7 + 3) % len(base)])
texts = base + specials + runs + mixed
seen = set(); uniq = []
for t in texts:
    if t not in seen:
        seen.add(t); uniq.append(t)

L.llama_backend_init()
mp = L.llama_model_default_params()
mp.vocab_only = True
m = L.llama_model_load_from_file(model_path.encode(), mp)
assert m, "load failed"
v = L.llama_model_get_vocab(m)

def tok(b, add, special):
    buf = (L.llama_token * (len(b) * 4 + 16))()
    n = L.llama_tokenize(v, b, len(b), buf, len(buf), add, special)
    assert n >= 0
    return list(buf[:n])

def detok(ids, remove_special, unparse):
    arr = (L.llama_token * max(1, len(ids)))(*ids)
    cap = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(cap)
    n = L.llama_detokenize(v, arr, len(ids), buf, cap, remove_special, unparse)
    assert n >= 0
    return buf.raw[:n]

cases = []
for t in uniq:
    b = t.encode("utf-8")
    for add, special in ((True, False), (False, True)):
        ids = tok(b, add, special)
        d = detok(ids, False, special)
        cases.append({"text": t, "add_special": add, "parse_special": special, "ids": ids, "detok_hex": d.hex()})
with open(out_path, "w", encoding="utf-8") as fh:
    head = {
        "source": "llama.cpp via llama-cpp-python 0.3.36 (llama_tokenize / llama_detokenize, vocab_only) on gemma-3-270m-q4_k_m.gguf",
        "regenerate": "cargo xtask tokenizer-fixtures",
        "n_strings": len(uniq),
    }
    fh.write(json.dumps(head, ensure_ascii=False)[:-1] + ',\n"cases": [\n')
    fh.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
    fh.write("\n]}\n")
print(f"{len(uniq)} strings, {len(cases)} cases -> {out_path}")
"#####;

const CHAT_PY: &str = r#####"
import datetime, glob, json, os, sys
from transformers.utils.chat_template_utils import _compile_jinja_template
import transformers

tdir, out_path = sys.argv[1], sys.argv[2]
FIXED = datetime.datetime(2024, 7, 26)
conv_sys = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello! What is 2+2?"},
    {"role": "assistant", "content": "2+2 equals 4."},
    {"role": "user", "content": "Thanks. Now say hi in French 🇫🇷."},
]
conv_nosys = conv_sys[1:]
out = []
for path in sorted(glob.glob(os.path.join(tdir, "*.jinja"))):
    name = os.path.basename(path)
    src = open(path, encoding="utf-8").read()
    entry = {"template": name, "renders": []}
    try:
        tmpl = _compile_jinja_template(src)
    except Exception as e:
        entry["compile_error"] = f"{type(e).__name__}: {e}"
        out.append(entry)
        continue
    tmpl.globals["strftime_now"] = lambda fmt: FIXED.strftime(fmt)
    for conv_name, conv in (("system", conv_sys), ("no_system", conv_nosys)):
        r = {"conversation": conv_name, "add_generation_prompt": True}
        try:
            r["output"] = tmpl.render(messages=conv, tools=None, documents=None, add_generation_prompt=True,
                                      bos_token="<s>", eos_token="</s>")
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {e}"
        entry["renders"].append(r)
        if "output" in r:
            break
    out.append(entry)
json.dump({
    "source": f"transformers {transformers.__version__} _compile_jinja_template (what apply_chat_template renders with); bos_token='<s>', eos_token='</s>', strftime_now pinned to 2024-07-26",
    "regenerate": "cargo xtask tokenizer-fixtures",
    "conversations": {"system": conv_sys, "no_system": conv_nosys},
    "templates": out,
}, open(out_path, "w", encoding="utf-8"), ensure_ascii=False, indent=1)
print(f"{len(out)} templates -> {out_path}")
"#####;

fn run_py(script: &str, args: &[&std::ffi::OsStr]) -> Result<()> {
    let py = crate::oracle_env::python()?;
    let status = Command::new(&py)
        .arg("-c")
        .arg(script)
        .args(args)
        .status()
        .with_context(|| format!("running {}", py.display()))?;
    if !status.success() {
        bail!("oracle script failed ({status})");
    }
    Ok(())
}

/// Regenerates the fixtures.
pub fn run(args: Args) -> Result<()> {
    let out_dir = crate::oracle_env::repo_root().join("fixtures/tokenizer");
    std::fs::create_dir_all(&out_dir)?;
    let model = args.model.unwrap_or_else(|| {
        std::env::var_os("SYNAPSE_MODEL_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| crate::vocab_suite::default_dir().with_file_name("models"))
            .join("gemma-3-270m-q4_k_m.gguf")
    });
    if !model.exists() {
        bail!("model not found at {} (pass --model)", model.display());
    }
    let gemma_out = out_dir.join("gemma3_llamacpp.json");
    run_py(GEMMA_PY, &[model.as_os_str(), gemma_out.as_os_str()])?;
    let templates = args
        .templates
        .unwrap_or_else(|| crate::vocab_suite::default_dir().join("templates"));
    if !templates.is_dir() {
        bail!(
            "templates folder {} not found (run `cargo xtask vocab-suite` or pass --templates)",
            templates.display()
        );
    }
    let chat_out = out_dir.join("chat_templates.json");
    run_py(CHAT_PY, &[templates.as_os_str(), chat_out.as_os_str()])?;
    Ok(())
}
