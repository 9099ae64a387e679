//! How `/mcp` names a server's tools, prompts and resources so that each name goes back to its
//! server: `mcp__<server>__<tool>` (the federation's name), `<server>/<prompt>` and
//! `turnstile://<server>/<uri>`. A server name has no `/` (config validation keeps it to
//! letters, digits, `_` and `-`), so the first `/` after it ends it and the rest is the
//! server's own name or URI (a URI in its canonical form, see
//! [`crate::tools::mcp::resource_uri`]). With `[mcp_endpoint] names = "own"`, [`shown`] keeps
//! a server's own name wherever it names one thing only and may be shown as it is.

use crate::config::EndpointNames;

/// The scheme of a passed-through resource's URI.
pub(crate) const SCHEME: &str = "turnstile://";

/// A server's resource URI (or URI template) as `/mcp` lists it.
pub(crate) fn expose_uri(server: &str, uri: &str) -> String {
    format!("{SCHEME}{server}/{uri}")
}

/// The server and its own URI of a URI `/mcp` listed; `None` for any other URI.
pub(crate) fn parse_uri(uri: &str) -> Option<(&str, &str)> {
    let (server, rest) = uri.strip_prefix(SCHEME)?.split_once('/')?;
    (!server.is_empty() && !rest.is_empty()).then_some((server, rest))
}

/// A server's prompt (or resource) name as `/mcp` lists it.
pub(crate) fn expose_prompt(server: &str, name: &str) -> String {
    format!("{server}/{name}")
}

/// The server and its own name of a prompt name `/mcp` listed.
pub(crate) fn parse_prompt(name: &str) -> Option<(&str, &str)> {
    let (server, prompt) = name.split_once('/')?;
    (!server.is_empty() && !prompt.is_empty()).then_some((server, prompt))
}

/// Whether a server's own tool or prompt name may be shown to a client as it is: what MCP
/// allows a tool name (1 to 128 of `A-Z a-z 0-9 _ - .`), as federated names are kept to. So no
/// client is shown a `/`, a control character or one that makes a name read backwards.
pub(crate) fn plain_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The name each item is shown by, given its own name and its federated one: the federated
/// one, or with [`EndpointNames::Own`] its own where it is `fit` to be shown, no other item
/// has that own name and no other item is shown by it. So every shown name is one item's, and
/// goes back to it.
pub(crate) fn shown<S: AsRef<str>>(
    items: &[(S, String)],
    names: EndpointNames,
    fit: impl Fn(&str) -> bool,
) -> Vec<String> {
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
            1 if fit(own.as_ref()) => own.as_ref().to_string(),
            _ => fed.clone(),
        })
        .collect()
}

/// What one step of a compiled template takes of a URI.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Class {
    /// Any character.
    Any,
    /// Any character but `/`, `?` and `#` (a simple `{x}` expression's value).
    Segment,
}

impl Class {
    fn has(self, c: char) -> bool {
        self == Class::Any || !matches!(c, '/' | '?' | '#')
    }
}

/// A step of a template compiled to an automaton: a literal character, one character of a
/// class, or any run of them.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    Char(char),
    One(Class),
    Star(Class),
}

/// An RFC 6570 template as steps: `{x}` one or more characters other than `/?#`, `{+x}` and
/// `{#x}` one or more of any, `{?x}`, `{&x}`, `{;x}` (query and parameters) any run, even
/// empty. `None` for a template with an unclosed expression.
fn compile(template: &str) -> Option<Vec<Step>> {
    let mut out = Vec::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.extend(rest[..open].chars().map(Step::Char));
        let close = rest[open..].find('}')? + open;
        match rest[open + 1..close].chars().next() {
            Some('+') | Some('#') => out.extend([Step::One(Class::Any), Step::Star(Class::Any)]),
            Some('?') | Some('&') | Some(';') => out.push(Step::Star(Class::Any)),
            _ => out.extend([Step::One(Class::Segment), Step::Star(Class::Segment)]),
        }
        rest = &rest[close + 1..];
    }
    out.extend(rest.chars().map(Step::Char));
    Some(out)
}

/// Add to `states` those reached without taking a character (past a run that may be empty).
fn close(steps: &[Step], states: &mut [bool]) {
    for i in 0..steps.len() {
        if states[i] && matches!(steps[i], Step::Star(_)) {
            states[i + 1] = true;
        }
    }
}

/// Whether `steps` take the whole of `s`: every reachable state at once, one character at a
/// time (no backtracking), so the work is at most `s`'s length times the steps. `None` when
/// that would pass `budget`, which is charged for the work done.
fn run(steps: &[Step], s: &str, budget: &mut usize) -> Option<bool> {
    let mut now = vec![false; steps.len() + 1];
    let mut next = now.clone();
    now[0] = true;
    close(steps, &mut now);
    for c in s.chars() {
        *budget = budget.checked_sub(steps.len() + 1)?;
        next.iter_mut().for_each(|x| *x = false);
        for (i, step) in steps.iter().enumerate() {
            if !now[i] {
                continue;
            }
            match *step {
                Step::Char(l) if l == c => next[i + 1] = true,
                Step::One(class) if class.has(c) => next[i + 1] = true,
                Step::Star(class) if class.has(c) => next[i] = true,
                _ => {}
            }
        }
        close(steps, &mut next);
        std::mem::swap(&mut now, &mut next);
        if !now.iter().any(|x| *x) {
            return Some(false);
        }
    }
    Some(now[steps.len()])
}

/// The work one request may spend matching a URI against templates (steps times characters):
/// a few milliseconds at most.
pub(crate) const TEMPLATE_BUDGET: usize = 4_000_000;

/// Whether `uri` is one that the RFC 6570 `template` expands to, in time linear in the URI
/// (templates and URIs over 2 KiB never match); `None` when the match would cost more than
/// what is left of `budget` (see [`TEMPLATE_BUDGET`]).
pub(crate) fn template_matches(template: &str, uri: &str, budget: &mut usize) -> Option<bool> {
    if template.len() > 2048 || uri.len() > 2048 {
        return Some(false);
    }
    match compile(template) {
        Some(steps) => run(&steps, uri, budget),
        None => Some(false),
    }
}

#[cfg(test)]
mod tests;
