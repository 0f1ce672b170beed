//! What the `peg` integration tests share.
// Each test crate uses only part of this.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs the `peg` binary built for these tests with `args`.
pub fn peg(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peg"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run peg")
}

/// A directory removed when the test ends, even on failure.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("peg-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
