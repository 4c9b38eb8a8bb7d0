//! Prompts: chat messages through the model's template (or llama.cpp's built-in formats when
//! the model has none), text and token prompts to token ids.

use synapse_tokenizer::{Message, Tokenizer};

use crate::error::{Result, ServerError};
use crate::openai::{ChatMessage, Content, PromptItem};
use crate::state::AppState;

/// Flattens OpenAI messages to (role, text); `developer` is a `system` turn. Only text parts.
pub fn flatten_messages(messages: &[ChatMessage]) -> Result<Vec<Message>> {
    if messages.is_empty() {
        return Err(ServerError::invalid(
            "messages",
            "messages must not be empty",
        ));
    }
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        let text = match &m.content {
            None => String::new(),
            Some(Content::Text(s)) => s.clone(),
            Some(Content::Parts(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for p in parts {
                    if p.kind != "text" {
                        return Err(ServerError::Unsupported {
                            param: "messages",
                            message: format!(
                                "content parts of type `{}` are not supported (text only)",
                                p.kind
                            ),
                        });
                    }
                    texts.push(p.text.clone().unwrap_or_default());
                }
                texts.join("\n")
            }
        };
        let role = if m.role == "developer" {
            "system"
        } else {
            m.role.as_str()
        };
        out.push(Message::new(role, text));
    }
    Ok(out)
}

/// llama.cpp's built-in `gemma` format (`llm_chat_apply_template`, `LLM_CHAT_TEMPLATE_GEMMA`):
/// system text is prepended to the first user turn, `assistant` is `model`, contents trimmed.
pub fn gemma_format(messages: &[Message], add_generation_prompt: bool) -> String {
    let mut s = String::new();
    let mut system = String::new();
    for m in messages {
        if m.role == "system" {
            system.push_str(m.content.trim());
            continue;
        }
        let role = if m.role == "assistant" {
            "model"
        } else {
            m.role.as_str()
        };
        s.push_str("<start_of_turn>");
        s.push_str(role);
        s.push('\n');
        if !system.is_empty() && role != "model" {
            s.push_str(&system);
            s.push_str("\n\n");
            system.clear();
        }
        s.push_str(m.content.trim());
        s.push_str("<end_of_turn>\n");
    }
    if add_generation_prompt {
        s.push_str("<start_of_turn>model\n");
    }
    s
}

/// llama.cpp's fallback for models without a template: ChatML.
pub fn chatml_format(messages: &[Message], add_generation_prompt: bool) -> String {
    let mut s = String::new();
    for m in messages {
        s.push_str("<|im_start|>");
        s.push_str(&m.role);
        s.push('\n');
        s.push_str(&m.content);
        s.push_str("<|im_end|>\n");
    }
    if add_generation_prompt {
        s.push_str("<|im_start|>assistant\n");
    }
    s
}

/// Renders the conversation as the model's prompt text.
pub fn render_chat(state: &AppState, messages: &[Message]) -> Result<String> {
    match &state.0.template {
        Some(t) => t.render(messages, true).map_err(|e| {
            ServerError::invalid("messages", format!("the chat template failed: {e}"))
        }),
        None if state.0.cfg.family.starts_with("gemma") => Ok(gemma_format(messages, true)),
        None => Ok(chatml_format(messages, true)),
    }
}

/// Tokenizes prompt text (BOS added, special tokens parsed, a doubled BOS dropped).
pub fn tokenize_text(tok: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    let mut ids = tok.encode(text, true, true)?;
    // A template (or a client) that writes BOS itself plus the tokenizer's own BOS: keep one.
    if ids.len() >= 2 && Some(ids[0]) == tok.bos() && ids[1] == ids[0] {
        ids.remove(0);
    }
    Ok(ids)
}

/// A completion prompt as token ids (token prompts are checked against the vocabulary).
pub fn prompt_ids(tok: &Tokenizer, item: &PromptItem, vocab: usize) -> Result<Vec<u32>> {
    let ids = match item {
        PromptItem::Text(t) => tokenize_text(tok, t)?,
        PromptItem::Tokens(ids) => {
            if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(ServerError::invalid(
                    "prompt",
                    format!("token id {bad} is outside the vocabulary (0..{vocab})"),
                ));
            }
            ids.clone()
        }
    };
    if ids.is_empty() {
        return Err(ServerError::invalid("prompt", "the prompt is empty"));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma_format_matches_llama_cpp() {
        let m = vec![
            Message::new("system", " Be brief. "),
            Message::new("user", "Hi"),
            Message::new("assistant", "Hello!"),
            Message::new("user", "Bye "),
        ];
        assert_eq!(
            gemma_format(&m, true),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello!<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
        // One user turn: what `synapse-cli generate --chat` writes.
        assert_eq!(
            gemma_format(&[Message::new("user", "x")], true),
            "<start_of_turn>user\nx<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn messages_flatten_text_parts_and_refuse_images() {
        let msgs: Vec<ChatMessage> = serde_json::from_str(
            r#"[{"role":"developer","content":"d"},
                {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]"#,
        )
        .unwrap();
        let f = flatten_messages(&msgs).unwrap();
        assert_eq!(f[0], Message::new("system", "d"));
        assert_eq!(f[1], Message::new("user", "a\nb"));
        let img: Vec<ChatMessage> = serde_json::from_str(
            r#"[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]"#,
        )
        .unwrap();
        assert!(matches!(
            flatten_messages(&img),
            Err(ServerError::Unsupported { .. })
        ));
        assert!(flatten_messages(&[]).is_err());
    }
}
