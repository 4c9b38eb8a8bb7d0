//! Chat templates: the model's own Jinja template rendered the way HF transformers renders it.
//!
//! transformers (`apply_chat_template`) compiles the template in a sandboxed Jinja2 environment
//! with `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter that
//! is plain `json.dumps(x, ensure_ascii=False, indent=…, separators=…, sort_keys=…)`, and the
//! globals `raise_exception(msg)` and `strftime_now(fmt)`; it renders with `messages`,
//! `tools=None`, `documents=None`, `add_generation_prompt` and the special-token strings.
//! This module does the same with minijinja and minijinja-contrib's Python-compatible methods
//! (`.strip()`, `.items()`, `.startswith()` …).
//!
//! Anything minijinja cannot parse or does not know (an unknown tag, filter, test, function or
//! method) is a typed [`TokenizerError::UnsupportedTemplateFeature`], never a silently
//! different prompt.

use crate::error::{Result, TokenizerError};
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind};
use serde::Serialize;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` …
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template plus the special-token strings it is rendered with.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

/// The date `strftime_now` reports: (year, month 1–12, day 1–31).
type Date = (i64, u32, u32);

impl ChatTemplate {
    /// Compiles `source` with the given BOS/EOS strings. Today's date (UTC) feeds `strftime_now`.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        Self::with_date(source, bos_token, eos_token, today_utc())
    }

    /// Like [`ChatTemplate::new`] with a fixed date for `strftime_now` (reproducible prompts).
    pub fn with_date(source: &str, bos_token: &str, eos_token: &str, date: Date) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("raise_exception: {msg}"),
                ))
            },
        );
        env.add_function("strftime_now", move |fmt: String| strftime(&fmt, date));
        // Jinja2's `iterable` test: none is not iterable, undefined is (it iterates as empty).
        env.add_test("iterable", |v: Value| !v.is_none() && v.try_iter().is_ok());
        env.add_template_owned("chat", translate_generation_tags(source))
            .map_err(map_err)?;
        Ok(Self {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The template a tokenizer's source carried (`tokenizer.chat_template`), with its BOS/EOS.
    pub fn from_tokenizer(tok: &crate::Tokenizer) -> Result<Self> {
        let src = tok.chat_template().ok_or(TokenizerError::NoTemplate)?;
        Self::new(
            src,
            tok.bos_text().unwrap_or(""),
            tok.eos_text().unwrap_or(""),
        )
    }

    /// The template in a GGUF file (`tokenizer.chat_template`).
    pub fn from_gguf(f: &synapse_formats::gguf::GgufFile) -> Result<Self> {
        let tok = crate::Tokenizer::from_gguf(f)?;
        Self::from_tokenizer(&tok)
    }

    /// Renders the conversation. `add_generation_prompt` appends the assistant-turn opener.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, Value::from(()))
    }

    /// Renders with extra context (`tools`: a JSON-like value, or none).
    pub fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        tools: Value,
    ) -> Result<String> {
        let tmpl = self.env.get_template("chat").map_err(map_err)?;
        tmpl.render(minijinja::context! {
            messages => Value::from_serialize(messages),
            tools => tools,
            documents => Value::from(()),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        })
        .map_err(map_err)
    }
}

/// transformers' `{% generation %}…{% endgeneration %}` (AssistantTracker) renders its body
/// unchanged when no assistant mask is requested; spell it as an always-true `if` block so
/// whitespace control and `trim_blocks`/`lstrip_blocks` behave the same.
fn translate_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(i) = rest.find("{%") {
        out.push_str(&rest[..i]);
        let tag = &rest[i..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[body.len() - 1..]),
            None => (body, ""),
        };
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{lead} if true {trail}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{lead} endif {trail}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn map_err(e: minijinja::Error) -> TokenizerError {
    let msg = format!("{e:#}");
    match e.kind() {
        ErrorKind::SyntaxError
        | ErrorKind::UnknownFilter
        | ErrorKind::UnknownTest
        | ErrorKind::UnknownFunction
        | ErrorKind::UnknownMethod
        | ErrorKind::UnknownBlock => TokenizerError::UnsupportedTemplateFeature(msg),
        ErrorKind::InvalidOperation if msg.contains("raise_exception: ") => {
            let m = e.detail().unwrap_or_default();
            TokenizerError::TemplateRaised(
                m.strip_prefix("raise_exception: ").unwrap_or(m).to_string(),
            )
        }
        _ => TokenizerError::Template(msg),
    }
}

/// `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(v: Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(i) if i.is_none() => None,
        Some(i) => {
            if let Some(s) = i.as_str() {
                Some(s.to_string())
            } else {
                let n = i64::try_from(i)?;
                Some(" ".repeat(n.max(0) as usize))
            }
        }
    };
    let (item_sep, key_sep) = match separators {
        Some(s) if !s.is_none() => {
            let a: Vec<Value> = s.try_iter()?.collect();
            if a.len() != 2 {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "separators must be a pair",
                ));
            }
            (a[0].to_string(), a[1].to_string())
        }
        _ => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    let mut out = String::new();
    let opts = JsonOpts {
        indent: indent.as_deref(),
        item_sep: &item_sep,
        key_sep: &key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    write_json(&v, &opts, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

struct JsonOpts<'a> {
    indent: Option<&'a str>,
    item_sep: &'a str,
    key_sep: &'a str,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// Serializes a template value as Python's `json.dumps` would, keeping map insertion order.
fn write_json(
    v: &Value,
    o: &JsonOpts<'_>,
    depth: usize,
    out: &mut String,
) -> std::result::Result<(), minijinja::Error> {
    use minijinja::value::ValueKind as K;
    let newline = |out: &mut String, d: usize| {
        if let Some(ind) = o.indent {
            out.push('\n');
            for _ in 0..d {
                out.push_str(ind);
            }
        }
    };
    match v.kind() {
        K::Undefined | K::None => out.push_str("null"),
        K::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        K::Number => {
            let s = v.to_string();
            match f64::try_from(v.clone()) {
                Ok(f)
                    if s.contains('.')
                        || s.contains('e')
                        || s.contains("inf")
                        || s.contains("NaN") =>
                {
                    out.push_str(&python_float(f))
                }
                _ => out.push_str(&s),
            }
        }
        K::String => write_str(v.as_str().unwrap_or_default(), o.ensure_ascii, out),
        K::Seq | K::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(o.item_sep);
                }
                newline(out, depth + 1);
                write_json(x, o, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
        K::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if o.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(o.item_sep);
                }
                newline(out, depth + 1);
                match k.as_str() {
                    Some(ks) => write_str(ks, o.ensure_ascii, out),
                    None => write_str(&k.to_string(), o.ensure_ascii, out),
                }
                out.push_str(o.key_sep);
                write_json(&v.get_item(k)?, o, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        _ => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialize a value of kind {}", v.kind()),
            ));
        }
    }
    Ok(())
}

