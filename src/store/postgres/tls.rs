//! TLS to PostgreSQL, with libpq's meaning of the store URL's `sslmode`, `sslrootcert`, `sslcert`
//! and `sslkey`: a URL that works with `psql` means the same here, and its security is the same.
//!
//! | `sslmode` | TLS | the server's certificate |
//! |-----------|-----|--------------------------|
//! | `disable` | never | — |
//! | `prefer` (the default) | when the server offers it, else plain | chain checked when `sslrootcert` is given |
//! | `require` | always | chain checked when `sslrootcert` is given (libpq's rule) |
//! | `verify-ca` | always | chain checked against `sslrootcert` |
//! | `verify-full` | always | chain and host name checked |
//!
//! `sslrootcert` is a PEM file of CAs, or `system` for the operating system's roots; `sslcert` and
//! `sslkey` are a client certificate and its key, for servers that authenticate by certificate.
//! libpq's files under `~/.postgresql/` are not read: what a node trusts is in its URL. Unix
//! sockets never use TLS, as in libpq. tokio-postgres itself knows only `disable`, `prefer` and
//! `require` and no certificate files, so these parameters are taken out of the URL here and the
//! rest is the driver's.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    Disable,
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    const ALLOWED: &str = "disable, prefer, require, verify-ca or verify-full";

    fn parse(value: &str) -> Result<SslMode, String> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => return Err(format!("sslmode {other:?} is not one of {}", SslMode::ALLOWED)),
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// The driver's mode: it negotiates; the checks are the connector's.
    pub fn for_driver(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => tokio_postgres::config::SslMode::Require,
        }
    }
}

/// Where the CAs that sign the server's certificate come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Roots {
    File(PathBuf),
    /// `sslrootcert=system`: the operating system's store.
    System,
}

/// The TLS parameters of a store URL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    pub mode: SslMode,
    pub roots: Option<Roots>,
    /// `sslcert` and `sslkey`.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// How much of the server's certificate a connection checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verification {
    None,
    /// Signed by a trusted CA; any name.
    Chain,
    /// Signed by a trusted CA, for the host the URL names.
    ChainAndName,
}

impl TlsOptions {
    /// Takes the TLS parameters out of `url`'s query: the URL left for the driver, and them.
    /// The other parameters are left as written (the driver decodes them).
    pub fn split_url(url: &str) -> Result<(String, TlsOptions), String> {
        let Some((base, query)) = url.split_once('?') else { return Ok((url.to_string(), TlsOptions::default())) };
        let (mut options, mut kept, mut cert, mut key) = (TlsOptions::default(), Vec::new(), None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (raw_key, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
            let value = decode(raw_value);
            match decode(raw_key).as_str() {
                "sslmode" => options.mode = SslMode::parse(&value)?,
                "sslrootcert" if value == "system" => options.roots = Some(Roots::System),
                "sslrootcert" => options.roots = Some(Roots::File(non_empty("sslrootcert", value)?)),
                "sslcert" => cert = Some(non_empty("sslcert", value)?),
                "sslkey" => key = Some(non_empty("sslkey", value)?),
                _ => kept.push(pair),
            }
        }
        options.client = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some(_), None) => return Err("sslcert is given without sslkey (the client certificate's key)".into()),
            (None, Some(_)) => return Err("sslkey is given without sslcert (the client certificate)".into()),
        };
        if matches!(options.mode, SslMode::VerifyCa | SslMode::VerifyFull) && options.roots.is_none() {
            return Err(format!(
                "sslmode={} checks the server's certificate against CAs the URL does not name: add sslrootcert=FILE (a PEM file of CAs) or sslrootcert=system",
                options.mode.as_str()
            ));
        }
        let driver_url = if kept.is_empty() { base.to_string() } else { format!("{base}?{}", kept.join("&")) };
        Ok((driver_url, options))
    }

    /// How much of the server's certificate is checked (libpq's rule: whenever there are CAs to
    /// check against, the chain is checked; the name only with `verify-full`).
    pub fn verification(&self) -> Verification {
        match (self.mode, &self.roots) {
            (SslMode::Disable, _) | (_, None) => Verification::None,
            (SslMode::VerifyFull, Some(_)) => Verification::ChainAndName,
            (_, Some(_)) => Verification::Chain,
        }
    }

    /// The connector for these options: reads the CA and client certificate files now, so a
    /// missing or unreadable one is said before any connection is tried.
    pub fn connector(&self) -> Result<MakeRustlsConnect, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier: Arc<dyn ServerCertVerifier> = match (self.verification(), &self.roots) {
            (Verification::None, _) | (_, None) => Arc::new(Relaxed { chain: None, provider: provider.clone() }),
            (Verification::Chain, Some(roots)) => {
                Arc::new(Relaxed { chain: Some(webpki(roots, &provider)?), provider: provider.clone() })
            }
            (Verification::ChainAndName, Some(roots)) => webpki(roots, &provider)?,
        };
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match &self.client {
            None => config.with_no_client_auth(),
            Some((cert, key)) => config
                .with_client_auth_cert(
                    crate::pem::certificates("sslcert", cert)?,
                    crate::pem::private_key("sslkey", key)?,
                )
                .map_err(|e| format!("sslcert {} and sslkey {} do not fit: {e}", cert.display(), key.display()))?,
        };
        Ok(MakeRustlsConnect::new(config))
    }
}

