//! The TLS set-up the TLS fuzz targets share: one self-signed certificate for
//! [`SERVER_NAME`], made once, and a client configuration that pins it.

use std::sync::{Arc, OnceLock};

use squarepeg_tls::config::{self, Trust};
use squarepeg_tls::rustls::{ClientConfig, ServerConfig};

pub const SERVER_NAME: &str = "peg.test";

pub fn configs() -> &'static (Arc<ClientConfig>, Arc<ServerConfig>) {
    static CONFIGS: OnceLock<(Arc<ClientConfig>, Arc<ServerConfig>)> = OnceLock::new();
    CONFIGS.get_or_init(|| {
        let cert = config::self_signed(&[SERVER_NAME.to_string()]).unwrap();
        let client = config::client_config(Trust::PinnedSha256(cert.fingerprint)).unwrap();
        let server =
            config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).unwrap();
        (client, server)
    })
}
