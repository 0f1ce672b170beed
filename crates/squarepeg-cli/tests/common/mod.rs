//! What the `peg` integration tests share.

use std::process::{Command, Output};

/// Runs the `peg` binary built for these tests with `args`.
pub fn peg(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peg"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run peg")
}
