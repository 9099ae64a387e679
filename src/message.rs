//! The conversation model shared by every layer: AAP `HistoryMessage` and its content blocks.
//!
//! AAP's history shape is our neutral format: the engine builds model requests from it, the
//! upstream providers translate it into their wire formats, and the AAP renderer returns it as is.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One message of a conversation (AAP `HistoryMessage`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case", deny_unknown_fields)]
pub enum Message {
    System {
        content: String,
    },
    User {
        content: Content,
    },
    Assistant {
        content: Content,
    },
    Tool {
        #[serde(rename = "toolCallId")]
        tool_call_id: String,
        content: Content,
    },
}

/// Message content: a plain string or a list of blocks (AAP allows both everywhere).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

/// By the JSON type: a string is text, an array is blocks. (serde's `untagged` would buffer the
/// value, try each variant and, failing, say only that none matched; this says what a bad block
/// is wrong with.)
impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Content, D::Error> {
        struct ContentVisitor;
        impl<'de> serde::de::Visitor<'de> for ContentVisitor {
            type Value = Content;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or an array of content blocks")
            }

            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Content, E> {
                Ok(Content::Text(s.to_owned()))
            }

            fn visit_string<E: serde::de::Error>(self, s: String) -> Result<Content, E> {
                Ok(Content::Text(s))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Content, A::Error> {
                Vec::<Block>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
                    .map(Content::Blocks)
            }
        }
        d.deserialize_any(ContentVisitor)
    }
}

/// One AAP content block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Block {
    Text {
        text: String,
    },
    /// `signed` never leaves the server through AAP (it is neither read nor written): the
    /// provider's own blocks this thinking came as, to be sent back to that provider.
    Thinking {
        thinking: String,
        #[serde(skip)]
        signed: Vec<SignedThinking>,
    },
    ToolUse {
        #[serde(rename = "toolCallId")]
        tool_call_id: String,
        name: String,
        input: Value,
    },
    /// `url` is an `https://` URL or a `data:` URI.
    Image {
        url: String,
    },
}

/// A thinking block as the provider issued it (Anthropic's `thinking` with its `signature`, or a
/// `redacted_thinking` block): opaque to us, kept in the log and sent back verbatim in the
/// assistant turn it came in, so that the model keeps its reasoning through a tool loop (the API
/// requires it there when thinking is on). Serializes as the Anthropic wire block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SignedThinking {
    Thinking { thinking: String, signature: String },
    RedactedThinking { data: String },
}

impl Block {
    /// A thinking block with no provider signature.
    pub fn thinking(text: impl Into<String>) -> Block {
        Block::Thinking {
            thinking: text.into(),
            signed: Vec::new(),
        }
    }
}

impl Content {
    /// The content's text: a string as is, blocks' text joined by newlines (non-text blocks skipped).
    pub fn text(&self) -> String {
        self.text_ref().into_owned()
    }

    /// [`Content::text`], borrowed when there is at most one text block to join.
    pub fn text_ref(&self) -> std::borrow::Cow<'_, str> {
        let blocks = match self {
            Content::Text(s) => return s.as_str().into(),
            Content::Blocks(blocks) => blocks,
        };
        let texts = || {
            blocks.iter().filter_map(|b| match b {
                Block::Text { text } => Some(text.as_str()),
                _ => None,
            })
        };
        let mut it = texts();
        match (it.next(), it.next()) {
            (None, _) => "".into(),
            (Some(only), None) => only.into(),
            _ => {
                let mut out = String::new();
                for text in texts() {
                    if !out.is_empty() {
                        out.push('\n');
                    }
                    out.push_str(text);
                }
                out.into()
            }
        }
    }

    /// Whether the content carries nothing at all (an empty string or no blocks).
    pub fn is_empty(&self) -> bool {
        match self {
            Content::Text(s) => s.is_empty(),
            Content::Blocks(b) => b.is_empty(),
        }
    }

    /// Blocks in order; a plain string is one text block.
    pub fn blocks(&self) -> Vec<Block> {
        match self {
            Content::Text(s) => vec![Block::Text { text: s.clone() }],
            Content::Blocks(b) => b.clone(),
        }
    }

    /// The AAP rendering of a list of blocks: one text block collapses to a plain string.
    pub fn from_blocks(mut blocks: Vec<Block>) -> Content {
        if blocks.len() == 1 {
            if let Block::Text { .. } = &blocks[0] {
                if let Some(Block::Text { text }) = blocks.pop() {
                    return Content::Text(text);
                }
            }
        }
        Content::Blocks(blocks)
    }
}

/// A tool as offered to the model or declared by a client (AAP `ToolSpec`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the input object. `inputSchema` (an older AAP spelling) is accepted too.
    /// Shared: every model request offers it, and a copy per request would cost a deep clone.
    #[serde(alias = "inputSchema", default = "empty_object_schema")]
    pub parameters: Arc<Value>,
}

/// `{"type": "object"}`: the schema of a tool that takes no declared parameters.
pub fn empty_object_schema() -> Arc<Value> {
    Arc::new(serde_json::json!({"type": "object", "properties": {}}))
}

/// A tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub input: Value,
}

/// Token usage; added up over every model call of a turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Of `input_tokens`, those read from the provider's prompt cache (OpenAI
    /// `prompt_tokens_details.cached_tokens`, Anthropic `cache_read_input_tokens`): priced at
    /// `cached_input` (`crate::usage`). Not part of the log's or any protocol's usage object.
    #[serde(skip)]
    pub cached_input_tokens: u64,
}

impl Usage {
    pub fn add(&mut self, other: Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_input_tokens += other.cached_input_tokens;
    }
}

#[cfg(test)]
mod tests;
