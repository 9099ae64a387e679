//! Path safety of `deliver_file`: nothing outside the workspace is ever read.
//!
//! A workspace with files, nested folders and symlinks (inside ones, and ones leading out: absolute
//! and relative, to a file and to a folder, in chains, through `/proc`, a hard link) sits among
//! files that carry a unique marker: the secret beside the sandboxes, a sibling workspace, and
//! decoys under the names an escape would most likely land on. Thousands of hostile paths,
//! generated deterministically (`..` in every spelling, percent-encoded, fullwidth and other
//! Unicode look-alikes, backslashes, trailing dots and spaces, `/workspace/..`, `//`, NUL, very long
//! paths, absolute paths, the symlinks with suffixes, and a seeded random mix), go to
//! `open_in_workspace` and a sample of them through the real tool (`deliver::call` with a
//! `FileStore`). A read escapes when its bytes hold the marker or are not one of the workspace's
//! own files. Races: a file swapped with a symlink to the secret (rename over), a folder swapped
//! with a symlink out (RENAME_EXCHANGE), and a folder moved out of the workspace while `..` walks
//! through it, each against thousands of opens.

use std::collections::HashSet;
use std::ffi::CString;
use std::io::Read;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use serde_json::json;
use turnstile::files::safe_open::{open_in_workspace, OpenError};
use turnstile::files::FileStore;
use turnstile::log::Store;
use turnstile::tools::deliver;
use turnstile::tools::CallContext;

const MARKER: &str = "MARKER-hostile-paths-5f0c1e9a";

/// The layout: `root/` holds the secrets, `root/sandboxes/ws/` is the workspace.
struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    ws: PathBuf,
    /// The bytes of every regular file inside the workspace: the only bytes a read may return.
    inside: HashSet<Vec<u8>>,
}

fn secret(what: &str) -> String {
    format!("{MARKER}: {what} is outside the workspace\n")
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let ws = root.join("sandboxes/ws");
        let mut inside = HashSet::new();
        let mut put = |rel: &str| {
            let path = ws.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let content = format!("INSIDE {rel}\n").into_bytes();
            std::fs::write(&path, &content).unwrap();
            inside.insert(content);
        };
        for rel in [
            "inside.txt",
            "report.csv",
            "sub/inside.txt",
            "sub/deeper/inside.txt",
            "sub/deeper/file.txt",
            "café.txt",
            "secret.txt.inside",
            "rdir/f.txt",
            "d1/d2/keep.txt",
        ] {
            put(rel);
        }
        // Outside: the secret and decoys where an escape would land.
        for rel in [
            "secret.txt",
            "inside.txt",
            "report.csv",
            "outside_dir/secret.txt",
            "outside_dir/inside.txt",
            "outside_dir/f.txt",
            "sandboxes/secret.txt",
            "sandboxes/inside.txt",
            "sandboxes/other/secret.txt",
            "sandboxes/other/inside.txt",
            "moved_out/.keep",
        ] {
            let path = root.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, secret(rel)).unwrap();
        }
        let link = |target: &str, at: &str| symlink(target, ws.join(at)).unwrap();
        let abs = |rel: &str| root.join(rel).display().to_string();
        // Inside links (allowed to work).
        link("../inside.txt", "sub/inside_link");
        link("..", "sub/up");
        link(&ws.join("inside.txt").display().to_string(), "abs_in");
        // Out: absolute and relative, to a file and to a folder.
        link(&abs("secret.txt"), "abs_out");
        link("../../secret.txt", "rel_out");
        link("../../../secret.txt", "sub/rel_out");
        link(&abs("outside_dir"), "dir_out_abs");
        link("../../outside_dir", "dir_out_rel");
        link("../dir_out_rel", "sub/dir_out_chain");
        link("../other", "sibling");
        // Chains a -> b -> c -> outside, to a file and to a folder.
        link("b", "a");
        link("c", "b");
        link("../../secret.txt", "c");
        link("chain_d2", "chain_d1");
        link("sub/dir_out_chain", "chain_d2");
        // Special targets.
        link(
            &format!("/proc/self/root{}", abs("secret.txt")),
            "proc_link",
        );
        link("/proc/self/cwd", "proc_cwd");
        link("/etc/passwd", "etc_link");
        link("../../../../../../../../dev/zero", "dev_link");
        link("loop2", "loop1");
        link("loop1", "loop2");
        std::fs::hard_link(root.join("secret.txt"), ws.join("hard")).unwrap();
        Fixture {
            _dir: dir,
            root,
            ws,
            inside,
        }
    }

    /// Whether bytes read through the workspace came from outside it.
    fn escaped(&self, bytes: &[u8]) -> bool {
        let marker = MARKER.as_bytes();
        bytes.windows(marker.len()).any(|w| w == marker) || !self.inside.contains(bytes)
    }
}

