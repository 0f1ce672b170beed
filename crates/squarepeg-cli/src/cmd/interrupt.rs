//! A lab experiment stopped by a signal (Ctrl-C, SIGTERM, SIGHUP) removes what it built
//! before it exits: its labs' `Drop` would not run, and their namespaces, interfaces and the
//! processes started in them (an OpenVPN) would stay until the next lab or `peg lab
//! cleanup`.
//!
//! The handler only writes a byte to a pipe (async-signal-safe); a thread of its own reads it
//! and does the work. A handler, not a blocked signal mask: a mask would be inherited by the
//! experiment's child processes, which must still stop on SIGTERM. A second signal while the
//! cleanup runs exits at once.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use squarepeg_lab::net;

/// The pipe's write end, for the handler (-1: not installed).
static PIPE: AtomicI32 = AtomicI32::new(-1);

/// A signal came: the cleanup runs, and ends the process.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// The exit status after a signal: 128 + SIGINT, as a shell reports an interrupted command.
const EXIT_INTERRUPTED: i32 = 130;

extern "C" fn on_signal(_signal: libc::c_int) {
    let fd = PIPE.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; the buffer is a valid byte. A full pipe (a
        // flood of signals) only drops this one.
        unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) };
    }
}

/// Installs the handler for this process (once; later calls do nothing).
pub fn remove_labs_on_signal() {
    let mut fds = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        eprintln!(
            "warning: no cleanup on Ctrl-C ({})",
            std::io::Error::last_os_error()
        );
        return;
    }
    let [read_end, write_end] = fds;
    if PIPE
        .compare_exchange(-1, write_end, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        // SAFETY: both descriptors were just created here and are used nowhere else.
        unsafe {
            libc::close(read_end);
            libc::close(write_end);
        }
        return;
    }
    std::thread::spawn(move || {
        wait_for_signal(read_end);
        INTERRUPTED.store(true, Ordering::SeqCst);
        std::thread::spawn(move || {
            wait_for_signal(read_end);
            std::process::exit(EXIT_INTERRUPTED);
        });
        eprintln!("\ninterrupted: removing this run's labs");
        let own = std::process::id();
        let _ = net::remove_labs_of(own);
        // The experiment's thread may have been building a lab meanwhile (its commands fail
        // once their namespace is gone, and it then waits in `exit_if_interrupted`): once
        // more, after it had a moment.
        std::thread::sleep(Duration::from_millis(200));
        let report = net::remove_labs_of(own);
        for failed in &report.failed {
            eprintln!("could not remove {failed} (peg lab cleanup retries)");
        }
        std::process::exit(EXIT_INTERRUPTED);
    });
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: sigaction with a zeroed struct, an empty mask and a handler that only
        // calls write(2); SA_RESTART keeps interrupted system calls of other threads going.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// After the experiment returned (an error, often: its lab's commands were killed): if a signal
/// came, waits for the cleanup, which ends the process with status 130, instead of returning
/// (and exiting with the experiment's error).
pub fn exit_if_interrupted() {
    if INTERRUPTED.load(Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
}

/// Blocks until the handler wrote a byte.
fn wait_for_signal(fd: libc::c_int) {
    let mut byte = 0u8;
    loop {
        // SAFETY: reads one byte into a valid local.
        let n = unsafe { libc::read(fd, (&mut byte as *mut u8).cast(), 1) };
        if n == 1 {
            return;
        }
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        // The pipe failed: nothing will come; never return (no cleanup, no exit).
        loop {
            std::thread::park();
        }
    }
}
