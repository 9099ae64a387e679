use super::*;

#[test]
fn names_are_cleaned() {
    assert_eq!(clean_name("../../etc/passwd"), "passwd");
    assert_eq!(clean_name("a\u{0}b\nc.txt"), "abc.txt");
    assert_eq!(clean_name(".."), "file");
    assert_eq!(clean_name("C:\\x\\report.pdf"), "report.pdf");
    assert_eq!(clean_name("résumé.pdf"), "résumé.pdf");
    // Bidirectional-text controls: invoice, U+202E, fdp.exe would show as "invoiceexe.pdf".
    assert_eq!(clean_name("invoice\u{202E}fdp.exe"), "invoicefdp.exe");
    for c in [
        '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}', '\u{2066}', '\u{2067}',
        '\u{2068}', '\u{2069}', '\u{200E}', '\u{200F}', '\u{061C}',
    ] {
        assert_eq!(
            clean_name(&format!("a{c}b.txt")),
            "ab.txt",
            "{:04X}",
            c as u32
        );
    }
    assert_eq!(clean_name("\u{202E}\u{2066}"), "file");
    // Other format characters of scripts that need them stay (a zero-width joiner).
    assert_eq!(clean_name("a\u{200D}b"), "a\u{200D}b");
}

#[test]
fn free_names_count_on_without_rescanning() {
    let mut taken: HashSet<String> = ["r.csv", "r (2).csv", ".env"]
        .into_iter()
        .map(String::from)
        .collect();
    let mut next = HashMap::new();
    assert_eq!(free_name("new.txt", &taken, &mut next), "new.txt");
    let a = free_name("r.csv", &taken, &mut next);
    assert_eq!(a, "r (3).csv");
    taken.insert(a);
    assert_eq!(free_name("r.csv", &taken, &mut next), "r (4).csv");
    assert_eq!(free_name(".env", &taken, &mut next), ".env (2)");
    // 10,000 copies of one name: each found in one step, not by counting from 2.
    for _ in 0..10_000 {
        let n = free_name("r.csv", &taken, &mut next);
        assert!(taken.insert(n));
    }
    assert_eq!(next["r.csv"], 10_005, "one candidate tried per copy");
}

#[tokio::test]
async fn put_streams_hashes_dedupes_and_enforces_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), false).unwrap();
    let files = FileStore::open(dir.path(), store, 10).unwrap();
    let a = files.put(None, "a.txt", &b"hello"[..]).await.unwrap();
    let b = files.put(None, "b.txt", &b"hello"[..]).await.unwrap();
    assert_ne!(a.id, b.id);
    assert_eq!((a.size_bytes, a.mime_type.as_str()), (5, "text/plain"));
    let blobs: Vec<_> = std::fs::read_dir(dir.path().join("files"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .collect();
    assert_eq!(blobs.len(), 1, "same bytes, one blob");
    let err = files.put(None, "big", &[0u8; 11][..]).await.unwrap_err();
    assert!(matches!(err, FileError::TooLarge { limit: 10 }));
    assert_eq!(
        std::fs::read_dir(dir.path().join("files/tmp"))
            .unwrap()
            .count(),
        0,
        "no leftovers"
    );
    let row = files.get(None, &a.id).await.unwrap();
    assert_eq!(row.filename, "a.txt");
    assert!(matches!(
        files.get(Some("other"), &a.id).await,
        Err(FileError::NotFound(_))
    ));
}

fn blob_count(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("files"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .count()
}

#[tokio::test]
async fn a_deleted_file_takes_its_blob_only_when_no_other_record_shares_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), false).unwrap();
    let files = FileStore::open(dir.path(), store, 1000).unwrap();
    let a = files
        .put(Some("k".into()), "a.txt", &b"same"[..])
        .await
        .unwrap();
    let b = files
        .put(Some("k".into()), "b.txt", &b"same"[..])
        .await
        .unwrap();
    assert_eq!(blob_count(dir.path()), 1);
    assert!(matches!(
        files.delete(Some("other"), &a.id).await,
        Err(FileError::NotFound(_))
    ));
    files.delete(Some("k"), &a.id).await.unwrap();
    assert_eq!(blob_count(dir.path()), 1, "b still names the blob");
    assert!(matches!(
        files.get(Some("k"), &a.id).await,
        Err(FileError::NotFound(_))
    ));
    let mut bytes = Vec::new();
    let row = files.get(Some("k"), &b.id).await.unwrap();
    files
        .open_blob(&row)
        .await
        .unwrap()
        .read_to_end(&mut bytes)
        .await
        .unwrap();
    assert_eq!(bytes, b"same");
    files.delete(Some("k"), &b.id).await.unwrap();
    assert_eq!(blob_count(dir.path()), 0);
    assert_eq!(files.usage(Some("k")).await.unwrap(), FileUsage::default());
}

