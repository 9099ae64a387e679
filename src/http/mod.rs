//! The HTTP edge: the accept loop, auth, bodies, ranges, errors and SSE. It serves whatever
//! handler it is given (the api module's `handle`) and imports no protocol and no route.

pub(crate) mod auth;
pub(crate) mod body;
pub(crate) mod browser;
pub(crate) mod conn;
pub(crate) mod detached;
pub(crate) mod error;
mod query;
pub(crate) mod range;
mod response;
pub(crate) mod server;
pub(crate) mod sse;

pub(crate) use error::ApiError;
pub(crate) use query::query_param;
pub(crate) use response::{empty_response, json_response, text_response, Body, Request, Response};
