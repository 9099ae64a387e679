//! The upstreams: the Anthropic Messages one (the OpenAI one is the fake every other test
//! uses), and several upstreams with fallback and a circuit breaker.

mod anthropic;
mod anthropic_thinking;
mod fallback;
