//! Landlock confinement for MCP children (`sandbox = "landlock"`). The ruleset is built in the
//! parent and enforced in the child right before `exec`, so the server never runs unconfined.
//! Where the kernel has no Landlock, such a server is refused, never started unconfined.
//!
//! What a confined child may reach ([`plan`]):
//! - read, write and execute: its workspace (session-scoped servers) or its configured `cwd`;
//! - read and execute: the system folders an interpreter needs (`/usr`, `/lib*`, `/bin`,
//!   `/sbin`, `/etc`, `/opt`, `/nix`), the install folder of its command (resolved on `PATH`,
//!   symlinks followed: `/root/.pyenv` for a pyenv shim, `<prefix>` for `<prefix>/bin/node`),
//!   the folder of every absolute path named in its args, and `~/.local/lib` (Python's user
//!   packages);
//! - a launcher's cache, read and write: `~/.npm` for `npx`/`npm`, `~/.cache/uv` for `uvx`/`uv`;
//! - `/dev/null`, `/dev/zero`, `/dev/full` (read and write), `/dev/urandom`, `/dev/random`;
//! - nothing else: not `/tmp`, not `/proc`, not `/home`.
//!
//! **Turnstile's own state is never reachable**, and no rule is ever widened to a folder that
//! holds some of it. Its own state ([`own_state`] and [`plan`]):
//! - `data_dir` (the event log `turnstile.db*`, stored files, OAuth tokens under `oauth/`)
//!   and `sandboxes` (every session's workspace);
//! - the config file, and beside it, in its folder, turnstile's other files: names that begin
//!   with `turnstile` (`turnstile.env`, `turnstile.db`), `tools*.toml`, `.env` and `*.env`;
//! - the files the config names for OAuth (`private_key_file`, `identity_assertion_file`), and
//!   what lies beside them as beside the config;
//! - another instance's state, found by looking through each folder allowed because of the
//!   server's args or its `cwd` (the folders an operator names) before allowing it: a folder
//!   holding a file named `turnstile.db*` or an `instance` file naming one (a data folder), a
//!   folder holding a session's workspace (`sess_…`: a sandboxes folder), and a `tools.toml`
//!   with what lies beside it. Such a folder with more than [`MAX_CHECKED`] entries (all of
//!   its server's together) cannot be vouched for: it is not allowed at all, and the start-up
//!   log says so. The system folders and the command's install folder are not looked
//!   through; the known paths above are cut out of them.
//!
//! A folder that would contain some state (HOME holding the repository, `/etc` holding the
//! config) is not allowed whole: its entries are allowed one by one instead, recursively,
//! leaving out the private ones. A path inside the private ones is left out, except the
//! instance's own workspace, which turnstile places there (`sandboxes/<session>/`). Every path
//! is resolved (symlinks followed, `..` taken away) before it is compared, because Landlock
//! applies a rule to the resolved folder; the search does not follow symlinks, since a link
//! leads out of the allowed folder and Landlock then refuses what lies at its end.
//!
//! Network: where the kernel has Landlock ABI 4 or later, TCP `connect` and `bind` are refused
//! unless the server's `network = true`; with `network = false` abstract Unix sockets outside
//! the sandbox are refused too (ABI 6). Signals to processes outside the sandbox are always
//! refused (ABI 6). On older kernels these parts are skipped and the start-up log says so.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, Scope, ABI,
};

/// The newest ABI we ask for; older kernels get what they support (best effort above V1).
const ABI_WANTED: ABI = ABI::V6;

/// Folders readable (and executable) by every confined child, where they exist.
const SYSTEM_READ: &[&str] = &[
    "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/opt", "/nix",
];
/// Devices a child may read and write.
const DEVICES_RW: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];
/// Devices a child may read.
const DEVICES_READ: &[&str] = &["/dev/urandom", "/dev/random"];
/// At most this many entries of one folder are allowed one by one when it holds a private one.
const MAX_SPLIT_ENTRIES: usize = 4096;
/// At most this many entries of the folders a server's args and `cwd` name are looked through
/// for turnstile's state, all of them together; a folder that has more is not allowed.
pub const MAX_CHECKED: usize = 20_000;

/// Where turnstile keeps its own state, as `config` says: `data_dir`, `sandboxes`, the config
/// file and the files it names for OAuth (the private paths of every [`Request`]).
pub fn own_state(config: &crate::config::Config) -> Vec<PathBuf> {
    let mut out = vec![
        config.server.data_dir.clone(),
        config.server.sandboxes.clone(),
        config.path.clone(),
    ];
    for s in &config.mcp_servers {
        if let Some(o) = &s.oauth {
            out.extend(o.private_key_file.clone());
            out.extend(o.idp.as_ref().and_then(|i| i.assertion_file.clone()));
        }
    }
    out
}

