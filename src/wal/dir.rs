//! The data directory: its locks, its identity while the router runs, and
//! the switch from one log layout to another.
//!
//! ```text
//! <data dir>/lock              exclusive lock (flock) while a router runs
//! <data dir>/wal/shard-<n>/    the log of shard n (see super::segment)
//! <data dir>/wal.new/          a new layout being written (re-sharding, damage skipped)
//! <data dir>/wal.old/          the layout being replaced
//! <data dir>/damaged/          segments set aside by --recover-skip-damaged
//! ```
//!
//! # Two locks
//!
//! A router holds the data directory by two locks: `flock` on the file
//! `lock` in it, and an abstract Unix socket named after the directory's
//! canonical path (`emq-router-data-dir/<sha1 of the path>`). The file
//! lock goes with the directory when someone deletes or replaces it; the
//! socket name cannot be deleted, and the kernel drops it when the process
//! ends (even by `kill -9`). So a second router is refused on a path whose
//! router runs, also after that router's directory was deleted (issue 25).
//! Abstract socket names belong to a network namespace: two routers in
//! different network namespaces see only each other's file lock.
//!
//! # Identity
//!
//! [`DataDir::check`] compares the directory and its lock file as opened
//! with what their paths name now: deleted, moved away or replaced (a
//! volume mounted over it) shows as [`FaultKind::Gone`]. A shard's log
//! checks its own directory and segment the same way before it
//! acknowledges anything ([`Identity`]). [`DataDir::release`] closes the
//! files (so a file system gone read-only can be unmounted and checked),
//! keeping the socket lock; [`DataDir::ensure`] re-creates the directory
//! and takes its file lock again.
//!
//! # Layout switches
//!
//! A new layout is written to `wal.new`, synced, marked complete (the file
//! `wal.new/complete`), then `wal` becomes `wal.old`, `wal.new` becomes
//! `wal` and `wal.old` is removed. [`DataDir::settle`] finishes or undoes
//! an interrupted switch, so a crash at any step leaves one whole layout.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use super::WalError;
use crate::joblog::FaultKind;
use crate::limits;

/// The data directory, locked for this process (see the module docs).
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    /// The abstract socket holding the directory's name for the process.
    _name: UnixListener,
    open: Mutex<Opened>,
    /// The device of the directory's file system at start: the directory
    /// is only made again on it (see [`DataDir::ensure`]).
    dev: u64,
}

/// The directory and lock file as this process opened them (`None` once
/// released).
#[derive(Debug, Default)]
struct Opened {
    dir: Option<File>,
    lock: Option<File>,
}

impl DataDir {
    /// Creates `path` if needed and takes both its locks (the file lock is
    /// retried for about a second: see [`limits::DATA_DIR_LOCK_TRIES`]).
    ///
    /// # Errors
    /// [`WalError::Io`] naming the directory or lock file;
    /// [`WalError::Locked`] when another process holds either lock.
    pub fn lock(path: &Path) -> Result<DataDir, WalError> {
        fs::create_dir_all(path).map_err(WalError::io(path))?;
        let path = fs::canonicalize(path).map_err(WalError::io(path))?;
        let lock = open_lock(&path)?;
        let mut tries = 0;
        let name = loop {
            // A router that is just stopping still holds both for a moment.
            match bind_name(&path)? {
                Some(name) if lock.try_lock().is_ok() => break name,
                _ => {}
            }
            tries += 1;
            if tries >= limits::DATA_DIR_LOCK_TRIES {
                return Err(WalError::Locked { dir: path });
            }
            std::thread::sleep(limits::DATA_DIR_LOCK_RETRY);
        };
        let dir = File::open(&path).map_err(WalError::io(&path))?;
        let dev = dir.metadata().map_err(WalError::io(&path))?.dev();
        Ok(DataDir { path, _name: name, open: Mutex::new(Opened { dir: Some(dir), lock: Some(lock) }), dev })
    }

    /// The directory (canonical).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The log's root, `<data dir>/wal`.
    pub fn wal(&self) -> PathBuf {
        self.path.join("wal")
    }

    /// Where a new layout is written, `<data dir>/wal.new`.
    pub fn wal_new(&self) -> PathBuf {
        self.path.join("wal.new")
    }

    /// Where damaged segments are moved, `<data dir>/damaged`.
    pub fn damaged(&self) -> PathBuf {
        self.path.join("damaged")
    }

    /// Whether the directory and its lock file are still the ones this
    /// process opened (and open): [`FaultKind::Gone`] when either was
    /// deleted, moved or replaced, or was released.
    pub fn check(&self) -> Result<(), FaultKind> {
        self.open.lock().check(&self.path)
    }

