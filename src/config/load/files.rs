//! `[files]`: the file store.

use toml::Spanned;

use super::error::{ConfigError, Cx};
use crate::config::raw::RawFiles;
use crate::config::FilesConfig;

/// Default `[files] max_bytes`: 100 MiB.
const DEFAULT_FILES_MAX_BYTES: u64 = 100 * 1024 * 1024;

pub(super) fn files(
    cx: &Cx<'_>,
    raw: Option<&Spanned<RawFiles>>,
) -> Result<FilesConfig, ConfigError> {
    let max = raw.and_then(|t| t.get_ref().max_bytes.as_ref());
    Ok(FilesConfig {
        max_bytes: cx
            .int(
                max,
                "files.max_bytes",
                DEFAULT_FILES_MAX_BYTES as i64,
                1,
                i64::MAX,
            )?
            .unsigned_abs(),
    })
}