fn python_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        }
    } else if f == f.trunc() && f.abs() < 1e16 {
        format!("{f:.1}")
    } else {
        // Rust's shortest round-trip repr matches Python's repr for ordinary magnitudes.
        format!("{f}")
    }
}

fn write_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7E) => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

fn civil_from_days(z: i64) -> Date {
    let z = z + 719468;
    let era = if z >= 0 { z } else { z - 146096 } / 146097;
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn today_utc() -> Date {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    civil_from_days(secs.div_euclid(86400))
}

/// The subset of Python's `strftime` chat templates use (dates only; time fields are 00).
fn strftime(fmt: &str, (y, m, d): Date) -> std::result::Result<String, minijinja::Error> {
    let weekday = (days_from_civil(y, m, d) + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let month = MONTHS[(m.clamp(1, 12) - 1) as usize];
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('-') => match it.next() {
                Some('d') => out.push_str(&d.to_string()),
                Some('m') => out.push_str(&m.to_string()),
                other => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        format!("strftime_now: unsupported directive %-{other:?}"),
                    ));
                }
            },
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('H') | Some('M') | Some('S') => out.push_str("00"),
            Some('%') => out.push('%'),
            other => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported directive %{other:?}"),
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = ChatTemplate::with_date(
            "{% set x = {\"b\": [1, 2.5, \"é\\n\"], \"a\": none} %}{{ x | tojson }}|{{ x | tojson(indent=2) }}",
            "<s>",
            "</s>",
            (2024, 1, 1),
        )
        .unwrap();
        let env = &t.env;
        let out = env
            .get_template("chat")
            .unwrap()
            .render(minijinja::context! {})
            .unwrap();
        assert_eq!(
            out,
            "{\"b\": [1, 2.5, \"é\\n\"], \"a\": null}|{\n  \"b\": [\n    1,\n    2.5,\n    \"é\\n\"\n  ],\n  \"a\": null\n}"
        );
    }

    #[test]
    fn raise_exception_is_typed() {
        let t = ChatTemplate::new("{{ raise_exception('no system') }}", "", "").unwrap();
        match t.render(&[], false) {
            Err(TokenizerError::TemplateRaised(m)) => assert_eq!(m, "no system"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_filter_is_typed() {
        let err =
            ChatTemplate::new("{{ x | frobnicate }}", "", "").and_then(|t| t.render(&[], false));
        assert!(
            matches!(err, Err(TokenizerError::UnsupportedTemplateFeature(_))),
            "{err:?}"
        );
    }

    #[test]
    fn strftime_subset() {
        assert_eq!(
            strftime("%d %b %Y %A", (2024, 7, 26)).unwrap(),
            "26 Jul 2024 Friday"
        );
        assert_eq!(civil_from_days(days_from_civil(2031, 2, 28)), (2031, 2, 28));
    }
}