    /// Closes the directory and lock file (the socket lock stays): after a
    /// fault, so that the file system can be unmounted and checked.
    pub fn release(&self) {
        let mut open = self.open.lock();
        if open.dir.is_some() {
            tracing::warn!(dir = %self.path.display(), "data directory released until the log can be repaired");
        }
        *open = Opened::default();
    }

    /// Makes the directory usable again after [`DataDir::check`] failed or
    /// [`DataDir::release`]: re-creates it when it is missing, opens it and
    /// takes the file lock of its (perhaps new) lock file. Does nothing
    /// when the check passes.
    ///
    /// # Errors
    /// The fault's kind and the OS error: the path cannot be created or
    /// opened ([`FaultKind::of`]), or [`FaultKind::Taken`] when another
    /// process holds the new lock file.
    pub fn ensure(&self) -> Result<(), (FaultKind, std::io::Error)> {
        // Under the lock: two shards repairing at once make it again once.
        let mut open = self.open.lock();
        if open.check(&self.path).is_ok() {
            return Ok(());
        }
        let io = |e: std::io::Error| (FaultKind::of(&e), e);
        let existed = self.path.exists();
        fs::create_dir_all(&self.path).map_err(io)?;
        let dir = File::open(&self.path).map_err(io)?;
        let dev = dir.metadata().map_err(io)?.dev();
        if dev != self.dev {
            // Its file system was unmounted (or another mounted over it):
            // a log made here would live on whatever lies beneath (the
            // root file system, say) and vanish when it is mounted back.
            drop(dir);
            if !existed {
                let _ = fs::remove_dir(&self.path);
            }
            let why = format!(
                "{} is now on another file system (device {}, was {} at start: unmounted?); \
                 the log is not made again there: mount it back, or restart the router",
                self.path.display(),
                dev_name(dev),
                dev_name(self.dev)
            );
            return Err((FaultKind::Gone, std::io::Error::other(why)));
        }
        let lock = open_lock(&self.path).map_err(|e| match e {
            WalError::Io { source, .. } => io(source),
            other => (FaultKind::Other, std::io::Error::other(other.to_string())),
        })?;
        if lock.try_lock().is_err() {
            let why = format!("{}/lock is held by another process", self.path.display());
            return Err((FaultKind::Taken, std::io::Error::other(why)));
        }
        sync_dir(&self.path).map_err(|e| match e {
            WalError::Io { source, .. } => io(source),
            other => (FaultKind::Other, std::io::Error::other(other.to_string())),
        })?;
        tracing::warn!(dir = %self.path.display(), "data directory opened and locked again");
        *open = Opened { dir: Some(dir), lock: Some(lock) };
        Ok(())
    }

    /// Free bytes for unprivileged writers on the directory's file system
    /// (`statvfs`: available blocks × fragment size).
    ///
    /// # Errors
    /// The OS error (the directory is gone, say).
    pub fn free_bytes(&self) -> std::io::Result<u64> {
        free_bytes(&self.path)
    }

    /// Free and total bytes of the directory's file system (one
    /// `statvfs`, see [`space`]).
    ///
    /// # Errors
    /// The OS error (the directory is gone, say).
    pub fn space(&self) -> std::io::Result<Space> {
        space(&self.path)
    }

    /// Finishes or undoes a layout switch a crash interrupted (see the
    /// module docs).
    ///
    /// # Errors
    /// [`WalError::Io`] naming the path that could not be renamed or removed.
    pub fn settle(&self) -> Result<(), WalError> {
        let (wal, new, old) = (self.wal(), self.wal_new(), self.path.join("wal.old"));
        if new.exists() {
            if new.join("complete").exists() {
                if wal.exists() {
                    fs::rename(&wal, &old).map_err(WalError::io(&wal))?;
                }
                fs::rename(&new, &wal).map_err(WalError::io(&new))?;
                sync_dir(&self.path)?;
                tracing::info!(dir = %wal.display(), "finished switching to a new log layout");
            } else {
                tracing::warn!(dir = %new.display(), "removing an unfinished new log layout");
                fs::remove_dir_all(&new).map_err(WalError::io(&new))?;
            }
        }
        if old.exists() {
            fs::remove_dir_all(&old).map_err(WalError::io(&old))?;
        }
        Ok(())
    }

