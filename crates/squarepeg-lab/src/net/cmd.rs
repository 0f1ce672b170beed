//! Running `ip` and `ethtool`: every failure becomes a [`NetError`] that says which command
//! failed and what it printed.

use std::io;
use std::process::{Command, Stdio};

use super::NetError;

/// The Debian package that provides `program`, for error messages.
fn package_of(program: &str) -> &'static str {
    match program {
        "ip" => "iproute2",
        "ethtool" => "ethtool",
        _ => "the package that provides it",
    }
}

/// Runs `program args…` and returns its standard output.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String, NetError> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|error| match error.kind() {
            io::ErrorKind::NotFound => NetError::ToolMissing {
                program: program.to_owned(),
                package: package_of(program),
            },
            _ => NetError::Io {
                context: format!("running {program}"),
                source: error,
            },
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(NetError::CommandFailed {
            command: format!("{program} {}", args.join(" ")),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// Runs `ip args…`.
pub(crate) fn ip(args: &[&str]) -> Result<String, NetError> {
    run("ip", args)
}
