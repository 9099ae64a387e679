//! How `/mcp` names a server's tools, prompts and resources so that each name goes back to its
//! server: `mcp__<server>__<tool>` (the federation's name), `<server>/<prompt>` and
//! `turnstile://<server>/<uri>`. A server name has no `/` (config validation keeps it to
//! letters, digits, `_` and `-`), so the first `/` after it ends it and the rest is the
//! server's own name or URI, unchanged. With `[mcp_endpoint] names = "own"`, [`shown`] keeps a
//! server's own name wherever it names one thing only.

use crate::config::EndpointNames;

/// The scheme of a passed-through resource's URI.
pub const SCHEME: &str = "turnstile://";

/// A server's resource URI (or URI template) as `/mcp` lists it.
pub fn expose_uri(server: &str, uri: &str) -> String {
    format!("{SCHEME}{server}/{uri}")
}

/// The server and its own URI of a URI `/mcp` listed; `None` for any other URI.
pub fn parse_uri(uri: &str) -> Option<(&str, &str)> {
    let (server, rest) = uri.strip_prefix(SCHEME)?.split_once('/')?;
    (!server.is_empty() && !rest.is_empty()).then_some((server, rest))
}

/// A server's prompt (or resource) name as `/mcp` lists it.
pub fn expose_prompt(server: &str, name: &str) -> String {
    format!("{server}/{name}")
}

/// The server and its own name of a prompt name `/mcp` listed.
pub fn parse_prompt(name: &str) -> Option<(&str, &str)> {
    let (server, prompt) = name.split_once('/')?;
    (!server.is_empty() && !prompt.is_empty()).then_some((server, prompt))
}

/// The name each item is shown by, given its own name and its federated one: the federated
/// one, or with [`EndpointNames::Own`] its own where no other item has that own name and no
/// other item is shown by it. So every shown name is one item's, and goes back to it.
pub fn shown<S: AsRef<str>>(items: &[(S, String)], names: EndpointNames) -> Vec<String> {
    let federated = || items.iter().map(|(_, f)| f.clone()).collect();
    if names == EndpointNames::Federated {
        return federated();
    }
    let count = |name: &str| {
        items
            .iter()
            .filter(|(own, fed)| own.as_ref() == name || fed == name)
            .count()
    };
    items
        .iter()
        .map(|(own, fed)| match count(own.as_ref()) {
            // Its own name is its federated one (a built-in tool), or no other item's.
            1 => own.as_ref().to_string(),
            _ => fed.clone(),
        })
        .collect()
}

/// One piece of an RFC 6570 template.
#[derive(Debug, PartialEq)]
enum Piece<'a> {
    Literal(&'a str),
    /// An expression: `{x}` matches one or more characters other than `/?#`, `{+x}` and `{#x}`
    /// one or more of any, `{?x}`, `{&x}`, `{;x}` (query and parameters) any run, even empty.
    Simple,
    Reserved,
    Query,
}

fn pieces(template: &str) -> Option<Vec<Piece<'_>>> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            out.push(Piece::Literal(&rest[..open]));
        }
        let close = rest[open..].find('}')? + open;
        let expr = &rest[open + 1..close];
        out.push(match expr.chars().next() {
            Some('+') | Some('#') => Piece::Reserved,
            Some('?') | Some('&') | Some(';') => Piece::Query,
            _ => Piece::Simple,
        });
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        out.push(Piece::Literal(rest));
    }
    Some(out)
}

fn matches(pieces: &[Piece<'_>], s: &str) -> bool {
    let Some((first, rest)) = pieces.split_first() else {
        return s.is_empty();
    };
    let (min, stops): (usize, &[char]) = match first {
        Piece::Literal(l) => return s.strip_prefix(l).is_some_and(|t| matches(rest, t)),
        Piece::Simple => (1, &['/', '?', '#']),
        Piece::Reserved => (1, &[]),
        Piece::Query => (0, &[]),
    };
    let ends = s
        .char_indices()
        .map(|(i, _)| i)
        .skip(1)
        .chain(std::iter::once(s.len()));
    if min == 0 && matches(rest, s) {
        return true;
    }
    for end in ends {
        if s[..end].contains(stops) {
            return false;
        }
        if matches(rest, &s[end..]) {
            return true;
        }
    }
    false
}

/// Whether `uri` is one that the RFC 6570 `template` expands to (a bounded match: templates
/// and URIs over 2 KiB never match).
pub fn template_matches(template: &str, uri: &str) -> bool {
    if template.len() > 2048 || uri.len() > 2048 {
        return false;
    }
    pieces(template).is_some_and(|p| matches(&p, uri))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_to_their_server() {
        let u = expose_uri("fs", "file:///tmp/a b/c?x=1#f");
        assert_eq!(u, "turnstile://fs/file:///tmp/a b/c?x=1#f");
        assert_eq!(parse_uri(&u), Some(("fs", "file:///tmp/a b/c?x=1#f")));
        assert_eq!(
            parse_uri(&expose_uri("a-b_c", "turnstile://x/y")),
            Some(("a-b_c", "turnstile://x/y"))
        );
        assert_eq!(parse_uri("test://static-text"), None);
        assert_eq!(parse_uri("turnstile://fs"), None);
        assert_eq!(parse_uri("turnstile:///x"), None);
        let p = expose_prompt("docs", "summarize/long");
        assert_eq!(parse_prompt(&p), Some(("docs", "summarize/long")));
        assert_eq!(parse_prompt("bare"), None);
        assert_eq!(parse_prompt("/x"), None);
    }

    #[test]
    fn own_names_where_they_name_one_thing() {
        let items = vec![
            ("add", "mcp__a__add".to_string()),
            ("add", "mcp__b__add".to_string()),
            ("echo", "mcp__a__echo".to_string()),
            ("deliver_file", "deliver_file".to_string()),
            // Its own name is another one's federated name: neither may be shown by it.
            ("mcp__a__echo", "mcp__c__mcp__a__echo".to_string()),
        ];
        assert_eq!(
            shown(&items, EndpointNames::Federated),
            vec![
                "mcp__a__add",
                "mcp__b__add",
                "mcp__a__echo",
                "deliver_file",
                "mcp__c__mcp__a__echo"
            ]
        );
        assert_eq!(
            shown(&items, EndpointNames::Own),
            vec![
                "mcp__a__add",
                "mcp__b__add",
                "echo",
                "deliver_file",
                "mcp__c__mcp__a__echo"
            ]
        );
    }

    #[test]
    fn templates_match_what_they_expand_to() {
        let t = "test://template/{id}/data";
        assert!(template_matches(t, "test://template/123/data"));
        assert!(!template_matches(t, "test://template//data"));
        assert!(!template_matches(t, "test://template/1/2/data"));
        assert!(!template_matches(t, "test://template/123/data/x"));
        assert!(template_matches("file:///{+path}", "file:///a/b/c.txt"));
        assert!(!template_matches("file:///{path}", "file:///a/b"));
        assert!(template_matches("db://t{?q,limit}", "db://t"));
        assert!(template_matches("db://t{?q,limit}", "db://t?q=1&limit=2"));
        assert!(template_matches("x://{a}-{b}", "x://1-2"));
        assert!(!template_matches("x://{a", "x://1"));
        assert!(template_matches("plain://x", "plain://x"));
        assert!(!template_matches("plain://x", "plain://y"));
    }
}
