# syntax=docker/dockerfile:1
#
# turnstile: a release build on the official Rust image, run on Debian slim with Python 3 and
# Node.js for stdio MCP servers, as a non-root user, with the event log and the session
# workspaces in volumes.
#
#   docker build -t turnstile .
#   docker run -d --name turnstile -p 8787:8787 --stop-timeout 20 \
#     -e TURNSTILE_API_KEYS=change-me -v turnstile-data:/data -v turnstile-sandboxes:/sandboxes \
#     turnstile
#
# The config is /etc/turnstile/tools.toml (deploy/tools.toml; mount yours over it). It listens
# on 0.0.0.0:8787, so it needs API keys: TURNSTILE_API_KEYS="key1,key2" (serve exits 1 naming
# the variable when it is unset or empty). TLS belongs in front of it (a reverse proxy).
#
# MCP servers: install them into the image in a derived Dockerfile, as root, e.g.
#   FROM turnstile
#   USER root
#   RUN /opt/mcp/bin/pip install --no-cache-dir mcp-server-time \
#    && npm install -g @modelcontextprotocol/server-filesystem
#   USER turnstile
# /opt/mcp/bin is on PATH (a venv: Debian's own Python refuses pip installs outside one), and
# global npm packages land under /usr/local; both are folders a `sandbox = "landlock"` server
# may read. Installing at run time (npx -y, uvx) needs the network and a writable home.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# The registry and target folder are BuildKit caches: a rebuild after a source change compiles
# turnstile alone. The binary is copied out of the cache mount in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin turnstile \
 && install -m 0755 target/release/turnstile /usr/local/bin/turnstile

FROM debian:bookworm-slim
# Unpinned on purpose: bookworm's security updates replace these versions.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates tini python3 python3-venv python3-pip nodejs npm \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/mcp \
 && groupadd --system --gid 10001 turnstile \
 && useradd --system --uid 10001 --gid turnstile --home-dir /home/turnstile --create-home \
      --shell /usr/sbin/nologin turnstile \
 && mkdir -p /data /sandboxes /etc/turnstile \
 && chown turnstile:turnstile /data /sandboxes

COPY --from=build /usr/local/bin/turnstile /usr/local/bin/turnstile
COPY deploy/tools.toml /etc/turnstile/tools.toml

ENV TURNSTILE_CONFIG=/etc/turnstile/tools.toml \
    PATH=/opt/mcp/bin:$PATH
VOLUME ["/data", "/sandboxes"]
USER 10001:10001
WORKDIR /home/turnstile
EXPOSE 8787

# /healthz needs no API key. No curl in the slim image: Python's urllib, which is there anyway
# (an HTTP error or a refused connection raises, and the check fails). Change the port here if
# your config listens elsewhere.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8787/healthz', timeout=4)"]

# tini is PID 1: it passes SIGTERM on to turnstile (which ends running turns with
# worker_shutdown, waits up to 10 s for them and flushes the log) and reaps the orphans of MCP
# servers. Docker waits 10 s by default before SIGKILL: run with --stop-timeout 20.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "turnstile"]
CMD ["serve"]
