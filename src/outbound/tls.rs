//! TLS for outbound connections: the webpki roots plus the system's.

use std::sync::{Arc, OnceLock};

/// TLS for outbound connections: the webpki roots plus the system's (`SSL_CERT_FILE`,
/// `SSL_CERT_DIR`, else the distribution's bundle), built once.
#[expect(clippy::expect_used, reason = "ring supports TLS 1.3 on every build")]
pub fn tls_config() -> rustls::ClientConfig {
    static CONFIG: OnceLock<rustls::ClientConfig> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            let (added, _) = roots.add_parsable_certificates(native_certs());
            tracing::debug!(system_roots = added, "TLS roots: webpki and the system's");
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map(|b| {
                    b.with_root_certificates(roots.clone())
                        .with_no_client_auth()
                })
                .unwrap_or_else(|_| {
                    rustls::ClientConfig::builder_with_provider(Arc::new(
                        rustls::crypto::ring::default_provider(),
                    ))
                    .with_protocol_versions(&[&rustls::version::TLS13])
                    .map(|b| b.with_root_certificates(roots).with_no_client_auth())
                    .expect("TLS 1.3 with ring is always supported")
                })
        })
        .clone()
}

/// The system's CA certificates (Linux locations, as OpenSSL finds them).
fn native_certs() -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut files = Vec::new();
    if let Some(f) = std::env::var_os("SSL_CERT_FILE") {
        files.push(std::path::PathBuf::from(f));
    } else if let Some(f) = [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/ca-bundle.pem",
        "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
        "/etc/ssl/cert.pem",
    ]
    .iter()
    .map(std::path::PathBuf::from)
    .find(|p| p.is_file())
    {
        files.push(f);
    }
    if let Some(dir) = std::env::var_os("SSL_CERT_DIR") {
        for d in std::env::split_paths(&dir) {
            if let Ok(entries) = std::fs::read_dir(&d) {
                files.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_file()));
            }
        }
    }
    files
        .iter()
        .filter_map(|f| CertificateDer::pem_file_iter(f).ok())
        .flat_map(|certs| certs.flatten())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_roots_are_trusted_besides_webpki() {
        // Whatever the machine has, the config builds (and its roots include webpki's).
        let _ = tls_config();
    }
}
