//! One module per `peg` verb.

pub mod bench;
mod bench_tcp;
pub mod tcp;
