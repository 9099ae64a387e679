//! The web console in a real (headless) Chromium, and the browser guard against pages of other
//! origins.

mod browser_guard;
mod elicitation;
mod ui;
