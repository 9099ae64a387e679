//! `[store]`: where the event log lives (the embedded SQLite file, or a shared PostgreSQL).

use std::time::Duration;

use toml::Spanned;

use super::error::{ConfigError, Cx};
use crate::config::raw::RawStore;
use crate::config::{StoreBackendKind, StoreConfig};

/// Default `[store] lease_s`.
const DEFAULT_LEASE_S: i64 = 10;

pub(super) fn store(
    cx: &Cx<'_>,
    raw: Option<&Spanned<RawStore>>,
) -> Result<StoreConfig, ConfigError> {
    let Some(table) = raw else {
        return Ok(StoreConfig::default());
    };
    let t = table.get_ref();
    let backend = match &t.backend {
        None => StoreBackendKind::Sqlite,
        Some(v) => match cx.choice(v, "store.backend", "backend", &["sqlite", "postgres"])? {
            "postgres" => StoreBackendKind::Postgres,
            _ => StoreBackendKind::Sqlite,
        },
    };
    let url_env = cx.env_var_name(t.url_env.as_ref(), "store.url_env")?;
    if backend == StoreBackendKind::Postgres && url_env.is_none() {
        return Err(cx.err(
            table.span(),
            "store.url_env",
            "backend = \"postgres\" needs url_env: add url_env = \"TURNSTILE_PG_URL\" naming the \
             environment variable that holds the connection string",
        ));
    }
    let lease = cx.int(
        t.lease_s.as_ref(),
        "store.lease_s",
        DEFAULT_LEASE_S,
        1,
        3600,
    )?;
    Ok(StoreConfig {
        backend,
        url_env,
        lease: Duration::from_secs(lease.unsigned_abs()),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use crate::config::StoreBackendKind;

    #[test]
    fn sqlite_is_the_default_and_postgres_takes_its_keys() {
        let c = ok("");
        assert_eq!(c.store.backend, StoreBackendKind::Sqlite);
        assert_eq!(c.store.lease.as_secs(), 10);
        let c = ok("[store]\nbackend = \"postgres\"\nurl_env = \"PG_URL\"\nlease_s = 3\n");
        assert_eq!(c.store.backend, StoreBackendKind::Postgres);
        assert_eq!(c.store.url_env.as_deref(), Some("PG_URL"));
        assert_eq!(c.store.lease.as_secs(), 3);
    }

    #[test]
    fn postgres_without_url_env_or_with_bad_values_is_one_clear_line() {
        let e = bad("[store]\nbackend = \"postgres\"\n");
        assert_eq!(e.key.as_deref(), Some("store.url_env"));
        assert!(e.to_string().contains("needs url_env"), "{e}");
        let e = bad("[store]\nbackend = \"mysql\"\n");
        assert_eq!(e.key.as_deref(), Some("store.backend"));
        assert_eq!(e.line, Some(2));
        let e = bad("[store]\nbackend = \"postgres\"\nurl_env = \"postgres://x\"\n");
        assert_eq!(e.key.as_deref(), Some("store.url_env"));
        let e = bad("[store]\nlease_s = 0\n");
        assert_eq!(e.key.as_deref(), Some("store.lease_s"));
        let e = bad("[store]\nurl = \"postgres://x\"\n");
        assert!(e.to_string().contains("url"), "{e}");
    }
}