fn non_empty(what: &str, value: String) -> Result<PathBuf, String> {
    if value.is_empty() { Err(format!("{what} is empty: give a file's path")) } else { Ok(PathBuf::from(value)) }
}

/// The standard check of chain and name against `roots`.
fn webpki(roots: &Roots, provider: &Arc<CryptoProvider>) -> Result<Arc<WebPkiServerVerifier>, String> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::File(path) => {
            let (added, _) = store.add_parsable_certificates(crate::pem::certificates("sslrootcert", path)?);
            if added == 0 {
                return Err(format!("sslrootcert {}: no CA certificate in the file could be used", path.display()));
            }
        }
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(format!(
                    "sslrootcert=system: this machine's certificate store has no usable CA ({} errors reading it)",
                    found.errors.len()
                ));
            }
        }
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider.clone())
        .build()
        .map_err(|e| format!("sslrootcert: {e}"))
}

/// The checks webpki's verifier does not do as libpq would: with no CAs (`prefer` and `require`
/// without `sslrootcert`: encrypted, not authenticated) any certificate passes; with CAs but not
/// `verify-full` a certificate for another name passes (webpki checks the chain first, so a
/// name error means the chain was good). The handshake's signatures are checked either way.
#[derive(Debug)]
struct Relaxed {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Relaxed {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else { return Ok(ServerCertVerified::assertion()) };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// What a failed handshake's error says to do, from the rustls error under it (or the driver's
/// text when the server refused TLS).
pub fn advice(e: &tokio_postgres::Error) -> Option<(String, &'static str)> {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let rustls = s.downcast_ref::<rustls::Error>().or_else(|| {
            s.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|i| i.downcast_ref::<rustls::Error>())
        });
        if let Some(r) = rustls {
            return Some((r.to_string(), advice_for(r)));
        }
        source = s.source();
    }
    // The driver's own refusals ("server does not support TLS") are its Tls kind, whose text
    // is in the error's source.
    if !e.to_string().starts_with("error performing TLS handshake") {
        return None;
    }
    let detail = std::error::Error::source(e).map_or_else(|| e.to_string(), |s| s.to_string());
    Some((
        detail.clone(),
        if detail.contains("does not support TLS") {
            "the server has TLS off: turn ssl on in its postgresql.conf, or set sslmode=prefer in the store URL"
        } else {
            "check sslmode, sslrootcert, sslcert and sslkey in the store URL"
        },
    ))
}

