//! rmcp's streamable-HTTP client, over our own hyper client.
//!
//! rmcp ships this client only on top of reqwest, which would bring a second HTTP and TLS stack
//! into the build. [`HyperMcpClient`] implements rmcp's
//! [`StreamableHttpClient`] with the hyper, hyper-util and hyper-rustls the crate already uses;
//! rmcp's transport worker keeps doing the protocol part (the handshake, sessions, the GET stream,
//! reconnection and session recovery).
//!
//! What the trait asks of a client, per request:
//! * POST a JSON-RPC message with `Accept: application/json, text/event-stream`, the session id
//!   (`Mcp-Session-Id`) once there is one, and the custom headers (rmcp adds
//!   `MCP-Protocol-Version` to them after the handshake); the answer is 202/204 (accepted), a
//!   JSON message, or an SSE stream of messages, plus the session id the server assigned;
//! * GET the server's own SSE stream (`Last-Event-ID` to resume); 405 means the server has none;
//! * DELETE the session when the transport closes;
//! * map statuses to rmcp's errors: 401/403 with a challenge, 404 on a session (expired),
//!   429/5xx (status with `Retry-After`), other failures with a bounded body prefix;
//! * bound what is buffered: a JSON body, an error body, one SSE event
//!   ([`StreamableHttpResponseLimits`]). A JSON answer to a request, or an SSE event, over the
//!   size an MCP message may have is not an error of the connection (which would leave the call
//!   waiting, or fail it with rmcp's words): it becomes a JSON-RPC error answer to the request,
//!   whose message says so (see [`super::too_large`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use http::header::{ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use rmcp::transport::StreamableHttpClientTransport;

use super::oauth::OAuth;
use crate::outbound::{https_client, HttpsClient};
use bounded_events::sse_events;
use responses::{auth_error, media_type_is, post_failure, preview, read_bounded, status_error};
use wire::{Error, CONNECT_TIMEOUT, EVENT_STREAM, JSON, LAST_EVENT_ID, RESERVED, SESSION_ID};

mod bounded_events;
mod responses;
mod wire;

pub use wire::HyperMcpError;

/// An MCP streamable-HTTP client over hyper (http and https), with TCP_NODELAY and a connection pool.
#[derive(Clone)]
pub struct HyperMcpClient {
    client: HttpsClient,
    /// The server's OAuth: each request's bearer token, and what a challenge means.
    oauth: Option<Arc<OAuth>>,
    /// The server's name, for the log and for what an answer too large is replaced with.
    server: Arc<str>,
}

impl Default for HyperMcpClient {
    fn default() -> Self {
        Self::new()
    }
}

impl HyperMcpClient {
    /// A client with its own pool; TLS trusts the webpki roots, as the upstream client does.
    pub fn new() -> HyperMcpClient {
        HyperMcpClient {
            client: https_client(Some(CONNECT_TIMEOUT)),
            oauth: None,
            server: Arc::from("remote"),
        }
    }

    /// A client whose requests carry the server's OAuth token.
    pub fn with_oauth(oauth: Option<Arc<OAuth>>) -> HyperMcpClient {
        HyperMcpClient {
            oauth,
            ..HyperMcpClient::new()
        }
    }