    /// Makes the layout written in [`DataDir::wal_new`] the log (marks it
    /// complete first, so a crash half-way is finished by the next
    /// [`DataDir::settle`]).
    ///
    /// # Errors
    /// [`WalError::Io`] naming the path.
    pub fn switch_to_new(&self) -> Result<(), WalError> {
        let new = self.wal_new();
        let marker = new.join("complete");
        File::create(&marker).and_then(|f| f.sync_all()).map_err(WalError::io(&marker))?;
        sync_dir(&new)?;
        self.settle()
    }
}

impl Opened {
    fn check(&self, path: &Path) -> Result<(), FaultKind> {
        let (Some(dir), Some(lock)) = (&self.dir, &self.lock) else { return Err(FaultKind::Gone) };
        same_file(dir, path)?;
        same_file(lock, &path.join("lock"))
    }
}

/// An open file or directory and the path it was opened at: whether the
/// path still names it ([`Identity::check`]).
#[derive(Debug)]
pub struct Identity {
    /// The path.
    pub path: PathBuf,
    /// The file or directory, open.
    pub file: File,
}

impl Identity {
    /// Opens `path` (a directory or file, read-only).
    ///
    /// # Errors
    /// The OS error.
    pub fn open(path: &Path) -> std::io::Result<Identity> {
        Ok(Identity { path: path.to_path_buf(), file: File::open(path)? })
    }

    /// [`FaultKind::Gone`] when the file was deleted or its path now names
    /// something else.
    pub fn check(&self) -> Result<(), FaultKind> {
        same_file(&self.file, &self.path)
    }
}

/// Whether `file` is still linked and `path` still names it.
fn same_file(file: &File, path: &Path) -> Result<(), FaultKind> {
    let held = file.metadata().map_err(|e| FaultKind::of(&e))?;
    if held.nlink() == 0 {
        return Err(FaultKind::Gone);
    }
    let named = fs::metadata(path).map_err(|_| FaultKind::Gone)?;
    if (named.dev(), named.ino()) != (held.dev(), held.ino()) {
        return Err(FaultKind::Gone);
    }
    Ok(())
}

/// Removes `name` from the open directory `dir` (`unlinkat`).
///
/// # Errors
/// The OS error.
pub fn unlink_at(dir: &File, name: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(name.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: `dir` is an open directory for the call's duration and `c` a
    // NUL-terminated name.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A device number as `major:minor`.
fn dev_name(dev: u64) -> String {
    format!("{}:{}", libc::major(dev), libc::minor(dev))
}

/// Removes, through the open directory `dir` (not by its path, which may
/// name another directory now: the directory was moved), every log file
/// in it: segments and `held`; syncs it. How many segments went.
///
/// # Errors
/// The OS error of listing or syncing it (a file that cannot be removed is
/// logged and left).
pub fn remove_log_files_at(dir: &File) -> std::io::Result<u64> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let fd = dir.as_raw_fd();
    // The directory's entries, read through the descriptor.
    let listing = fs::read_dir(format!("/proc/self/fd/{fd}"))?;
    let mut removed = 0;
    for entry in listing {
        let name = entry?.file_name();
        let segment = name.to_str().and_then(super::segment::parse_segment_name).is_some();
        if !segment && name != super::held::HELD_FILE && name != super::held::HELD_TMP_FILE {
            continue;
        }
        let c = std::ffi::CString::new(name.as_bytes()).map_err(std::io::Error::other)?;
        // SAFETY: `fd` is an open directory for the call's duration and `c`
        // a NUL-terminated name in it.
        if unsafe { libc::unlinkat(fd, c.as_ptr(), 0) } != 0 {
            let e = std::io::Error::last_os_error();
            tracing::warn!(file = %name.to_string_lossy(), error = %e, "cannot remove a file of the log's old directory");
            continue;
        }
        removed += u64::from(segment);
    }
    dir.sync_all()?;
    Ok(removed)
}

/// Whether a segment file this log writes is still linked; its length.
pub fn linked(file: &File) -> Result<u64, FaultKind> {
    match file.metadata() {
        Ok(m) if m.nlink() > 0 => Ok(m.len()),
        Ok(_) => Err(FaultKind::Gone),
        Err(e) => Err(FaultKind::of(&e)),
    }
}

/// Free bytes on the file system holding `path` (see [`DataDir::free_bytes`]).
///
/// # Errors
/// The OS error.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    space(path).map(|s| s.free)
}

/// A file system's space, from one `statvfs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Free bytes for unprivileged writers (available blocks × fragment size).
    pub free: u64,
    /// The file system's size (blocks × fragment size).
    pub total: u64,
}

/// Free and total bytes of the file system holding `path`.
///
/// # Errors
/// The OS error.
pub fn space(path: &Path) -> std::io::Result<Space> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path; `st` is written by statvfs
    // before it is read, and read only when the call succeeded.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    Ok(Space { free: st.f_bavail.saturating_mul(st.f_frsize), total: st.f_blocks.saturating_mul(st.f_frsize) })
}

