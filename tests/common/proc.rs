//! Child processes that cannot outlive their test.
//!
//! [`Child::spawn`] starts a command as the leader of its own process group
//! (pgid = its pid), with stdout and stderr in a log file, and registers the
//! group. Dropping the [`Child`] SIGKILLs the whole group (the Python
//! jobmanager forks worker processes into it) and reaps the leader. The
//! watchdog calls [`kill_all_registered`] before it aborts a hung test.
//! As a last resort every child also gets `PR_SET_PDEATHSIG = SIGKILL`.

use std::fs::{self, File};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::wait;

/// Process groups of live [`Child`]ren, by pgid.
static LIVE_GROUPS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// SIGKILLs every registered process group (used by the watchdog).
pub fn kill_all_registered() {
    let groups = LIVE_GROUPS.lock().unwrap_or_else(|e| e.into_inner());
    for &pgid in groups.iter() {
        // SAFETY: plain syscall; pgid is a group this process created.
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
    }
}

/// Makes `cmd` run with its descriptor limit (`RLIMIT_NOFILE`) at `soft`
/// and `hard` (`ulimit -Sn soft -Hn hard`).
pub fn limit_descriptors(cmd: &mut Command, soft: u64, hard: u64) {
    // SAFETY: setrlimit is async-signal-safe; nothing else runs in pre_exec.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit { rlim_cur: soft, rlim_max: hard };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A child process (and its process group), killed by PID on drop.
pub struct Child {
    /// Short name used in messages.
    pub name: String,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
    inner: std::process::Child,
    pgid: i32,
    reaped: Option<ExitStatus>,
}

impl Child {
    /// Starts `cmd` in its own process group with stdin from /dev/null and
    /// stdout+stderr appended to `log`. Panics if it cannot be started.
    pub fn spawn(name: &str, cmd: &mut Command, log: &Path) -> Child {
        let out = File::options().create(true).append(true).open(log).expect("open child log");
        let err = out.try_clone().expect("clone child log handle");
        cmd.stdout(out).stderr(err);
        Child::spawn_keeping_output(name, cmd, log)
    }

    /// Like [`Child::spawn`] but leaves `cmd`'s stdout and stderr as the
    /// caller set them (`log` is only used in messages).
    pub fn spawn_keeping_output(name: &str, cmd: &mut Command, log: &Path) -> Child {
        cmd.stdin(Stdio::null()).process_group(0);
        // SIGHUP at its default: a suite run under `nohup` (which ignores
        // it, and an ignored signal stays ignored across exec) would start
        // every program with it ignored, and the tests of what SIGHUP does
        // would fail. A test of an ignored SIGHUP execs `nohup` itself.
        // SAFETY: prctl and signal are async-signal-safe; nothing else runs
        // in pre_exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                libc::signal(libc::SIGHUP, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut groups = LIVE_GROUPS.lock().unwrap_or_else(|e| e.into_inner());
        let inner = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        let pgid = inner.id() as i32;
        groups.push(pgid);
        Child { name: name.to_string(), log: log.to_path_buf(), inner, pgid, reaped: None }
    }

    /// The leader's PID (= the process group id).
    pub fn pid(&self) -> i32 {
        self.pgid
    }

    /// True while the group leader has not exited.
    pub fn is_alive(&mut self) -> bool {
        self.exit_status().is_none()
    }

    /// The leader's exit status once it has exited (non-blocking).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.reaped.is_none() {
            self.reaped = self.inner.try_wait().ok().flatten();
        }
        self.reaped
    }

    /// SIGKILLs the whole process group at once (`kill -9 -PGID`) and reaps
    /// the leader.
    pub fn kill_group(&mut self) {
        // SAFETY: plain syscall on our own child's process group.
        unsafe { libc::killpg(self.pgid, libc::SIGKILL) };
        if self.reaped.is_none() {
            self.reaped = self.inner.wait().ok();
        }
        LIVE_GROUPS.lock().unwrap_or_else(|e| e.into_inner()).retain(|&g| g != self.pgid);
    }

    /// Sends `sig` to the leader while it has not been reaped. After
    /// `SIGSTOP` it returns once every thread of the leader is stopped (up
    /// to 5 s): the signal is delivered asynchronously, and on a loaded
    /// machine a thread may otherwise still run for a moment (an I/O
    /// thread completing a handshake the test expects to hang; seen once).
    pub fn signal(&mut self, sig: i32) {
        if self.is_alive() {
            // SAFETY: plain syscall on our own, not yet reaped, child.
            unsafe { libc::kill(self.pgid, sig) };
            if sig == libc::SIGSTOP {
                let pid = self.pgid;
                let stopped = wait::until(Duration::from_secs(5), || all_threads_stopped(pid));
                assert!(stopped, "pid {pid}: not every thread stopped 5 s after SIGSTOP");
            }
        }
    }

    /// Sends `sig` to the leader, waits up to `grace` for it to exit, then
    /// SIGKILLs whatever is left of the group. Returns the leader's exit
    /// code (`None`: ended by a signal, or killed after `grace`).
    pub fn stop_with(&mut self, sig: i32, grace: Duration) -> Option<i32> {
        self.signal(sig);
        wait::until(grace, || !self.is_alive());
        self.kill_group();
        self.reaped.and_then(|s| s.code())
    }

    /// SIGTERMs the leader, waits up to `grace` for it to exit, then
    /// SIGKILLs whatever is left of the group. Returns the leader's status.
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.stop_with(libc::SIGTERM, grace);
        self.reaped
    }

    /// The whole log so far (lossy UTF-8).
    pub fn log_text(&self) -> String {
        fs::read(&self.log).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }

    /// The last `n` lines of the log, headed by the child's name and pid.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        let start = lines.len().saturating_sub(n);
        format!(
            "--- {} (pid {}) log tail, {} ---\n{}",
            self.name,
            self.pgid,
            self.log.display(),
            lines[start..].join("\n")
        )
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill_group();
    }
}

