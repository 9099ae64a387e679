//! Bearer keys. With keys set, every route but the public ones needs `Authorization: Bearer
//! <key>`; what a key creates belongs to it (its owner id is a digest of the key, so the key
//! itself is never stored).

use ring::digest::{digest, SHA256};

use super::{ApiError, Request};

/// The configured keys, as digests.
#[derive(Clone, Default)]
pub(crate) struct Keys {
    digests: Vec<[u8; 32]>,
}

fn sha256(s: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, s.as_bytes()).as_ref());
    out
}

impl Keys {
    /// Keys from a comma-separated list (blank entries ignored).
    pub(crate) fn parse(list: &str) -> Keys {
        Keys {
            digests: list
                .split(',')
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(sha256)
                .collect(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// The owner id of the request's key; `None` when no keys are configured.
    pub(crate) fn owner(&self, req: &Request) -> Result<Option<String>, ApiError> {
        if self.digests.is_empty() {
            return Ok(None);
        }
        let unauthorized =
            |msg: &str| ApiError::new(http::StatusCode::UNAUTHORIZED, "unauthorized", msg);
        let header = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .ok_or_else(|| {
                unauthorized("this server needs an API key: send Authorization: Bearer <key>")
            })?;
        let key = header
            .to_str()
            .ok()
            .and_then(|h| {
                h.strip_prefix("Bearer ")
                    .or_else(|| h.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or_else(|| unauthorized("the Authorization header must be Bearer <key>"))?;
        let d = sha256(key);
        // Compare digests, all of them, so timing says nothing about the keys.
        let found = self
            .digests
            .iter()
            .fold(false, |acc, k| acc | ring_eq(k, &d));
        if !found {
            return Err(unauthorized("the API key is not valid"));
        }
        Ok(Some(d[..16].iter().map(|b| format!("{b:02x}")).collect()))
    }
}

fn ring_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
