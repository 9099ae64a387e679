//! The inbox: requests for a session that an instance received while another instance holds
//! the session's lease (a queued message, a cancel, an interrupt, a plan decision). The
//! receiving instance writes a row and notifies [`INBOX_CHANNEL`] (payload `<session> <holder>`,
//! delivered at `COMMIT`); the holder takes the session's rows in `seq` order and applies them
//! as if they had come to it.
//!
//! No row is ever left without an instance to take it:
//!
//! - [`PgStore::post_inbox`] locks the lease row (`FOR SHARE`) and writes only while another
//!   instance holds it; without one it answers [`Posted::NotHeld`] (the caller takes the lease
//!   and does the request itself).
//! - A release ([`PgStore::release_lease`]) locks the same row (`FOR UPDATE`: it waits for a post
//!   under way) and then, in a statement of its own (a fresh snapshot that sees that post's row),
//!   deletes the lease only if the session has no row waiting; otherwise it answers
//!   [`Released::InboxWaiting`] and the holder takes them.
//! - Handing every lease back (shutdown) notifies, with no holder named, the sessions that have
//!   rows waiting, so whichever instance takes the lease first runs them.
//! - An expired lease taken over (its holder died) is then released, which finds the rows.

use super::pg_store::PgStore;
use crate::log::StoreError;

/// The channel the inbox notifies on: payload `<session id> <holder>` (no holder: anyone).
pub(crate) const INBOX_CHANNEL: &str = "turnstile_inbox";

/// A request waiting in the inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxRow {
    /// Its place in the order the rows were written.
    pub seq: i64,
    /// `message`, `cancel`, `interrupt` or `plan`.
    pub kind: String,
    /// The request (JSON, the engine's).
    pub body: String,
    /// The turn id the receiving instance answered, for a request that starts a turn.
    pub turn_id: Option<String>,
}

/// The outcome of [`PgStore::post_inbox`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Posted {
    /// Written, as the inbox row of this seq; the holder was notified.
    Queued(i64),
    /// No other instance holds the session's lease (none does, or this one): do it here.
    NotHeld,
    /// The session already has this many messages waiting in the inbox (the quota).
    Full(usize),
}

/// The outcome of [`PgStore::release_lease`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// Handed back (or no longer this instance's).
    Yes,
    /// Kept: taken again since the mark was read, or a claim is under way.
    Kept,
    /// Kept: the session has requests waiting in the inbox; take them.
    InboxWaiting,
}

impl PgStore {
    /// Write a request for the holder of the session's lease and notify it, if another
    /// instance holds it; a `message` only while fewer than `max_messages` wait.
    pub(crate) async fn post_inbox(
        &self,
        session_id: &str,
        kind: &'static str,
        body: String,
        turn_id: Option<String>,
        max_messages: usize,
    ) -> Result<Posted, StoreError> {
        let sid = session_id.to_string();
        let me = self.shared.instance.clone();
        self.run(move |pool| async move {
            let mut c = pool.get().await?;
            let tx = c.transaction().await?;
            let holder: Option<String> = tx
                .query_opt(
                    "SELECT holder FROM leases WHERE session_id = $1 FOR SHARE",
                    &[&sid],
                )
                .await?
                .map(|r| r.get(0));
            let Some(holder) = holder.filter(|h| *h != me) else {
                return Ok(Posted::NotHeld);
            };
            if kind == "message" {
                let waiting: i64 = tx
                    .query_one(
                        "SELECT count(*) FROM inbox WHERE session_id = $1 AND kind = 'message'",
                        &[&sid],
                    )
                    .await?
                    .get(0);
                if waiting as usize >= max_messages {
                    return Ok(Posted::Full(waiting as usize));
                }
            }
            let seq: i64 = tx
                .query_one(
                    "INSERT INTO inbox (session_id, kind, body, turn_id) VALUES ($1, $2, $3, $4)
                     RETURNING seq",
                    &[&sid, &kind, &body, &turn_id],
                )
                .await?
                .get(0);
            let payload = format!("{sid} {holder}");
            tx.execute("SELECT pg_notify($1, $2)", &[&INBOX_CHANNEL, &payload])
                .await?;
            tx.commit().await?;
            Ok(Posted::Queued(seq))
        })
        .await
    }