/// Runs `cmd` to completion (in its own process group, output in
/// `<dir>/<name>.out` / `.err`), killing it after `timeout`.
/// Returns (status, stdout, stderr); status is `None` on timeout.
pub fn run(name: &str, cmd: &mut Command, dir: &Path, timeout: Duration) -> (Option<ExitStatus>, String, String) {
    let out_path = dir.join(format!("{name}.out"));
    let err_path = dir.join(format!("{name}.err"));
    let out = File::create(&out_path).expect("create stdout file");
    let err = File::create(&err_path).expect("create stderr file");
    cmd.stdout(out).stderr(err);
    let mut child = Child::spawn_keeping_output(name, cmd, &err_path);
    wait::until(timeout, || !child.is_alive());
    let status = child.exit_status();
    child.kill_group();
    let read = |p: &Path| fs::read(p).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    (status, read(&out_path), read(&err_path))
}

/// The writing end of a pipe whose reader is already closed: a child given
/// it as stdout or stderr gets `EPIPE` at its every write (SIGPIPE, which
/// Rust programs ignore, aside), like a program whose log reader went away.
pub fn closed_pipe() -> std::io::PipeWriter {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    writer
}

static DIR_SEQ: AtomicUsize = AtomicUsize::new(0);

/// A per-test scratch directory under the system temp dir. Removed on drop
/// when the test passed; kept (and its path printed) when it panicked, so
/// the logs can be read.
pub struct TestDir {
    /// The directory.
    pub path: PathBuf,
}

impl TestDir {
    /// Creates `$TMPDIR/emq-<name>-<pid>-<seq>`.
    pub fn new(name: &str) -> TestDir {
        let seq = DIR_SEQ.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("emq-{name}-{}-{seq}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("create test dir");
        TestDir { path }
    }

    /// `path/file`.
    pub fn join(&self, file: &str) -> PathBuf {
        self.path.join(file)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test failed: kept its files in {}", self.path.display());
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// Whether every thread of `pid` is stopped (state `T` in
/// `/proc/<pid>/task/<tid>/stat`) or ended; `true` when it is gone.
fn all_threads_stopped(pid: i32) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { return true };
    tasks.flatten().all(|t| {
        let stat = fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // The state follows the command name's closing parenthesis.
        // T/t stopped; Z/X a thread that ended meanwhile.
        stat.rsplit_once(") ").is_none_or(|(_, rest)| rest.starts_with(['T', 't', 'Z', 'X']))
    })
}

/// CPU time (user and system) process `pid` has used so far
/// (`/proc/<pid>/stat` utime + stime).
pub fn cpu_time(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("process stat");
    // The fields after the command name, which is in parentheses: the
    // 14th and 15th of the line are the 12th and 13th after it.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("a command name") + 1..].split_whitespace().collect();
    let ticks: u64 = fields[11..13].iter().map(|f| f.parse::<u64>().expect("clock ticks")).sum();
    // SAFETY: sysconf has no preconditions.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).expect("clock ticks a second");
    Duration::from_millis(ticks * 1000 / per_second)
}
