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
mod tests {
    use std::time::Duration;

    use http::HeaderMap;
    use http_body_util::BodyExt;

    use super::bounded_events::SseParser;
    use super::responses::challenge_scope;
    use super::wire::Sse;
    use std::sync::Mutex;

    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use rmcp::model::CallToolRequestParams;
    use rmcp::ServiceExt;
    use serde_json::{json, Value};

    use super::*;

    /// One request as the fake server saw it.
    #[derive(Debug, Clone)]
    struct Seen {
        method: Method,
        headers: HeaderMap,
        /// The JSON-RPC method of a POST.
        rpc: Option<String>,
    }

    /// A streamable-HTTP MCP server just good enough for the client: `initialize` answered
    /// with JSON and a session id, `tools/list` with an SSE stream, `tools/call` with JSON,
    /// notifications with 202, GET with 405 (no server stream), DELETE with 200. With `fail`,
    /// every POST gets a 500.
    struct Fake {
        url: String,
        seen: Arc<Mutex<Vec<Seen>>>,
    }

    impl Fake {
        async fn start(fail: bool) -> Fake {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}/mcp", listener.local_addr().unwrap());
            let seen = Arc::new(Mutex::new(Vec::new()));
            let log = seen.clone();
            tokio::spawn(async move {
                loop {
                    let (stream, _) = listener.accept().await.unwrap();
                    let log = log.clone();
                    let service = service_fn(move |req| answer(req, log.clone(), fail));
                    tokio::spawn(
                        http1::Builder::new().serve_connection(TokioIo::new(stream), service),
                    );
                }
            });
            Fake { url, seen }
        }

