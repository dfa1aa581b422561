//! The data directory: its lock file and the switch from one log layout to
//! another.
//!
//! ```text
//! <data dir>/lock              exclusive lock (flock) while a router runs
//! <data dir>/wal/shard-<n>/    the log of shard n (see super::segment)
//! <data dir>/wal.new/          a new layout being written (re-sharding, damage skipped)
//! <data dir>/wal.old/          the layout being replaced
//! <data dir>/damaged/          segments set aside by --recover-skip-damaged
//! ```
//!
//! A new layout is written to `wal.new`, synced, marked complete (the file
//! `wal.new/complete`), then `wal` becomes `wal.old`, `wal.new` becomes
//! `wal` and `wal.old` is removed. [`DataDir::settle`] finishes or undoes
//! an interrupted switch, so a crash at any step leaves one whole layout.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};

use super::WalError;
use crate::limits;

/// The data directory, locked for this process.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    _lock: File,
}

impl DataDir {
    /// Creates `path` if needed and takes its lock (retried for about a
    /// second: see [`limits::DATA_DIR_LOCK_TRIES`]).
    ///
    /// # Errors
    /// [`WalError::Io`] naming the directory or lock file;
    /// [`WalError::Locked`] when another process holds the lock.
    pub fn lock(path: &Path) -> Result<DataDir, WalError> {
        fs::create_dir_all(path).map_err(WalError::io(path))?;
        let lock_path = path.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(WalError::io(&lock_path))?;
        let mut tries = 0;
        while lock.try_lock().is_err() {
            tries += 1;
            if tries >= limits::DATA_DIR_LOCK_TRIES {
                return Err(WalError::Locked { dir: path.to_path_buf() });
            }
            std::thread::sleep(limits::DATA_DIR_LOCK_RETRY);
        }
        Ok(DataDir { path: path.to_path_buf(), _lock: lock })
    }

    /// The directory.
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

/// Syncs a directory, so that files created, renamed or removed in it stay so.
///
/// # Errors
/// [`WalError::Io`] naming the directory.
pub fn sync_dir(dir: &Path) -> Result<(), WalError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(WalError::io(dir))
}

/// `$XDG_STATE_HOME/emq-router`, else `$HOME/.local/state/emq-router`,
/// else `./emq-router-data` (the scheduler's rule: a log of jobs is state,
/// not configuration or cache).
pub fn default_data_dir() -> PathBuf {
    let nonempty = |v: &str| std::env::var_os(v).filter(|s| !s.is_empty()).map(PathBuf::from);
    if let Some(state) = nonempty("XDG_STATE_HOME") {
        return state.join("emq-router");
    }
    if let Some(home) = nonempty("HOME") {
        return home.join(".local/state/emq-router");
    }
    PathBuf::from("emq-router-data")
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
}
