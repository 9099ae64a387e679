//! The one spelling of a resource URI: what the policy judges and what the server is sent.
//!
//! A client names a resource by any spelling it likes (`file:///srv/../etc/shadow`,
//! `file:///%65tc/shadow`, `file://localhost/etc/shadow`, `file:////etc/shadow`), and a server
//! resolves them all to one file. A policy glob matched on the string as given would judge a
//! spelling, not the file. So a URI from a client is first brought to its canonical form, and
//! that form is both what the globs see and what reaches the server: whatever the server makes
//! of it, it is what was judged. A URI without one unambiguous canonical form is refused.
//!
//! The rule (RFC 3986 §6.2.2, made strict):
//! - the scheme and the host in lower case; a `file` URI's authority empty (`localhost` becomes
//!   empty, any other host is refused) and `file:/x` written `file:///x`;
//! - in the path, every escape of a character a path may hold as it is (letters, digits,
//!   `-._~!$&'()*+,;=:@`, and UTF-8 characters beyond ASCII) decoded, every character it may
//!   not hold (a space, `"<>^`{|}`, `%`) escaped, escapes in upper case; then dot segments
//!   (`.`, `..`) removed and runs of `/` made one. So each path has one spelling;
//! - refused: an escaped `/`, `?` or `#` in a path (a server may split on it or not), a `\`
//!   (a separator to some), control and bidirectional-formatting characters raw or escaped, a
//!   malformed escape, escapes that are not UTF-8, a `file` URI with a query or fragment (a
//!   file server may ignore them), and URIs over [`MAX_LEN`] bytes;
//! - query and fragment of other schemes keep their meaning: only escapes of unreserved
//!   characters are decoded and hex put in upper case.
//!
//! A URI template (`resources/templates/list`, a completion's `ref/resource`) keeps its `{…}`
//! expressions as they are ([`canonical_template`]).

use std::fmt::Write as _;

/// The longest URI taken, in bytes.
pub const MAX_LEN: usize = 8192;

/// Why a URI has no canonical form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The canonical form of a resource URI (see the module documentation).
pub fn canonical(uri: &str) -> Result<String, Refused> {
    canonicalize(uri, false)
}

/// The canonical form of a URI template: as [`canonical`], with `{` and `}` kept.
pub fn canonical_template(template: &str) -> Result<String, Refused> {
    canonicalize(template, true)
}

fn refused(why: impl Into<String>) -> Refused {
    Refused(why.into())
}

/// Characters no URI shows unambiguously: controls and Unicode's bidirectional and invisible
/// formatting characters (a name could read backwards or hide a part).
pub fn is_deceptive(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{061C}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}')
}

