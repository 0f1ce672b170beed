//! A handle on a named network namespace (`/run/netns/<name>`, as `ip netns` makes them), and
//! a namespace of one's own for tests, benchmarks and tools ([`NetNs::create`]).
//!
//! A TUN device, like a socket, belongs to the namespace of the thread that creates it and
//! stays there; so [`NetNs::run`] opening a device or binding a socket gives an object that any
//! thread can then use.

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;

use super::{NetError, cmd, sys};

/// Where `ip netns` keeps its namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// A named network namespace, held open (so it outlives a concurrent `ip netns del` for as
/// long as this handle lives). Deleted on drop if this handle created it.
#[derive(Debug)]
pub struct NetNs {
    name: String,
    file: File,
    owned: bool,
}

impl NetNs {
    /// Opens the namespace `name`.
    pub fn open(name: &str) -> Result<Self, NetError> {
        let path = Self::path_of(name);
        let file = File::open(&path).map_err(|source| NetError::Io {
            context: format!("opening network namespace {}", path.display()),
            source,
        })?;
        Ok(Self {
            name: name.to_owned(),
            file,
            owned: false,
        })
    }

    /// Creates namespace `name` (`ip netns add`) with its loopback up, deleted when the
    /// returned handle is dropped (also during a panic). For one namespace of a test's or a
    /// tool's own; a [`Topology`](super::Topology) makes a lab's three.
    pub fn create(name: &str) -> Result<Self, NetError> {
        // `ip netns add` makes a file of that name in /run/netns.
        if name.is_empty() || name.len() > 200 || name.contains('/') || name.starts_with('.') {
            return Err(NetError::InvalidNamespace(name.to_owned()));
        }
        cmd::ip(&["netns", "add", name]).map_err(|error| match error {
            NetError::CommandFailed { stderr, .. } if stderr.contains("File exists") => {
                NetError::NamespaceExists(name.to_owned())
            }
            other => other,
        })?;
        let mut ns = match Self::open(name) {
            Ok(ns) => ns,
            Err(error) => {
                let _ = remove_namespace(name);
                return Err(error);
            }
        };
        ns.owned = true;
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The file of namespace `name`.
    pub fn path_of(name: &str) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(name)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Moves the calling thread into this namespace for good. Prefer [`NetNs::run`], which
    /// uses a fresh thread.
    pub fn enter_current_thread(&self) -> Result<(), NetError> {
        sys::enter_netns(&self.file).map_err(|source| NetError::Io {
            context: format!("entering network namespace {}", self.name),
            source,
        })
    }

    /// Runs `f` on a new thread inside this namespace and returns its result. Sockets `f`
    /// creates stay in the namespace wherever they are used afterwards, so this is how a test
    /// makes a client socket and then drives it from any thread. A panic in `f` is resumed
    /// in the caller.
    pub fn run<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> Result<T, NetError> {
        std::thread::scope(|scope| {
            let thread = scope.spawn(|| {
                self.enter_current_thread()?;
                Ok(f())
            });
            match thread.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// A second handle on the same namespace (e.g. to move into a thread that enters it).
    pub fn try_clone(&self) -> Result<NetNs, NetError> {
        let file = self.file.try_clone().map_err(|source| NetError::Io {
            context: format!("duplicating the handle of {}", self.name),
            source,
        })?;
        Ok(Self {
            name: self.name.clone(),
            file,
            owned: false,
        })
    }

    /// Runs `ip -n <name> args…` and returns its standard output.
    pub fn ip(&self, args: &[&str]) -> Result<String, NetError> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        cmd::ip(&all)
    }

    /// A command that runs `program` inside this namespace (via `ip netns exec`, which also
    /// gives it the namespace's view of `/sys` and `/etc/netns/<name>`).
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name, program]);
        command
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if self.owned
            && let Err(error) = remove_namespace(&self.name)
        {
            eprintln!(
                "squarepeg-lab: removing network namespace {}: {error}",
                self.name
            );
        }
    }
}

/// Removes a namespace if it exists.
pub(super) fn remove_namespace(ns: &str) -> Result<(), NetError> {
    if !NetNs::path_of(ns).exists() {
        return Ok(());
    }
    cmd::ip(&["netns", "del", ns]).map(|_| ())
}
