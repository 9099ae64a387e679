//! Landlock confinement for MCP children (`sandbox = "landlock"`): the child may read what it
//! could read before, but may write only beneath its workspace (and to `/dev/null`). The ruleset
//! is built in the parent and enforced in the child right before `exec`, so the server never
//! runs unconfined. Where the kernel has no Landlock, such a server is refused, never started
//! unconfined.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use landlock::{
    AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreated,
    RulesetCreatedAttr, ABI,
};

/// The newest ABI we ask for; older kernels get what they support (best effort above V1).
const ABI_WANTED: ABI = ABI::V5;

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

/// A ruleset allowing writes only beneath `writable`, ready to be enforced in a child.
pub fn ruleset(writable: &[PathBuf]) -> Result<RulesetCreated, String> {
    let write = AccessFs::from_write(ABI_WANTED);
    let mut created = Ruleset::default()
        .handle_access(write)
        .and_then(|r| r.create())
        .map_err(|e| format!("cannot build the Landlock ruleset: {e}"))?;
    for dir in writable {
        let fd = PathFd::new(dir).map_err(|e| format!("Landlock: {}: {e}", dir.display()))?;
        created = created
            .add_rule(PathBeneath::new(fd, write))
            .map_err(|e| format!("Landlock rule for {}: {e}", dir.display()))?;
    }
    if let Ok(fd) = PathFd::new(Path::new("/dev/null")) {
        created = created
            .add_rule(PathBeneath::new(fd, AccessFs::WriteFile))
            .map_err(|e| format!("Landlock rule for /dev/null: {e}"))?;
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