fn canonicalize(uri: &str, template: bool) -> Result<String, Refused> {
    if uri.len() > MAX_LEN {
        return Err(refused(format!(
            "the URI is {} bytes long; at most {MAX_LEN} are taken",
            uri.len()
        )));
    }
    if let Some(c) = uri.chars().find(|c| is_deceptive(*c) || *c == '\\') {
        return Err(refused(format!(
            "the URI holds the character {:?}, which a server may read otherwise",
            c
        )));
    }
    let (scheme, rest) = split_scheme(uri)?;
    let (rest, fragment) = match rest.split_once('#') {
        Some((r, f)) => (r, Some(f)),
        None => (rest, None),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.strip_prefix("//") {
        Some(r) => {
            let end = r.find('/').unwrap_or(r.len());
            (Some(&r[..end]), &r[end..])
        }
        None => (None, rest),
    };
    let file = scheme == "file";
    let mut out = String::with_capacity(uri.len() + 8);
    out.push_str(&scheme);
    out.push(':');
    let authority = match authority {
        Some(a) => Some(normalize_authority(a)?),
        None => None,
    };
    if file {
        if query.is_some() || fragment.is_some() {
            return Err(refused(
                "a file URI with a query or a fragment (?, #) names a file ambiguously",
            ));
        }
        match authority.as_deref() {
            None | Some("") | Some("localhost") => {}
            Some(host) => {
                return Err(refused(format!(
                    "a file URI on another host ({host}) is not a local file"
                )))
            }
        }
        if !path.starts_with('/') {
            return Err(refused("a file URI needs an absolute path (file:///…)"));
        }
        out.push_str("//");
    } else if let Some(a) = &authority {
        out.push_str("//");
        out.push_str(a);
    }
    let path = normalize_path(path, template)?;
    let hierarchical = authority.is_some() || path.starts_with('/');
    if hierarchical {
        out.push_str(&remove_dot_segments(&path));
    } else {
        out.push_str(&path);
    }
    if let Some(q) = query {
        out.push('?');
        out.push_str(&normalize_other(q, template)?);
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(&normalize_other(f, template)?);
    }
    Ok(out)
}

/// The scheme in lower case, and what follows its `:`.
fn split_scheme(uri: &str) -> Result<(String, &str), Refused> {
    let no_scheme = || refused("the URI has no scheme (such as file: or https:)");
    let (scheme, rest) = uri.split_once(':').ok_or_else(no_scheme)?;
    let mut chars = scheme.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid {
        return Err(no_scheme());
    }
    Ok((scheme.to_ascii_lowercase(), rest))
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// What a path segment may hold as it is besides unreserved characters (RFC 3986 `pchar`).
fn is_path_char(b: u8) -> bool {
    is_unreserved(b)
        || matches!(
            b,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
        )
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The bytes `s` spells, escapes decoded; a malformed escape is refused.
fn decode(s: &str) -> Result<Vec<u8>, Refused> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let v = b
                .get(i + 1)
                .and_then(|h| hex(*h))
                .zip(b.get(i + 2).and_then(|l| hex(*l)))
                .map(|(h, l)| h * 16 + l)
                .ok_or_else(|| refused("the URI has a % not followed by two hex digits"))?;
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

/// A path with each character spelled one way: decoded where it may stand as it is, escaped
/// where it may not.
fn normalize_path(path: &str, template: bool) -> Result<String, Refused> {
    // Raw `/` separate segments; an escaped one inside a segment is refused below.
    let mut out = String::with_capacity(path.len());
    for (n, segment) in path.split('/').enumerate() {
        if n > 0 {
            out.push('/');
        }
        let bytes = decode(segment)?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|_| refused("the URI's path has escapes that are not UTF-8 text"))?;
        for c in text.chars() {
            match c {
                '/' | '?' | '#' => {
                    return Err(refused(format!(
                        "the URI's path has an escaped {c:?}; a server may read it as a separator or not"
                    )))
                }
                '\\' => return Err(refused("the URI's path has an escaped backslash")),
                c if is_deceptive(c) => {
                    return Err(refused(format!(
                        "the URI's path has the escaped character {c:?}"
                    )))
                }
                '{' | '}' if template => out.push(c),
                c if c.is_ascii() && is_path_char(c as u8) => out.push(c),
                c if c.is_ascii() => {
                    let _ = write!(out, "%{:02X}", c as u8);
                }
                c => out.push(c),
            }
        }
    }
    Ok(out)
}

/// An authority (`host`, `user@host:port`): escapes of unreserved characters decoded, hex in
/// upper case, the host in lower case.
fn normalize_authority(a: &str) -> Result<String, Refused> {
    let a = normalize_other(a, false)?;
    Ok(match a.rsplit_once('@') {
        Some((user, host)) => format!("{user}@{}", lower_outside_escapes(host)),
        None => lower_outside_escapes(&a),
    })
}

/// `s` in lower case but for the hex digits of its escapes (kept upper case).
fn lower_outside_escapes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut hex_left = 0;
    for c in s.chars() {
        if hex_left > 0 {
            hex_left -= 1;
            out.push(c);
        } else {
            hex_left = if c == '%' { 2 } else { 0 };
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// A query, fragment or authority: only escapes of unreserved characters decoded (others keep
/// their meaning there), hex in upper case, characters no URI holds raw escaped.
fn normalize_other(s: &str, template: bool) -> Result<String, Refused> {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let v = b
                .get(i + 1)
                .and_then(|h| hex(*h))
                .zip(b.get(i + 2).and_then(|l| hex(*l)))
                .map(|(h, l)| h * 16 + l)
                .ok_or_else(|| refused("the URI has a % not followed by two hex digits"))?;
            if v < 0x20 || v == 0x7F {
                return Err(refused("the URI has an escaped control character"));
            }
            if is_unreserved(v) {
                out.push(v as char);
            } else {
                let _ = write!(out, "%{v:02X}");
            }
            i += 3;
            continue;
        }
        // Whole characters from here: `s` is text.
        let c = s[i..].chars().next().unwrap_or(' ');
        match c {
            '{' | '}' if template => out.push(c),
            ' ' | '"' | '<' | '>' | '^' | '`' | '{' | '|' | '}' => {
                let _ = write!(out, "%{:02X}", c as u8);
            }
            c => out.push(c),
        }
        i += c.len_utf8();
    }
    Ok(out)
}

/// RFC 3986 §5.2.4, with runs of `/` made one: `/a//b/./c/../d` is `/a/b/d`.
fn remove_dot_segments(path: &str) -> String {
    let absolute = path.starts_with('/');
    let mut kept: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').collect();
    let last = segments.len().saturating_sub(1);
    // A path ending in `/`, `/.` or `/..` names a folder: it keeps its trailing `/`.
    let mut trailing = false;
    for (n, seg) in segments.iter().enumerate() {
        match *seg {
            "" => trailing = n == last && n > 0,
            "." => trailing = n == last,
            ".." => {
                kept.pop();
                trailing = n == last;
            }
            s => {
                kept.push(s);
                trailing = false;
            }
        }
    }
    let mut out = String::with_capacity(path.len());
    if absolute {
        out.push('/');
    }
    out.push_str(&kept.join("/"));
    if trailing && !kept.is_empty() {
        out.push('/');
    }
    out
}

#[cfg(test)]
#[path = "resource_uri_tests.rs"]
mod tests;