fn advice_for(e: &rustls::Error) -> &'static str {
    use rustls::Error::{AlertReceived, InvalidCertificate};
    match e {
        InvalidCertificate(CertificateError::UnknownIssuer | CertificateError::BadSignature) => {
            "the server's certificate is not signed by a CA of sslrootcert: give the CA that signed it"
        }
        InvalidCertificate(CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }) => {
            "the server's certificate is not for the host of the URL: connect by a name it carries (host=NAME, with hostaddr=IP if need be) or use sslmode=verify-ca"
        }
        InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. }) => {
            "the server's certificate has expired: renew it"
        }
        AlertReceived(_) => {
            "the server refused the handshake: if it asks for a client certificate, give sslcert and sslkey"
        }
        _ => "check sslmode, sslrootcert, sslcert and sslkey in the store URL",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(url: &str) -> (String, TlsOptions) {
        TlsOptions::split_url(url).unwrap()
    }

    #[test]
    fn the_tls_parameters_leave_the_url_and_the_others_stay_as_written() {
        let (rest, o) =
            split("postgres://u@h/db?sslmode=verify-full&application_name=a%20b&sslrootcert=%2Fetc%2Fca.pem");
        assert_eq!(rest, "postgres://u@h/db?application_name=a%20b");
        assert_eq!(o.mode, SslMode::VerifyFull);
        assert_eq!(o.roots, Some(Roots::File("/etc/ca.pem".into())));
        assert_eq!(o.verification(), Verification::ChainAndName);
        let (rest, o) = split("postgres://u@h/db?sslmode=require");
        assert_eq!((rest.as_str(), o.verification()), ("postgres://u@h/db", Verification::None));
        let (rest, o) = split("postgres://u@h/db");
        assert_eq!((rest.as_str(), o), ("postgres://u@h/db", TlsOptions::default()));
        assert_eq!(TlsOptions::default().mode, SslMode::Prefer, "libpq's default");
    }

    #[test]
    fn with_cas_to_check_against_every_mode_but_disable_checks_the_chain_as_libpq_does() {
        for (mode, expected) in [
            ("disable", Verification::None),
            ("prefer", Verification::Chain),
            ("require", Verification::Chain),
            ("verify-ca", Verification::Chain),
            ("verify-full", Verification::ChainAndName),
        ] {
            let (_, o) = split(&format!("postgres://u@h/db?sslrootcert=system&sslmode={mode}"));
            assert_eq!(o.verification(), expected, "{mode}");
        }
    }

    #[test]
    fn bad_tls_parameters_say_which_one_and_what_is_allowed() {
        let bad = |url: &str| TlsOptions::split_url(url).unwrap_err();
        assert_eq!(
            bad("postgres://u@h/db?sslmode=verify"),
            "sslmode \"verify\" is not one of disable, prefer, require, verify-ca or verify-full"
        );
        assert!(bad("postgres://u@h/db?sslmode=verify-ca").starts_with(
            "sslmode=verify-ca checks the server's certificate against CAs the URL does not name: add sslrootcert=FILE"
        ));
        assert_eq!(
            bad("postgres://u@h/db?sslcert=/c.pem"),
            "sslcert is given without sslkey (the client certificate's key)"
        );
        assert_eq!(bad("postgres://u@h/db?sslkey=/k.pem"), "sslkey is given without sslcert (the client certificate)");
        assert_eq!(bad("postgres://u@h/db?sslrootcert="), "sslrootcert is empty: give a file's path");
    }

    #[test]
    fn a_missing_ca_or_client_file_is_said_before_connecting() {
        let (_, o) = split("postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem");
        let e = o.connector().err().unwrap();
        assert!(e.starts_with("sslrootcert /nonexistent/ca.pem: "), "{e}");
        let (_, o) = split("postgres://u@h/db?sslcert=/nonexistent/c.pem&sslkey=/nonexistent/k.pem");
        assert!(o.connector().err().unwrap().starts_with("sslcert /nonexistent/c.pem: "));
        assert!(split("postgres://u@h/db?sslmode=require").1.connector().is_ok(), "nothing to read without files");
    }

    /// `require` against a server that answers the TLS request with "no" (all this fake one does).
    #[tokio::test]
    async fn require_against_a_server_without_tls_is_one_line_that_says_so() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 8];
            socket.read_exact(&mut request).await.unwrap();
            socket.write_all(b"N").await.unwrap();
            let _ = socket.read(&mut request).await;
        });
        let target =
            super::super::PgTarget::parse(&format!("postgres://u:p@127.0.0.1:{port}/db?sslmode=require")).unwrap();
        let e = target.connect_one().await.err().unwrap().to_string();
        assert_eq!(
            e,
            format!(
                "TLS with PostgreSQL at 127.0.0.1:{port} failed (server does not support TLS); the server has TLS off: turn ssl on in its postgresql.conf, or set sslmode=prefer in the store URL"
            )
        );
    }

    /// The test server's TLS files (`SESSIONS_MCP_TEST_PG_TLS`: `ca.crt`, `client.crt`,
    /// `client.key`, from .ci/postgres.sh) beside its URL; a skip without them, a failure under CI.
    fn tls_server() -> Option<(String, PathBuf)> {
        let url = super::super::test_url()?;
        match std::env::var_os("SESSIONS_MCP_TEST_PG_TLS").filter(|v| !v.is_empty()) {
            Some(dir) => Some((url, PathBuf::from(dir))),
            None if std::env::var_os("CI").is_some() => {
                panic!("SESSIONS_MCP_TEST_PG_TLS is unset under CI: .ci/postgres.sh makes the server's TLS files")
            }
            None => {
                eprintln!("skipped: SESSIONS_MCP_TEST_PG_TLS is unset (the test server's CA and client certificate)");
                None
            }
        }
    }

    /// `url` with `params` added to its query.
    fn with(url: &str, params: &str) -> String {
        format!("{url}{}{params}", if url.contains('?') { '&' } else { '?' })
    }

    /// Connects to `url` and says whether the connection is encrypted, and as whom it logged in.
    async fn encrypted(url: &str) -> Result<(bool, String), super::super::PgError> {
        let target = super::super::PgTarget::parse(url)?;
        let (client, connection) = target.connect_one().await?;
        tokio::spawn(connection);
        let row = client
            .query_one("SELECT ssl, current_user::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[])
            .await
            .unwrap();
        Ok((row.get(0), row.get(1)))
    }

    /// The test URL for the name `localhost` (the one the server's certificate carries) while
    /// still connecting to 127.0.0.1.
    fn by_name(url: &str) -> String {
        with(&url.replacen("@127.0.0.1:", "@localhost:", 1), "hostaddr=127.0.0.1")
    }

    #[tokio::test]
    async fn every_sslmode_against_a_tls_server_does_what_libpq_does() {
        let Some((url, dir)) = tls_server() else { return };
        let ca = dir.join("ca.crt");
        let ok = async |u: String| encrypted(&u).await.unwrap_or_else(|e| panic!("{e}")).0;
        assert!(ok(url.clone()).await, "the default (prefer) encrypts when the server offers TLS");
        assert!(!ok(with(&url, "sslmode=disable")).await);
        assert!(ok(with(&url, "sslmode=require")).await);
        assert!(ok(with(&url, &format!("sslmode=verify-ca&sslrootcert={}", ca.display()))).await);
        assert!(ok(with(&by_name(&url), &format!("sslmode=verify-full&sslrootcert={}", ca.display()))).await);

        let e = encrypted(&with(&url, &format!("sslmode=verify-full&sslrootcert={}", ca.display())))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("TLS with PostgreSQL at 127.0.0.1:"), "{e}");
        assert!(e.ends_with("the server's certificate is not for the host of the URL: connect by a name it carries (host=NAME, with hostaddr=IP if need be) or use sslmode=verify-ca"), "{e}");
        assert!(!e.contains('\n'), "{e}");

        // A CA that did not sign the server's certificate: refused whatever the mode (libpq
        // checks the chain whenever it has CAs to check against).
        let other = tempfile::tempdir().unwrap();
        let other_ca = other.path().join("other-ca.crt");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        std::fs::write(&other_ca, params.self_signed(&key).unwrap().pem()).unwrap();
        for mode in ["prefer", "require", "verify-ca"] {
            let e = encrypted(&with(&url, &format!("sslmode={mode}&sslrootcert={}", other_ca.display())))
                .await
                .unwrap_err()
                .to_string();
            assert!(
                e.ends_with(
                    "the server's certificate is not signed by a CA of sslrootcert: give the CA that signed it"
                ),
                "{mode}: {e}"
            );
        }
    }

    #[tokio::test]
    async fn a_client_certificate_logs_in_without_a_password() {
        let Some((url, dir)) = tls_server() else { return };
        let host_and_db = url.split_once('@').unwrap().1;
        let cert_url = by_name(&format!("postgres://sessions_mcp_cert@{host_and_db}"));
        let files = format!(
            "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
            dir.join("ca.crt").display(),
            dir.join("client.crt").display(),
            dir.join("client.key").display()
        );
        let (tls, user) = encrypted(&with(&cert_url, &files)).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(tls);
        assert_eq!(user, "sessions_mcp_cert");
        let without =
            encrypted(&with(&cert_url, &format!("sslmode=verify-full&sslrootcert={}", dir.join("ca.crt").display())))
                .await
                .unwrap_err()
                .to_string();
        assert!(without.starts_with("PostgreSQL at localhost:"), "{without}");
        assert!(without.contains("refused user \"sessions_mcp_cert\": authentication failed"), "{without}");
    }
}
