//! An example MCP server built with rmcp, used by the integration tests and the README.
//!
//! ```text
//! cargo run --example mcp_example                          # stdio (default)
//! cargo run --example mcp_example -- --http 127.0.0.1:0    # streamable HTTP at /mcp
//! cargo run --example mcp_example -- --tools 12            # plus t0..t11, tools/list paged by 5
//! ```
//!
//! Flags:
//! - `--http ADDR`: serve streamable HTTP at `http://ADDR/mcp` instead of stdio. On start the
//!   server prints exactly one line, `listening on http://ADDR/mcp` (the bound address, so port
//!   0 resolves), to stdout.
//! - `--tools N`: register N extra trivial tools `t0..t(N-1)`; `tools/list` is then paginated.
//! - `--page-size N`: the `tools/list` page size; default 5 with `--tools`, else no paging.
//! - `--extra-tool NAME` (repeatable): one more tool with exactly that name.
//! - `--log-calls PATH`: append one line per `tools/call` to PATH (`<tool> <arguments JSON>`),
//!   before the call runs, so that a test can count the calls that reached the server.
//! - `--test-tools`: also list `stderr_flood`, `stderr_write`, `read_file`, `argv`, `connect`
//!   and `big`, for tests of hostile or confined servers (a flood of stderr, a line that is not
//!   UTF-8, reads and connections a sandbox must refuse, the args as the server got them, a
//!   message over the size an MCP message may have).
//! - `--label TEXT` (repeatable): ignored; a value for a test to read back with `argv`.
//! - `--naive-files`: serve the machine's files as resources the way a careless server does:
//!   templates `file:///{+path}` and `u://{+a}/{+b}/{+c}.json`, and `resources/read` of a
//!   `file:` URI in any case, with an empty or `localhost` host, percent-decoded whole, `..`
//!   resolved, returns that file (for tests that the policy judges what the server reads).
//!
//! Tools: `echo`, `add`, `slow`, `fail`, `env`, `pid`, `image`, `add_tool`, `write_file`, `cwd`
//! (see each tool's description). `add_tool` registers a tool at runtime and sends
//! `notifications/tools/list_changed`, so the tool list is served by hand (static tools from a
//! `#[tool_router]` plus an `Arc<Mutex<..>>` of dynamic ones) instead of by `#[tool_handler]`.
//!
//! Every start writes `mcp_example: started (stdio|http)` to stderr.

// A tool for measuring and testing, not the server: a panic is its error message.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

use std::convert::Infallible;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rmcp::handler::server::common::schema_for_empty_input;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListResourceTemplatesResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::schemars::JsonSchema;
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_router, ErrorData, Peer, RoleServer, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::json;

