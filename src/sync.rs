//! Mutexes that outlive a panic elsewhere.
//!
//! A poisoned mutex's data is used as it is: every critical section here leaves its data whole at
//! each step, and a panicking thread must not turn every later call into a second panic.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A value that is replaced whole now and then (the configuration on a reload) and read often:
/// a reader takes the current `Arc` and keeps that snapshot for as long as it needs one
/// consistent value (a turn keeps the config it started with), whatever replaces it meanwhile.
#[derive(Debug)]
pub(crate) struct Swap<T>(std::sync::RwLock<std::sync::Arc<T>>);

impl<T> Swap<T> {
    pub(crate) fn new(value: std::sync::Arc<T>) -> Swap<T> {
        Swap(std::sync::RwLock::new(value))
    }

    /// The current value.
    pub(crate) fn get(&self) -> std::sync::Arc<T> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replace the value; readers that took the old one keep it. Returns the old one.
    pub(crate) fn set(&self, value: std::sync::Arc<T>) -> std::sync::Arc<T> {
        let mut slot = self.0.write().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *slot, value)
    }
}
