//! Running tshark on a capture, shared by the integration tests.

use std::path::Path;
use std::process::Command;

/// Runs `tshark -r <file> <args>` and returns its output lines, or `None` (after saying so)
/// when tshark is not installed. Fails the test if tshark fails or complains.
pub fn tshark(file: &Path, args: &[&str]) -> Option<Vec<String>> {
    let output = match Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(args)
        .output()
    {
        Ok(output) => output,
        Err(error) => {
            eprintln!("SKIPPED tshark check: tshark is not installed ({error}); CI installs it");
            return None;
        }
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "tshark failed: {stderr}");
    // tshark warns about running as root; anything else is a complaint about the file.
    let complaints: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.contains("Running as user"))
        .collect();
    assert!(complaints.is_empty(), "tshark complained: {stderr}");
    Some(
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(str::to_owned)
            .collect(),
    )
}

/// A scratch directory unique to this process, removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("squarepeg-lab-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}
