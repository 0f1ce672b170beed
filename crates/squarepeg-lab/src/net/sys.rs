//! The few system calls the network lab makes directly, each wrapped once with its safety
//! argument. Everything else goes through `ip` and `ethtool` (see [`super::cmd`]).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// True when running as root (the lab needs CAP_NET_ADMIN and CAP_NET_RAW; root is the
/// supported way to have both).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// True if a process with this pid exists (a zombie counts; EPERM means it exists).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Kills process `pid` (SIGKILL); a process already gone is not an error.
pub fn kill(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    if pid <= 0 {
        return;
    }
    // SAFETY: kill(2) with a positive pid signals that one process only; at worst it is gone
    // already (ESRCH).
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// Moves the calling thread into the network namespace `ns` (an open `/run/netns/<name>`).
/// Only this thread moves; sockets it creates afterwards belong to that namespace for their
/// whole life, wherever they are used.
pub fn enter_netns(ns: &File) -> io::Result<()> {
    // SAFETY: the fd is valid for the duration of the call; CLONE_NEWNET restricts the call
    // to network namespaces.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Asks the kernel to wake this thread's timed sleeps within `slack` of their deadline (the
/// default of 50 µs adds to every emulator timer).
pub fn set_timer_slack(slack: Duration) {
    let nanos = libc::c_ulong::try_from(slack.as_nanos())
        .unwrap_or(libc::c_ulong::MAX)
        .max(1);
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and affects only this thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, nanos, 0, 0, 0);
    }
}

/// Raises this thread's scheduling priority (a negative nice value) so that the emulator's
/// timers fire on time on a busy machine; best effort.
pub fn raise_thread_priority(nice: i32) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    // SAFETY: on Linux, PRIO_PROCESS with a thread id sets that thread's nice value only.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice);
    }
}

/// Puts this thread in the SCHED_FIFO real-time class at `priority` (1-99), so that its
/// timer wake-ups preempt ordinary work (compilers on a shared machine) at once. The kernel's
/// real-time throttling (`sched_rt_runtime_us`, 95 % by default) still leaves the CPU to
/// others should the thread ever spin. Returns false if not allowed.
pub fn set_realtime_priority(priority: i32) -> bool {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: param is a valid sched_param; pthread_self is the calling thread.
    unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) == 0 }
}

/// The index of interface `name` in the calling thread's network namespace.
pub fn interface_index(name: &str) -> io::Result<u32> {
    let c_name = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name with NUL"))?;
    // SAFETY: c_name is a valid NUL-terminated string for the duration of the call.
    let index = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
    if index == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(index)
    }
}

/// An eventfd: a counter other threads bump to wake a thread blocked in [`poll`].
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A non-blocking eventfd.
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd has no memory arguments; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor owned by nobody else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Wakes the waiting thread.
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64; a full counter (EAGAIN) still wakes.
        unsafe {
            libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }

    /// Resets the counter after a wake-up.
    pub fn drain(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64; EAGAIN when nothing is pending is fine.
        unsafe {
            libc::read(self.0.as_raw_fd(), (&mut value as *mut u64).cast(), 8);
        }
    }

    /// The descriptor, for [`poll`].
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Waits until one of `fds` is readable or `timeout` passes (`None`: no timeout), with
/// nanosecond resolution (ppoll; epoll_wait would round to milliseconds). Fills `ready` with
/// the readiness of each fd. EINTR counts as a timeout.
pub fn poll(fds: &[RawFd], timeout: Option<Duration>, ready: &mut [bool]) -> io::Result<()> {
    let mut pollfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let spec = timeout.map(|t| libc::timespec {
        tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
    });
    let spec_ptr = spec
        .as_ref()
        .map_or(std::ptr::null(), |s| s as *const libc::timespec);
    // SAFETY: pollfds is a valid array of the given length; spec_ptr is null or points to a
    // live timespec; no signal mask is passed.
    let rc = unsafe {
        libc::ppoll(
            pollfds.as_mut_ptr(),
            pollfds.len() as libc::nfds_t,
            spec_ptr,
            std::ptr::null(),
        )
    };
    if rc < 0 {
        let error = io::Error::last_os_error();
        if error.kind() == io::ErrorKind::Interrupted {
            ready.iter_mut().for_each(|r| *r = false);
            return Ok(());
        }
        return Err(error);
    }
    for (flag, pfd) in ready.iter_mut().zip(&pollfds) {
        *flag = pfd.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0;
    }
    Ok(())
}