/// Whether a file beside the config (or in another instance's config folder) is turnstile's.
fn is_turnstile_file(name: &[u8]) -> bool {
    name.starts_with(b"turnstile")
        || (name.starts_with(b"tools") && name.ends_with(b".toml"))
        || name == b".env"
        || name.ends_with(b".env")
}

/// The turnstile files in folder `dir` (resolved).
fn beside(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten().take(MAX_SPLIT_ENTRIES) {
        if is_turnstile_file(entry.file_name().as_encoded_bytes()) {
            out.push(dir.join(entry.file_name()));
        }
    }
}

/// Whether `path` is a data folder's `instance` file (a PostgreSQL-backed instance's name).
fn is_instance_file(path: &Path) -> bool {
    let mut head = [0u8; 64];
    let n = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    std::str::from_utf8(&head[..n]).is_ok_and(|s| crate::ids::is_valid("inst", s.trim()))
}

/// Turnstile state beneath `root` (resolved, not itself private), added to `found`: see the
/// module's doc. `Err` when `budget` entries were not enough to look through it all.
fn find_state(
    root: &Path,
    private: &[PathBuf],
    budget: &mut usize,
    found: &mut Vec<PathBuf>,
) -> Result<(), ()> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if private
            .iter()
            .chain(found.iter())
            .any(|p| dir.starts_with(p))
        {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            *budget = budget.checked_sub(1).ok_or(())?;
            let name = entry.file_name();
            let name = name.as_encoded_bytes();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                if std::str::from_utf8(name).is_ok_and(|n| crate::ids::is_valid("sess", n)) {
                    // A session's workspace: its folder is a sandboxes folder.
                    found.push(dir.clone());
                    break;
                }
                stack.push(entry.path());
            } else if name.starts_with(b"turnstile.db")
                || (name == b"instance" && is_instance_file(&entry.path()))
            {
                found.push(dir.clone());
                break;
            } else if name == b"tools.toml" {
                beside(&dir, found);
            }
        }
    }
    Ok(())
}

/// Whether this kernel enforces Landlock (checked once).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessFs::from_write(ABI::V1))
            .and_then(|r| r.create())
            .is_ok()
    })
}

/// The kernel's Landlock ABI version (0 when it has none).
pub fn kernel_abi() -> i64 {
    static ABI_VERSION: OnceLock<i64> = OnceLock::new();
    *ABI_VERSION.get_or_init(|| {
        // LANDLOCK_CREATE_RULESET_VERSION: with a null attr and size 0, returns the ABI.
        const VERSION: libc::c_uint = 1;
        // SAFETY: this form of the call reads no memory; it returns a number or -1.
        let v = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<libc::c_void>(),
                0usize,
                VERSION,
            )
        };
        v.max(0)
    })
}

/// Whether the kernel can restrict TCP (Landlock ABI 4).
pub fn restricts_tcp() -> bool {
    kernel_abi() >= 4
}

/// What a child may reach, before it is resolved into rules.
#[derive(Debug, Default, Clone)]
pub struct Request {
    /// The command as configured (a name looked up on `path_var`, or a path).
    pub command: String,
    /// The args as the child gets them (`{workspace}` replaced).
    pub args: Vec<String>,
    /// The child's `PATH`.
    pub path_var: Option<std::ffi::OsString>,
    /// The child's `HOME`.
    pub home: Option<PathBuf>,
    /// The instance's own workspace: read and write, even inside a private folder.
    pub workspace: Option<PathBuf>,
    /// Other read-write folders (a configured `cwd`), subject to the private rule.
    pub read_write: Vec<PathBuf>,
    /// Never reachable: turnstile's own state ([`own_state`]).
    pub private: Vec<PathBuf>,
    /// TCP allowed.
    pub network: bool,
}

/// What a rule grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rights {
    /// Read, list, execute.
    Read,
    /// Everything.
    ReadWrite,
}

/// The resolved rules: each path (symlinks resolved) with its rights.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Plan {
    pub rules: Vec<(PathBuf, Rights)>,
    pub network: bool,
    /// Folders named in the args or as `cwd` that were not allowed, with why (for the log).
    pub refused: Vec<(PathBuf, String)>,
}

impl Plan {
    /// Whether `path` (resolved) falls under a rule granting at least `rights`.
    pub fn allows(&self, path: &Path, rights: Rights) -> bool {
        let path = resolve(path).unwrap_or_else(|| path.to_path_buf());
        self.rules
            .iter()
            .any(|(p, r)| path.starts_with(p) && (rights == Rights::Read || *r == rights))
    }
}

