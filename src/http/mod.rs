//! The HTTP edge: the accept loop, auth, bodies, ranges, errors and SSE. It serves whatever
//! handler it is given (the api module's `handle`) and imports no protocol and no route.

pub mod auth;
pub mod body;
pub mod browser;
pub mod conn;
pub mod detached;
pub mod error;
mod query;
pub mod range;
mod response;
pub mod server;
pub mod sse;

pub use error::ApiError;
pub use query::query_param;
pub use response::{empty_response, json_response, text_response, Body, Request, Response};
