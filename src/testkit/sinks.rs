//! Delta sinks for tests of a provider's streaming: one that records every fragment, one that
//! forwards text fragments as they come.

use tokio::sync::mpsc;

use crate::upstream::DeltaSink;

/// Records every fragment, text and thinking apart.
#[derive(Default)]
pub struct Rec {
    pub text: Vec<String>,
    pub thinking: Vec<String>,
}

impl DeltaSink for Rec {
    fn text(&mut self, fragment: &str) {
        self.text.push(fragment.to_string());
    }
    fn thinking(&mut self, fragment: &str) {
        self.thinking.push(fragment.to_string());
    }
}

/// Forwards text fragments as they come, so a test can watch them while the call runs.
pub struct Forward(pub mpsc::UnboundedSender<String>);

impl DeltaSink for Forward {
    fn text(&mut self, fragment: &str) {
        let _ = self.0.send(fragment.to_string());
    }
    fn thinking(&mut self, _: &str) {}
}
