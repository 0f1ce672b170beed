//! Trust: a CA in PEM, a pinned certificate, any certificate; self-signed certificates and
//! their fingerprints.

mod common;

use std::sync::Arc;

use common::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use ring::digest;
use squarepeg_tls::config::{self, Trust};
use squarepeg_tls::rustls::pki_types::pem::PemObject;
use squarepeg_tls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use squarepeg_tls::rustls::server::{ClientHello, ResolvesServerCert};
use squarepeg_tls::rustls::sign::CertifiedKey;
use squarepeg_tls::rustls::{self, CertificateError, ClientConfig, ServerConfig};
use squarepeg_tls::{Tls, TlsError};

/// A CA called `ca_name` and a certificate for `name` it signed: (CA PEM, leaf chain PEM,
/// leaf key PEM).
fn ca_and_leaf(ca_name: &str, name: &str) -> (String, String, String) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, ca_name);
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    (ca_cert.pem(), leaf.pem(), leaf_key.serialize_pem())
}

/// Runs a handshake; on failure returns the client's error and what the server made of the
/// client's alert.
fn handshake(
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
    name: &str,
) -> Result<Tls, Box<(TlsError, TlsError)>> {
    let mut client = Tls::client(client, name).unwrap();
    let mut server = Tls::server(server).unwrap();
    match pump(&mut client, &mut server) {
        Ok(_) => {
            assert!(!client.is_handshaking());
            Ok(client)
        }
        Err(client_error) => {
            let mut alert = Vec::new();
            client.poll_output(&mut alert);
            let server_error = feed(&mut server, &alert, usize::MAX).unwrap_err();
            Err(Box::new((client_error, server_error)))
        }
    }
}

fn invalid_certificate(e: CertificateError) -> TlsError {
    TlsError::Handshake(rustls::Error::InvalidCertificate(e))
}

#[test]
fn ca_pem_accepts_its_certificates_only() {
    let (ca, chain, key) = ca_and_leaf("squarepeg test CA", SERVER_NAME);
    let (_other_ca, other_chain, other_key) = ca_and_leaf("another CA", SERVER_NAME);
    let client = config::client_config(Trust::CaPem(ca.into_bytes())).unwrap();
    let server = config::server_config(chain.as_bytes(), key.as_bytes()).unwrap();
    let other_server = config::server_config(other_chain.as_bytes(), other_key.as_bytes()).unwrap();

    let connected = handshake(client.clone(), server.clone(), SERVER_NAME).unwrap();
    let presented = connected.peer_certificates().unwrap();
    assert_eq!(
        presented[0].as_ref(),
        CertificateDer::from_pem_slice(chain.as_bytes())
            .unwrap()
            .as_ref()
    );

    let (client_error, server_error) =
        *handshake(client.clone(), other_server, SERVER_NAME).unwrap_err();
    assert_eq!(
        client_error,
        invalid_certificate(CertificateError::UnknownIssuer)
    );
    assert_eq!(server_error, TlsError::Alert { description: 48 }); // unknown_ca

    // The right CA, the wrong name.
    let (client_error, _) = *handshake(client, server, "elsewhere.test").unwrap_err();
    assert!(
        matches!(
            client_error,
            TlsError::Handshake(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForNameContext { .. }
            ))
        ),
        "{client_error:?}"
    );
}

