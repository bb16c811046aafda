//! Every libc call of the llama.cpp target and kvaudit's worker, each behind a small safe function whose comment says why it is
//! sound. With [`super::ffi`] (llama.cpp's own code) this is one of the two modules of the crate
//! that contain `unsafe`.
//!
//! - File locks: [`try_lock_exclusive`], [`lock_exclusive`], [`unlock`] (`flock(2)`).
//! - The user: [`current_uid`].
//! - Processes: [`fork_and_run`] (refuses to fork a process with more than one thread),
//!   [`kill_me_when_parent_dies`], [`exit_immediately`], [`wait_for_child`], [`send_sigabrt`].
//! - Signals of the worker's fork server and its children: [`install_fatal_signal_report`] (a
//!   handler that writes the current trial and step, as set with [`set_current_trial`] and
//!   [`advance_current_step`], then dies of the signal) and [`install_sigabrt_forwarding`] (the
//!   server passes SIGABRT on to its running child). The handlers make only async-signal-safe
//!   calls and never allocate. [`hold_sigabrt`], [`release_sigabrt`] and
//!   [`discard_held_sigabrt`] keep a hang's SIGABRT for the child it is meant for.
//! - Allocator tuning: [`keep_freed_memory`] (`mallopt(3)`).
//! - A cheap clock: [`coarse_now`] (`CLOCK_MONOTONIC_COARSE`).

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

// ---- file locks ----

/// Takes an exclusive `flock` on `file` if nobody holds one: `Ok(false)` when another holder has
/// it.
pub fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    // SAFETY: flock(2) on a descriptor `file` owns for the whole call; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(error)
    }
}

/// Takes an exclusive `flock` on `file`, waiting for the holder to release it.
pub fn lock_exclusive(file: &File) -> io::Result<()> {
    loop {
        // SAFETY: as in `try_lock_exclusive`; this call blocks until the lock is free.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Releases the `flock` on `file` (closing the file releases it too).
pub fn unlock(file: &File) {
    // SAFETY: as in `try_lock_exclusive`. A failure leaves the lock to the close of `file`.
    unsafe {
        libc::flock(file.as_raw_fd(), libc::LOCK_UN);
    }
}

// ---- the user ----

/// The real user id of this process.
pub fn current_uid() -> u32 {
    // SAFETY: getuid(2) takes nothing and cannot fail.
    unsafe { libc::getuid() }
}

// ---- processes ----

/// Forks this process and runs `child` in the new one, which then ends with `_exit(2)` and the
/// code `child` returned (101 if it panicked, as a Rust program that panics does); never
/// returns in the child. Returns the child's pid in the parent.
///
/// Refuses (`Err`) when this process has more than one thread: only the forking thread exists in
/// the child, and a lock another thread held (in malloc, stdio, llama.cpp) would never be
/// released there. With one thread the child may run any code, Rust's and llama.cpp's.
pub fn fork_and_run(child: impl FnOnce() -> i32) -> io::Result<i32> {
    let threads = std::fs::read_dir("/proc/self/task")?.count();
    if threads != 1 {
        return Err(io::Error::other(format!(
            "refusing to fork a process with {threads} threads"
        )));
    }
    // SAFETY: the process has exactly one thread (checked just above; nothing in between starts
    // one), so the child's copy of every lock is in the state this thread left it in.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid > 0 {
        return Ok(pid);
    }
    let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
    exit_immediately(code)
}

/// Makes the kernel send SIGKILL to this process when its parent ends: a worker child that
/// outlived its fork server would keep the pipes to the kvaudit parent open, and the parent would
/// wait forever for the end of a worker that is gone.
pub fn kill_me_when_parent_dies() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) with a signal number only sets a flag of this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
}

/// Ends this process at once with `code`, without running exit handlers or destructors: a fork
/// server's child shares them with the server, and its replies are flushed by then.
pub fn exit_immediately(code: i32) -> ! {
    // SAFETY: _exit(2) touches no memory of this process and does not return.
    unsafe { libc::_exit(code) }
}

