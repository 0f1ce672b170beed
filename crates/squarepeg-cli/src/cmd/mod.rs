//! One module per `peg` verb.

pub mod bench;