/// A valid 1x1 red PNG.
const RED_PIXEL_PNG_BASE64: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct EchoArgs {
    /// The text to send back.
    text: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct AddArgs {
    /// The first addend.
    a: f64,
    /// The second addend.
    b: f64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct SlowArgs {
    /// How long to sleep, in milliseconds.
    ms: u64,
    /// Optional `host:port`: connect there and write this process's pid once the sleep has
    /// started, so a test knows the call is in flight (no timing guesses).
    #[serde(default)]
    notify: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct FailArgs {
    /// The error message to return.
    message: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct EnvArgs {
    /// The name of the environment variable.
    name: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct AddToolArgs {
    /// The name of the tool to register.
    name: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct WriteFileArgs {
    /// The file to write; a relative path is relative to the server's current directory.
    path: String,
    /// The text to write (the file is created or truncated).
    text: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct StderrFloodArgs {
    /// How many bytes (`x`) to write to stderr.
    bytes: u64,
    /// Whether to end them with a newline.
    #[serde(default)]
    newline: bool,
    /// How many times to write them (default 1).
    #[serde(default)]
    lines: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct StderrWriteArgs {
    /// The line to write to stderr (a newline is added).
    text: String,
    /// Write the bytes 0xff 0xfe (not UTF-8) before the text.
    #[serde(default)]
    bad_utf8: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct ReadFileArgs {
    /// The file to read; a relative path is relative to the server's current directory.
    path: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct ConnectArgs {
    /// `host:port` to open a TCP connection to.
    addr: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct BigArgs {
    /// How many bytes of text the answer carries.
    bytes: u64,
    /// Send a log message (`notifications/message`) of that size first, then answer
    /// "logged N bytes".
    #[serde(default)]
    log: bool,
}

/// The output schema of `add`.
fn add_output_schema() -> Arc<JsonObject> {
    let schema = json!({
        "type": "object",
        "properties": { "sum": { "type": "number", "description": "a + b" } },
        "required": ["sum"]
    });
    match schema {
        serde_json::Value::Object(object) => Arc::new(object),
        _ => unreachable!("the schema is an object"),
    }
}

/// A JSON number for `value`: an integer when it is one (so 2 + 3 gives `5`, not `5.0`).
fn json_number(value: f64) -> serde_json::Value {
    if value.fract() == 0.0 && value.abs() < 9.0e15 {
        json!(value as i64)
    } else {
        json!(value)
    }
}

fn text_result(text: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text)])
}

fn error_result(text: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// The example server. Cheap to clone: every clone shares the dynamic tools, so over HTTP
/// the tools added in one session are listed in every session.
#[derive(Clone)]
struct ExampleServer {
    /// The static tools (from `#[tool_router]`).
    router: ToolRouter<Self>,
    /// Tools added at runtime (`add_tool`, `--tools N`), in the order they were added; each
    /// answers `hello from <name>`.
    dynamic: Arc<Mutex<Vec<Tool>>>,
    /// The `tools/list` page size; `None` lists every tool in one page.
    page_size: Option<usize>,
    /// `--log-calls`: where each call is recorded.
    log_calls: Option<Arc<std::path::PathBuf>>,
    /// `--naive-files`: the machine's files as resources, read carelessly.
    naive_files: bool,
}

/// The path a careless file server reads for `uri`: see `--naive-files`.
fn naive_file_path(uri: &str) -> Option<String> {
    fn decode(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            let hex = |j: usize| {
                b.get(j)
                    .and_then(|c| (*c as char).to_digit(16))
                    .map(|d| d as u8)
            };
            match (b[i], hex(i + 1), hex(i + 2)) {
                (b'%', Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                }
                (c, _, _) => {
                    out.push(c);
                    i += 1;
                }
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    let (scheme, rest) = uri.split_once(':')?;
    if !scheme.eq_ignore_ascii_case("file") {
        return None;
    }
    let rest = decode(rest);
    let rest = rest.split(['?', '#']).next()?;
    let path = match rest.strip_prefix("//") {
        Some(r) => {
            let end = r.find('/').unwrap_or(r.len());
            let host = &r[..end];
            if !host.is_empty() && !host.eq_ignore_ascii_case("localhost") {
                return None;
            }
            &r[end..]
        }
        None => rest,
    };
    let mut parts: Vec<&str> = Vec::new();
    for seg in path.split(['/', '\\']) {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

#[tool_router]
impl ExampleServer {
    #[tool(description = "Return the given text unchanged.")]
    async fn echo(&self, Parameters(args): Parameters<EchoArgs>) -> CallToolResult {
        text_result(args.text)
    }

    #[tool(
        description = "Add two numbers. Returns the sum as text and as structured content {\"sum\": a + b}.",
        output_schema = add_output_schema()
    )]
    async fn add(&self, Parameters(args): Parameters<AddArgs>) -> CallToolResult {
        let sum = json_number(args.a + args.b);
        let mut result = text_result(sum.to_string());
        result.structured_content = Some(json!({ "sum": sum }));
        result
    }

    #[tool(
        description = "Sleep for `ms` milliseconds, then return \"slept <ms> ms\". Stops early with an error result if the call is cancelled."
    )]
    async fn slow(
        &self,
        Parameters(args): Parameters<SlowArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        if let Some(addr) = &args.notify {
            use tokio::io::AsyncWriteExt;
            if let Ok(mut conn) = tokio::net::TcpStream::connect(addr.as_str()).await {
                let _ = conn
                    .write_all(format!("{}\n", std::process::id()).as_bytes())
                    .await;
            }
        }
        if let Some(token) = context.meta.get_progress_token() {
            let mut progress = ProgressNotificationParam::new(token, 0.0);
            progress.total = Some(args.ms as f64);
            progress.message = Some("sleeping".into());
            let _ = context.peer.notify_progress(progress).await;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(args.ms)) => {
                text_result(format!("slept {} ms", args.ms))
            }
            _ = context.ct.cancelled() => {
                // Tell the watcher the cancellation arrived (tests of cancellation relays).
                if let Some(addr) = &args.notify {
                    use tokio::io::AsyncWriteExt;
                    if let Ok(mut conn) = tokio::net::TcpStream::connect(addr.as_str()).await {
                        let _ = conn.write_all(b"cancelled\n").await;
                    }
                }
                error_result("cancelled")
            }
        }
    }

    #[tool(
        description = "Always fail: return a tool error result (isError: true) with the given message."
    )]
    async fn fail(&self, Parameters(args): Parameters<FailArgs>) -> CallToolResult {
        error_result(args.message)
    }

    #[tool(
        description = "Return the value of the server process's environment variable `name`, or \"<unset>\" if it is not set."
    )]
    async fn env(&self, Parameters(args): Parameters<EnvArgs>) -> CallToolResult {
        match std::env::var_os(&args.name) {
            Some(value) => text_result(value.to_string_lossy()),
            None => text_result("<unset>"),
        }
    }

    #[tool(description = "Return the server process's id.")]
    async fn pid(&self) -> CallToolResult {
        text_result(std::process::id().to_string())
    }

    #[tool(description = "Return an image content (a 1x1 red PNG) and the text \"a red pixel\".")]
    async fn image(&self) -> CallToolResult {
        CallToolResult::success(vec![
            ContentBlock::image(RED_PIXEL_PNG_BASE64, "image/png"),
            ContentBlock::text("a red pixel"),
        ])
    }

    #[tool(
        description = "Register a new tool `name` at runtime (it answers \"hello from <name>\"), then send notifications/tools/list_changed. Returns \"added <name>\"."
    )]
    async fn add_tool(
        &self,
        Parameters(args): Parameters<AddToolArgs>,
        peer: Peer<RoleServer>,
    ) -> CallToolResult {
        let name = args.name;
        if name.is_empty() {
            return error_result("the tool name must not be empty");
        }
        if self.router.has_route(&name) || self.dynamic_tool(&name).is_some() {
            return error_result(format!("a tool named {name} already exists"));
        }
        self.dynamic
            .lock()
            .expect("dynamic tools lock")
            .push(dynamic_tool(
                &name,
                format!("Added at runtime: answers \"hello from {name}\"."),
            ));
        if let Err(error) = peer.notify_tool_list_changed().await {
            eprintln!("mcp_example: cannot send notifications/tools/list_changed: {error}");
        }
        text_result(format!("added {name}"))
    }

    #[tool(
        description = "Write `text` to the file `path` (relative to the server's current directory), creating or truncating it. Returns \"wrote N bytes\", or an error result with the OS error."
    )]
    async fn write_file(&self, Parameters(args): Parameters<WriteFileArgs>) -> CallToolResult {
        match tokio::fs::write(&args.path, args.text.as_bytes()).await {
            Ok(()) => text_result(format!("wrote {} bytes", args.text.len())),
            Err(error) => error_result(format!("cannot write {}: {error}", args.path)),
        }
    }

    #[tool(description = "Return the server process's current directory.")]
    async fn cwd(&self) -> CallToolResult {
        match std::env::current_dir() {
            Ok(dir) => text_result(dir.display().to_string()),
            Err(error) => error_result(format!("cannot read the current directory: {error}")),
        }
    }
}

