//! Stored OAuth state of one server, encrypted at rest: ChaCha20-Poly1305 (ring's) under a key
//! derived from `[server] secret_key_env`, the server's name and URL bound in as associated
//! data, so a file copied to another server's name or URL does not open (its tokens are never
//! sent elsewhere). Written whole (temporary file, then rename), mode 0600.

use std::path::{Path, PathBuf};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

use super::discovery::AuthServer;
use crate::config::Env;

/// A registered (or configured) client.
#[derive(Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClientReg {
    pub client_id: String,
    #[serde(default)]
    pub client_secret: Option<String>,
    /// `client_secret_basic`, `client_secret_post`, `private_key_jwt` or `none`.
    pub auth_method: String,
    /// The redirect URI it was registered with.
    #[serde(default)]
    pub redirect_uri: Option<String>,
}

/// Everything kept for one server between runs. Never `Debug`-printed (tokens).
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct Saved {
    pub resource: String,
    pub auth_server: AuthServer,
    pub client: ClientReg,
    pub access_token: String,
    #[serde(default)]
    pub refresh_token: Option<String>,
    /// Unix seconds.
    #[serde(default)]
    pub expires_at: Option<u64>,
    #[serde(default)]
    pub scope: Option<String>,
}

impl std::fmt::Debug for Saved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Saved")
            .field("resource", &self.resource)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// Where one server's state is stored and the key that opens it.
pub struct TokenStore {
    path: PathBuf,
    aad: String,
    key: Option<[u8; 32]>,
    /// Why there is no key, for messages.
    no_key: String,
}

impl TokenStore {
    /// The store of server `name` at `url` under `data_dir/oauth/`.
    pub fn new(
        data_dir: &Path,
        name: &str,
        url: &str,
        secret_key_env: Option<&str>,
        env: &Env,
    ) -> TokenStore {
        let secret = secret_key_env
            .and_then(|v| env.var(v))
            .filter(|s| !s.is_empty());
        let no_key = match secret_key_env {
            None => "no [server] secret_key_env is set: OAuth tokens are only stored encrypted; set it to a variable holding a secret".to_string(),
            Some(v) => format!("[server] secret_key_env names {v}, which is not set or empty"),
        };
        TokenStore {
            path: data_dir.join("oauth").join(format!("{name}.tokens")),
            aad: format!("turnstile oauth v1\n{name}\n{url}"),
            key: secret.map(derive),
            no_key,
        }
    }

    /// The stored state; `None` when there is none or it does not open (another key, another
    /// server or URL).
    pub fn load(&self) -> Option<Saved> {
        let key = self.key?;
        let bytes = std::fs::read(&self.path).ok()?;
        if bytes.len() > 1 << 20 {
            return None;
        }
        let plain = open(&key, &self.aad, bytes)?;
        serde_json::from_slice(&plain).ok()
    }

    /// Store `saved` (an error when there is no key).
    pub fn save(&self, saved: &Saved) -> Result<(), String> {
        let key = self.key.ok_or_else(|| self.no_key.clone())?;
        let plain = serde_json::to_vec(saved).map_err(|e| e.to_string())?;
        let sealed = seal(&key, &self.aad, plain)?;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let tmp = self
            .path
            .with_extension(format!("tmp{}", std::process::id()));
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(|e| format!("write {}: {e}", tmp.display()))?;
            f.write_all(&sealed)
                .and_then(|()| f.sync_all())
                .map_err(|e| format!("write {}: {e}", tmp.display()))?;
        }
        std::fs::rename(&tmp, &self.path)
            .map_err(|e| format!("rename to {}: {e}", self.path.display()))
    }

    /// The folder of the stored files.
    pub fn dir(&self) -> PathBuf {
        self.path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    /// Whether a key is configured.
    pub fn has_key(&self) -> bool {
        self.key.is_some()
    }

    /// The file's modification time (to notice a login by another process).
    pub fn stamp(&self) -> Option<std::time::SystemTime> {
        std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok()
    }
}

fn derive(secret: &str) -> [u8; 32] {
    let d = ring::digest::digest(
        &ring::digest::SHA256,
        format!("turnstile oauth token key\n{secret}").as_bytes(),
    );
    let mut k = [0u8; 32];
    k.copy_from_slice(d.as_ref());
    k
}

fn cipher(key: &[u8; 32]) -> Option<LessSafeKey> {
    Some(LessSafeKey::new(
        UnboundKey::new(&CHACHA20_POLY1305, key).ok()?,
    ))
}

fn seal(key: &[u8; 32], aad: &str, mut plain: Vec<u8>) -> Result<Vec<u8>, String> {
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| "no randomness for a nonce".to_string())?;
    let k = cipher(key).ok_or("bad key")?;
    k.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(aad.as_bytes()),
        &mut plain,
    )
    .map_err(|_| "encryption failed".to_string())?;
    let mut out = nonce.to_vec();
    out.extend_from_slice(&plain);
    Ok(out)
}

fn open(key: &[u8; 32], aad: &str, bytes: Vec<u8>) -> Option<Vec<u8>> {
    if bytes.len() < NONCE_LEN {
        return None;
    }
    let (n, rest) = bytes.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(n).ok()?;
    let mut buf = rest.to_vec();
    let plain = cipher(key)?
        .open_in_place(nonce, Aad::from(aad.as_bytes()), &mut buf)
        .ok()?;
    Some(plain.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_encrypted_and_open_only_for_their_server() {
        let dir = tempfile::tempdir().unwrap();
        let env = Env::from_vars([("TURNSTILE_TEST_OAUTH_KEY", "k3y")]);
        let s = TokenStore::new(
            dir.path(),
            "a",
            "https://a/mcp",
            Some("TURNSTILE_TEST_OAUTH_KEY"),
            &env,
        );
        let saved = Saved {
            access_token: "secret-access-token".into(),
            ..Saved::default()
        };
        s.save(&saved).unwrap();
        let raw = std::fs::read(dir.path().join("oauth/a.tokens")).unwrap();
        assert!(!String::from_utf8_lossy(&raw).contains("secret-access-token"));
        assert_eq!(s.load().unwrap().access_token, "secret-access-token");
        // The same file under another URL does not open.
        let other = TokenStore::new(
            dir.path(),
            "a",
            "https://evil/mcp",
            Some("TURNSTILE_TEST_OAUTH_KEY"),
            &env,
        );
        assert!(other.load().is_none());
        let nokey = TokenStore::new(dir.path(), "a", "https://a/mcp", None, &env);
        assert!(nokey.load().is_none());
        assert!(nokey.save(&saved).unwrap_err().contains("secret_key_env"));
    }
}