/// A path with symlinks resolved; a missing path as its resolved parent plus its name.
fn resolve(p: &Path) -> Option<PathBuf> {
    if let Ok(c) = p.canonicalize() {
        return Some(c);
    }
    let parent = p.parent()?.canonicalize().ok()?;
    Some(parent.join(p.file_name()?))
}

/// The folders an operator names (`read_write`, and the absolute paths in the args): looked
/// through for state before they are allowed.
fn named_folders(req: &Request) -> Vec<(PathBuf, Rights)> {
    req.read_write
        .iter()
        .map(|p| (p.clone(), Rights::ReadWrite))
        .chain(req.args.iter().filter_map(|a| {
            let p = Path::new(a);
            if !p.is_absolute() || !p.exists() {
                return None;
            }
            let dir = if p.is_dir() { p } else { p.parent()? };
            Some((dir.to_path_buf(), Rights::Read))
        }))
        .collect()
}

/// Folders with the rights they are allowed, and folders refused with why.
type Checked = (Vec<(PathBuf, Rights)>, Vec<(PathBuf, String)>);

/// The named folders that hold none of turnstile's state (`private`, to which the state files
/// found are added), and the ones refused with why.
fn check_named(named: Vec<(PathBuf, Rights)>, private: &mut Vec<PathBuf>) -> Checked {
    let mut refused = Vec::new();
    let mut budget = MAX_CHECKED;
    let mut found = Vec::new();
    let mut checked = Vec::new();
    for (dir, rights) in named {
        let Ok(dir) = dir.canonicalize() else {
            continue;
        };
        if private.iter().any(|p| dir.starts_with(p)) {
            continue;
        }
        if checked
            .iter()
            .any(|(d, _): &(PathBuf, Rights)| dir.starts_with(d))
        {
            checked.push((dir, rights));
            continue;
        }
        match find_state(&dir, private, &mut budget, &mut found) {
            Ok(()) => checked.push((dir, rights)),
            Err(()) => refused.push((
                dir,
                format!(
                    "it has more entries than turnstile looks through for its own state ({MAX_CHECKED}); name a narrower folder"
                ),
            )),
        }
    }
    private.extend(found);
    (checked, refused)
}

/// Resolve a request into rules (reads the file system: symlinks, folder entries).
pub fn plan(req: &Request) -> Plan {
    let mut private: Vec<PathBuf> = req.private.iter().filter_map(|p| resolve(p)).collect();
    for file in private.clone() {
        if file.is_file() {
            if let Some(dir) = file.parent() {
                beside(dir, &mut private);
            }
        }
    }
    let (checked, refused) = check_named(named_folders(req), &mut private);
    let mut rules = Vec::new();
    if let Some(ws) = req.workspace.as_ref().and_then(|w| resolve(w)) {
        // Its own workspace may lie inside a private folder (turnstile puts it there); it
        // must not hold one.
        let inner: Vec<PathBuf> = private
            .iter()
            .filter(|f| !ws.starts_with(f))
            .cloned()
            .collect();
        Builder::new(&inner).add(&ws, Rights::ReadWrite, &mut rules);
    }
    let mut b = Builder::new(&private);
    for (p, rights) in &checked {
        b.add(p, *rights, &mut rules);
    }
    for p in SYSTEM_READ {
        b.add(Path::new(p), Rights::Read, &mut rules);
    }
    // Often a link out of /etc (to /run/systemd/resolve/...): the file itself.
    b.add(Path::new("/etc/resolv.conf"), Rights::Read, &mut rules);
    for p in command_prefixes(&req.command, req.path_var.as_deref(), req.home.as_deref()) {
        b.add(&p, Rights::Read, &mut rules);
    }
    if let Some(home) = &req.home {
        b.add(&home.join(".local/lib"), Rights::Read, &mut rules);
        for (dir, rights) in launcher_caches(&req.command) {
            b.add(&home.join(dir), *rights, &mut rules);
        }
    }
    for d in DEVICES_RW {
        b.add(Path::new(d), Rights::ReadWrite, &mut rules);
    }
    for d in DEVICES_READ {
        b.add(Path::new(d), Rights::Read, &mut rules);
    }
    Plan {
        rules,
        network: req.network,
        refused,
    }
}

struct Builder<'a> {
    private: &'a [PathBuf],
    /// Folders already split (a symlink loop cannot recurse forever).
    seen: HashSet<PathBuf>,
}

impl<'a> Builder<'a> {
    fn new(private: &'a [PathBuf]) -> Self {
        Builder {
            private,
            seen: HashSet::new(),
        }
    }

