//! `GET /usage`: what principals spent (tokens, USD, model and tool calls), from the store's
//! usage rows, summed by `group_by` (a comma-separated subset of `principal`, `agent`,
//! `upstream`, `model`, `day`; default `day`) over the days `from..=to` (`YYYY-MM-DD`, UTC,
//! each optional), optionally only `agent=`, `upstream=`, `model=`. A principal reads its own
//! rows; an admin (`[keys.NAME] admin`) reads every principal's and may pick one with
//! `principal=` (a `[keys.NAME]` name, the digest an `api_keys_env` key shows as, or
//! `anonymous`).

use http::StatusCode;

use crate::config::KEY_OWNER_PREFIX;
use crate::http::{json_response, query_param, ApiError, Request, Response};
use crate::log::{UsageFilter, USAGE_ROWS_AT_MOST};
use crate::protocol::context::{App, Caller};
use crate::usage::{parse_day, principal_name, report, Dimension, Query, ANONYMOUS};

/// `GET /usage`.
pub(crate) async fn usage(app: &App, caller: &Caller, req: &Request) -> Result<Response, ApiError> {
    let param = |name: &str| query_param(req, name);
    let day = |name: &str| -> Result<Option<String>, ApiError> {
        match param(name) {
            None => Ok(None),
            Some(d) if parse_day(&d).is_some() => Ok(Some(d)),
            Some(d) => Err(ApiError::bad_request(format!(
                "{name}={d:?} is not a day: give YYYY-MM-DD (UTC), e.g. {name}=2026-12-01"
            ))),
        }
    };
    let (from, to) = (day("from")?, day("to")?);
    if let (Some(f), Some(t)) = (&from, &to) {
        if f > t {
            return Err(ApiError::bad_request(format!(
                "from={f} is after to={t}: give from <= to"
            )));
        }
    }
    let group_by = group_by(param("group_by").as_deref())?;
    let owner = owner_asked(caller, param("principal"))?;
    let filter = UsageFilter {
        owner,
        from: from.clone(),
        to: to.clone(),
    };
    let mut rows = app.engine.store().usage(filter).await.map_err(|e| {
        tracing::error!(error = %e, "usage could not be read");
        ApiError::store_unavailable(format!("usage cannot be read now ({e}); try again shortly"))
    })?;
    let truncated = rows.len() >= USAGE_ROWS_AT_MOST;
    for (name, field) in [("agent", 0usize), ("upstream", 1), ("model", 2)] {
        if let Some(want) = param(name) {
            rows.retain(|r| [&r.agent, &r.upstream, &r.model][field] == &want);
        }
    }
    let q = Query { group_by, from, to };
    Ok(json_response(StatusCode::OK, &report(&q, &rows, truncated)))
}

/// `group_by`: dimensions, each once, in the order given; `day` when absent.
fn group_by(v: Option<&str>) -> Result<Vec<Dimension>, ApiError> {
    let Some(v) = v else {
        return Ok(vec![Dimension::Day]);
    };
    let mut out = Vec::new();
    for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let d = Dimension::parse(name).ok_or_else(|| {
            ApiError::bad_request(format!(
                "group_by: unknown dimension {name:?}; use a comma-separated subset of principal, agent, upstream, model, day"
            ))
        })?;
        if !out.contains(&d) {
            out.push(d);
        }
    }
    Ok(out)
}

/// Whose rows the caller reads: its own (`Some`), or with an admin's key every principal's
/// (`None`) or the one `principal=` names.
fn owner_asked(caller: &Caller, asked: Option<String>) -> Result<Option<String>, ApiError> {
    let own = caller.owner().unwrap_or_default().to_string();
    let admin = caller.principal.as_deref().is_some_and(|p| p.scope.admin);
    let Some(name) = asked.filter(|n| !n.is_empty()) else {
        return Ok((!admin).then_some(own));
    };
    let valid = name.len() <= 64
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-');
    if !valid {
        return Err(ApiError::bad_request(format!(
            "principal={name:?} is not a principal's name: give the NAME of a [keys.NAME] table, an api_keys_env key's digest, or {ANONYMOUS}"
        )));
    }
    let is_digest =
        name.len() == 32 && name.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let owner = match name.as_str() {
        ANONYMOUS => String::new(),
        _ if is_digest => name.clone(),
        _ => format!("{KEY_OWNER_PREFIX}{name}"),
    };
    if !admin && owner != own {
        return Err(ApiError::forbidden(format!(
            "only an admin key may read another principal's usage; yours is {}",
            principal_name(caller.owner())
        )));
    }
    Ok(Some(owner))
}
