//! The Agent Application Protocol as a client sees it: sessions, turns, and the context window
//! compacted as a conversation grows.

mod context_compaction;
mod sessions;
mod turns;
