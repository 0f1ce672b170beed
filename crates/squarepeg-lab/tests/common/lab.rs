//! The harness of the tests that build real labs (`net.rs`, `two_paths.rs`).

use std::sync::{Mutex, MutexGuard};

use squarepeg_lab::net;

/// One lab at a time within a test binary: calibration must not compete with another lab
/// for the CPU.
pub fn lab_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// True if this machine can run labs; otherwise says why (once per test).
pub fn can_run(test: &str) -> bool {
    if !net::is_root() {
        eprintln!("SKIPPED {test}: the network lab needs root; CI runs it as root");
        return false;
    }
    for (tool, version) in [("ip", "-V"), ("ethtool", "--version")] {
        let found = std::process::Command::new(tool)
            .arg(version)
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            eprintln!("SKIPPED {test}: `{tool}` is not installed; .ci/run installs it");
            return false;
        }
    }
    true
}