    /// A request with the headers every call shares: the session, the bearer token and the
    /// custom headers (which rmcp also uses for `MCP-Protocol-Version`).
    fn request(
        method: Method,
        uri: &str,
        session_id: Option<&str>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<http::request::Builder, Error> {
        let mut builder = Request::builder().method(method).uri(uri);
        if let Some(session_id) = session_id {
            builder = builder.header(SESSION_ID, session_id);
        }
        if let Some(token) = auth_token {
            let mut value = HeaderValue::try_from(format!("Bearer {token}"))
                .map_err(|e| Error::Client(HyperMcpError::Request(e.into())))?;
            value.set_sensitive(true);
            builder = builder.header(AUTHORIZATION, value);
        }
        for (name, value) in custom_headers {
            if RESERVED
                .iter()
                .any(|r| name.as_str().eq_ignore_ascii_case(r))
            {
                return Err(Error::ReservedHeaderConflict(name.to_string()));
            }
            builder = builder.header(name, value);
        }
        Ok(builder)
    }

    /// A JSON answer to a POST, read within `max` bytes: the server's message, or (over the
    /// bound) the JSON-RPC error answer its request gets instead.
    async fn json_answer(
        &self,
        response: Response<Incoming>,
        message: &ClientJsonRpcMessage,
        new_session: Option<String>,
        content_length: Option<u64>,
        max: usize,
    ) -> Result<StreamableHttpPostResponse, Error> {
        // Notifications, responses and errors leave nothing outstanding: any 2xx will do.
        let awaits_no_response = !matches!(message, ClientJsonRpcMessage::Request(_));
        let too_large = |size: Option<u64>| {
            let ClientJsonRpcMessage::Request(request) = message else {
                tracing::warn!(server = %self.server, size_bytes = size, "an MCP server's answer to a notification was over the size an MCP message may have: dropped");
                return Ok(StreamableHttpPostResponse::Accepted);
            };
            tracing::warn!(server = %self.server, size_bytes = size, max_bytes = max, "an MCP server's answer was over the size an MCP message may have: its call ended with the reason");
            let who = format!("MCP server {}", self.server);
            let error = super::too_large::error_data(&who, size);
            let reply = ServerJsonRpcMessage::error(error, Some(request.id.clone()));
            Ok(StreamableHttpPostResponse::Json(reply, new_session.clone()))
        };
        if content_length.is_some_and(|n| n > max as u64) {
            return too_large(content_length);
        }
        let body = match read_bounded(response.into_body(), max).await {
            Ok(body) => body,
            Err(Error::ResponseBodyTooLarge { .. }) => return too_large(None),
            Err(e) => return Err(e),
        };
        match serde_json::from_slice::<ServerJsonRpcMessage>(&body) {
            Ok(reply) => Ok(StreamableHttpPostResponse::Json(reply, new_session)),
            Err(_) if awaits_no_response => Ok(StreamableHttpPostResponse::Accepted),
            Err(e) => Err(Error::UnexpectedServerResponse(Cow::Owned(format!(
                "could not parse JSON response as ServerJsonRpcMessage: {e}: {}",
                preview(&body, 256)
            )))),
        }
    }

    /// Send a request built by `build` (given the bearer token); on a 401/403 challenge that
    /// the server's OAuth answers with a new token, once more.
    async fn send(
        &self,
        build: impl Fn(Option<String>) -> Result<http::request::Builder, Error>,
        body: Bytes,
    ) -> Result<Response<Incoming>, Error> {
        let Some(oauth) = &self.oauth else {
            return self.send_once(build(None)?, body).await;
        };
        let response = self
            .send_once(build(oauth.bearer().await)?, body.clone())
            .await?;
        let status = response.status();
        if status.is_success() {
            oauth.succeeded().await;
            return Ok(response);
        }
        if !matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            return Ok(response);
        }
        let challenge = response
            .headers()
            .get(http::header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("Bearer")
            .to_string();
        if oauth.challenged(status, &challenge).await {
            return self.send_once(build(oauth.bearer().await)?, body).await;
        }
        Ok(response)
    }

    async fn send_once(
        &self,
        builder: http::request::Builder,
        body: Bytes,
    ) -> Result<Response<Incoming>, Error> {
        let request = builder
            .body(Full::new(body))
            .map_err(|e| Error::Client(e.into()))?;
        self.client
            .request(request)
            .await
            .map_err(|e| Error::Client(e.into()))
    }
}

impl StreamableHttpClient for HyperMcpClient {
    type Error = HyperMcpError;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let limits = StreamableHttpResponseLimits::default();
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_token,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_token,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let body = serde_json::to_vec(&message).map_err(|e| Error::Client(e.into()))?;
        let had_session = session_id.is_some();
        let build = |token: Option<String>| {
            Ok(Self::request(
                Method::POST,
                &uri,
                session_id.as_deref(),
                token.or_else(|| auth_token.clone()),
                custom_headers.clone(),
            )?
            .header(CONTENT_TYPE, JSON)
            .header(ACCEPT, format!("{JSON}, {EVENT_STREAM}")))
        };
        let response = self.send(build, body.into()).await?;