/// Tools for hostile-server tests, listed only with `--test-tools`.
#[tool_router(router = test_tool_router)]
impl ExampleServer {
    #[tool(
        description = "Write `bytes` bytes of `x` to stderr (then a newline if `newline`), `lines` times (default 1). Returns \"wrote N bytes to stderr\", or an error result with the OS error (e.g. a closed pipe)."
    )]
    async fn stderr_flood(&self, Parameters(args): Parameters<StderrFloodArgs>) -> CallToolResult {
        let chunk = vec![b'x'; 64 * 1024];
        let lines = args.lines.unwrap_or(1);
        let mut err = std::io::stderr().lock();
        for _ in 0..lines {
            let mut left = args.bytes;
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                if let Err(error) = err.write_all(&chunk[..n]) {
                    return error_result(format!("cannot write to stderr: {error}"));
                }
                left -= n as u64;
            }
            if args.newline {
                if let Err(error) = err.write_all(b"\n") {
                    return error_result(format!("cannot write to stderr: {error}"));
                }
            }
        }
        match err.flush() {
            Ok(()) => text_result(format!("wrote {} bytes to stderr", args.bytes * lines)),
            Err(error) => error_result(format!("cannot write to stderr: {error}")),
        }
    }

    #[tool(
        description = "Write `text` and a newline to stderr (after the bytes 0xff 0xfe if `bad_utf8`). Returns \"written\", or an error result with the OS error (e.g. a closed pipe)."
    )]
    async fn stderr_write(&self, Parameters(args): Parameters<StderrWriteArgs>) -> CallToolResult {
        let mut line = Vec::new();
        if args.bad_utf8 {
            line.extend_from_slice(b"\xff\xfe");
        }
        line.extend_from_slice(args.text.as_bytes());
        line.push(b'\n');
        let mut err = std::io::stderr().lock();
        match err.write_all(&line).and_then(|()| err.flush()) {
            Ok(()) => text_result("written"),
            Err(error) => error_result(format!("cannot write to stderr: {error}")),
        }
    }

    #[tool(
        description = "Return the text of the file `path` (relative to the server's current directory), or an error result with the OS error."
    )]
    async fn read_file(&self, Parameters(args): Parameters<ReadFileArgs>) -> CallToolResult {
        match tokio::fs::read(&args.path).await {
            Ok(bytes) => text_result(String::from_utf8_lossy(&bytes)),
            Err(error) => error_result(format!("cannot read {}: {error}", args.path)),
        }
    }

    #[tool(
        description = "Answer with a text of `bytes` bytes (`b` repeated). With `log`, first send a log message of that size, then answer \"logged N bytes\"."
    )]
    #[allow(deprecated)] // logging: deprecated by SEP-2577, still what servers send
    async fn big(
        &self,
        Parameters(args): Parameters<BigArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let text = "b".repeat(args.bytes as usize);
        if args.log {
            let message = rmcp::model::LoggingMessageNotificationParam::new(
                rmcp::model::LoggingLevel::Info,
                json!(text),
            );
            let _ = context.peer.notify_logging_message(message).await;
            return text_result(format!("logged {} bytes", args.bytes));
        }
        text_result(text)
    }

    #[tool(description = "Return the server process's arguments as a JSON array of strings.")]
    async fn argv(&self) -> CallToolResult {
        let args: Vec<String> = std::env::args().collect();
        text_result(json!(args).to_string())
    }

    #[tool(
        description = "Open a TCP connection to `addr` (`host:port`) and close it. Returns \"connected\", or an error result with the OS error."
    )]
    async fn connect(&self, Parameters(args): Parameters<ConnectArgs>) -> CallToolResult {
        match tokio::net::TcpStream::connect(args.addr.as_str()).await {
            Ok(_) => text_result("connected"),
            Err(error) => error_result(format!("cannot connect to {}: {error}", args.addr)),
        }
    }
}

