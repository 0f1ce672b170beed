//! Build script shared by the crates whose tests need a real network (network namespaces,
//! veths, TUN devices): sets `cfg(network_tests)` when the build runs as root with
//! `/dev/net/tun` and `ip` available, so that those tests are marked
//! `#[cfg_attr(not(network_tests), ignore = "needs root, /dev/net/tun and iproute2")]` and show
//! as *ignored* elsewhere instead of passing without running. The tests keep their own
//! run-time check too (a build made as root and run as another user).
//! `SQUAREPEG_NETWORK_TESTS=0` turns them off (ignored) even where they could run.

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(network_tests)");
    // Who builds decides; a change of user changes these.
    for var in [
        "USER",
        "LOGNAME",
        "HOME",
        "SUDO_USER",
        "PATH",
        "SQUAREPEG_NETWORK_TESTS",
    ] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            // "Uid:	real	effective	saved	fs"
            let line = s.lines().find(|l| l.starts_with("Uid:"))?;
            line.split_whitespace().nth(2)?.parse::<u32>().ok()
        })
        == Some(0);
    let tun = Path::new("/dev/net/tun").exists();
    let ip = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join("ip").is_file()));
    let off = std::env::var("SQUAREPEG_NETWORK_TESTS").is_ok_and(|v| v == "0");
    if root && tun && ip && !off {
        println!("cargo::rustc-cfg=network_tests");
    }
}
