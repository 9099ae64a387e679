//! The Anthropic Messages upstream (the OpenAI one is the fake every other test uses).

mod anthropic;
mod anthropic_thinking;
