//! The event log: every turn's events, durable and ordered (spec 003). The single source of
//! truth: AAP history, the turns stream, the run stream and the event stream all render it.

pub mod event;
pub mod store;

pub use event::{Event, EventBody, FailReason, FileRef, StopReason};
pub use store::{FileRow, SessionRow, Store, StoreError};
