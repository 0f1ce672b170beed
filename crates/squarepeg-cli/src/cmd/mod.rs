//! One module per `peg` verb.

pub mod bench;
pub mod connect;
pub mod demo;
pub mod lab;
pub mod listen;
mod peer;
pub mod priority;
pub mod tcp;
pub mod voip;