fn read_all(mut f: std::fs::File) -> Vec<u8> {
    let mut out = Vec::new();
    // Bounded, so that a device that slipped through cannot hang the test.
    let _ = (&mut f).take(1 << 20).read_to_end(&mut out);
    out
}

/// A stored file's bytes (bounded like [`read_all`]).
async fn read_blob(blob: turnstile::files::Blob) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let _ = blob.take(1 << 20).read_to_end(&mut out).await;
    out
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

/// The hostile paths, deterministic and without duplicates.
fn hostile_paths(root: &Path, ws: &Path) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    // `..` in every spelling: plain, dotted, padded, encoded, doubly encoded, overlong UTF-8,
    // fullwidth and other look-alikes, with zero-width and combining characters, backslashed.
    let climbs = [
        "..",
        "./..",
        "../.",
        "...",
        "....",
        ".. ",
        " ..",
        "..\t",
        "..;",
        "%2e%2e",
        "%2E%2E",
        ".%2e",
        "%2e.",
        "%252e%252e",
        "%c0%ae%c0%ae",
        "%uff0e%uff0e",
        "\u{FF0E}\u{FF0E}",
        "\u{2025}",
        "\u{2024}\u{2024}",
        "\u{FE52}\u{FE52}",
        ".\u{200B}.",
        "..\u{200B}",
        ".\u{0307}.",
        "..\\..",
        "sub/..",
        "sub/up",
        "sub/up/..",
        "/workspace/..",
    ];
    let seps = [
        "/", "//", "/./", "\\", "%2f", "%2F", "%252f", "\u{2215}", "\u{FF0F}",
    ];
    let prefixes = [
        "",
        "./",
        "/workspace/",
        "/workspace//",
        "sub/deeper/",
        "/workspace/sub/up/",
    ];
    let targets = [
        "secret.txt",
        "inside.txt",
        "outside_dir/secret.txt",
        "other/secret.txt",
        "sandboxes/other/inside.txt",
        "etc/passwd",
    ];
    for climb in climbs {
        for sep in seps {
            for depth in [1, 2, 4] {
                for prefix in prefixes {
                    for target in targets {
                        let mut p = prefix.to_string();
                        for _ in 0..depth {
                            p.push_str(climb);
                            p.push_str(sep);
                        }
                        p.push_str(target);
                        out.push(p);
                    }
                }
            }
        }
    }
    // The symlinks, with suffixes, reached in several ways.
    let bases = [
        "abs_out",
        "rel_out",
        "sub/rel_out",
        "dir_out_abs",
        "dir_out_rel",
        "sub/dir_out_chain",
        "sibling",
        "a",
        "b",
        "c",
        "chain_d1",
        "chain_d2",
        "proc_link",
        "proc_cwd",
        "etc_link",
        "dev_link",
        "loop1",
        "hard",
        "sub/up",
        "abs_in",
    ];
    let suffixes = [
        "",
        "/",
        "/.",
        "/..",
        "/secret.txt",
        "/inside.txt",
        "/f.txt",
        "/./secret.txt",
        "//secret.txt",
        "/../secret.txt",
        "/../../secret.txt",
        "/../../../secret.txt",
        "/outside_dir/secret.txt",
        "/other/secret.txt",
        "/Cargo.toml",
    ];
    let via = [
        "",
        "./",
        "/workspace/",
        "sub/../",
        "sub/up/",
        "/workspace/sub/up/./",
    ];
    for base in bases {
        for suffix in suffixes {
            for v in via {
                out.push(format!("{v}{base}{suffix}"));
            }
        }
    }
    // Absolute paths.
    let r = root.display().to_string();
    let w = ws.display().to_string();
    for p in [
        "/etc/passwd".to_string(),
        "/etc/shadow".into(),
        "/proc/self/environ".into(),
        "/proc/self/cmdline".into(),
        "/proc/self/mem".into(),
        "/dev/zero".into(),
        "/dev/stdin".into(),
        "/".into(),
        "//".into(),
        "///etc/passwd".into(),
        "//workspace/inside.txt".into(),
        "/workspace".into(),
        "/workspace/".into(),
        "/workspace/.".into(),
        "/workspace/..".into(),
        "/workspace/../..".into(),
        "/workspace/../../secret.txt".into(),
        "/workspace/./../../secret.txt".into(),
        "/workspace../secret.txt".into(),
        "/workspace..".into(),
        "/Workspace/../../secret.txt".into(),
        "/WORKSPACE/inside.txt".into(),
        "workspace/../../secret.txt".into(),
        format!("{r}/secret.txt"),
        format!("{w}/inside.txt"),
        format!("{w}/../../secret.txt"),
        format!("/workspace/{r}/secret.txt"),
        format!("/workspace//{r}/secret.txt"),
        format!("/proc/self/root{r}/secret.txt"),
        format!("/proc/self/cwd/../{r}/secret.txt"),
        format!("/proc/{}/root{r}/secret.txt", std::process::id()),
        "/proc/self/fd/0".into(),
        "/proc/thread-self/root/etc/passwd".into(),
        "/sys/kernel/notes".into(),
        "~/secret.txt".into(),
        "~root/.bashrc".into(),
        "$HOME/../secret.txt".into(),
        "file:///etc/passwd".into(),
        "C:\\Windows\\win.ini".into(),
        "\\\\?\\C:\\secret.txt".into(),
        "\\..\\..\\secret.txt".into(),
    ] {
        out.push(p);
    }
    // NUL bytes, control characters.
    for p in [
        "\0",
        "inside.txt\0",
        "inside.txt\0../../secret.txt",
        "..\0/../secret.txt",
        "\0/etc/passwd",
        "/workspace/\0../../secret.txt",
        "sub/\u{0}/../../../secret.txt",
        "..\n/../secret.txt",
        "..\r\n../secret.txt",
    ] {
        out.push(p.to_string());
    }
    // Very long paths.
    for n in [100, 1000, 1500, 2048, 5000] {
        out.push(format!("{}secret.txt", "../".repeat(n)));
        out.push(format!("{}../../secret.txt", "./".repeat(n)));
        out.push(format!("{}../../../secret.txt", "sub/".repeat(n)));
        out.push(format!("{}../../secret.txt", "sub/up/".repeat(n / 4)));
        out.push("x".repeat(n));
    }
    out.push(format!("{}/../../secret.txt", "a".repeat(300)));
    // Trailing dots and spaces, case and Unicode normalisation variants of real names.
    for p in [
        "secret.txt",
        "secret.txt.",
        "secret.txt ",
        "secret.txt::$DATA",
        "inside.txt.",
        "inside.txt ",
        "inside.txt/",
        "inside.txt/.",
        "inside.txt/..",
        "inside.txt/../../../secret.txt",
        "INSIDE.TXT",
        "\u{FF49}\u{FF4E}\u{FF53}\u{FF49}\u{FF44}\u{FF45}.txt",
        "cafe\u{0301}.txt",
        "CAFÉ.txt",
        "café.txt/../../../secret.txt",
        "café.txt\u{200B}",
        "\u{202E}txt.terces",
        "sub\u{2215}..\u{2215}..\u{2215}..\u{2215}secret.txt",
        "sub\u{FF0F}..\u{FF0F}..\u{FF0F}..\u{FF0F}secret.txt",
        "",
        ".",
        "./",
        "././",
        "..",
        "../",
        "sub",
        "sub/",
    ] {
        out.push(p.to_string());
    }
    // A seeded random mix of the same pieces.
    let tokens = [
        "..",
        ".",
        "/",
        "//",
        "\\",
        "sub",
        "up",
        "deeper",
        "a",
        "c",
        "abs_out",
        "rel_out",
        "dir_out_abs",
        "dir_out_rel",
        "chain_d1",
        "sibling",
        "secret.txt",
        "inside.txt",
        "outside_dir",
        "other",
        "sandboxes",
        "%2e",
        "%2f",
        "\u{FF0E}",
        "\u{2025}",
        "/workspace/",
        "proc_link",
        "hard",
        " ",
        "\0",
        "f.txt",
        "etc",
        "passwd",
    ];
    let mut rng = Rng(0x5EED_F11E_5AFE_u64);
    for _ in 0..3000 {
        let n = 1 + rng.next() % 12;
        let p: String = (0..n).map(|_| rng.pick(&tokens)).collect();
        out.push(p);
    }
    let mut seen = HashSet::new();
    out.retain(|p| seen.insert(p.clone()));
    out
}