        fn seen(&self) -> Vec<Seen> {
            self.seen.lock().unwrap().clone()
        }
    }

    async fn answer(
        req: Request<Incoming>,
        log: Arc<Mutex<Vec<Seen>>>,
        fail: bool,
    ) -> Result<Response<Full<Bytes>>, hyper::Error> {
        let (parts, body) = req.into_parts();
        let body = body.collect().await?.to_bytes();
        let rpc: Option<Value> = serde_json::from_slice(&body).ok();
        let method = rpc
            .as_ref()
            .and_then(|m| m["method"].as_str())
            .map(str::to_owned);
        log.lock().unwrap().push(Seen {
            method: parts.method.clone(),
            headers: parts.headers,
            rpc: method.clone(),
        });
        let reply = |status: u16, ct: Option<&str>, body: String| {
            let mut r = Response::builder().status(status);
            if let Some(ct) = ct {
                r = r.header(CONTENT_TYPE, ct);
            }
            Ok(r.body(Full::new(Bytes::from(body))).unwrap())
        };
        match parts.method {
            Method::GET => return reply(405, None, String::new()),
            Method::DELETE => return reply(200, None, String::new()),
            _ if fail => return reply(500, Some("text/plain"), "boom".into()),
            _ => {}
        }
        let rpc = rpc.unwrap_or_default();
        let result = |result: Value| json!({"jsonrpc": "2.0", "id": rpc["id"], "result": result});
        match method.as_deref().unwrap_or_default() {
            "initialize" => {
                // What servers deployed today answer, whatever the client proposes (rmcp 3.11
                // proposes 2026-07-28; echoing that would add its Mcp-Method/Mcp-Name headers).
                let init = result(json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {"tools": {"listChanged": true}},
                    "serverInfo": {"name": "fake", "version": "1.0.0"}
                }));
                let mut r = reply(200, Some(JSON), init.to_string())?;
                r.headers_mut()
                    .insert(SESSION_ID, HeaderValue::from_static("sess-1"));
                Ok(r)
            }
            "tools/list" => {
                let tools = result(json!({"tools": [
                    {"name": "echo", "description": "Echo", "inputSchema": {"type": "object"}},
                    {"name": "add", "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}}}}
                ]}));
                // A keep-alive comment, then the response split over CRLF-terminated lines.
                let sse = format!(": keep-alive\r\nevent: message\r\ndata: {tools}\r\n\r\n");
                reply(200, Some("text/event-stream; charset=utf-8"), sse)
            }
            "tools/call" => {
                let args = &rpc["params"]["arguments"];
                if let Some(n) = args["big"].as_u64() {
                    // An answer of n bytes of text, chunked (no Content-Length) if asked.
                    let text =
                        json!({"content": [{"type": "text", "text": "b".repeat(n as usize)}]});
                    let mut r = reply(200, Some(JSON), result(text).to_string())?;
                    if args["chunked"] == true {
                        r.headers_mut()
                            .insert("transfer-encoding", HeaderValue::from_static("chunked"));
                    }
                    return Ok(r);
                }
                let text = json!({"content": [{"type": "text", "text": args.to_string()}]});
                reply(200, Some(JSON), result(text).to_string())
            }
            _ => reply(202, None, String::new()),
        }
    }

    fn bearer() -> HashMap<HeaderName, HeaderValue> {
        HashMap::from([(AUTHORIZATION, HeaderValue::from_static("Bearer x"))])
    }

    #[tokio::test]
    async fn handshake_session_sse_listing_and_custom_headers() {
        let fake = Fake::start(false).await;
        let client = ().serve(transport(&fake.url, bearer(), None)).await.expect("handshake");
        assert_eq!(
            client
                .peer_info()
                .unwrap()
                .server_info
                .as_ref()
                .unwrap()
                .name,
            "fake"
        );

        let tools = client.list_all_tools().await.expect("tools/list");
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(names, ["echo", "add"]);

        let args = json!({"a": 1}).as_object().cloned().unwrap();
        let called = client
            .call_tool(CallToolRequestParams::new("add").with_arguments(args))
            .await
            .expect("tools/call");
        assert_eq!(called.content[0].as_text().unwrap().text, r#"{"a":1}"#);

        client.cancel().await.expect("close");
        let seen = fake.seen();
        let rpcs: Vec<(&Method, Option<&str>)> =
            seen.iter().map(|s| (&s.method, s.rpc.as_deref())).collect();
        let post = |rpc| (&Method::POST, Some(rpc));
        for expected in [
            post("initialize"),
            post("notifications/initialized"),
            (&Method::GET, None),
            post("tools/list"),
            post("tools/call"),
            (&Method::DELETE, None),
        ] {
            assert!(
                rpcs.contains(&expected),
                "{expected:?} missing from {rpcs:?}"
            );
        }
        assert_eq!(rpcs[0], post("initialize"));
        for s in &seen {
            let header = |name: &str| s.headers.get(name).and_then(|v| v.to_str().ok());
            assert_eq!(header("authorization"), Some("Bearer x"), "{s:?}");
            if s.rpc.as_deref() == Some("initialize") {
                assert_eq!(header("mcp-session-id"), None);
            } else {
                assert_eq!(header("mcp-session-id"), Some("sess-1"), "{s:?}");
                assert_eq!(header("mcp-protocol-version"), Some("2025-06-18"), "{s:?}");
            }
            if s.method == Method::POST {
                assert_eq!(header("content-type"), Some(JSON));
                let accept = header("accept").unwrap();
                assert!(
                    accept.contains(JSON) && accept.contains(EVENT_STREAM),
                    "{accept}"
                );
            }
        }
    }

    #[tokio::test]
    async fn a_failing_server_is_an_error() {
        let fake = Fake::start(true).await;
        let served = tokio::time::timeout(
            Duration::from_secs(20),
            ().serve(transport(&fake.url, HashMap::new(), None)),
        )
        .await
        .expect("the handshake must fail, not hang");
        let Err(error) = served else {
            panic!("a 500 must fail the handshake");
        };
        let error = error.to_string();
        assert!(error.contains("HTTP 500"), "{error}");
    }

    /// A JSON answer over the limit ends its call at once with the reason, with its size when
    /// the server gave it; the connection goes on serving.
    #[tokio::test]
    async fn a_json_answer_over_the_limit_becomes_its_error() {
        let fake = Fake::start(false).await;
        let client =
            ().serve(server_transport("shop", &fake.url, HashMap::new(), None))
                .await
                .expect("handshake");
        let call = |args: Value| {
            let params = CallToolRequestParams::new("echo")
                .with_arguments(args.as_object().cloned().unwrap());
            client.call_tool(params)
        };
        for (chunked, size) in [(false, "was 17 MiB, over"), (true, "was over the 16 MiB")] {
            let args = json!({"big": 17 << 20, "chunked": chunked});
            let error = tokio::time::timeout(Duration::from_secs(20), call(args))
                .await
                .expect("the call ends at once")
                .expect_err("an answer over the limit is an error");
            let words = crate::tools::mcp::describe_error("MCP server shop", &error);
            assert!(
                words.starts_with("the answer of MCP server shop was ") && words.contains(size),
                "{words}"
            );
        }
        let fits = call(json!({"big": 1 << 20})).await.expect("1 MiB fits");
        assert_eq!(fits.content[0].as_text().unwrap().text.len(), 1 << 20);
        client.cancel().await.expect("close");
    }

    #[tokio::test]
    async fn reserved_custom_headers_are_refused() {
        let headers = HashMap::from([(ACCEPT, HeaderValue::from_static("text/plain"))]);
        let request = HyperMcpClient::request(Method::GET, "http://h/", None, None, headers);
        let error = request.expect_err("accept is reserved");
        assert!(matches!(error, Error::ReservedHeaderConflict(_)), "{error}");
    }

    fn parse(chunks: &[&[u8]], max: usize) -> Result<Vec<Sse>, String> {
        let mut parser = SseParser::new(max, Arc::from("shop"));
        for chunk in chunks {
            parser.feed(chunk).map_err(|e| e.to_string())?;
        }
        Ok(parser.ready.into_iter().collect())
    }

    #[test]
    fn sse_events_across_chunks_and_line_endings() {
        let events = parse(
            &[
                b"\xEF\xBB\xBFdata: a\r",
                b"\ndata:b\r\r: hi\nid: 7\nretry: 50\nev",
                b"ent: x\n\n",
            ],
            1024,
        )
        .unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].data.as_deref(), Some("a\nb"));
        assert_eq!(events[1].id.as_deref(), Some("7"));
        assert_eq!(events[1].retry, Some(50));
        assert_eq!(events[1].event.as_deref(), Some("x"));
        assert_eq!(events[1].data, None);
        // An event cut off by the end of the body is not emitted.
        assert!(parse(&[b"data: half"], 1024).unwrap().is_empty());
    }

    #[test]
    fn sse_event_size_is_bounded() {
        assert_eq!(parse(&[b"data: 12345\n\n"], 12).unwrap().len(), 1);
        // Over the limit, and no response: dropped; the events after it are read.
        let events = parse(&[b"data: 12345\ndata: 6\n\ndata: 7\n\n"], 12).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].data.as_deref(), Some("7"));
        // The limit is per event, and comments do not count.
        assert_eq!(
            parse(&[b": 0123456789\ndata: 1\n\ndata: 2\n\n"], 12)
                .unwrap()
                .len(),
            2
        );
    }

    /// A response over the limit becomes the JSON-RPC error ending its call, whichever end of
    /// it holds the id and however it is cut into chunks and lines; a request or notification
    /// is dropped, its event id kept.
    #[test]
    fn an_sse_response_over_the_limit_becomes_its_error() {
        let text = "t".repeat(5000);
        let first = format!("id: 9\ndata: {{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{{\"content\":[{{\"text\":\"{text}\"}}]}}}}\n\n");
        let last = format!("data: {{\"result\":{{\"content\":[{{\"text\":\"{text}\"}}]}},\ndata: \"jsonrpc\":\"2.0\",\r\ndata:\"id\":\"a\\\"b\"}}\n\n");
        let note = format!("id: 10\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"data\":\"{text}\"}}}}\n\ndata: after\n\n");
        for (input, id, event_id) in [(first, json!(3), Some("9")), (last, json!("a\"b"), None)] {
            for chunk in [1, 7, 4096] {
                let chunks: Vec<&[u8]> = input.as_bytes().chunks(chunk).collect();
                let events = parse(&chunks, 1024).unwrap();
                assert_eq!(events.len(), 1, "{events:?}");
                assert_eq!(events[0].id.as_deref(), event_id);
                let answer: Value =
                    serde_json::from_str(events[0].data.as_deref().unwrap()).unwrap();
                assert_eq!(answer["id"], id);
                let message = answer["error"]["message"].as_str().unwrap();
                assert!(
                    message.starts_with("the answer of MCP server shop was over")
                        || message.contains("MiB, over the 16 MiB"),
                    "{message}"
                );
            }
        }
        let events = parse(&[note.as_bytes()], 1024).unwrap();
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(
            (events[0].id.as_deref(), events[0].data.as_deref()),
            (Some("10"), None)
        );
        assert_eq!(events[1].data.as_deref(), Some("after"));
    }

    #[test]
    fn headers_and_challenges() {
        assert!(media_type_is(
            &HeaderValue::from_static("Application/JSON; charset=utf-8"),
            JSON
        ));
        assert!(!media_type_is(
            &HeaderValue::from_static("application/jsonx"),
            JSON
        ));
        let quoted = r#"Bearer error="insufficient_scope", scope="files:read files:write""#;
        assert_eq!(
            challenge_scope(quoted).as_deref(),
            Some("files:read files:write")
        );
        assert_eq!(
            challenge_scope("Bearer scope=read, x=y").as_deref(),
            Some("read")
        );
        assert_eq!(challenge_scope("Bearer"), None);
    }
}