    /// Allow `path` (resolved), or, when it holds a private folder, its entries but that one.
    fn add(&mut self, path: &Path, rights: Rights, out: &mut Vec<(PathBuf, Rights)>) {
        let Ok(c) = path.canonicalize() else { return };
        if self.private.iter().any(|f| c.starts_with(f)) {
            return;
        }
        if self.private.iter().any(|f| f.starts_with(&c)) {
            if !c.is_dir() || !self.seen.insert(c.clone()) {
                return;
            }
            let Ok(entries) = std::fs::read_dir(&c) else {
                return;
            };
            for entry in entries.flatten().take(MAX_SPLIT_ENTRIES) {
                self.add(&entry.path(), rights, out);
            }
            return;
        }
        if !out.iter().any(|(p, r)| p == &c && *r == rights) {
            out.push((c, rights));
        }
    }
}

/// Where a command is installed: the folder above its `bin` (or `shims`) folder, or its own
/// folder; for the path as found on `PATH` and for its resolved target. Never `/` or HOME.
fn command_prefixes(command: &str, path_var: Option<&OsStr>, home: Option<&Path>) -> Vec<PathBuf> {
    let Some(found) = which(command, path_var) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for exe in [Some(found.clone()), found.canonicalize().ok()]
        .into_iter()
        .flatten()
    {
        let Some(dir) = exe.parent() else { continue };
        let install = match dir.file_name().and_then(|n| n.to_str()) {
            Some("bin" | "sbin" | "shims") => dir.parent().unwrap_or(dir),
            _ => dir,
        };
        let too_wide = |p: &Path| p.parent().is_none() || Some(p) == home;
        let pick = if too_wide(install) { dir } else { install };
        if !too_wide(pick) && !out.iter().any(|p: &PathBuf| p == pick) {
            out.push(pick.to_path_buf());
        }
    }
    out
}

/// The command's path: itself when it has a slash, else the first match on `PATH`.
fn which(command: &str, path_var: Option<&OsStr>) -> Option<PathBuf> {
    if command.contains('/') {
        return Some(PathBuf::from(command));
    }
    std::env::split_paths(path_var?)
        .map(|dir| dir.join(command))
        .find(|p| p.is_file())
}

/// A launcher's cache under HOME, which it must write to work at all.
fn launcher_caches(command: &str) -> &'static [(&'static str, Rights)] {
    let name = Path::new(command)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    match name {
        "npx" | "npm" => &[(".npm", Rights::ReadWrite)],
        "uvx" | "uv" => &[
            (".cache/uv", Rights::ReadWrite),
            (".local/share/uv", Rights::Read),
        ],
        _ => &[],
    }
}

/// A ruleset enforcing `plan`, ready to be enforced in a child.
pub fn ruleset(plan: &Plan) -> Result<RulesetCreated, String> {
    let all = AccessFs::from_all(ABI_WANTED);
    let read = AccessFs::from_read(ABI_WANTED);
    let mut attr = Ruleset::default()
        .handle_access(all)
        .map_err(|e| format!("cannot build the Landlock ruleset: {e}"))?;
    let mut scope: landlock::BitFlags<Scope> = Scope::Signal.into();
    if !plan.network {
        attr = attr
            .handle_access(AccessNet::from_all(ABI_WANTED))
            .map_err(|e| format!("cannot build the Landlock ruleset: {e}"))?;
        scope |= Scope::AbstractUnixSocket;
    }
    let mut created = attr
        .scope(scope)
        .and_then(|r| r.create())
        .map_err(|e| format!("cannot build the Landlock ruleset: {e}"))?;
    for (path, rights) in &plan.rules {
        let fd = PathFd::new(path).map_err(|e| format!("Landlock: {}: {e}", path.display()))?;
        let mut access = match rights {
            Rights::Read => read,
            Rights::ReadWrite => all,
        };
        if !path.is_dir() {
            access &= AccessFs::from_file(ABI_WANTED);
        }
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| format!("Landlock rule for {}: {e}", path.display()))?;
    }
    Ok(created)
}

/// Enforce `ruleset` in the child between fork and exec.
pub fn confine(cmd: &mut tokio::process::Command, ruleset: RulesetCreated) {
    let slot = std::sync::Mutex::new(Some(ruleset));
    // SAFETY: the closure runs in the forked child before exec; it only takes the prepared
    // ruleset (a private mutex no other thread can hold) and makes the landlock and prctl calls.
    unsafe {
        cmd.pre_exec(move || {
            let ruleset = slot
                .lock()
                .map_err(|_| std::io::Error::other("landlock slot poisoned"))?
                .take();
            if let Some(r) = ruleset {
                r.restrict_self()
                    .map_err(|e| std::io::Error::other(format!("landlock: {e}")))?;
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests;
