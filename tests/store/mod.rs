//! The event log's stores: what survives a restart or a kill, and the PostgreSQL store with
//! several instances (leases, the inbox, failover, idempotency keys).

mod accepted;
mod chaos;
mod persistence;
mod postgres;
mod postgres_idempotency;
mod postgres_inbox;
mod postgres_restart;
mod postgres_scaleout;
mod postgres_stress;
