//! File systems made for a test and taken down by it: a size-limited tmpfs
//! (to fill), and an ext4 on a loop device that the kernel turns read-only
//! on an error (`errors=remount-ro`, triggered through ext4's
//! `trigger_fs_error`), then checked (`e2fsck`) and mounted again.
//!
//! Mounting needs root: [`root_or_skip`] says in one line why a test skips
//! elsewhere, and fails instead under CI (`CI=true`), where the tests run
//! as root and must not skip. Every [`Mount`] is unmounted when dropped (a
//! lazy unmount if a process still holds it), and registered so that the
//! watchdog unmounts it before it aborts a hung test
//! ([`unmount_all_registered`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use super::wait;

/// Mount points of live [`Mount`]s.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Whether the test may mount; prints why not (one line) and returns
/// `false` when not root, panics when not root under CI.
pub fn root_or_skip(test: &str) -> bool {
    // SAFETY: plain syscall without arguments.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{test} needs root to mount file systems, and CI runs as root"
    );
    eprintln!("skipped: {test} mounts file systems, which needs root");
    false
}

/// Lazily unmounts every registered mount (the watchdog's last step).
pub fn unmount_all_registered() {
    let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    for path in live.iter() {
        let _ = Command::new("umount").arg("-l").arg(path).status();
    }
}

/// Runs `cmd`, panicking with its output when it fails.
fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A file system mounted for a test (see the module docs).
pub struct Mount {
    /// The mount point.
    pub path: PathBuf,
    /// The ext4 image, for a loop mount.
    image: Option<PathBuf>,
    mounted: bool,
}

impl Mount {
    /// A tmpfs of `bytes` at `path` (created).
    pub fn tmpfs(path: &Path, bytes: u64) -> Mount {
        std::fs::create_dir_all(path).expect("mount point");
        run(Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={bytes}")]).arg("tmpfs").arg(path));
        Mount::register(path, None)
    }

    /// An ext4 of `bytes` in `image`, mounted from a loop device at `path`
    /// with `errors=remount-ro`.
    pub fn ext4(path: &Path, image: &Path, bytes: u64) -> Mount {
        std::fs::create_dir_all(path).expect("mount point");
        let f = std::fs::File::create(image).expect("image");
        f.set_len(bytes).expect("image size");
        drop(f);
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(image));
        let m = Mount::register(path, Some(image.to_path_buf()));
        m.mount_ext4();
        m
    }

    fn register(path: &Path, image: Option<PathBuf>) -> Mount {
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).push(path.to_path_buf());
        Mount { path: path.to_path_buf(), image, mounted: true }
    }

    fn mount_ext4(&self) {
        let image = self.image.as_ref().expect("an ext4 mount");
        run(Command::new("mount").args(["-o", "loop,errors=remount-ro"]).arg(image).arg(&self.path));
    }

    /// The loop device's name (`loop3`) of an ext4 mount.
    fn device(&self) -> String {
        let out = Command::new("findmnt").args(["-n", "-o", "SOURCE"]).arg(&self.path).output().expect("findmnt");
        let source = String::from_utf8_lossy(&out.stdout).trim().to_string();
        source.rsplit('/').next().unwrap_or_default().to_string()
    }

    /// Makes ext4 report an error, as a failing disk would: with
    /// `errors=remount-ro` the file system refuses every write from then on
    /// (`EROFS`), until it is unmounted, checked and mounted again.
    pub fn trigger_error(&self) {
        let knob = format!("/sys/fs/ext4/{}/trigger_fs_error", self.device());
        std::fs::write(&knob, "emq test: disk error\n").unwrap_or_else(|e| panic!("{knob}: {e}"));
    }

    /// Unmounts (waiting up to `within` for the processes using it to let
    /// go), checks the file system and mounts it again: what an operator
    /// does after the kernel turned it read-only. Whether the unmount
    /// succeeded without forcing.
    pub fn check_and_remount(&mut self, within: Duration) -> bool {
        let clean = wait::until(within, || {
            Command::new("umount").arg(&self.path).output().map(|o| o.status.success()).unwrap_or(false)
        });
        if !clean {
            run(Command::new("umount").arg("-l").arg(&self.path));
        }
        let image = self.image.clone().expect("an ext4 mount");
        // 0: clean, 1: errors fixed; anything else fails the test.
        let status = Command::new("e2fsck").args(["-f", "-y"]).arg(&image).output().expect("e2fsck");
        assert!(matches!(status.status.code(), Some(0 | 1)), "e2fsck: {}", String::from_utf8_lossy(&status.stdout));
        self.mount_ext4();
        clean
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let ok = Command::new("umount").arg(&self.path).output().map(|o| o.status.success()).unwrap_or(false);
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(&self.path).status();
            }
            self.mounted = false;
        }
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).retain(|p| p != &self.path);
        if let Some(image) = &self.image {
            let _ = std::fs::remove_file(image);
        }
    }
}
