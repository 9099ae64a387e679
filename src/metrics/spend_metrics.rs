//! The metrics of principals' spend: tokens, USD and refused turns or tool calls, by principal
//! name (`NAME` of `[keys.NAME]`, the digest of an `api_keys_env` key, `anonymous`; never a
//! key). The label values are bounded by the configured principals.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, LazyLock};

use prometheus_client::metrics::counter::Counter;

use super::families::{Handles, PrincipalLabels, RefusalLabels, METRICS};

/// The spend metrics resolved so far, by principal.
static BY_PRINCIPAL: LazyLock<Handles<Spend>> = LazyLock::new(Handles::default);

/// The spend metrics of one principal.
pub(crate) struct Spend {
    principal: String,
    input_tokens: Counter,
    output_tokens: Counter,
    usd: Counter<f64, AtomicU64>,
}

/// The handle of `principal`'s spend metrics.
pub(crate) fn spend(principal: &str) -> Arc<Spend> {
    let m = &*METRICS;
    BY_PRINCIPAL.get("", principal, || {
        let labels = PrincipalLabels {
            principal: principal.to_string(),
        };
        Spend {
            principal: principal.to_string(),
            input_tokens: m.principal_input_tokens.get_or_create_owned(&labels),
            output_tokens: m.principal_output_tokens.get_or_create_owned(&labels),
            usd: m.principal_usd.get_or_create_owned(&labels),
        }
    })
}

impl Spend {
    /// A model call's tokens.
    pub(crate) fn tokens(&self, input: u64, output: u64) {
        self.input_tokens.inc_by(input);
        self.output_tokens.inc_by(output);
    }

    /// A model call's price.
    pub(crate) fn usd(&self, usd: f64) {
        if usd > 0.0 {
            self.usd.inc_by(usd);
        }
    }

    /// A turn or tool call refused for `budget` (rare: resolved here).
    pub(crate) fn refused(&self, budget: &'static str) {
        METRICS
            .principal_refusals
            .get_or_create(&RefusalLabels {
                principal: self.principal.clone(),
                budget,
            })
            .inc();
    }
}
