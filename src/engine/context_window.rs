//! The model's context window: how big it is, how big a request is, and what to compact when
//! the next request would pass `[agents.X] compact_at` of it.
//!
//! Tokens are estimated, not counted: a request's size is the bytes of its system prompt, its
//! messages (as JSON) and its tools, over 4, times a per-session ratio that each model call's
//! reported `usage.input_tokens` corrects ([`Calibration`]). A tokenizer would be exact for one
//! model family only, and costs build time and memory; the estimate needs a margin, which
//! `compact_at` gives. The ratio lives in memory with the session: after a restart it starts
//! again at 1 and the first model call corrects it (the log's usage sums a turn's calls, so the
//! ratio of one call cannot be read back from it).
//!
//! What is compacted is the oldest messages, up to a cut before a user or an assistant message
//! (never before a tool result, so a tool call is never split from its answer) and never past
//! the current turn's own message: the fewest that leave the rest under half the threshold, else
//! all that may go. Their summary is logged as an `agent.message` with `"compaction": true` and
//! `"replaces": [first, last event id]`; the history projection (`engine/history.rs`) folds it
//! into the context the model is sent next, which `history?type=compacted` shows.

use std::sync::Mutex;

use crate::message::{Block, Content, Message};
use crate::sync::lock;
use crate::upstream::ModelRequest;

/// Known context windows, by prefix of the upstream model name (the longest match wins).
const KNOWN: &[(&str, u32)] = &[
    ("gpt-4o", 128_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4-turbo", 128_000),
    ("gpt-5", 400_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4", 200_000),
    ("claude-", 200_000),
    ("qwen3", 40_960),
    ("llama3", 128_000),
    ("llama-3", 128_000),
    ("mistral-large", 128_000),
    ("deepseek", 128_000),
    ("gemini-", 1_048_576),
];

/// The window when neither the config nor the table knows better.
pub const DEFAULT_WINDOW: u32 = 128_000;

/// The context window of a known `model` (matched on its name without a `provider/` prefix,
/// case-insensitively).
pub fn known_window(model: &str) -> Option<u32> {
    let name = model
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .to_ascii_lowercase();
    KNOWN
        .iter()
        .filter(|(prefix, _)| name.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, n)| *n)
}

/// The window the agent's requests must fit: `[agents.X] context_tokens`, else the known
/// model's, else [`DEFAULT_WINDOW`]; and whether it is known (configured or in the table). A
/// guessed window is compacted to, but a request over it still goes upstream (the model's
/// window may be larger; its own error says if not).
pub fn window(configured: Option<u32>, model: &str) -> (u64, bool) {
    match configured.or_else(|| known_window(model)) {
        Some(n) => (u64::from(n), true),
        None => (u64::from(DEFAULT_WINDOW), false),
    }
}

/// Bytes per token the estimate starts from.
const BYTES_PER_TOKEN: f64 = 4.0;

/// A session's estimate correction: actual input tokens over estimated, smoothed.
#[derive(Debug)]
pub struct Calibration {
    ratio: Mutex<f64>,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration {
            ratio: Mutex::new(1.0),
        }
    }
}

impl Calibration {
    /// Estimated tokens of `bytes` of request.
    pub fn tokens(&self, bytes: usize) -> u64 {
        (bytes as f64 / BYTES_PER_TOKEN * *lock(&self.ratio)).ceil() as u64
    }

    /// Bytes that make about `tokens` tokens.
    pub fn bytes(&self, tokens: u64) -> usize {
        (tokens as f64 * BYTES_PER_TOKEN / *lock(&self.ratio)) as usize
    }

    /// A model call of `bytes` of request reported `actual` input tokens (0: not reported).
    /// The ratio moves halfway toward what this call measured, within [1/4, 4].
    pub fn observe(&self, bytes: usize, actual: u64) {
        if actual == 0 || bytes == 0 {
            return;
        }
        let measured = actual as f64 / (bytes as f64 / BYTES_PER_TOKEN);
        let mut ratio = lock(&self.ratio);
        *ratio = ((*ratio + measured) / 2.0).clamp(0.25, 4.0);
    }
}

/// The bytes a message counts for.
pub fn message_bytes(m: &Message) -> usize {
    json_len(m)
}

/// The length of `v` as compact JSON, counted as it is written: nothing is buffered (this runs
/// over every message before every model call).
fn json_len<T: serde::Serialize + ?Sized>(v: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, v).map_or(0, |()| count.0)
}