/// Whether the kernel has `openat2` (Linux 5.6+, not blocked by a seccomp filter). Without it
/// `open_in_workspace` follows no symlink and refuses every `..`, inside ones included.
fn has_openat2() -> bool {
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH;
    let dot = CString::new(".").unwrap();
    // SAFETY: valid arguments; the descriptor is closed at once.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            dot.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd >= 0 {
        unsafe { libc::close(fd as i32) };
    }
    fd >= 0
}

/// Paths that must work: proof that the checks below can see a read. Symlinks and `..` that
/// stay inside work only with openat2.
fn controls() -> Vec<(&'static str, &'static str)> {
    let mut c = vec![
        ("inside.txt", "INSIDE inside.txt\n"),
        (
            "/workspace/sub/deeper/file.txt",
            "INSIDE sub/deeper/file.txt\n",
        ),
        (
            "./sub//deeper/./inside.txt",
            "INSIDE sub/deeper/inside.txt\n",
        ),
        ("café.txt", "INSIDE café.txt\n"),
    ];
    if has_openat2() {
        c.extend([
            ("sub/inside_link", "INSIDE inside.txt\n"),
            ("sub/up/inside.txt", "INSIDE inside.txt\n"),
            ("./sub/../report.csv", "INSIDE report.csv\n"),
            (
                "/workspace/sub/up/sub/up/sub/inside.txt",
                "INSIDE sub/inside.txt\n",
            ),
        ]);
    }
    c
}

