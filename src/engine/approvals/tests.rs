use super::*;
use crate::engine::answer_check::check_answers;
use crate::engine::types::{EngineError, Permission, TurnInput};
use crate::message::{Content, Message};

fn pending(id: &str, kind: PendingKind, asked_at: &str) -> Pending {
    Pending {
        call_id: id.into(),
        name: format!("tool_{id}"),
        input: json!({}),
        kind,
        asked_at: asked_at.into(),
        expires_at: None,
        expired: false,
        ended: None,
    }
}

fn resume(perms: &[(&str, bool)], results: &[&str]) -> TurnInput {
    TurnInput::Resume {
        results: results
            .iter()
            .map(|id| crate::engine::types::ClientResult {
                call_id: id.to_string(),
                content: json!("r"),
                is_error: false,
            })
            .collect(),
        permissions: perms
            .iter()
            .map(|(id, granted)| Permission {
                call_id: id.to_string(),
                granted: *granted,
                reason: None,
            })
            .collect(),
    }
}

#[test]
fn permissions_expire_after_the_ttl_from_their_logged_time_and_stay_expired() {
    let t0 = "2030-01-01T00:00:00.000Z";
    let at0 = clock::parse_ms(t0).unwrap();
    let mut p = vec![
        pending("a", PendingKind::Permission, t0),
        pending("c", PendingKind::Client, t0),
    ];
    let ttl = Duration::from_secs(60);
    assert_eq!(stamp(&mut p, ttl, at0 + 59_999), Some(at0 + 60_000));
    assert_eq!(p[0].expires_at.as_deref(), Some("2030-01-01T00:01:00.000Z"));
    assert!(
        !p[0].expired && p[1].expires_at.is_none(),
        "client calls never expire"
    );
    assert_eq!(stamp(&mut p, ttl, at0 + 60_000), None);
    assert!(p[0].expired && !p[1].expired);
    // A longer ttl later does not revive it.
    assert_eq!(stamp(&mut p, Duration::from_secs(3600), at0 + 60_000), None);
    assert!(p[0].expired);
}

#[test]
fn grants_of_expired_settled_or_unknown_calls_are_409_naming_what_is_outstanding() {
    let t0 = "2030-01-01T00:00:00.000Z";
    let mut p = vec![
        pending("a", PendingKind::Permission, t0),
        pending("c", PendingKind::Client, t0),
    ];
    p[0].expired = true;
    let none = || Vec::new();
    // The expired call need not be answered.
    assert_eq!(
        check_answers(&p, &resume(&[], &["c"]), &none)
            .unwrap()
            .len(),
        2
    );
    // A denial of it is accepted; a grant is a conflict naming it as expired.
    assert!(check_answers(&p, &resume(&[("a", false)], &["c"]), &none).is_ok());
    let e = check_answers(&p, &resume(&[("a", true)], &["c"]), &none).unwrap_err();
    let EngineError::Conflict(msg) = e else {
        panic!("{e:?}")
    };
    assert!(msg.contains("toolCallId a (tool_a) has expired"), "{msg}");
    assert!(msg.contains("still outstanding: c (tool_c"), "{msg}");
    // A settled call, from the history.
    let hist = || {
        vec![Message::Tool {
            tool_call_id: "old".into(),
            content: Content::Text("done".into()),
        }]
    };
    let e = check_answers(&p, &resume(&[("old", true)], &["c"]), &hist).unwrap_err();
    assert!(
        matches!(&e, EngineError::Conflict(m) if m.contains("old is already settled")),
        "{e:?}"
    );
    // Unknown plus a missing answer: malformed, 400, still naming both.
    let e = check_answers(&p, &resume(&[("zzz", true)], &[]), &none).unwrap_err();
    assert!(
        matches!(&e, EngineError::Invalid(m) if m.contains("zzz is not a call") && m.contains("missing answers for toolCallId c")),
        "{e:?}"
    );
    // Nothing pending at all.
    let e = check_answers(&[], &resume(&[("a", true)], &[]), &hist).unwrap_err();
    assert!(
        matches!(&e, EngineError::Conflict(m) if m.contains("no tool calls are pending")),
        "{e:?}"
    );
    let user = TurnInput::User {
        content: json!("hi"),
        files: vec![],
        skills: vec![],
    };
    assert!(check_answers(&p, &user, &none).is_err());
    assert!(check_answers(&[], &user, &none).is_ok());
}

#[test]
fn digests_are_of_the_logged_json() {
    assert_eq!(digest(&json!({"a": 1})), digest(&json!({"a": 1})));
    assert_ne!(digest(&json!({"a": 1})), digest(&json!({"a": 2})));
    assert_eq!(digest(&json!({})).len(), 64);
}
