//! What the last configuration reload came to, as `GET /status` shows it under `"reload"`.

/// One reload's outcome. `generation` counts the reloads applied since start-up (0: none), so
/// that an operator or a test sees when a reload has taken effect.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReloadReport {
    /// When it was tried (RFC 3339 UTC, milliseconds).
    pub at: String,
    /// Whether the new file was applied.
    pub ok: bool,
    /// Reloads applied since start-up, this one included when `ok`.
    pub generation: u64,
    /// Why it was refused (`ok: false`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Tables and keys that changed but keep their running values until a restart.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub needs_restart: Vec<String>,
}