/// Binds the abstract socket name of the data directory at `path`;
/// `None` when another process holds it.
fn bind_name(path: &Path) -> Result<Option<UnixListener>, WalError> {
    use sha1::{Digest, Sha1};
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    let digest = Sha1::digest(path.as_os_str().as_bytes());
    let name = format!("emq-router-data-dir/{}", hex::encode(digest));
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).map_err(WalError::io(path))?;
    match UnixListener::bind_addr(&addr) {
        Ok(l) => Ok(Some(l)),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Ok(None),
        Err(e) => Err(WalError::Io { path: path.to_path_buf(), source: e }),
    }
}

fn open_lock(dir: &Path) -> Result<File, WalError> {
    let lock_path = dir.join("lock");
    OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(WalError::io(&lock_path))
}

/// Syncs a directory, so that files created, renamed or removed in it stay so.
///
/// # Errors
/// [`WalError::Io`] naming the directory.
pub fn sync_dir(dir: &Path) -> Result<(), WalError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(WalError::io(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_and_a_released_one_is_taken() {
        let tmp = tempfile::tempdir().unwrap();
        let first = DataDir::lock(tmp.path()).unwrap();
        let err = DataDir::lock(tmp.path()).unwrap_err();
        assert!(err.to_string().contains("in use by another emq-router"), "{err}");
        drop(first);
        DataDir::lock(tmp.path()).unwrap();
    }

    #[test]
    fn a_deleted_directory_stays_locked_and_is_seen_gone_then_made_again() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("data");
        let first = DataDir::lock(&path).unwrap();
        assert_eq!(first.check(), Ok(()));
        fs::remove_dir_all(&path).unwrap();
        assert_eq!(first.check(), Err(FaultKind::Gone));
        let err = DataDir::lock(&path).unwrap_err();
        assert!(matches!(err, WalError::Locked { .. }), "the socket lock outlives the directory: {err}");
        first.ensure().unwrap();
        assert_eq!(first.check(), Ok(()));
        assert!(path.join("lock").exists());
        // Replaced: moved away, a new directory in its place.
        fs::rename(&path, tmp.path().join("moved")).unwrap();
        fs::create_dir(&path).unwrap();
        assert_eq!(first.check(), Err(FaultKind::Gone));
        first.ensure().unwrap();
        assert_eq!(first.check(), Ok(()));
        // Released, then taken again.
        first.release();
        assert_eq!(first.check(), Err(FaultKind::Gone));
        first.ensure().unwrap();
        drop(first);
        DataDir::lock(&path).unwrap();
    }

    #[test]
    fn a_directory_made_again_and_locked_by_another_is_taken() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("data");
        let first = DataDir::lock(&path).unwrap();
        fs::remove_dir_all(&path).unwrap();
        // Someone else makes it again and locks its new lock file first
        // (another open file: flock locks conflict within one process too).
        fs::create_dir_all(&path).unwrap();
        let other = File::create(path.join("lock")).unwrap();
        other.try_lock().unwrap();
        let (kind, e) = first.ensure().unwrap_err();
        assert_eq!(kind, FaultKind::Taken, "{e}");
        assert!(e.to_string().contains("held by another process"), "{e}");
        drop(other);
        first.ensure().unwrap();
        assert_eq!(first.check(), Ok(()));
    }

    #[test]
    fn settle_finishes_a_complete_switch_and_drops_an_unfinished_one() {
        let tmp = tempfile::tempdir().unwrap();
        let d = DataDir::lock(tmp.path()).unwrap();
        fs::create_dir_all(d.wal().join("shard-0")).unwrap();
        fs::create_dir_all(d.wal_new().join("shard-1")).unwrap();
        d.settle().unwrap();
        assert!(d.wal().join("shard-0").exists() && !d.wal_new().exists(), "unfinished: old layout kept");
        fs::create_dir_all(d.wal_new().join("shard-1")).unwrap();
        d.switch_to_new().unwrap();
        assert!(d.wal().join("shard-1").exists() && !d.wal().join("shard-0").exists());
        assert!(!d.wal_new().exists() && !tmp.path().join("wal.old").exists());
    }

    #[test]
    fn free_bytes_reads_the_file_system() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(free_bytes(tmp.path()).unwrap() > 0);
        assert!(free_bytes(&tmp.path().join("missing")).is_err());
        let s = space(tmp.path()).unwrap();
        assert!(s.total >= s.free && s.total > 0, "{s:?}");
    }
}
