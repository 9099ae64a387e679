//! Test hooks: commits that fail as on an I/O error, a database capped as on a full disk, and a
//! count of the commits that wrote something. Compiled only for the crate's own tests and with
//! the `testkit` feature (the integration tests and the bench); a production build has no hooks,
//! and [`Faults`] is an empty type whose calls the compiler removes from the commit path.

#[cfg(any(test, feature = "testkit"))]
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// Faults to inject into the next commits, and what the commits did.
#[cfg(any(test, feature = "testkit"))]
#[derive(Default)]
pub(super) struct Faults {
    /// How many of the next commits fail ([`Store::fail_commits`]).
    fail_next: AtomicU32,
    /// Commits that wrote something ([`Store::commits`]).
    commits: AtomicU64,
}

#[cfg(any(test, feature = "testkit"))]
impl Faults {
    /// The error the commit under way is to fail with, if one is due.
    pub(super) fn inject(&self) -> Option<rusqlite::Error> {
        self.fail_next
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
            .ok()
            .map(|_| {
                rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
                    Some("injected by Store::fail_commits".into()),
                )
            })
    }

    /// A commit wrote something.
    pub(super) fn committed(&self) {
        self.commits.fetch_add(1, Relaxed);
    }
}

#[cfg(any(test, feature = "testkit"))]
mod hooks {
    use std::sync::atomic::Ordering::Relaxed;

    use crate::log::sqlite::SqliteStore;
    use crate::log::store_handle::Backend;
    use crate::log::{Store, StoreError};
    use crate::sync::lock;

    impl SqliteStore {
        fn fail_commits(&self, n: u32) {
            self.shared.faults.fail_next.store(n, Relaxed);
        }

        fn cap_size(&self, pages: Option<u64>) -> Result<(), StoreError> {
            let w = lock(&self.shared.writer);
            let max = match pages {
                Some(more) => {
                    w.conn
                        .query_row("PRAGMA page_count", [], |r| r.get::<_, u64>(0))?
                        + more
                }
                None => 0xffff_fffe,
            };
            w.conn
                .query_row(&format!("PRAGMA max_page_count = {max}"), [], |_| Ok(()))?;
            drop(w);
            self.shared.group.wake_waiting();
            Ok(())
        }
    }

    impl Store {
        /// Testing: how many commits have written something since the store was opened (each a
        /// SQLite transaction, and with `fsync` one sync of the disk).
        pub fn commits(&self) -> u64 {
            match &self.backend {
                Backend::Sqlite(s) => s.shared.faults.commits.load(Relaxed),
                Backend::Postgres(p) => p.commits(),
            }
        }

        /// Testing: the next `n` commits fail (as on an I/O error), writing nothing.
        pub fn fail_commits(&self, n: u32) {
            match &self.backend {
                Backend::Sqlite(s) => s.fail_commits(n),
                Backend::Postgres(p) => p.fail_commits(n),
            }
        }

        /// Testing: cap the database at its present size plus `pages` more pages (`None`: lift
        /// the cap), so that commits needing more fail as on a full disk (`SQLITE_FULL`).
        /// PostgreSQL: any cap fails every commit until it is lifted.
        pub fn cap_size(&self, pages: Option<u64>) -> Result<(), StoreError> {
            match &self.backend {
                Backend::Sqlite(s) => s.cap_size(pages),
                // No size cap to set on a shared server: every commit fails until lifted.
                Backend::Postgres(p) => {
                    p.fail_commits(if pages.is_some() { u32::MAX } else { 0 });
                    Ok(())
                }
            }
        }
    }
}

/// No faults in a production build: nothing to store, nothing injected.
#[cfg(not(any(test, feature = "testkit")))]
#[derive(Default)]
pub(super) struct Faults;

#[cfg(not(any(test, feature = "testkit")))]
impl Faults {
    #[inline(always)]
    pub(super) fn inject(&self) -> Option<rusqlite::Error> {
        None
    }

    #[inline(always)]
    pub(super) fn committed(&self) {}
}