    /// Take (return, in order) the session's waiting requests, if this instance holds its
    /// lease: at most `room` messages (the rows after the first message past it stay, so that
    /// the order holds); whether rows stay. A request that starts a turn (it has a turn id)
    /// keeps its row, marked as this process's, until the commit that begins its turn removes
    /// it (`WriteOp::InboxDone`): should this process stop first, the session's next holder
    /// takes it again. Rows marked by another process are taken again: the lease is this
    /// instance's, so that process is gone (or this instance's previous life). Others (a
    /// cancel, an interrupt) go at once. With `own_too`, the rows this process marked are
    /// taken again as well: the caller found none of their turns queued or running here (a
    /// turn whose start could not be stored), and skips those it does hold.
    pub(crate) async fn take_inbox(
        &self,
        session_id: &str,
        room: usize,
        own_too: bool,
    ) -> Result<(Vec<InboxRow>, bool), StoreError> {
        let sid = session_id.to_string();
        let me = self.shared.instance.clone();
        let boot = self.shared.boot.to_string();
        self.run(move |pool| async move {
            let mut c = pool.get().await?;
            let tx = c.transaction().await?;
            let held = tx
                .query_opt(
                    "SELECT 1 FROM leases WHERE session_id = $1 AND holder = $2 FOR SHARE",
                    &[&sid, &me],
                )
                .await?
                .is_some();
            if !held {
                return Ok((Vec::new(), false));
            }
            let rows = tx
                .query(
                    "SELECT seq, kind, body, turn_id FROM inbox
                      WHERE session_id = $1 AND ($3 OR taken IS DISTINCT FROM $2)
                      ORDER BY seq FOR UPDATE",
                    &[&sid, &boot, &own_too],
                )
                .await?;
            let all: Vec<InboxRow> = rows
                .iter()
                .map(|r| InboxRow {
                    seq: r.get(0),
                    kind: r.get(1),
                    body: r.get(2),
                    turn_id: r.get(3),
                })
                .collect();
            let taken = pick(all.clone(), room);
            let (kept, gone): (Vec<i64>, Vec<i64>) = {
                let (k, g): (Vec<&InboxRow>, Vec<&InboxRow>) =
                    taken.iter().partition(|r| r.turn_id.is_some());
                (
                    k.iter().map(|r| r.seq).collect(),
                    g.iter().map(|r| r.seq).collect(),
                )
            };
            if !kept.is_empty() {
                tx.execute(
                    "UPDATE inbox SET taken = $2 WHERE seq = ANY($1)",
                    &[&kept, &boot],
                )
                .await?;
            }
            if !gone.is_empty() {
                tx.execute("DELETE FROM inbox WHERE seq = ANY($1)", &[&gone])
                    .await?;
            }
            tx.commit().await?;
            Ok((taken.clone(), taken.len() < all.len()))
        })
        .await
    }