/// The bytes a request counts for: its system prompt, messages and tools.
pub fn request_bytes(req: &ModelRequest) -> usize {
    let system = req.system.as_ref().map_or(0, String::len);
    let messages: usize = req.messages.iter().map(message_bytes).sum();
    let tools: usize = req
        .tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + json_len(&t.parameters) + 32)
        .sum();
    system + messages + tools
}

/// Where to cut: the fewest leading messages to compact so that `fixed` plus the messages left
/// come under `target` (all in bytes), choosing among `cuts` (indices where a message may be
/// the first one kept, ascending, each > 0, each marked when a user message starts there).
/// Whole exchanges go first: a cut before a user message is preferred to one before an
/// assistant message (which would keep an answer without its question); when no cut reaches
/// the target, as much as may go. `None`: there is nothing to cut.
pub fn choose_cut(
    sizes: &[usize],
    cuts: &[(usize, bool)],
    fixed: usize,
    target: usize,
) -> Option<usize> {
    let total: usize = sizes.iter().sum();
    let fits = |cut: usize| fixed + total - sizes[..cut].iter().sum::<usize>() <= target;
    let valid = || {
        cuts.iter()
            .copied()
            .filter(|&(cut, _)| cut > 0 && cut <= sizes.len())
    };
    valid()
        .find(|&(cut, user)| user && fits(cut))
        .or_else(|| valid().find(|&(cut, _)| fits(cut)))
        .or_else(|| valid().next_back())
        .map(|(cut, _)| cut)
}

/// The instructions of a summary call.
pub const SUMMARY_SYSTEM: &str = "You summarise conversations between a user and an AI agent so that the agent can carry on from the summary alone. Be faithful and specific: keep every fact learned, decision taken, file name, path, identifier, number, command and tool result that may matter later, what the user asked for and still expects, and the open tasks. Write in the conversation's language, as compact notes. Do not add anything that was not said.";

/// How the summary is introduced in the model's context.
pub const SUMMARY_INTRO: &str =
    "Summary of the earlier conversation (it replaces the messages before this point):\n\n";

/// The user message of a summary call: the earlier summary if any, then the messages as a
/// transcript, each part shortened (its middle cut out) so that the whole stays near `budget`
/// bytes.
pub fn summary_request_text(prior: Option<&str>, messages: &[Message], budget: usize) -> String {
    let mut parts: Vec<(String, String)> = Vec::new();
    if let Some(prior) = prior {
        parts.push(("Summary of what came before".into(), prior.to_string()));
    }
    for m in messages {
        match m {
            Message::System { .. } => {}
            Message::User { content } => parts.push(("User".into(), content_text(content))),
            Message::Assistant { content } => {
                for b in content.blocks() {
                    match b {
                        Block::Text { text } => parts.push(("Assistant".into(), text)),
                        Block::ToolUse { name, input, .. } => parts.push((
                            format!("Assistant called the tool {name}"),
                            input.to_string(),
                        )),
                        _ => {}
                    }
                }
            }
            Message::Tool { content, .. } => {
                parts.push(("Tool result".into(), content_text(content)))
            }
        }
    }
    let total: usize = parts.iter().map(|(_, t)| t.len()).sum();
    // Parts over an equal share of the budget are cut down to it (at least 400 bytes each).
    let share = if total > budget {
        (budget / parts.len().max(1)).max(400)
    } else {
        usize::MAX
    };
    let mut out = String::from(
        "Summarise this conversation so far, for the agent to carry on from. Keep facts, decisions, file names, and open tasks.\n\n<conversation>\n",
    );
    for (who, text) in parts {
        out.push_str(&format!("[{who}]\n{}\n\n", shorten(&text, share)));
    }
    out.push_str("</conversation>");
    out
}

fn content_text(c: &Content) -> String {
    match c {
        Content::Text(t) => t.clone(),
        Content::Blocks(blocks) => blocks
            .iter()
            .map(|b| match b {
                Block::Text { text } => text.clone(),
                Block::Image { .. } => "[image]".into(),
                other => serde_json::to_string(other).unwrap_or_default(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// `text` within `max` bytes: its start and its end, with a note of what was left out.
fn shorten(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let keep = max / 2;
    let mut head = keep;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - keep;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{} […{} bytes left out…] {}",
        &text[..head],
        tail - head,
        &text[tail..]
    )
}

#[cfg(test)]
mod tests;