fn dynamic_tool(name: &str, description: String) -> Tool {
    Tool::new(name.to_owned(), description, schema_for_empty_input())
}

impl ExampleServer {
    fn new(
        extra_tools: usize,
        page_size: Option<usize>,
        named: &[String],
        test_tools: bool,
    ) -> Self {
        let dynamic = (0..extra_tools)
            .map(|i| {
                let name = format!("t{i}");
                let description = format!("Extra trivial tool {i}: answers \"hello from {name}\".");
                dynamic_tool(&name, description)
            })
            .chain(named.iter().map(|name| {
                dynamic_tool(
                    name,
                    format!("Extra tool {name}: answers \"hello from {name}\"."),
                )
            }))
            .collect();
        let mut router = Self::tool_router();
        if test_tools {
            router += Self::test_tool_router();
        }
        Self {
            router,
            dynamic: Arc::new(Mutex::new(dynamic)),
            page_size,
            log_calls: None,
            naive_files: false,
        }
    }

    fn dynamic_tool(&self, name: &str) -> Option<Tool> {
        let dynamic = self.dynamic.lock().expect("dynamic tools lock");
        dynamic.iter().find(|tool| tool.name == name).cloned()
    }

    /// Every tool: the static ones sorted by name, then the dynamic ones in the order added.
    fn all_tools(&self) -> Vec<Tool> {
        let mut tools = self.router.list_all();
        tools.extend(
            self.dynamic
                .lock()
                .expect("dynamic tools lock")
                .iter()
                .cloned(),
        );
        tools
    }
}

