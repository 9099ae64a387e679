//! The other HTTP APIs: the event log (`/events`), runs, files, delivered files, what the log
//! records of each decision, principals and their budgets and usage.

mod budgets;
mod deliver_file;
mod events;
mod files;
mod log_decisions;
mod principals;
mod runs;
