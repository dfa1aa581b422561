//! [`Wake`]: how other threads wake an I/O thread blocked in a poll (the
//! eMQP I/O thread's `zmq::poll`, a text I/O thread's readiness loop). An
//! `eventfd` is one of the poll items; writing to it makes the poll return.
//! [`Notify`] is what the broker sees of it: the shards wake a front end
//! without knowing how (a neutral leaf, so that neither the broker nor a
//! front end imports another front end).
//! The I/O thread *arms* the waker just before it blocks; a producer writes
//! only when it finds it armed, so a busy I/O thread costs producers one
//! atomic swap per batch and no system call.
//!
//! Correctness (a lost wake-up would leave frames unsent): both sides do
//! "write mine, full fence, read theirs". The I/O thread arms, fences, then
//! looks at its channel; a producer pushes into the channel, fences, then
//! disarms. Whichever runs second sees the other's write, so either the I/O
//! thread finds the message without blocking, or the producer finds the
//! waker armed and writes the eventfd. Measured against the alternatives
//! (PUSH/PULL carrying the frames, an inproc token per wake) by
//! `benches/wake.rs`; the figures are in the README.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};

/// Wakes the thread behind it if it sleeps: what a shard holds of a front
/// end's I/O thread (one call per shard batch).
pub trait Notify: Send + Sync + std::fmt::Debug {
    /// Wakes the thread (a no-op when it is awake).
    fn notify(&self);
}

impl Notify for Wake {
    fn notify(&self) {
        self.wake();
    }
}

/// An eventfd wake-up for a thread blocked in a poll.
#[derive(Debug)]
pub struct Wake {
    fd: OwnedFd,
    armed: AtomicBool,
}

impl Wake {
    /// A new, unarmed waker.
    ///
    /// # Errors
    /// The OS error of `eventfd(2)` (out of descriptors).
    pub fn new() -> io::Result<Wake> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is
        // checked before it is owned.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Ok(Wake { fd: unsafe { OwnedFd::from_raw_fd(fd) }, armed: AtomicBool::new(false) })
    }

    /// The descriptor to poll for `POLLIN`.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Producer side, after handing something over: wakes the thread if it
    /// is (about to be) blocked. Returns whether a wake-up was written.
    pub fn wake(&self) -> bool {
        fence(Ordering::SeqCst);
        if !self.armed.swap(false, Ordering::SeqCst) {
            return false;
        }
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd we own. A full
        // counter (EAGAIN) already means "wake", so the result is not needed.
        let _ = unsafe { libc::write(self.fd(), (&one as *const u64).cast(), 8) };
        true
    }

    /// Consumer side, before blocking: arms the waker. The caller must then
    /// look at its input once more and skip blocking if anything is there.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Consumer side, after waking: disarms and clears the eventfd.
    pub fn disarm(&self) {
        self.unarm();
        self.clear();
    }

    /// Consumer side, after waking: disarms without clearing, for a
    /// consumer that learns from its poll whether the eventfd was written
    /// (it then calls [`Wake::clear`]); saves a `read(2)` per wake-up.
    pub fn unarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }

    /// Consumer side: clears the eventfd after the poll reported it written.
    pub fn clear(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64 from an eventfd we
        // own; EAGAIN (nothing written) is fine.
        let _ = unsafe { libc::read(self.fd(), (&mut count as *mut u64).cast(), 8) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakes_only_when_armed() {
        let w = Wake::new().unwrap();
        assert!(!w.wake(), "unarmed: no write");
        w.arm();
        assert!(w.wake());
        assert!(!w.wake(), "the first producer disarms");
        let mut items = [zmq::PollItem::from_fd(w.fd(), zmq::POLLIN)];
        assert_eq!(zmq::poll(&mut items, 0).unwrap(), 1);
        w.disarm();
        let mut items = [zmq::PollItem::from_fd(w.fd(), zmq::POLLIN)];
        assert_eq!(zmq::poll(&mut items, 0).unwrap(), 0, "cleared");
    }
}
