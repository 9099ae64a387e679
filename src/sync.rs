//! Mutexes that outlive a panic elsewhere.
//!
//! A poisoned mutex's data is used as it is: every critical section here leaves its data whole at
//! each step, and a panicking thread must not turn every later call into a second panic.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
