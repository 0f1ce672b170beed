//! Helpers shared by the connection tests that run on simulated TCP endpoints.
// Not every test binary uses every helper.
#![allow(dead_code)]

use std::time::Instant;

use squarepeg_connection::TlsSetup;
use squarepeg_tcp::{Endpoint, EndpointConfig};
use squarepeg_tls::config::{self, Trust};

/// A simulated TCP endpoint at `ip`, its cookie secret filled with `secret`.
pub fn endpoint(ip: &str, secret: u8, now: Instant) -> Endpoint {
    let mut config = EndpointConfig::default();
    config.secret = [secret; 32];
    config.local_addresses = vec![ip.parse().unwrap()];
    Endpoint::new(config, now)
}

/// A TLS client and server for `peg.test`: a self-signed certificate, pinned by the client.
pub fn tls_setups() -> (TlsSetup, TlsSetup) {
    let cert = config::self_signed(&["peg.test".into()]).unwrap();
    let server = TlsSetup::Server {
        config: config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).unwrap(),
    };
    let client = TlsSetup::Client {
        config: config::client_config(Trust::PinnedSha256(cert.fingerprint)).unwrap(),
        server_name: "peg.test".into(),
    };
    (client, server)
}
