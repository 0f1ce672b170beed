//! Helpers shared by the connection tests that run on simulated TCP endpoints.

use std::time::Instant;

use squarepeg_tcp::{Endpoint, EndpointConfig};

/// A simulated TCP endpoint at `ip`, its cookie secret filled with `secret`.
pub fn endpoint(ip: &str, secret: u8, now: Instant) -> Endpoint {
    let mut config = EndpointConfig::default();
    config.secret = [secret; 32];
    config.local_addresses = vec![ip.parse().unwrap()];
    Endpoint::new(config, now)
}
