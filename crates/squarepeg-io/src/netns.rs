//! A network namespace of one's own for tests, benchmarks and lab runs: created with
//! `ip netns add` and deleted on drop. Running code and commands inside it is the lab's
//! [`squarepeg_lab::net::NetNs`]; this adds ownership of a single namespace (the lab's
//! `Topology` owns its three).
//!
//! A TUN device, like a socket, belongs to the namespace of the thread that creates it and
//! stays there; so [`NetNs::run`] opening a [`TunDevice`](crate::TunDevice) or binding a socket
//! gives an object that any thread can then use.

use std::path::PathBuf;
use std::process::Command;

use squarepeg_lab::net::NetNs as LabNetNs;

use crate::error::Error;

/// A named network namespace, deleted on drop when this value created it.
#[derive(Debug)]
pub struct NetNs {
    inner: LabNetNs,
    owned: bool,
}

fn namespace_error(name: &str, reason: impl std::fmt::Display) -> Error {
    Error::Namespace {
        name: name.to_string(),
        reason: reason.to_string(),
    }
}

impl NetNs {
    /// Creates a namespace (`ip netns add NAME`) with its loopback up; it is deleted when the
    /// value is dropped, even on a panic.
    pub fn create(name: &str) -> Result<NetNs, Error> {
        if name.is_empty() || name.len() > 200 || name.contains('/') || name.starts_with('.') {
            return Err(namespace_error(
                name,
                "a name is 1 to 200 bytes, without `/` or a leading `.`",
            ));
        }
        run_command(Command::new("ip").args(["netns", "add", name]))?;
        let inner = match LabNetNs::open(name) {
            Ok(ns) => ns,
            Err(e) => {
                let _ = run_command(Command::new("ip").args(["netns", "del", name]));
                return Err(namespace_error(name, e));
            }
        };
        let ns = NetNs { inner, owned: true };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// An existing namespace, not deleted on drop.
    pub fn existing(name: &str) -> Result<NetNs, Error> {
        if name.is_empty() || name.contains('/') || !LabNetNs::path_of(name).exists() {
            return Err(namespace_error(
                name,
                format!(
                    "does not exist (no {}); create it with `ip netns add {name}`",
                    LabNetNs::path_of(name).display()
                ),
            ));
        }
        let inner = LabNetNs::open(name).map_err(|e| namespace_error(name, e))?;
        Ok(NetNs {
            inner,
            owned: false,
        })
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Its bind mount (`/run/netns/NAME`).
    pub fn path(&self) -> PathBuf {
        LabNetNs::path_of(self.name())
    }

    /// Runs `f` on a new thread that has joined the namespace, and returns its result. Devices
    /// and sockets `f` creates belong to the namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, Error> {
        self.inner
            .run(f)
            .map_err(|e| namespace_error(self.name(), e))
    }

    /// Runs `ip -n NAME ARGS...` and returns its output.
    pub fn ip(&self, args: &[&str]) -> Result<String, Error> {
        run_command(Command::new("ip").arg("-n").arg(self.name()).args(args))
    }

    /// A command that runs `program` inside the namespace (`ip netns exec NAME program`).
    pub fn command(&self, program: &str) -> Command {
        self.inner.command(program)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if self.owned
            && let Err(e) = run_command(Command::new("ip").args(["netns", "del", self.name()]))
        {
            tracing::warn!("removing network namespace {}: {e}", self.name());
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