/// `waitpid` until child `pid` has ended (a forwarded SIGABRT interrupts the wait); its raw wait
/// status (`255 << 8`, an exit with status 255, when there is no such child any more).
pub fn wait_for_child(pid: i32) -> i32 {
    let mut status = 0;
    loop {
        // SAFETY: status is a valid out-pointer for one c_int during the call.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return status;
        }
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 255 << 8;
        }
    }
}

/// Sends SIGABRT to process `pid` (a worker that hangs: its handler reports where, then dies).
pub fn send_sigabrt(pid: u32) -> io::Result<()> {
    // pid 0 and negative pids name process groups: never send those.
    let pid = match libc::pid_t::try_from(pid) {
        Ok(p) if p > 0 => p,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("not a process id: {pid}"),
            ))
        }
    };
    // SAFETY: kill(2) with a positive pid and a signal number; no memory is passed.
    if unsafe { libc::kill(pid, libc::SIGABRT) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

// ---- signals ----

/// How the fatal-signal handler's line starts: `kvaudit-worker: signal SIG trial T step S`, on
/// stderr, where the worker's parent looks for it; ` observing O` follows when the child was
/// observing the result of step S (O: the code given to [`set_current_observation`]).
pub const FATAL_SIGNAL_REPORT: &str = "kvaudit-worker: signal ";

/// The trial (within its request) the worker's child is running, for the report.
static CURRENT_TRIAL: AtomicUsize = AtomicUsize::new(0);
/// The step (1-based; 0: the reset) within [`CURRENT_TRIAL`], for the report.
static CURRENT_STEP: AtomicUsize = AtomicUsize::new(0);
/// What the child is observing after [`CURRENT_STEP`]'s op (0: running ops, not observing).
static CURRENT_OBSERVATION: AtomicUsize = AtomicUsize::new(0);
/// The fork server's running child (0: none), where SIGABRT is forwarded.
static FORWARD_SIGABRT_TO: AtomicI32 = AtomicI32::new(0);

/// Records that trial `trial` starts; its step count starts at 0.
pub fn set_current_trial(trial: usize) {
    CURRENT_TRIAL.store(trial, Ordering::Relaxed);
}

/// Records that the current trial's reset starts (step 0).
pub fn reset_current_step() {
    CURRENT_STEP.store(0, Ordering::Relaxed);
    CURRENT_OBSERVATION.store(0, Ordering::Relaxed);
}

/// Records what the child observes from now on (`code` of an observation; 0: the next op).
pub fn set_current_observation(code: usize) {
    CURRENT_OBSERVATION.store(code, Ordering::Relaxed);
}

/// Dies of SIGSEGV here, through the fatal-signal report: the worker's test hook that makes an
/// observation crash (`KVAUDIT_TEST_CRASH_OBSERVING`, docs/usage.md).
pub fn crash_with_sigsegv() -> ! {
    // SAFETY: raise(3) has no memory-safety preconditions; the handler (or the default action)
    // ends the process.
    unsafe {
        libc::raise(libc::SIGSEGV);
    }
    unreachable!("SIGSEGV ends the process")
}

/// Records that the current trial's next op starts.
pub fn advance_current_step() {
    CURRENT_STEP.fetch_add(1, Ordering::Relaxed);
}

/// Writes `n` in decimal into `buf` from `at`; returns the new end. Async-signal-safe: no
/// allocation, no locks.
fn put_num(buf: &mut [u8], mut at: usize, n: usize) -> usize {
    let mut digits = [0u8; 20];
    let mut k = 0;
    let mut v = n;
    loop {
        digits[k] = b'0' + (v % 10) as u8;
        k += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    while k > 0 && at < buf.len() {
        k -= 1;
        buf[at] = digits[k];
        at += 1;
    }
    at
}

/// Copies `bytes` into `buf` from `at` (as far as it fits); returns the new end.
/// Async-signal-safe.
fn put_bytes(buf: &mut [u8], at: usize, bytes: &[u8]) -> usize {
    let n = bytes.len().min(buf.len().saturating_sub(at));
    buf[at..at + n].copy_from_slice(&bytes[..n]);
    at + n
}

extern "C" fn on_fatal_signal(sig: libc::c_int) {
    // Only async-signal-safe calls here: write(2), signal(2), raise(3); the text is built in a
    // local array.
    let mut buf = [0u8; 128];
    let mut at = put_bytes(&mut buf, 0, b"\n");
    at = put_bytes(&mut buf, at, FATAL_SIGNAL_REPORT.as_bytes());
    at = put_num(&mut buf, at, sig as usize);
    at = put_bytes(&mut buf, at, b" trial ");
    at = put_num(&mut buf, at, CURRENT_TRIAL.load(Ordering::Relaxed));
    at = put_bytes(&mut buf, at, b" step ");
    at = put_num(&mut buf, at, CURRENT_STEP.load(Ordering::Relaxed));
    let observing = CURRENT_OBSERVATION.load(Ordering::Relaxed);
    if observing != 0 {
        at = put_bytes(&mut buf, at, b" observing ");
        at = put_num(&mut buf, at, observing);
    }
    at = put_bytes(&mut buf, at, b"\n");
    // SAFETY: write(2), signal(2) and raise(3) are async-signal-safe; buf is a local array of at
    // least `at` bytes. Restoring the default action before re-raising makes the signal kill the
    // process once this handler returns (it stays blocked until then).
    unsafe {
        libc::write(2, buf.as_ptr().cast(), at);
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// The signals that end a worker's child and are reported first.
const FATAL_SIGNALS: [libc::c_int; 5] = [
    libc::SIGABRT,
    libc::SIGSEGV,
    libc::SIGFPE,
    libc::SIGBUS,
    libc::SIGILL,
];

/// On SIGABRT, SIGSEGV, SIGFPE, SIGBUS and SIGILL: write `kvaudit-worker: signal SIG trial T step
/// S` to stderr (see [`FATAL_SIGNAL_REPORT`]), then die of the signal as without the handler.
pub fn install_fatal_signal_report() {
    for sig in FATAL_SIGNALS {
        // SAFETY: on_fatal_signal only makes async-signal-safe calls; installing it replaces the
        // default action, which it restores before re-raising.
        unsafe {
            libc::signal(
                sig,
                on_fatal_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
}

/// Sets where [`install_sigabrt_forwarding`]'s handler sends SIGABRT: the fork server's running
/// child, or 0 for none.
pub fn set_sigabrt_forwarding_target(pid: i32) {
    FORWARD_SIGABRT_TO.store(pid, Ordering::SeqCst);
}

/// In the fork server, SIGABRT (the parent's "this trial hangs") goes to the running child, whose
/// own handler then says which trial and step it was in. Without a child, the server itself is
/// stuck (in a warm-up), and the signal is fatal as usual.
extern "C" fn on_sigabrt_in_server(sig: libc::c_int) {
    let child = FORWARD_SIGABRT_TO.load(Ordering::SeqCst);
    if child > 0 {
        // SAFETY: kill(2) is async-signal-safe; child is our own child's pid.
        unsafe {
            libc::kill(child, libc::SIGABRT);
        }
        return;
    }
    on_fatal_signal(sig);
}

/// Installs the fork server's SIGABRT handler (see [`set_sigabrt_forwarding_target`]).
pub fn install_sigabrt_forwarding() {
    // SAFETY: on_sigabrt_in_server only makes async-signal-safe calls (kill, or
    // on_fatal_signal's).
    unsafe {
        libc::signal(
            libc::SIGABRT,
            on_sigabrt_in_server as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
}

/// Whether SIGABRT is held back (pending) instead of delivered, in this thread.
fn mask_sigabrt(how: libc::c_int) {
    // SAFETY: the set is a local initialised by sigemptyset before use; pthread_sigmask only
    // reads it, and a null old-set pointer is allowed.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGABRT);
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// Holds SIGABRT back: in the fork server between trials, a "this trial hangs" SIGABRT from the
/// parent waits until there is a child to forward it to ([`release_sigabrt`]) instead of
/// killing the server (the parent may time out before the server has forked the child). A
/// forked child inherits the mask and must call [`release_sigabrt`] itself.
pub fn hold_sigabrt() {
    mask_sigabrt(libc::SIG_BLOCK);
}

/// Delivers SIGABRT again, including one that arrived while it was held.
pub fn release_sigabrt() {
    mask_sigabrt(libc::SIG_UNBLOCK);
}

/// Drops a SIGABRT that arrived while held: after a child has ended, a late "this trial hangs"
/// was meant for it, not for the next child. Call with SIGABRT held.
pub fn discard_held_sigabrt() {
    // SAFETY: local sets initialised before use; a zero timeout makes sigtimedwait poll, and it
    // only consumes a pending SIGABRT (held, so no handler runs).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGABRT);
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        while libc::sigtimedwait(&set, std::ptr::null_mut(), &zero) == libc::SIGABRT {}
    }
}

// ---- the allocator ----

/// Tells glibc's malloc (which llama.cpp's C++ uses; kvaudit's Rust side uses mimalloc) to keep
/// freed memory instead of returning it to the kernel. Every trial allocates and frees the same
/// buffers (batch allocator, graph, state copies); with the default thresholds the heap top was
/// trimmed with `brk` and large blocks `munmap`ed and faulted in again on every trial, about 3%
/// of a worker's time (perf, depth-3 seed audit).
pub fn keep_freed_memory() {
    // SAFETY: mallopt(3) only sets allocator parameters. A refused setting (return 0) only costs
    // speed.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TOP_PAD, 16 << 20);
    }
}

// ---- the clock ----

/// The monotonic clock at the kernel's tick (a few milliseconds): read from the vDSO without the
/// hardware counter. The worker checks after every trial whether its replies are due (a 100 ms
/// deadline), and `Instant::now` there cost about 0.7% of a depth-3 worker (perf); this
/// clock's resolution is ample for that deadline.
pub fn coarse_now() -> std::time::Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one timespec into `t`, which lives for the whole call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) };
    if rc != 0 {
        // Not on this kernel: the precise clock's reading, from the same epoch.
        // SAFETY: as above.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    }
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coarse_clock_goes_forward_at_a_tick() {
        let a = coarse_now();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let b = coarse_now();
        assert!(b > a, "{a:?} then {b:?}");
        assert!(
            b - a >= std::time::Duration::from_millis(20),
            "{a:?} then {b:?}"
        );
    }

    #[test]
    fn numbers_are_written_without_allocating() {
        let mut buf = [0u8; 8];
        let end = put_num(&mut buf, 1, 407);
        assert_eq!(&buf[1..end], b"407");
        // A number that does not fit is cut, not a panic.
        let end = put_num(&mut buf, 6, 12345);
        assert_eq!((end, &buf[6..8]), (8, &b"12"[..]));
        assert_eq!(put_bytes(&mut buf, 7, b"xyz"), 8);
    }

    #[test]
    fn a_lock_is_exclusive_across_open_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let a = File::create(&path).unwrap();
        let b = File::open(&path).unwrap();
        assert!(try_lock_exclusive(&a).unwrap());
        assert!(!try_lock_exclusive(&b).unwrap());
        unlock(&a);
        assert!(try_lock_exclusive(&b).unwrap());
        lock_exclusive(&b).unwrap();
    }

    #[test]
    fn signals_are_only_sent_to_real_pids() {
        assert!(send_sigabrt(0).is_err());
        assert!(send_sigabrt(u32::MAX).is_err());
    }
}
