//! llama.cpp's `models/templates/*.jinja` rendered for a fixed conversation, against what
//! transformers renders (`fixtures/tokenizer/chat_templates.json`, `cargo xtask
//! tokenizer-fixtures`). The template sources come with the vocab suite (`cargo xtask
//! vocab-suite` extracts `templates/` beside the vocabularies).

mod common;

use serde::Deserialize;
use synapse_tokenizer::{ChatTemplate, Message};

#[derive(Deserialize)]
struct Render {
    conversation: String,
    add_generation_prompt: bool,
    output: Option<String>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct Entry {
    template: String,
    compile_error: Option<String>,
    renders: Vec<Render>,
}

#[derive(Deserialize)]
struct Fixture {
    conversations: std::collections::HashMap<String, Vec<Message>>,
    templates: Vec<Entry>,
}

/// Templates where Jinja2 and minijinja differ by design, with the reason. The test fails if
/// one of these starts to match (remove it here) or any other template diverges.
const KNOWN_DIVERGENT: &[(&str, &str)] = &[
    // `{% for tool in tools %}` with tools=None: Jinja2 raises TypeError, minijinja iterates
    // none as empty and renders a prompt with an empty tool list.
    (
        "CohereForAI-c4ai-command-r-plus-tool_use.jinja",
        "iterating none",
    ),
    (
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
        "iterating none",
    ),
    (
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
        "iterating none",
    ),
];

#[test]
fn chat_templates_match_transformers() {
    let dir = synapse_testdata::vocab_suite_dir().join("templates");
    if !synapse_testdata::require(&dir, "the vocab suite's chat templates") {
        return;
    }
    let fx: Fixture = serde_json::from_str(
        &std::fs::read_to_string(common::fixtures().join("chat_templates.json")).unwrap(),
    )
    .unwrap();
    let mut matched = 0;
    let mut both_failed = 0;
    let mut bad = Vec::new();
    let mut divergent = Vec::new();
    for e in &fx.templates {
        if KNOWN_DIVERGENT.iter().any(|(t, _)| *t == e.template) {
            let src = std::fs::read_to_string(dir.join(&e.template)).unwrap();
            let t = ChatTemplate::with_date(&src, "<s>", "</s>", (2024, 7, 26)).unwrap();
            let r = &e.renders[0];
            let got = t.render(&fx.conversations[&r.conversation], r.add_generation_prompt);
            if r.output.is_none() && got.is_ok() {
                divergent.push(e.template.clone());
            }
            continue;
        }
        let src = std::fs::read_to_string(dir.join(&e.template)).unwrap();
        let t = ChatTemplate::with_date(&src, "<s>", "</s>", (2024, 7, 26));
        if let Some(err) = &e.compile_error {
            if t.is_ok() {
                bad.push(format!(
                    "{}: transformers failed to compile ({err}) but we compiled it",
                    e.template
                ));
            }
            continue;
        }
        let t = match t {
            Ok(t) => t,
            Err(err) => {
                bad.push(format!("{}: compile: {err}", e.template));
                continue;
            }
        };
        for r in &e.renders {
            let conv = &fx.conversations[&r.conversation];
            let got = t.render(conv, r.add_generation_prompt);
            match (&r.output, got) {
                (Some(want), Ok(got)) if *want == got => matched += 1,
                (Some(want), Ok(got)) => bad.push(format!(
                    "{} [{}]:\n--- want\n{want}\n--- got\n{got}",
                    e.template, r.conversation
                )),
                (Some(_), Err(err)) => {
                    bad.push(format!("{} [{}]: {err}", e.template, r.conversation))
                }
                (None, Err(_)) => both_failed += 1,
                (None, Ok(got)) => bad.push(format!(
                    "{} [{}]: transformers raised {:?}, we rendered:\n{got}",
                    e.template, r.conversation, r.error
                )),
            }
        }
    }
    println!(
        "chat templates: {} templates, {matched} renders identical, {both_failed} rejected by both, {} known divergent",
        fx.templates.len(),
        divergent.len()
    );
    assert_eq!(
        divergent.len(),
        KNOWN_DIVERGENT.len(),
        "known divergences changed: {divergent:?}"
    );
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n\n")
    );
}
