//! Network namespaces for tests, benchmarks and lab runs: create one (`ip netns add`), run code
//! in it from a thread that has `setns`'d into it, run commands in it, and delete it on drop.
//!
//! A TUN device, like a socket, belongs to the namespace of the thread that creates it and
//! stays there; so [`NetNs::run`] opening a [`TunDevice`](crate::TunDevice) or binding a socket
//! gives an object that any thread can then use.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;

use crate::error::Error;

/// A named network namespace, deleted on drop when this value created it.
#[derive(Debug)]
pub struct NetNs {
    name: String,
    owned: bool,
}

impl NetNs {
    /// Creates a namespace (`ip netns add NAME`) with its loopback up; it is deleted when the
    /// value is dropped, even on a panic.
    pub fn create(name: &str) -> Result<NetNs, Error> {
        if name.is_empty() || name.len() > 200 || name.contains('/') || name.starts_with('.') {
            return Err(Error::Namespace {
                name: name.to_string(),
                reason: "a name is 1 to 200 bytes, without `/` or a leading `.`".into(),
            });
        }
        run_command(Command::new("ip").args(["netns", "add", name]))?;
        let ns = NetNs {
            name: name.to_string(),
            owned: true,
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// An existing namespace, not deleted on drop.
    pub fn existing(name: &str) -> Result<NetNs, Error> {
        let ns = NetNs {
            name: name.to_string(),
            owned: false,
        };
        if name.is_empty() || name.contains('/') || !ns.path().exists() {
            return Err(Error::Namespace {
                name: name.to_string(),
                reason: format!(
                    "does not exist (no {}); create it with `ip netns add {name}`",
                    ns.path().display()
                ),
            });
        }
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its bind mount (`/run/netns/NAME`).
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// Runs `f` on a new thread that has joined the namespace, and returns its result. Devices
    /// and sockets `f` creates belong to the namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, Error> {
        let path = self.path();
        let file =
            File::open(&path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    // SAFETY: setns on a valid namespace file descriptor; it only changes this
                    // thread's network namespace, which ends with the thread.
                    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                    if rc != 0 {
                        return Err(Error::io(
                            format!("joining network namespace {}", self.name),
                            std::io::Error::last_os_error(),
                        ));
                    }
                    Ok(f())
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Runs `ip -n NAME ARGS...` and returns its output.
    pub fn ip(&self, args: &[&str]) -> Result<String, Error> {
        run_command(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// A command that runs `program` inside the namespace (`ip netns exec NAME program`).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if self.owned
            && let Err(e) = run_command(Command::new("ip").args(["netns", "del", &self.name]))
        {
            tracing::warn!("removing network namespace {}: {e}", self.name);
        }
    }
}

/// Runs a command to completion; a non-zero exit is an error carrying its stderr.
pub(crate) fn run_command(command: &mut Command) -> Result<String, Error> {
    let line = format!("{command:?}").replace('"', "");
    let out = command.output().map_err(|e| Error::Command {
        command: line.clone(),
        message: if e.kind() == std::io::ErrorKind::NotFound {
            "not found: install iproute2".to_string()
        } else {
            e.to_string()
        },
    })?;
    if !out.status.success() {
        return Err(Error::Command {
            command: line,
            message: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
