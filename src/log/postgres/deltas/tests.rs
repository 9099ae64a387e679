use super::*;

#[test]
fn payloads_stay_under_the_limit_keep_order_and_cut_long_texts_at_char_boundaries() {
    let long = "é\"\u{1}x".repeat(3000);
    let deltas: Vec<_> = (0..200)
        .map(|i| {
            (
                "sess_a".to_string(),
                i,
                "turn_1".to_string(),
                false,
                format!("{i} "),
            )
        })
        .chain([("sess_b".into(), 7, "turn_2".into(), true, long.clone())])
        .collect();
    let out = payloads("inst_x", 5, deltas);
    assert!(out.len() > 2);
    let mut all = Vec::new();
    for (k, p) in out.iter().enumerate() {
        assert!(p.len() < PAYLOAD_BYTES, "{}", p.len());
        let m: Message = serde_json::from_str(p).unwrap();
        assert_eq!((m.i.as_str(), m.n), ("inst_x", 5 + k as u64));
        all.extend(m.d);
    }
    let texts: String = all
        .iter()
        .filter(|d| d.0 == "sess_a")
        .map(|d| d.4.as_str())
        .collect();
    assert_eq!(texts, (0..200).map(|i| format!("{i} ")).collect::<String>());
    let b: String = all
        .iter()
        .filter(|d| d.0 == "sess_b")
        .map(|d| d.4.as_str())
        .collect();
    assert_eq!(b, long);
    assert!(all.iter().filter(|d| d.0 == "sess_b").count() > 1);
}

#[test]
fn a_tap_queues_only_while_another_instance_watches_and_costs_a_load_otherwise() {
    let deltas = Arc::new(Deltas::default());
    let tap = DeltaTap {
        deltas: deltas.clone(),
        session_id: "sess_a".into(),
    };
    let started = Instant::now();
    for _ in 0..1_000_000 {
        tap.send(3, "turn_1", false, "some text");
    }
    let each = started.elapsed() / 1_000_000;
    assert!(
        lock(&deltas.queue).is_empty(),
        "nobody watches: nothing queued"
    );
    println!("an unwatched session's delta costs its writer {each:?}");
    // Another session watched: this one still queues nothing.
    deltas.note_watch(
        "b",
        vec!["sess_z".into()],
        Instant::now() + Duration::from_secs(60),
    );
    tap.send(3, "turn_1", false, "x");
    assert!(lock(&deltas.queue).is_empty());
    deltas.note_watch(
        "b",
        vec!["sess_a".into()],
        Instant::now() + Duration::from_secs(60),
    );
    tap.send(3, "turn_1", true, "thought");
    assert_eq!(
        *lock(&deltas.queue),
        [("sess_a".into(), 3, "turn_1".into(), true, "thought".into())]
    );
}

#[test]
fn watches_expire_and_are_withdrawn() {
    let d = Deltas::default();
    assert!(!d.is_watched("s"));
    d.note_watch(
        "b",
        vec!["s".into()],
        Instant::now() + Duration::from_secs(60),
    );
    d.note_watch(
        "c",
        vec!["s".into()],
        Instant::now() + Duration::from_secs(60),
    );
    assert!(d.is_watched("s"));
    d.note_unwatch("b", vec!["s".into()]);
    assert!(d.is_watched("s"), "c still watches");
    d.note_unwatch("c", vec!["s".into()]);
    assert!(!d.is_watched("s"));
    assert_eq!(d.n_watched.load(Ordering::Relaxed), 0);
    d.note_watch("b", vec!["t".into()], Instant::now());
    assert!(!d.is_watched("t"), "expired");
    assert_eq!(d.n_watched.load(Ordering::Relaxed), 0);
}