#[test]
fn pinned_sha256_accepts_the_pinned_certificate_only() {
    let pinned = config::self_signed(&[SERVER_NAME.to_string()]).unwrap();
    let other = config::self_signed(&[SERVER_NAME.to_string()]).unwrap();
    let client = config::client_config(Trust::PinnedSha256(pinned.fingerprint)).unwrap();
    let server =
        config::server_config(pinned.cert_pem.as_bytes(), pinned.key_pem.as_bytes()).unwrap();
    let other_server =
        config::server_config(other.cert_pem.as_bytes(), other.key_pem.as_bytes()).unwrap();

    // The pin ignores the name.
    handshake(client.clone(), server, "any-name.invalid").unwrap();

    let (client_error, server_error) =
        *handshake(client.clone(), other_server, SERVER_NAME).unwrap_err();
    assert_eq!(
        client_error,
        invalid_certificate(CertificateError::ApplicationVerificationFailure)
    );
    assert_eq!(server_error, TlsError::Alert { description: 49 }); // access_denied

    // The pinned certificate presented by someone without its key: the CertificateVerify
    // signature (RFC 8446 §4.4.3) does not verify.
    #[derive(Debug)]
    struct Fixed(Arc<CertifiedKey>);
    impl ResolvesServerCert for Fixed {
        fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
            Some(self.0.clone())
        }
    }
    let chain = vec![CertificateDer::from_pem_slice(pinned.cert_pem.as_bytes()).unwrap()];
    let wrong_key = PrivateKeyDer::from_pem_slice(other.key_pem.as_bytes()).unwrap();
    let signer = rustls::crypto::ring::sign::any_supported_type(&wrong_key).unwrap();
    let mut impostor =
        (*config::server_config(other.cert_pem.as_bytes(), other.key_pem.as_bytes()).unwrap())
            .clone();
    impostor.cert_resolver = Arc::new(Fixed(Arc::new(CertifiedKey::new(chain, signer))));
    let (client_error, server_error) =
        *handshake(client, Arc::new(impostor), SERVER_NAME).unwrap_err();
    assert!(
        matches!(client_error, TlsError::Handshake(_)),
        "{client_error:?}"
    );
    assert_eq!(server_error, TlsError::Alert { description: 51 }); // decrypt_error
}

#[test]
fn insecure_accepts_any_certificate() {
    let cert = config::self_signed(&["somewhere.else".to_string()]).unwrap();
    let client = config::client_config(Trust::Insecure).unwrap();
    let server = config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).unwrap();
    handshake(client, server, SERVER_NAME).unwrap();
}

#[test]
fn self_signed_fingerprint_is_sha256_of_the_der() {
    let names = ["peg.test".to_string(), "10.0.0.1".to_string()];
    let cert = config::self_signed(&names).unwrap();
    let der = CertificateDer::from_pem_slice(cert.cert_pem.as_bytes()).unwrap();
    let sha256 = digest::digest(&digest::SHA256, der.as_ref());
    assert_eq!(&cert.fingerprint[..], sha256.as_ref());
    assert_eq!(config::certificate_fingerprint(&der), cert.fingerprint);
    let hex = config::fingerprint_hex(&cert.fingerprint);
    assert_eq!(hex.len(), 32 * 3 - 1);
    assert!(
        hex.bytes()
            .all(|b| b == b':' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    );
    assert_eq!(config::parse_fingerprint(&hex).unwrap(), cert.fingerprint);
    assert_eq!(
        config::parse_fingerprint(&hex.replace(':', "").to_uppercase()).unwrap(),
        cert.fingerprint
    );
    assert!(config::parse_fingerprint("ab:cd").is_err());
    assert_eq!(config::fingerprint_hex(&[0xab; 32])[..8], *"ab:ab:ab");
    // The key is the certificate's: a server can use the pair.
    config::server_config(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).unwrap();
}

#[test]
fn bad_configuration_is_a_config_error() {
    let cert = config::self_signed(&[SERVER_NAME.to_string()]).unwrap();
    let is_config = |r: Result<_, TlsError>| matches!(r, Err(TlsError::Config(_)));
    assert!(is_config(
        config::client_config(Trust::CaPem(b"not pem".to_vec())).map(|_| ())
    ));
    assert!(is_config(
        config::server_config(b"", cert.key_pem.as_bytes()).map(|_| ())
    ));
    assert!(is_config(
        config::server_config(cert.cert_pem.as_bytes(), b"").map(|_| ())
    ));
    assert!(is_config(
        config::client_config_with_suites(Trust::Insecure, &[]).map(|_| ())
    ));
    let client = config::client_config(Trust::Insecure).unwrap();
    assert!(is_config(
        Tls::client(client.clone(), "not a name!").map(|_| ())
    ));
    let mut no_extraction = (*client).clone();
    no_extraction.enable_secret_extraction = false;
    assert!(is_config(
        Tls::client(Arc::new(no_extraction), SERVER_NAME).map(|_| ())
    ));
    // The system's roots: usable, or a clear error where the machine has none.
    match config::client_config(Trust::SystemRoots) {
        Ok(config) => assert!(config.enable_secret_extraction),
        Err(e) => assert!(matches!(e, TlsError::Config(_)), "{e:?}"),
    }
}
