//! How a batch of the group commit is planned (`commit.rs`): the fence first, then one
//! statement per run of events and one per other write, in queue order.

use std::collections::BTreeMap;

use crate::log::backend::WriteOp;

/// One statement of the batch, with what it binds.
pub(super) enum Step<'a> {
    Events {
        sid: Vec<&'a str>,
        seq: Vec<i64>,
        id: Vec<&'a str>,
        turn: Vec<&'a str>,
        kind: Vec<&'a str>,
        json: Vec<&'a str>,
    },
    File(&'a crate::log::FileRow, i64),
    /// A queued turn's row ([`WriteOp::InboxPut`]).
    Inbox {
        sid: &'a str,
        kind: &'a str,
        body: &'a str,
        turn: &'a str,
        taken: Option<&'a str>,
    },
    /// A queued turn begun ([`WriteOp::InboxDone`]).
    InboxDone {
        sid: &'a str,
        turn: &'a str,
    },
    /// An idempotency key's row, with its turn id and `after_seq` as bound.
    Key(&'a crate::log::KeyRow, Option<&'a str>, Option<i64>),
    /// The fence ([`FENCE`]) of the sessions whose events are written, each with its first
    /// seq here.
    Fence(Vec<&'a str>, Vec<i64>),
    /// A usage row, with its counts as bound.
    Usage(&'a crate::log::UsageRow, [i64; 5]),
    Op(&'a WriteOp),
}

/// The last seq of each session with events among the steps planned; `i64::MAX` for a
/// session deleted (every instance that has it in memory reads it back, and finds it gone).
pub(super) type LastSeqs<'a> = BTreeMap<&'a str, i64>;

/// Plan the writes: the fence first, for the sessions with events; consecutive events become
/// one statement; other writes keep their place.
pub(super) fn plan<'a>(
    ops: impl IntoIterator<Item = &'a WriteOp>,
) -> (Vec<Step<'a>>, LastSeqs<'a>) {
    let mut steps: Vec<Step<'a>> = vec![Step::Fence(Vec::new(), Vec::new())];
    let mut last_seq: LastSeqs<'a> = BTreeMap::new();
    for op in ops {
        match op {
            WriteOp::Event {
                session_id, seq, ..
            } => {
                let seq = *seq as i64;
                let e = last_seq.entry(&**session_id).or_insert(seq);
                *e = (*e).max(seq);
                add_event(&mut steps, op);
            }
            WriteOp::PutFile(f) => steps.push(Step::File(f, f.size_bytes as i64)),
            WriteOp::InboxPut {
                session_id,
                turn_id,
                kind,
                body,
                taken,
            } => steps.push(Step::Inbox {
                sid: session_id,
                kind,
                body,
                turn: turn_id,
                taken: taken.as_deref(),
            }),
            WriteOp::InboxDone {
                session_id,
                turn_id,
            } => steps.push(Step::InboxDone {
                sid: session_id,
                turn: turn_id,
            }),
            WriteOp::PutKey(k) => {
                let (turn, after) = k
                    .started
                    .as_ref()
                    .map(|(t, a)| (t.as_str(), *a as i64))
                    .unzip();
                steps.push(Step::Key(k, turn, after));
            }
            WriteOp::DeleteSession(id) => steps.push(deleted(&mut last_seq, id, op)),
            WriteOp::Usage(r) => steps.push(Step::Usage(r, super::usage_rows::counts(r))),
            other => steps.push(Step::Op(other)),
        }
    }
    if matches!(steps.first(), Some(Step::Fence(f, _)) if f.is_empty()) {
        steps.remove(0);
    }
    (steps, last_seq)
}

/// An event added to the steps: its session to the fence (the first step), itself to the
/// last step if that writes events, else to a new one.
fn add_event<'a>(steps: &mut Vec<Step<'a>>, op: &'a WriteOp) {
    let WriteOp::Event {
        session_id,
        seq,
        id,
        turn_id,
        kind,
        json,
    } = op
    else {
        return;
    };
    if let Some(Step::Fence(fenced, firsts)) = steps.first_mut() {
        match fenced.iter().position(|s| *s == &**session_id) {
            Some(i) => firsts[i] = firsts[i].min(*seq as i64),
            None => {
                fenced.push(session_id);
                firsts.push(*seq as i64);
            }
        }
    }
    if !matches!(steps.last(), Some(Step::Events { .. })) {
        steps.push(Step::Events {
            sid: vec![],
            seq: vec![],
            id: vec![],
            turn: vec![],
            kind: vec![],
            json: vec![],
        });
    }
    if let Some(Step::Events {
        sid,
        seq: seqs,
        id: ids,
        turn,
        kind: kinds,
        json: jsons,
    }) = steps.last_mut()
    {
        sid.push(session_id);
        seqs.push(*seq as i64);
        ids.push(id);
        turn.push(turn_id);
        kinds.push(kind);
        jsons.push(json);
    }
}

/// The step of a session's delete, noted in `last_seq` as `i64::MAX` (see [`LastSeqs`]).
fn deleted<'a>(last_seq: &mut LastSeqs<'a>, id: &'a str, op: &'a WriteOp) -> Step<'a> {
    last_seq.insert(id, i64::MAX);
    Step::Op(op)
}