impl ServerHandler for ExampleServer {
    fn get_info(&self) -> ServerConfig {
        let mut capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        if self.naive_files {
            capabilities.resources = Some(Default::default());
        }
        ServerConfig::new(capabilities)
        .with_server_info(Implementation::new("mcp_example", env!("CARGO_PKG_VERSION")))
        .with_instructions("A test server for turnstile: echo, add, slow, fail, env, pid, image, add_tool, write_file, cwd.")
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        if !self.naive_files {
            return Ok(ListResourceTemplatesResult::default());
        }
        let template = ResourceTemplate::new;
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            template("file:///{+path}", "files"),
            template("u://{+a}/{+b}/{+c}.json", "nested"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri;
        let not_found = || ErrorData::resource_not_found(format!("no resource {uri}"), None);
        if !self.naive_files {
            return Err(not_found());
        }
        if uri.starts_with("u://") {
            return Ok(ReadResourceResult::new(vec![ResourceContents::text("nested", uri)]).into());
        }
        let path = naive_file_path(&uri).ok_or_else(not_found)?;
        let text = std::fs::read_to_string(&path).map_err(|_| not_found())?;
        Ok(ReadResourceResult::new(vec![ResourceContents::text(text, uri)]).into())
    }

    /// Pages the tool list: the cursor is the decimal offset of the next tool.
    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self.all_tools();
        let start = match request.and_then(|params| params.cursor) {
            None => 0,
            Some(cursor) => match cursor.parse::<usize>() {
                Ok(offset) if offset <= tools.len() => offset,
                _ => {
                    return Err(ErrorData::invalid_params(
                        format!("invalid cursor {cursor:?}"),
                        None,
                    ))
                }
            },
        };
        let end = match self.page_size {
            Some(size) => tools.len().min(start + size.max(1)),
            None => tools.len(),
        };
        let mut result = ListToolsResult::with_all_items(tools[start..end].to_vec());
        if end < tools.len() {
            result.next_cursor = Some(end.to_string());
        }
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if let Some(path) = &self.log_calls {
            let args = serde_json::to_string(&request.arguments).unwrap_or_default();
            let line = format!("{} {args}\n", request.name);
            let logged = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path.as_path())
                .and_then(|mut f| f.write_all(line.as_bytes()));
            if let Err(error) = logged {
                eprintln!(
                    "mcp_example: cannot log the call to {}: {error}",
                    path.display()
                );
            }
        }
        if self.router.has_route(&request.name) {
            let call = ToolCallContext::new(self, request, context);
            return self.router.call(call).await;
        }
        match self.dynamic_tool(&request.name) {
            Some(tool) => Ok(text_result(format!("hello from {}", tool.name)).into()),
            None => Err(ErrorData::invalid_params(
                format!("tool not found: {}", request.name),
                None,
            )),
        }
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.router
            .get(name)
            .cloned()
            .or_else(|| self.dynamic_tool(name))
    }
}

