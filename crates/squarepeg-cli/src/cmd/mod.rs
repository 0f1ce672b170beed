//! One module per `peg` verb.