    /// The turns queued for a session, on any instance, in the order they run: its `message`
    /// rows (a turn's row stays until the turn begins) but those cancelled while they wait
    /// (a `cancel` row under the same turn id).
    pub(crate) async fn queued_turns(&self, session_id: &str) -> Result<Vec<String>, StoreError> {
        let sid = session_id.to_string();
        self.run(move |pool| async move {
            let c = pool.get().await?;
            let rows = c
                .query(
                    "SELECT turn_id FROM inbox i WHERE session_id = $1 AND kind = 'message'
                        AND turn_id IS NOT NULL
                        AND NOT EXISTS (SELECT 1 FROM inbox c WHERE c.session_id = $1
                                          AND c.kind = 'cancel' AND c.turn_id = i.turn_id)
                      ORDER BY seq",
                    &[&sid],
                )
                .await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
        .await
    }

    /// Drop the rows of a session that is gone.
    pub(crate) async fn drop_inbox(&self, session_id: &str) -> Result<(), StoreError> {
        let sid = session_id.to_string();
        self.run(move |pool| async move {
            let c = pool.get().await?;
            c.execute("DELETE FROM inbox WHERE session_id = $1", &[&sid])
                .await?;
            Ok(())
        })
        .await
    }

    /// Put rows taken by [`PgStore::take_inbox`] back where they were (they could not be
    /// applied now: the server is at its limit of running turns, or stopping): a turn's row
    /// is no longer this process's, and the others are written again in their places.
    pub(crate) async fn put_back_inbox(
        &self,
        session_id: &str,
        rows: Vec<InboxRow>,
    ) -> Result<(), StoreError> {
        let sid = session_id.to_string();
        self.run(move |pool| async move {
            let mut c = pool.get().await?;
            let tx = c.transaction().await?;
            let turns: Vec<i64> = rows
                .iter()
                .filter(|r| r.turn_id.is_some())
                .map(|r| r.seq)
                .collect();
            tx.execute(
                "UPDATE inbox SET taken = NULL WHERE seq = ANY($1)",
                &[&turns],
            )
            .await?;
            for r in rows.iter().filter(|r| r.turn_id.is_none()) {
                tx.execute(
                    "INSERT INTO inbox (seq, session_id, kind, body, turn_id)
                     VALUES ($1, $2, $3, $4, $5)",
                    &[&r.seq, &sid, &r.kind, &r.body, &r.turn_id],
                )
                .await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }
}

/// The rows taken: in order, at most `room` messages.
fn pick(rows: Vec<InboxRow>, room: usize) -> Vec<InboxRow> {
    let mut messages = 0;
    let mut out = Vec::new();
    let mut rows = rows.into_iter();
    for r in rows.by_ref() {
        if r.kind == "message" {
            if messages == room {
                break;
            }
            messages += 1;
        }
        out.push(r);
    }
    // A taken turn's own `cancel` row goes with it, wherever it lies (see
    // `engine/command/cancel.rs`): taken without it, the cancelled turn would run.
    let taken: Vec<String> = out
        .iter()
        .filter(|r| r.kind == "message")
        .filter_map(|r| r.turn_id.clone())
        .collect();
    out.extend(
        rows.filter(|r| {
            r.kind == "cancel" && r.turn_id.as_ref().is_some_and(|t| taken.contains(t))
        }),
    );
    out
}

/// `<session id> <holder>` (an empty holder: anyone).
pub(super) fn parse(payload: &str) -> Option<(String, String)> {
    let (sid, holder) = payload.rsplit_once(' ')?;
    (!sid.is_empty()).then(|| (sid.to_string(), holder.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, kind: &str) -> InboxRow {
        InboxRow {
            seq,
            kind: kind.into(),
            body: "{}".into(),
            turn_id: None,
        }
    }

    #[test]
    fn rows_are_taken_in_order_up_to_the_room_for_messages() {
        let rows = vec![
            row(1, "message"),
            row(2, "cancel"),
            row(3, "message"),
            row(4, "interrupt"),
        ];
        let seqs = |r: Vec<InboxRow>| r.iter().map(|r| r.seq).collect::<Vec<_>>();
        assert_eq!(seqs(pick(rows.clone(), 0)), Vec::<i64>::new());
        assert_eq!(seqs(pick(rows.clone(), 1)), [1, 2]);
        assert_eq!(seqs(pick(rows, 5)), [1, 2, 3, 4]);
        assert_eq!(seqs(pick(vec![row(7, "cancel")], 0)), [7]);
    }

    #[test]
    fn a_taken_turns_own_cancel_row_is_taken_with_it_wherever_it_lies() {
        let of = |seq: i64, kind: &str, turn: &str| InboxRow {
            turn_id: Some(turn.into()),
            ..row(seq, kind)
        };
        let rows = vec![
            of(1, "message", "turn_a"),
            of(2, "message", "turn_b"),
            of(3, "cancel", "turn_a"),
            of(4, "cancel", "turn_b"),
        ];
        let seqs = |r: Vec<InboxRow>| r.iter().map(|r| r.seq).collect::<Vec<_>>();
        assert_eq!(
            seqs(pick(rows.clone(), 1)),
            [1, 3],
            "turn_b waits, with its cancel"
        );
        assert_eq!(seqs(pick(rows, 2)), [1, 2, 3, 4]);
    }

    #[test]
    fn a_payload_names_its_session_and_holder() {
        assert_eq!(
            parse("sess_a inst_b"),
            Some(("sess_a".into(), "inst_b".into()))
        );
        assert_eq!(parse("sess_a "), Some(("sess_a".into(), String::new())));
        assert_eq!(parse("garbage"), None);
    }
}