struct Options {
    http: Option<SocketAddr>,
    tools: usize,
    page_size: Option<usize>,
    /// `--extra-tool NAME` (repeatable): a tool with exactly this name.
    named: Vec<String>,
    /// `--log-calls PATH`.
    log_calls: Option<std::path::PathBuf>,
    /// `--test-tools`: also list the tools for hostile-server tests.
    test_tools: bool,
    /// `--naive-files`.
    naive_files: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: mcp_example [--http ADDR] [--tools N] [--page-size N] [--extra-tool NAME]... [--log-calls PATH] [--test-tools] [--naive-files] [--label TEXT]..."
    );
    std::process::exit(2);
}

fn parse_options() -> Options {
    let mut options = Options {
        http: None,
        tools: 0,
        page_size: None,
        named: Vec::new(),
        log_calls: None,
        test_tools: false,
        naive_files: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
            None => (arg, None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .unwrap_or_else(|| usage())
        };
        match flag.as_str() {
            "--http" => options.http = Some(value().parse().unwrap_or_else(|_| usage())),
            "--tools" => options.tools = value().parse().unwrap_or_else(|_| usage()),
            "--page-size" => options.page_size = Some(value().parse().unwrap_or_else(|_| usage())),
            "--extra-tool" => options.named.push(value()),
            "--log-calls" => options.log_calls = Some(value().into()),
            "--test-tools" => options.test_tools = true,
            "--naive-files" => options.naive_files = true,
            // Ignored: a value for tests to read back with the `argv` tool.
            "--label" => {
                value();
            }
            "-h" | "--help" => {
                eprintln!("usage: mcp_example [--http ADDR] [--tools N] [--page-size N] [--extra-tool NAME]... [--log-calls PATH] [--test-tools] [--naive-files] [--label TEXT]...");
                std::process::exit(0);
            }
            _ => usage(),
        }
    }
    if options.page_size.is_none() && options.tools > 0 {
        options.page_size = Some(5);
    }
    options
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let options = parse_options();
    let mut server = ExampleServer::new(
        options.tools,
        options.page_size,
        &options.named,
        options.test_tools,
    );
    server.log_calls = options.log_calls.map(Arc::new);
    server.naive_files = options.naive_files;
    let result = match options.http {
        None => serve_stdio(server).await,
        Some(addr) => serve_http(server, addr).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("mcp_example: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Serves one client on stdin/stdout until stdin closes.
async fn serve_stdio(server: ExampleServer) -> Result<(), Box<dyn std::error::Error>> {
    eprintln!("mcp_example: started (stdio)");
    let running = match server.serve(rmcp::transport::stdio()).await {
        Ok(running) => running,
        // stdin closed before the handshake: nothing to serve.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => {
            eprintln!("mcp_example: stdin closed before initialize");
            return Ok(());
        }
        Err(error) => return Err(error.into()),
    };
    running.waiting().await?;
    eprintln!("mcp_example: stdin closed, exiting");
    Ok(())
}

/// Serves streamable HTTP at `http://ADDR/mcp` until killed.
async fn serve_http(
    server: ExampleServer,
    addr: SocketAddr,
) -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let mut allowed_hosts = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    allowed_hosts.push(local.ip().to_string());
    let config = StreamableHttpServerConfig::default().with_allowed_hosts(allowed_hosts);
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    eprintln!("mcp_example: started (http)");
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening on http://{local}/mcp")?;
        stdout.flush()?;
    }
    loop {
        let (stream, _) = listener.accept().await?;
        let service = service.clone();
        tokio::spawn(async move {
            let handler = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let service = service.clone();
                async move {
                    if request.uri().path() != "/mcp" {
                        let not_found = hyper::Response::builder()
                            .status(hyper::StatusCode::NOT_FOUND)
                            .body(http_body_util::BodyExt::boxed(http_body_util::Full::new(
                                bytes::Bytes::from_static(b"not found; the MCP endpoint is /mcp\n"),
                            )))
                            .expect("a static response");
                        return Ok::<_, Infallible>(not_found);
                    }
                    Ok::<_, Infallible>(service.handle(request).await)
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), handler);
            if let Err(error) = connection.await {
                eprintln!("mcp_example: connection error: {error}");
            }
        });
    }
}