#[tokio::test]
async fn the_quota_counts_stored_bytes_per_owner_from_the_store_and_frees_on_delete() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), false).unwrap();
    {
        let files = FileStore::open(dir.path(), store.clone(), 1000).unwrap();
        files
            .put(Some("k".into()), "a", &[1u8; 60][..])
            .await
            .unwrap();
    }
    // A new handle (a restart) reads what "k" has from the store.
    // Each file counts as at least MIN_ACCOUNTED_BYTES: 60 bytes take 4,096.
    let m = MIN_ACCOUNTED_BYTES;
    let files = FileStore::open(dir.path(), store, 2 * m)
        .unwrap()
        .with_quota(2 * m + 100, 3);
    let bytes = |u: FileUsage| u.bytes;
    assert_eq!(bytes(files.usage(Some("k")).await.unwrap()), m);
    let err = files
        .put(Some("k".into()), "b", &vec![2u8; m as usize + 101][..])
        .await
        .unwrap_err();
    assert!(
        matches!(err, FileError::QuotaExceeded { limit } if limit == 2 * m + 100),
        "{err}"
    );
    assert!(
        err.to_string().contains("[limits] disk_bytes_per_key"),
        "{err}"
    );
    assert_eq!(
        files.usage(Some("k")).await.unwrap(),
        FileUsage { files: 1, bytes: m },
        "the refused upload is given back"
    );
    let other = files
        .put(Some("j".into()), "b", &vec![2u8; m as usize + 101][..])
        .await
        .unwrap();
    assert_eq!(other.size_bytes, m + 101, "another key has its own quota");
    let fits = files
        .put(Some("k".into()), "c", &vec![3u8; m as usize + 100][..])
        .await
        .unwrap();
    // Full by bytes: even an empty file counts MIN_ACCOUNTED_BYTES.
    assert!(matches!(
        files.put(Some("k".into()), "d", &[][..]).await,
        Err(FileError::QuotaExceeded { .. })
    ));
    files.delete(Some("k"), &fits.id).await.unwrap();
    files.put(Some("k".into()), "d", &[][..]).await.unwrap();
    assert_eq!(
        files.usage(Some("k")).await.unwrap(),
        FileUsage {
            files: 2,
            bytes: 2 * m
        }
    );
}

#[tokio::test]
async fn a_key_stores_at_most_files_per_key_files_empty_ones_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), false).unwrap();
    let files = FileStore::open(dir.path(), store.clone(), 1000)
        .unwrap()
        .with_quota(u64::MAX, 2);
    let a = files.put(Some("k".into()), "a", &[][..]).await.unwrap();
    files.put(Some("k".into()), "b", &[][..]).await.unwrap();
    let err = files.put(Some("k".into()), "c", &[][..]).await.unwrap_err();
    assert!(matches!(err, FileError::TooManyFiles { limit: 2 }), "{err}");
    assert!(err.to_string().contains("[limits] files_per_key"), "{err}");
    files.put(None, "c", &[][..]).await.unwrap();
    files.delete(Some("k"), &a.id).await.unwrap();
    files.put(Some("k".into()), "c", &[][..]).await.unwrap();
    // A restart reads the count back from the store.
    let again = FileStore::open(dir.path(), store, 1000)
        .unwrap()
        .with_quota(u64::MAX, 2);
    assert_eq!(again.usage(Some("k")).await.unwrap().files, 2);
    assert!(again.put(Some("k".into()), "d", &[][..]).await.is_err());
}

#[tokio::test]
async fn copies_into_a_workspace_get_free_names_and_tmp_is_emptied_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), false).unwrap();
    let files = FileStore::open(dir.path(), store.clone(), 1000).unwrap();
    let a = files.put(None, "notes.txt", &b"one"[..]).await.unwrap();
    let row = files.get(None, &a.id).await.unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("notes.txt"), "mine").unwrap();
    let names = files
        .copy_all_into(&[row.clone(), row.clone(), row], &ws)
        .await
        .unwrap();
    assert_eq!(names, ["notes (2).txt", "notes (3).txt", "notes (4).txt"]);
    assert_eq!(
        std::fs::read_to_string(ws.join("notes.txt")).unwrap(),
        "mine"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("notes (4).txt")).unwrap(),
        "one"
    );

    std::fs::write(dir.path().join("files/tmp/tmp_left_by_a_crash"), "x").unwrap();
    FileStore::open(dir.path(), store, 1000).unwrap();
    assert_eq!(
        std::fs::read_dir(dir.path().join("files/tmp"))
            .unwrap()
            .count(),
        0
    );
}
