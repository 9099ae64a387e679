//! Query strings, decoded as `application/x-www-form-urlencoded` (`+` is a space, then `%XX`).

use super::response::Request;

/// The first query parameter `name`, decoded.
pub(crate) fn query_param(req: &Request, name: &str) -> Option<String> {
    param(req.uri().query()?, name)
}

/// The first value of `name` in the query string `q`.
fn param(q: &str, name: &str) -> Option<String> {
    form_urlencoded::parse(q.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

#[cfg(test)]
mod tests {
    use super::param;

    #[test]
    fn decoding() {
        assert_eq!(param("q=a%20b+c", "q").as_deref(), Some("a b c"));
        assert_eq!(param("q=100%", "q").as_deref(), Some("100%"));
        assert_eq!(param("q=%e4%b8%ad", "q").as_deref(), Some("中"));
        assert_eq!(param("q=%zz", "q").as_deref(), Some("%zz"));
        assert_eq!(param("a+b=1&q", "a b").as_deref(), Some("1"));
        assert_eq!(param("x=1&q", "q").as_deref(), Some(""));
        assert_eq!(param("x=1", "q"), None);
    }
}