#[test]
fn the_checker_sees_a_read_from_outside() {
    let fx = Fixture::new();
    for rel in [
        "secret.txt",
        "outside_dir/inside.txt",
        "sandboxes/other/inside.txt",
    ] {
        let bytes = std::fs::read(fx.root.join(rel)).unwrap();
        assert!(fx.escaped(&bytes), "{rel} counts as an escape");
    }
    assert!(fx.escaped(&std::fs::read("/etc/hostname").unwrap_or_else(|_| b"x".to_vec())));
    assert!(!fx.escaped(b"INSIDE inside.txt\n"));
    // Without the guard these symlinks do lead to the secret: the fixture is hostile for real.
    for link in [
        "abs_out",
        "rel_out",
        "a",
        "dir_out_abs/secret.txt",
        "sub/dir_out_chain/secret.txt",
        "hard",
    ] {
        let bytes = std::fs::read(fx.ws.join(link)).unwrap();
        assert!(
            fx.escaped(&bytes),
            "{link} reaches outside when followed blindly"
        );
    }
}

#[test]
fn a_thousand_hostile_paths_never_read_outside_the_workspace() {
    let fx = Fixture::new();
    for (path, want) in controls() {
        let (f, size, _) =
            open_in_workspace(&fx.ws, path).unwrap_or_else(|e| panic!("control {path}: {e}"));
        assert_eq!(read_all(f), want.as_bytes(), "control {path}");
        assert_eq!(size, want.len() as u64);
    }
    let paths = hostile_paths(&fx.root, &fx.ws);
    let (mut tried, mut escaped, mut opened, mut refused) = (0usize, 0usize, 0usize, 0usize);
    let mut escapes = Vec::new();
    for p in &paths {
        tried += 1;
        match open_in_workspace(&fx.ws, p) {
            Ok((f, _, _)) => {
                opened += 1;
                let bytes = read_all(f);
                if fx.escaped(&bytes) {
                    escaped += 1;
                    escapes.push((p.clone(), String::from_utf8_lossy(&bytes).into_owned()));
                }
            }
            Err(e) => {
                refused += 1;
                assert!(
                    !e.to_string().contains(MARKER),
                    "{p:?}: the refusal leaks content: {e}"
                );
            }
        }
    }
    println!(
        "hostile paths (open_in_workspace): tried {tried}, escaped {escaped} (opened inside files {opened}, refused {refused}; openat2: {})",
        has_openat2()
    );
    assert!(tried >= 1000, "only {tried} paths");
    assert_eq!(escaped, 0, "reads outside the workspace: {escapes:#?}");
    // The symlinks that lead out are refused as leaving, not merely missing.
    for p in [
        "abs_out",
        "rel_out",
        "a",
        "dir_out_abs/secret.txt",
        "sub/dir_out_chain/secret.txt",
        "sibling/secret.txt",
        "proc_link",
        "../../secret.txt",
        "/workspace/../../secret.txt",
    ] {
        assert!(
            matches!(open_in_workspace(&fx.ws, p), Err(OpenError::Outside(_))),
            "{p}: {:?}",
            open_in_workspace(&fx.ws, p).map(|(_, s, n)| (s, n))
        );
    }
    assert!(matches!(
        open_in_workspace(&fx.ws, "hard"),
        Err(OpenError::Linked { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_paths_through_the_deliver_file_tool_store_nothing_from_outside() {
    let fx = Fixture::new();
    let data = fx.root.join("data");
    let store = Store::open(&data, false).unwrap();
    let files = FileStore::open(&data, store, 1 << 20).unwrap();
    let ctx = CallContext {
        session_id: "sess_hostile".into(),
        workspace: fx.ws.clone(),
        owner: None,
        elicitor: None,
        sampler: None,
    };
    let deliver = |path: String| {
        let (files, ctx) = (&files, &ctx);
        async move { deliver::call(files, ctx, json!({ "path": path })).await }
    };
    for (path, want) in controls() {
        let out = deliver(path.to_string()).await;
        assert!(!out.is_error, "control {path}: {:?}", out.content);
        let row = files.get(None, &out.files[0].id).await.unwrap();
        let f = read_blob(files.open_blob(&row).await.unwrap()).await;
        assert_eq!(f, want.as_bytes(), "control {path}");
    }
    // Every symlink-based, absolute (the `/workspace/` forms included), NUL and long path, and
    // every 20th of the rest.
    let paths = hostile_paths(&fx.root, &fx.ws);
    let sample: Vec<&String> = paths
        .iter()
        .enumerate()
        .filter(|(i, p)| {
            i % 20 == 0
                || p.starts_with('/')
                || p.contains('\0')
                || p.len() > 250
                || [
                    "abs_out", "rel_out", "dir_out", "chain", "sibling", "proc", "hard", "etc_link",
                ]
                .iter()
                .any(|b| p.contains(b))
        })
        .map(|(_, p)| p)
        .collect();
    let (mut tried, mut escaped) = (0usize, 0usize);
    let mut escapes = Vec::new();
    for p in sample {
        tried += 1;
        let out = deliver(p.clone()).await;
        let text = out.content.to_string();
        assert!(
            !text.contains(MARKER),
            "{p:?}: the result leaks content: {text}"
        );
        if out.is_error {
            assert!(out.files.is_empty(), "{p:?}");
            continue;
        }
        for f in &out.files {
            let row = files.get(None, &f.id).await.unwrap();
            let bytes = read_blob(files.open_blob(&row).await.unwrap()).await;
            if fx.escaped(&bytes) {
                escaped += 1;
                escapes.push((p.clone(), String::from_utf8_lossy(&bytes).into_owned()));
            }
        }
    }
    println!("hostile paths (deliver_file tool): tried {tried}, escaped {escaped}");
    assert!(tried >= 1000, "only {tried} paths through the tool");
    assert_eq!(
        escaped, 0,
        "files stored from outside the workspace: {escapes:#?}"
    );
}

/// Swaps a race must have overlapped.
const MIN_SWAPS: u64 = 1000;

/// Run `swap` on a thread as fast as it can while `open` is tried at least `min_tries` times,
/// until the thread has swapped `MIN_SWAPS` times meanwhile and both outcomes (an inside read, a
/// refusal) have been seen; every read must be the inside content. Returns (tries, inside reads, refusals, swaps).
fn race(
    fx: &Fixture,
    path: &str,
    inside: &[u8],
    min_tries: usize,
    swap: impl FnMut() + Send + 'static,
) -> (usize, usize, usize, u64) {
    // Unraced, the path opens with openat2; without it (no `..`, no symlink) it may be refused
    // every time, and then only "never the secret" can be asserted.
    let opens_unraced = open_in_workspace(&fx.ws, path).is_ok();
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(2));
    let swapper = {
        let (stop, swaps, start) = (stop.clone(), swaps.clone(), start.clone());
        let mut swap = swap;
        std::thread::spawn(move || {
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                swap();
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    start.wait();
    let (mut tries, mut ok, mut refused) = (0usize, 0usize, 0usize);
    let mut leaked = None;
    let mut kinds = std::collections::BTreeMap::new();
    // Bounded, so that a swapper that never interleaves fails the test instead of hanging it.
    // Until enough opens have overlapped enough swaps, and both outcomes were seen.
    while tries < 2_000_000
        && (tries < min_tries
            || swaps.load(Ordering::Relaxed) < MIN_SWAPS
            || (opens_unraced && ok == 0)
            || refused == 0)
    {
        tries += 1;
        match open_in_workspace(&fx.ws, path) {
            Ok((f, _, _)) => {
                let bytes = read_all(f);
                if bytes != inside {
                    leaked = Some(String::from_utf8_lossy(&bytes).into_owned());
                    break;
                }
                ok += 1;
            }
            Err(e) => {
                refused += 1;
                let kind = match e {
                    OpenError::Outside(_) => "outside".to_string(),
                    OpenError::NotFound(_) => "not found".to_string(),
                    other => other.to_string(),
                };
                *kinds.entry(kind).or_insert(0usize) += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    let swaps = swaps.load(Ordering::Relaxed);
    println!("race on {path} (openat2: {}): {tries} opens, {ok} inside reads, {refused} refusals {kinds:?}, {swaps} swaps", has_openat2());
    assert!(
        swaps >= MIN_SWAPS,
        "{path}: only {swaps} swaps overlapped {tries} opens"
    );
    assert_eq!(
        leaked, None,
        "{path}: a read returned something else than the inside file"
    );
    assert!(
        (ok > 0 || !opens_unraced) && refused > 0,
        "{path}: the race never interleaved ({ok} reads, {refused} refusals in {tries} tries)"
    );
    (tries, ok, refused, swaps)
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

#[test]
fn a_file_swapped_for_a_symlink_to_the_secret_during_the_open_is_never_read() {
    let fx = Fixture::new();
    let ws = fx.ws.clone();
    let target = ws.join("race");
    let content = b"INSIDE race\n".to_vec();
    std::fs::write(&target, &content).unwrap();
    let abs_secret = fx.root.join("secret.txt");
    let inside = content.clone();
    let mut i = 0u64;
    let (tries, ..) = race(&fx, "race", &inside, 2000, move || {
        // Rename over: "race" is always there, alternately a regular file and a symlink out
        // (absolute or relative).
        if i % 2 == 0 {
            let tmp = ws.join(".race_file");
            std::fs::write(&tmp, &content).unwrap();
            std::fs::rename(&tmp, &target).unwrap();
        } else {
            let tmp = ws.join(".race_link");
            let _ = std::fs::remove_file(&tmp);
            if i % 4 == 1 {
                symlink(&abs_secret, &tmp).unwrap();
            } else {
                symlink("../../secret.txt", &tmp).unwrap();
            }
            std::fs::rename(&tmp, &target).unwrap();
        }
        i += 1;
    });
    assert!(tries >= 2000);
}

fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    let (a, b) = (cstr(a), cstr(b));
    // SAFETY: valid C strings; renameat2 with RENAME_EXCHANGE swaps the two names atomically.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn a_folder_swapped_for_a_symlink_out_during_the_open_is_never_followed() {
    let fx = Fixture::new();
    let ws = fx.ws.clone();
    // `rdir` is a real folder holding f.txt; `rdir_alt` a symlink to outside_dir (holding an
    // f.txt with the marker). Each swap exchanges the two names atomically.
    symlink("../../outside_dir", ws.join("rdir_alt")).unwrap();
    exchange(&ws.join("rdir"), &ws.join("rdir_alt")).expect("renameat2(RENAME_EXCHANGE)");
    exchange(&ws.join("rdir"), &ws.join("rdir_alt")).unwrap();
    let (a, b) = (ws.join("rdir"), ws.join("rdir_alt"));
    let (tries, ..) = race(&fx, "rdir/f.txt", b"INSIDE rdir/f.txt\n", 2000, move || {
        exchange(&a, &b).unwrap();
    });
    assert!(tries >= 2000);
}

#[test]
fn a_folder_moved_out_while_dotdot_walks_through_it_never_leads_outside() {
    let fx = Fixture::new();
    // "d1/d2/../../inside.txt" is the workspace's inside.txt; were d2 moved to root/moved_out/ in
    // mid-walk, the same `..`s would land on root/inside.txt (the marker).
    let inside_d2 = fx.ws.join("d1/d2");
    let outside_d2 = fx.root.join("moved_out/d2");
    let mut out = false;
    let (tries, ..) = race(
        &fx,
        "d1/d2/../../inside.txt",
        b"INSIDE inside.txt\n",
        2000,
        move || {
            if out {
                std::fs::rename(&outside_d2, &inside_d2).unwrap();
            } else {
                std::fs::rename(&inside_d2, &outside_d2).unwrap();
            }
            out = !out;
        },
    );
    assert!(tries >= 2000);
}

#[test]
fn an_inside_path_with_dotdot_opens_while_unrelated_files_are_renamed() {
    // The kernel refuses a `..` walk with EAGAIN when any rename happens meanwhile (anywhere on
    // the system): a path that stays inside must still open, not fail spuriously.
    let fx = Fixture::new();
    if !has_openat2() {
        println!("no openat2: `..` is refused by design, nothing to check");
        return;
    }
    let (a, b) = (fx.ws.join("churn_a"), fx.ws.join("churn_b"));
    std::fs::write(&a, "churn").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(2));
    let churner = {
        let (stop, swaps, start) = (stop.clone(), swaps.clone(), start.clone());
        std::thread::spawn(move || {
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                std::fs::rename(&a, &b).unwrap();
                std::fs::rename(&b, &a).unwrap();
                swaps.fetch_add(2, Ordering::Relaxed);
            }
        })
    };
    start.wait();
    let mut tries = 0usize;
    let mut failures = std::collections::BTreeMap::new();
    while tries < 2000 || swaps.load(Ordering::Relaxed) < MIN_SWAPS {
        tries += 1;
        match open_in_workspace(&fx.ws, "sub/deeper/../../inside.txt") {
            Ok((f, _, _)) => assert_eq!(read_all(f), b"INSIDE inside.txt\n"),
            Err(e) => *failures.entry(e.to_string()).or_insert(0usize) += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    churner.join().unwrap();
    println!(
        "inside `..` path under renames: {tries} opens, {} swaps, failures {failures:?}",
        swaps.load(Ordering::Relaxed)
    );
    assert!(
        failures.is_empty(),
        "an inside path failed while unrelated files were renamed: {failures:?} in {tries} opens"
    );
}
