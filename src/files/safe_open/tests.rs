use super::*;
use std::io::Read;
use std::os::unix::fs::symlink;

#[test]
fn reads_inside_and_refuses_escapes() {
    let root = tempfile::tempdir().unwrap();
    let ws = root.path().join("ws");
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    std::fs::write(ws.join("sub/a.txt"), "inside").unwrap();
    std::fs::write(root.path().join("secret.txt"), "SECRET").unwrap();
    symlink(root.path().join("secret.txt"), ws.join("abs_link")).unwrap();
    symlink("../secret.txt", ws.join("rel_link")).unwrap();
    symlink("sub/a.txt", ws.join("ok_link")).unwrap();

    let (mut f, size, name) = open_in_workspace(&ws, "/workspace/sub/a.txt").unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!((s.as_str(), size, name.as_str()), ("inside", 6, "a.txt"));
    assert!(
        open_in_workspace(&ws, "ok_link").is_ok(),
        "a symlink that stays inside is fine"
    );
    for p in [
        "../secret.txt",
        "sub/../../secret.txt",
        "abs_link",
        "rel_link",
        "/etc/passwd",
        "/workspace/../secret.txt",
    ] {
        assert!(
            matches!(open_in_workspace(&ws, p), Err(OpenError::Outside(_))),
            "{p}"
        );
    }
    assert!(matches!(
        open_in_workspace(&ws, "sub"),
        Err(OpenError::NotRegular { .. })
    ));
    assert!(matches!(
        open_in_workspace(&ws, "nope.txt"),
        Err(OpenError::NotFound(_))
    ));
    assert!(matches!(
        open_in_workspace(&ws, ""),
        Err(OpenError::Invalid(_))
    ));
    assert!(matches!(
        open_in_workspace(&ws, "a\0b"),
        Err(OpenError::Invalid(_))
    ));
}

#[test]
fn fifos_and_hard_links_are_refused_without_blocking() {
    let root = tempfile::tempdir().unwrap();
    let ws = root.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let fifo = CString::new(ws.join("pipe").as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    assert!(matches!(
        open_in_workspace(&ws, "pipe"),
        Err(OpenError::NotRegular { kind: "a FIFO", .. })
    ));
    std::fs::write(root.path().join("outside.txt"), "x").unwrap();
    std::fs::hard_link(root.path().join("outside.txt"), ws.join("hard")).unwrap();
    assert!(matches!(
        open_in_workspace(&ws, "hard"),
        Err(OpenError::Linked { .. })
    ));
}

#[test]
fn the_fallback_follows_no_symlink() {
    let root = tempfile::tempdir().unwrap();
    let ws = root.path().join("ws");
    std::fs::create_dir_all(ws.join("d")).unwrap();
    std::fs::write(ws.join("d/f"), "x").unwrap();
    symlink("d", ws.join("dl")).unwrap();
    let dir = open_dir(&ws).unwrap();
    assert!(open_nofollow(&dir, "d/f").is_ok());
    assert!(matches!(
        open_nofollow(&dir, "dl/f"),
        Err(libc::ELOOP | libc::ENOTDIR)
    ));
    assert_eq!(open_nofollow(&dir, "../ws/d/f"), Err(libc::EXDEV));
}
