//! PEM files for TLS: the certificate chains and private keys that the HTTP server
//! (`server.tls`) and the PostgreSQL client (`sslrootcert`, `sslcert`, `sslkey`) read. Each
//! error names the setting and the file, so an operator knows which one to fix.

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Every certificate of the PEM file at `path` (at least one), for the setting `what`.
pub fn certificates(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bad = |e: rustls::pki_types::pem::Error| format!("{what} {}: {e}", path.display());
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(path).map_err(bad)?.collect::<Result<_, _>>().map_err(bad)?;
    if certs.is_empty() {
        return Err(format!("{what} {}: no certificate in the file", path.display()));
    }
    Ok(certs)
}

/// The private key of the PEM file at `path`, for the setting `what`.
pub fn private_key(what: &str, path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_names_the_setting_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        let e = certificates("sslrootcert", &missing).unwrap_err();
        assert!(e.starts_with(&format!("sslrootcert {}: ", missing.display())), "{e}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        assert_eq!(
            certificates("server.tls.cert", &empty).unwrap_err(),
            format!("server.tls.cert {}: no certificate in the file", empty.display())
        );
        assert!(private_key("sslkey", &empty).unwrap_err().starts_with(&format!("sslkey {}: ", empty.display())));
    }

    #[test]
    fn a_generated_certificate_and_key_are_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let (c, k) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&c, cert.cert.pem()).unwrap();
        std::fs::write(&k, cert.signing_key.serialize_pem()).unwrap();
        assert_eq!(certificates("sslcert", &c).unwrap().len(), 1);
        assert!(private_key("sslkey", &k).is_ok());
    }
}
