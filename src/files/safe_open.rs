//! Opening a path inside a workspace so that nothing outside it is ever read.
//!
//! The path is resolved by the kernel relative to the workspace's directory handle with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`: `..` that would climb out, absolute
//! symlinks and symlinks whose target leaves the workspace all fail, at any depth, and since
//! resolution and opening are one system call there is no window between checking and opening.
//! On kernels without `openat2` each component is opened with `O_NOFOLLOW` instead (no symlink
//! is followed at all). The file is opened non-blocking (a FIFO cannot hang the call) and must be
//! a regular file with a single link (a hard link could be a window onto a file outside).

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;

/// Why a path was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OpenError {
    #[error("{0}")]
    Outside(String),
    #[error("no such file in the workspace: {0}")]
    NotFound(String),
    #[error("{path} is {kind}, not a regular file")]
    NotRegular { path: String, kind: &'static str },
    #[error("{path} has several hard links and may be a window onto a file outside the workspace; copy it instead")]
    Linked { path: String },
    #[error("{0}")]
    Invalid(String),
    #[error("cannot read {path}: {message}")]
    Io { path: String, message: String },
}

/// The path relative to the workspace: `/workspace/x` means `x`; other absolute paths, empty
/// paths and NUL bytes are refused.
pub fn relative(user_path: &str) -> Result<&str, OpenError> {
    if user_path.contains('\0') {
        return Err(OpenError::Invalid("the path contains a NUL byte".into()));
    }
    let rel = if user_path == "/workspace" || user_path == "/workspace/" {
        return Err(OpenError::NotRegular {
            path: user_path.into(),
            kind: "the workspace folder",
        });
    } else if let Some(rest) = user_path.strip_prefix("/workspace/") {
        rest
    } else if user_path.starts_with('/') {
        return Err(OpenError::Outside(format!(
            "{user_path} is an absolute path outside the workspace; give a path relative to the workspace, or /workspace/<path>"
        )));
    } else {
        user_path
    };
    let rel = rel.trim_start_matches("./");
    if rel.is_empty() {
        return Err(OpenError::Invalid(
            "the path is empty; name a file in the workspace".into(),
        ));
    }
    Ok(rel)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn open_dir(workspace: &Path) -> Result<OwnedFd, OpenError> {
    let c = CString::new(workspace.as_os_str().as_encoded_bytes())
        .map_err(|_| OpenError::Invalid("the workspace path contains a NUL byte".into()))?;
    // SAFETY: a valid C string; the returned descriptor is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(OpenError::Io {
            path: workspace.display().to_string(),
            message: std::io::Error::last_os_error().to_string(),
        });
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

const FLAGS: i32 = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;

/// How often a `..` walk is retried when the kernel reports a concurrent rename (EAGAIN).
const EAGAIN_RETRIES: usize = 64;

/// `openat2` beneath `dir`, retried while the kernel answers EAGAIN: with RESOLVE_BENEATH it
/// refuses a walk through `..` when any rename or mount happened meanwhile, anywhere on the
/// system, and asks the caller to retry. Each attempt is a complete, atomic resolution, so
/// retrying never weakens the check.
fn openat2_retrying(dir: &OwnedFd, rel: &CString) -> Result<i32, i32> {
    let mut result = openat2_beneath(dir, rel);
    for _ in 0..EAGAIN_RETRIES {
        if result != Err(libc::EAGAIN) {
            break;
        }
        std::thread::yield_now();
        result = openat2_beneath(dir, rel);
    }
    result
}

fn openat2_beneath(dir: &OwnedFd, rel: &CString) -> Result<i32, i32> {
    use std::os::fd::AsRawFd;
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = FLAGS as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: the arguments are a valid descriptor, C string and open_how of the given size.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            rel.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    } as i32;
    if fd < 0 {
        Err(errno())
    } else {
        Ok(fd)
    }
}

/// Without openat2: walk the components, following no symlink at all.
fn open_nofollow(dir: &OwnedFd, rel: &str) -> Result<i32, i32> {
    use std::os::fd::AsRawFd;
    let parts: Vec<&str> = rel
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(libc::EXDEV);
    }
    let mut current: Option<OwnedFd> = None;
    for (i, part) in parts.iter().enumerate() {
        let at = current.as_ref().unwrap_or(dir).as_raw_fd();
        let name = CString::new(*part).map_err(|_| libc::EINVAL)?;
        let last = i + 1 == parts.len();
        let flags = if last {
            FLAGS | libc::O_NOFOLLOW
        } else {
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC
        };
        // SAFETY: valid descriptor and C string.
        let fd = unsafe { libc::openat(at, name.as_ptr(), flags) };
        if fd < 0 {
            return Err(errno());
        }
        if last {
            return Ok(fd);
        }
        // SAFETY: fresh descriptor we own.
        current = Some(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    Err(libc::ENOENT)
}

/// Open `user_path` in `workspace` for reading: the file, its size and its file name.
pub fn open_in_workspace(
    workspace: &Path,
    user_path: &str,
) -> Result<(File, u64, String), OpenError> {
    let rel = relative(user_path)?;
    let dir = open_dir(workspace)?;
    let c =
        CString::new(rel).map_err(|_| OpenError::Invalid("the path contains a NUL byte".into()))?;
    let fd = match openat2_retrying(&dir, &c) {
        Err(libc::ENOSYS) | Err(libc::EPERM) => open_nofollow(&dir, rel),
        other => other,
    };
    let fd = fd.map_err(|e| match e {
        libc::EXDEV => OpenError::Outside(format!(
            "{user_path} leads outside the workspace (through .. or a symlink); only files inside it can be delivered"
        )),
        libc::ELOOP => OpenError::Outside(format!(
            "{user_path} goes through a symlink that cannot be followed safely"
        )),
        libc::ENOENT | libc::ENOTDIR => OpenError::NotFound(user_path.to_string()),
        libc::ENAMETOOLONG => OpenError::Invalid("the path is too long".into()),
        libc::EAGAIN => OpenError::Io {
            path: user_path.to_string(),
            message: "files were being renamed while the path was resolved; try again".into(),
        },
        other => OpenError::Io {
            path: user_path.to_string(),
            message: std::io::Error::from_raw_os_error(other).to_string(),
        },
    })?;
    // SAFETY: fresh descriptor we own.
    let file = unsafe { File::from_raw_fd(fd) };
    let meta = file.metadata().map_err(|e| OpenError::Io {
        path: user_path.to_string(),
        message: e.to_string(),
    })?;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let ft = meta.file_type();
    let kind = if ft.is_dir() {
        Some("a directory")
    } else if ft.is_fifo() {
        Some("a FIFO")
    } else if ft.is_char_device() || ft.is_block_device() {
        Some("a device")
    } else if ft.is_socket() {
        Some("a socket")
    } else if !ft.is_file() {
        Some("not a regular file")
    } else {
        None
    };
    if let Some(kind) = kind {
        return Err(OpenError::NotRegular {
            path: user_path.to_string(),
            kind,
        });
    }
    if meta.nlink() > 1 {
        return Err(OpenError::Linked {
            path: user_path.to_string(),
        });
    }
    let name = rel.rsplit('/').next().unwrap_or(rel).to_string();
    Ok((file, meta.len(), name))
}

#[cfg(test)]
mod tests;
