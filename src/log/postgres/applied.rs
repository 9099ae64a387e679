//! Replies to relayed requests: the holder of a session's lease, having applied a request
//! another instance left in its inbox (a cancel, an interrupt, a plan decision), says so on
//! [`APPLIED_CHANNEL`] with what came of it; the instance that sent it answers its client
//! then, with that outcome, as a single instance would (a cancel names the turns it stopped,
//! and the turns it stopped are stopped before the answer).
//!
//! Every instance hears every reply and keeps the latest few ([`KEPT`]) for a moment: a reply
//! may come before its sender, whose post has just committed, starts waiting for it.

use std::time::Duration;

use super::pg_store::PgStore;
use crate::log::StoreError;

/// The channel replies go on: payload `<inbox seq> <outcome>`.
pub(crate) const APPLIED_CHANNEL: &str = "turnstile_applied";

impl PgStore {
    /// Say that the inbox rows `replies` name were applied, each with its outcome.
    pub(crate) async fn notify_applied(
        &self,
        replies: Vec<(i64, String)>,
    ) -> Result<(), StoreError> {
        if replies.is_empty() {
            return Ok(());
        }
        let payloads: Vec<String> = replies
            .into_iter()
            .map(|(seq, outcome)| format!("{seq} {outcome}"))
            .collect();
        self.run(move |pool| async move {
            let c = pool.get().await?;
            c.execute(
                "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p",
                &[&APPLIED_CHANNEL, &payloads],
            )
            .await?;
            Ok(())
        })
        .await
    }

    /// The outcome the holder replied for the inbox row `seq`, once it has applied it; `None`
    /// if no reply comes `within` (the holder is gone: the row waits for the next one).
    pub(crate) async fn applied(&self, seq: i64, within: Duration) -> Option<String> {
        let replies = &self.shared.replies;
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let came = replies.came.notified();
            let mut came = std::pin::pin!(came);
            came.as_mut().enable();
            if let Some(outcome) = crate::sync::lock(&replies.heard).remove(&seq) {
                return Some(outcome);
            }
            if tokio::time::timeout_at(deadline, came).await.is_err() {
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::heard::{parse_reply as parse, Replies, KEPT};

    #[test]
    fn a_reply_names_its_row_and_keeps_its_outcome_whole() {
        assert_eq!(
            parse("12 [\"turn_a\", \"turn b\"]"),
            Some((12, "[\"turn_a\", \"turn b\"]"))
        );
        assert_eq!(parse("7"), Some((7, "")));
        assert_eq!(parse("x y"), None);
    }

    #[test]
    fn only_the_newest_replies_are_kept() {
        let r = Replies::default();
        for seq in 0..(KEPT as i64 + 10) {
            r.heard(&format!("{seq} ok"));
        }
        let heard = crate::sync::lock(&r.heard);
        assert_eq!(heard.len(), KEPT);
        assert_eq!(heard.keys().next(), Some(&10));
    }
}