        let status = response.status();
        if let Some(error) = auth_error(&response) {
            return Err(error);
        }
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == StatusCode::NOT_FOUND && had_session {
            return Err(Error::SessionExpired);
        }
        let headers = response.headers();
        let content_type = headers.get(CONTENT_TYPE).cloned();
        let is = |mime: &str| {
            content_type
                .as_ref()
                .is_some_and(|ct| media_type_is(ct, mime))
        };
        let (is_json, is_sse) = (is(JSON), is(EVENT_STREAM));
        let content_length = headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let new_session = headers
            .get(SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // Notifications, responses and errors leave nothing outstanding: any 2xx will do.
        let awaits_no_response = !matches!(message, ClientJsonRpcMessage::Request(_));

        if !status.is_success() {
            return post_failure(response, &message, had_session, is_json, limits).await;
        }
        if is_sse {
            let max = limits.max_sse_event_size;
            let stream = sse_events(response.into_body(), max, self.server.clone());
            return Ok(StreamableHttpPostResponse::Sse(stream, new_session));
        }
        if content_length == Some(0) && awaits_no_response {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if !is_json {
            if awaits_no_response {
                return Ok(StreamableHttpPostResponse::Accepted);
            }
            let ct = content_type.map(|ct| String::from_utf8_lossy(ct.as_bytes()).into_owned());
            return Err(Error::UnexpectedContentType(ct));
        }
        let max = limits.max_json_response_size;
        self.json_answer(response, &message, new_session, content_length, max)
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Error> {
        let build = |token: Option<String>| {
            Self::request(
                Method::DELETE,
                &uri,
                Some(&session_id),
                token.or_else(|| auth_token.clone()),
                custom_headers.clone(),
            )
        };
        let status = self.send(build, Bytes::new()).await?.status();
        // 405: the server keeps sessions until they expire; nothing to do.
        if status.is_success() || status == StatusCode::METHOD_NOT_ALLOWED {
            Ok(())
        } else {
            Err(Error::UnexpectedServerResponse(Cow::Owned(format!(
                "delete_session returned {status}"
            ))))
        }
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxedSseResponse, Error> {
        let max = StreamableHttpResponseLimits::default().max_sse_event_size;
        self.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_token,
            custom_headers,
            max,
        )
        .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxedSseResponse, Error> {
        let build = |token: Option<String>| {
            let mut builder = Self::request(
                Method::GET,
                &uri,
                session_id.as_deref(),
                token.or_else(|| auth_token.clone()),
                custom_headers.clone(),
            )?
            .header(ACCEPT, format!("{EVENT_STREAM}, {JSON}"));
            if let Some(id) = &last_event_id {
                builder = builder.header(LAST_EVENT_ID, id);
            }
            Ok(builder)
        };
        let response = self.send(build, Bytes::new()).await?;
        let status = response.status();
        if status == StatusCode::METHOD_NOT_ALLOWED {
            return Err(Error::ServerDoesNotSupportSse);
        }
        if let Some(error) = auth_error(&response).or_else(|| status_error(&response)) {
            return Err(error);
        }
        if !status.is_success() {
            return Err(Error::UnexpectedServerResponse(Cow::Owned(format!(
                "get_stream returned {status}"
            ))));
        }
        // rmcp's clients also let a JSON content type through here (and parse it as SSE).
        match response.headers().get(CONTENT_TYPE) {
            Some(ct) if media_type_is(ct, EVENT_STREAM) || media_type_is(ct, JSON) => {
                Ok(sse_events(
                    response.into_body(),
                    max_sse_event_size,
                    self.server.clone(),
                ))
            }
            ct => {
                Err(Error::UnexpectedContentType(ct.map(|ct| {
                    String::from_utf8_lossy(ct.as_bytes()).into_owned()
                })))
            }
        }
    }
}

/// Connect to a remote server: the transport rmcp's `ServiceExt::serve` takes.
///
/// `headers` go out with every request (an `Authorization` among them included); the transport
/// is spawned on the current tokio runtime, so this must run inside one.
pub fn transport(
    url: &str,
    headers: HashMap<HeaderName, HeaderValue>,
    oauth: Option<Arc<OAuth>>,
) -> StreamableHttpClientTransport<HyperMcpClient> {
    server_transport("remote", url, headers, oauth)
}

/// [`transport`] to the server named `server` in `[mcp_servers]` (the name its log lines and
/// error answers give).
pub fn server_transport(
    server: &str,
    url: &str,
    headers: HashMap<HeaderName, HeaderValue>,
    oauth: Option<Arc<OAuth>>,
) -> StreamableHttpClientTransport<HyperMcpClient> {
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
    let client = HyperMcpClient {
        server: Arc::from(server),
        ..HyperMcpClient::with_oauth(oauth)
    };
    StreamableHttpClientTransport::with_client(client, config)
}

#[cfg(test)]
mod tests;
