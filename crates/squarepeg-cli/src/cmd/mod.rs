//! One module per `peg` verb.

pub mod bench;
pub mod connect;
pub mod listen;
mod peer;
