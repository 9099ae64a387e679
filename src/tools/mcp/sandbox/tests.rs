use super::*;

fn touch(p: &Path) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, b"x").unwrap();
}

/// HOME holds the install, the data folder and the sandboxes: the install is readable, the
/// private folders are not, and neither is HOME whole; the own workspace is read-write.
#[test]
fn a_folder_holding_a_private_one_is_split() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path().join("home");
    let repo = home.join("repo");
    let data = repo.join("data");
    let sandboxes = repo.join("sandboxes");
    let ws = sandboxes.join("sess_a");
    let other = sandboxes.join("sess_b");
    touch(&data.join("turnstile.db"));
    touch(&other.join("secret.txt"));
    std::fs::create_dir_all(&ws).unwrap();
    touch(&repo.join("server.py"));
    touch(&repo.join("lib/helper.py"));
    touch(&home.join(".tool/bin/tool"));
    touch(&home.join(".ssh/id_ed25519"));
    // A symlink in HOME to the data folder must not open it.
    std::os::unix::fs::symlink(&data, home.join("data-link")).unwrap();
    let req = Request {
        command: home.join(".tool/bin/tool").display().to_string(),
        args: vec![repo.join("server.py").display().to_string()],
        home: Some(home.clone()),
        workspace: Some(ws.clone()),
        private: vec![data.clone(), sandboxes.clone()],
        ..Request::default()
    };
    let plan = plan(&req);
    assert!(
        plan.allows(&ws.join("new.txt"), Rights::ReadWrite),
        "{plan:?}"
    );
    assert!(plan.allows(&repo.join("server.py"), Rights::Read));
    assert!(plan.allows(&repo.join("lib/helper.py"), Rights::Read));
    assert!(!plan.allows(&repo.join("server.py"), Rights::ReadWrite));
    assert!(plan.allows(&home.join(".tool/bin/tool"), Rights::Read));
    assert!(plan.allows(Path::new("/usr/bin"), Rights::Read));
    for denied in [
        data.join("turnstile.db"),
        other.join("secret.txt"),
        home.join(".ssh/id_ed25519"),
        home.join("data-link/turnstile.db"),
        sandboxes.clone(),
        home.clone(),
        repo.clone(),
    ] {
        assert!(
            !plan.allows(&denied, Rights::Read),
            "{denied:?} in {plan:?}"
        );
    }
}

/// A command right in HOME does not open HOME; one in `/x/bin` opens `/x`.
#[test]
fn the_command_prefix_is_narrow() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path().join("home");
    touch(&home.join("tool"));
    touch(&t.path().join("opt/node/bin/node"));
    let path_var = std::env::join_paths([t.path().join("opt/node/bin"), home.clone()]).unwrap();
    let got = command_prefixes("node", Some(&path_var), Some(&home));
    assert_eq!(got, [t.path().join("opt/node")]);
    assert!(command_prefixes("tool", Some(&path_var), Some(&home)).is_empty());
    assert!(command_prefixes("missing", Some(&path_var), Some(&home)).is_empty());
}

/// A folder named in the args that holds the config (with the data folder) or another
/// instance's state, reached through a symlink or `..`: what is turnstile's stays out of
/// reach, the rest is readable.
#[test]
fn state_beside_or_below_a_named_folder_stays_out() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().canonicalize().unwrap();
    // This instance: root/tools.toml, root/turnstile.env, root/data, root/sandboxes.
    let data = root.join("data");
    let sandboxes = root.join("sandboxes");
    touch(&data.join("turnstile.db"));
    touch(&sandboxes.join("sess_x/f"));
    for f in [
        "tools.toml",
        "tools.prod.toml",
        "turnstile.env",
        ".env",
        "notes.txt",
        "server.py",
    ] {
        touch(&root.join(f));
    }
    // Another instance, its data folder named `state`, its workspaces `ws`; a PostgreSQL
    // instance whose data folder holds only its name.
    let other = root.join("srv/other");
    touch(&other.join("state/turnstile.db-wal"));
    touch(&other.join("ws/sess_0123456789abcdef01234567/secret.txt"));
    touch(&other.join("tools.toml"));
    touch(&other.join("site/index.html"));
    let pg = root.join("srv/pg");
    std::fs::create_dir_all(&pg).unwrap();
    std::fs::write(pg.join("instance"), "inst_0123456789abcdef01234567\n").unwrap();
    touch(&pg.join("files/ab/blob"));
    touch(&root.join("srv/readme.txt"));
    std::os::unix::fs::symlink(&root, root.join("srv/up")).unwrap();
    let req = Request {
        command: "/bin/sh".into(),
        args: vec![
            // The config's folder through a symlink, and through `..`.
            root.join("srv/up").display().to_string(),
            format!("{}/srv/..", root.display()),
            root.join("srv").display().to_string(),
        ],
        private: vec![data.clone(), sandboxes.clone(), root.join("tools.toml")],
        ..Request::default()
    };
    let plan = plan(&req);
    assert!(plan.refused.is_empty(), "{plan:?}");
    for readable in [
        root.join("notes.txt"),
        root.join("server.py"),
        root.join("srv/readme.txt"),
        other.join("site/index.html"),
    ] {
        assert!(
            plan.allows(&readable, Rights::Read),
            "{readable:?} in {plan:?}"
        );
    }
    for denied in [
        root.join("tools.toml"),
        root.join("tools.prod.toml"),
        root.join("turnstile.env"),
        root.join(".env"),
        data.join("turnstile.db"),
        sandboxes.join("sess_x/f"),
        other.join("state/turnstile.db-wal"),
        other.join("ws/sess_0123456789abcdef01234567/secret.txt"),
        other.join("tools.toml"),
        pg.join("instance"),
        pg.join("files/ab/blob"),
        root.clone(),
    ] {
        assert!(
            !plan.allows(&denied, Rights::Read),
            "{denied:?} in {plan:?}"
        );
    }
}

/// A named folder too large to look through whole is not allowed at all.
#[test]
fn a_folder_too_large_to_look_through_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().canonicalize().unwrap();
    let mut budget = 10;
    let mut found = Vec::new();
    for i in 0..5 {
        touch(&root.join(format!("a/{i}")));
    }
    assert_eq!(find_state(&root, &[], &mut budget, &mut found), Ok(()));
    for i in 0..10 {
        touch(&root.join(format!("b/{i}")));
    }
    assert_eq!(find_state(&root, &[], &mut budget, &mut found), Err(()));
    assert!(found.is_empty());
    // Through plan: MAX_CHECKED entries and one more.
    let big = root.join("big");
    std::fs::create_dir_all(&big).unwrap();
    for i in 0..=MAX_CHECKED {
        std::fs::File::create(big.join(i.to_string())).unwrap();
    }
    let req = Request {
        command: "/bin/sh".into(),
        args: vec![big.join("0").display().to_string()],
        ..Request::default()
    };
    let plan = plan(&req);
    assert_eq!(plan.refused.len(), 1, "{:?}", plan.refused);
    assert!(!plan.allows(&big.join("0"), Rights::Read));
}

/// A private folder named in the args or as a read-write folder stays private.
#[test]
fn a_private_folder_is_never_allowed() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    touch(&data.join("files/f"));
    let req = Request {
        command: "/bin/sh".into(),
        args: vec![data.display().to_string()],
        read_write: vec![data.clone(), data.join("files")],
        private: vec![data.clone()],
        ..Request::default()
    };
    let plan = plan(&req);
    assert!(
        !plan.allows(&data.join("files/f"), Rights::Read),
        "{plan:?}"
    );
}
