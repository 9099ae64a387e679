//! The other HTTP APIs: the event log (`/events`), runs, files, delivered files, and what the log
//! records of each decision.

mod deliver_file;
mod events;
mod files;
mod log_decisions;
mod runs;
