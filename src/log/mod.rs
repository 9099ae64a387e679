//! The event log: every turn's events, durable and ordered (spec 003). The single source of
//! truth: AAP history, the turns stream, the run stream and the event stream all render it.
//!
//! - `event.rs`: the events and how they are stored (JSON).
//! - `store_handle.rs`: [`Store`], the handle the crate holds, dispatching to a backend.
//! - `backend.rs`: `StoreBackend`, the seam a backend implements (group commit,
//!   durability watermark, invariants).
//! - `rows.rs`: the rows, queued writes and errors all backends share.
//! - `group.rs`: the backend-neutral half of group commit (queue, tickets, watermark, failed
//!   commits, waking the flushes that wait on another's commit).
//! - `sqlite/`: the embedded backend (schema, group commit, reads, file records, test hooks).
//! - `postgres/`: the shared backend (`[store] backend = "postgres"`): versioned migrations,
//!   a pipelined group commit with `pg_notify`, reads on a pool, deltas to other instances,
//!   stored files' bytes.

pub(crate) mod backend;
pub mod event;
pub(crate) mod group;
pub(crate) mod postgres;
pub(crate) mod rows;
pub(crate) mod sqlite;
pub mod store_handle;

pub use event::{Event, EventBody, FailReason, FileRef, StopReason};
pub use postgres::deltas::{DeltaTap, DeltaWatch, RemoteDelta};
pub use postgres::inbox::{InboxRow, Posted, Released};
pub use postgres::lease::{ClaimGuard, Heard, LeaseTaken};
pub(crate) use rows::USAGE_ROWS_AT_MOST;
pub use rows::{
    FileRow, FileUsage, KeyReserved, KeyRow, Owners, SessionRow, StoreError, UsageFilter, UsageRow,
};
pub use store_handle::Store;
