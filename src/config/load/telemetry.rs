//! `[telemetry]`: where traces go.

use toml::Spanned;

use super::error::{ConfigError, Cx};
use crate::config::raw::RawTelemetry;
use crate::config::TelemetryConfig;

pub(super) fn telemetry(
    cx: &Cx<'_>,
    raw: Option<&Spanned<RawTelemetry>>,
) -> Result<TelemetryConfig, ConfigError> {
    let Some(v) = raw.and_then(|t| t.get_ref().otlp_endpoint.as_ref()) else {
        return Ok(TelemetryConfig::default());
    };
    Ok(TelemetryConfig {
        otlp_endpoint: Some(cx.http_url(v, "telemetry.otlp_endpoint", "http://127.0.0.1:4317")?),
    })
}
