// turnstile console: a single-page app over turnstile's own HTTP API (same origin).
// No framework, no build step. Every value from the server is inserted as text (never as HTML).
// The API key lives in sessionStorage only (never in a URL); requests carry it as a bearer token.

const KEY_STORE = "turnstile.console.key";
const PAGE = 20;

const state = {
  key: sessionStorage.getItem(KEY_STORE) || "",
  meta: null,
  tools: new Map(), // federated name -> GET /tools entry
  view: null, // the mounted view (has unmount())
  pendingAll: [], // GET /console/pending: the permissions waited for, across sessions
  sessionsPage: 0,
};

// ---------------------------------------------------------------- helpers

/** Build an element: h("div", {class: "x", onclick: f}, child, "text", ...). */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const $ = (sel, root = document) => root.querySelector(sel);

/** The client tool that carries MCP servers' questions to the person (the agents' default
 * `elicitation_tool`); a pending call of it is shown as a form. */
const ELICITATION_TOOL = {
  name: "elicitation",
  description: "Asks the person at the console a question of an MCP server (a form).",
  parameters: { type: "object" },
};

/** Whether a pending call is an MCP server's question (its input carries the requested schema). */
const isQuestion = (p) => p.kind === "client" && !!p.input?.requestedSchema && !!p.input?.toolCallId;
const delay = (ms) => new Promise((r) => setTimeout(r, ms));

function toast(text, kind = "info") {
  const t = h("div", { class: `toast ${kind}` }, text);
  $("#toasts").append(t);
  setTimeout(() => t.remove(), kind === "error" ? 9000 : 4000);
}

function pretty(v) {
  if (typeof v === "string") {
    try {
      return JSON.stringify(JSON.parse(v), null, 2);
    } catch {
      return v;
    }
  }
  return JSON.stringify(v, null, 2);
}

function bytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  const s = (Date.now() - d.getTime()) / 1000;
  if (s < 60) return "just now";
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return d.toLocaleString();
}

function timeLeft(iso) {
  const s = Math.max(0, Math.round((new Date(iso).getTime() - Date.now()) / 1000));
  if (s >= 3600) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  if (s >= 60) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${s} s`;
}

const STATUS = {
  idle: ["idle", "idle"],
  running: ["running", "running"],
  awaiting_client: ["waiting for approval", "waiting"],
  plan_pending_approval: ["plan pending", "plan"],
};

function badge(status) {
  const [label, cls] = STATUS[status] || [status || "unknown", "idle"];
  return h("span", { class: `badge ${cls}`, dataset: { status } }, label);
}

// ---------------------------------------------------------------- API

class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

async function api(method, path, opts = {}) {
  const headers = new Headers(opts.headers || {});
  if (state.key) headers.set("Authorization", `Bearer ${state.key}`);
  let body = opts.body;
  if (opts.json !== undefined) {
    headers.set("Content-Type", "application/json");
    body = JSON.stringify(opts.json);
  }
  let resp;
  try {
    resp = await fetch(path, { method, headers, body, signal: opts.signal, cache: "no-store" });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, "network", `cannot reach turnstile (${e.message})`);
  }
  if (resp.status === 401 && !opts.probe) {
    signedOut("Your key was refused: sign in again.");
    throw new ApiError(401, "unauthorized", "sign in");
  }
  if (opts.raw && resp.ok) return resp;
  if (resp.status === 204) return null;
  const text = await resp.text();
  let v = null;
  try {
    v = text ? JSON.parse(text) : null;
  } catch {
    v = null;
  }
  if (!resp.ok) {
    throw new ApiError(resp.status, v?.error?.type || "error", v?.error?.message || text || resp.statusText);
  }
  return v;
}

/** Every session the key owns, newest first (the API pages oldest first). */
async function allSessions() {
  const out = [];
  let after = null;
  for (let i = 0; i < 200; i++) {
    const q = after ? `?after=${encodeURIComponent(after)}` : "";
    const r = await api("GET", `/sessions${q}`);
    out.push(...r.sessions);
    if (!r.next) break;
    after = r.next;
  }
  out.sort((a, b) => (a.created_at < b.created_at ? 1 : a.created_at > b.created_at ? -1 : a.id < b.id ? 1 : -1));
  return out;
}

async function loadTools() {
  try {
    const r = await api("GET", "/tools");
    state.tools = new Map(r.tools.map((t) => [t.name, t]));
  } catch (e) {
    if (e.status !== 401) toast(`Tools: ${e.message}`, "error");
  }
}

/** Download a stored file through the API (the key goes in a header, not the URL). */
async function download(file) {
  try {
    const resp = await api("GET", `/files/${encodeURIComponent(file.id)}/content`, { raw: true });
    const blob = await resp.blob();
    const url = URL.createObjectURL(blob);
    const a = h("a", { href: url, download: file.filename || file.id, hidden: true });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  } catch (e) {
    toast(`Download failed: ${e.message}`, "error");
  }
}

function fileLink(f) {
  return h(
    "a",
    {
      class: "file",
      href: `/files/${encodeURIComponent(f.id)}/content`,
      dataset: { fileId: f.id },
      onclick: (ev) => {
        ev.preventDefault();
        download(f);
      },
    },
    h("span", { class: "file-icon", "aria-hidden": "true" }, "⇩"),
    f.filename,
    h("span", { class: "muted" }, ` ${f.mime_type || ""} · ${bytes(f.size_bytes || 0)}`),
  );
}

// ---------------------------------------------------------------- sign-in

function signedOut(message) {
  state.key = "";
  sessionStorage.removeItem(KEY_STORE);
  showSignin(message);
}

function showSignin(message) {
  unmount();
  document.body.dataset.signedOut = "";
  $("#signout").hidden = true;
  const input = h("input", {
    type: "password",
    id: "key",
    name: "key",
    autocomplete: "current-password",
    placeholder: "API key",
    required: true,
  });
  const err = h("p", { class: "error", id: "signin-error" }, message || "");
  const form = h(
    "form",
    {
      class: "card signin",
      onsubmit: async (ev) => {
        ev.preventDefault();
        state.key = input.value.trim();
        try {
          await api("GET", "/sessions", { probe: true }).then(null, (e) => {
            throw e;
          });
          sessionStorage.setItem(KEY_STORE, state.key);
          boot();
        } catch (e) {
          state.key = "";
          err.textContent = e.status === 401 ? "That key was refused." : e.message;
        }
      },
    },
    h("h1", {}, "Sign in"),
    h("p", { class: "muted" }, "This turnstile needs an API key. It is kept in this tab only (sessionStorage) and sent as a bearer token; you see only what it owns."),
    h("label", { for: "key" }, "API key"),
    input,
    err,
    h("button", { type: "submit", class: "primary" }, "Sign in"),
  );
  const main = $("#main");
  main.replaceChildren(form);
  input.focus();
}

// ---------------------------------------------------------------- router

function unmount() {
  if (state.view?.unmount) state.view.unmount();
  state.view = null;
}

function route() {
  const hash = location.hash || "#/sessions";
  unmount();
  const main = $("#main");
  let m;
  let nav = "sessions";
  if ((m = hash.match(/^#\/s\/([^/]+)$/))) {
    state.view = new SessionView(decodeURIComponent(m[1]));
  } else if (hash === "#/tools") {
    state.view = new ToolsView();
    nav = "tools";
  } else if (hash === "#/approvals") {
    state.view = new ApprovalsView();
    nav = "approvals";
  } else {
    state.view = new SessionsView();
  }
  for (const a of document.querySelectorAll("[data-nav]")) {
    a.classList.toggle("active", a.dataset.nav === nav);
  }
  state.view.mount(main);
}

// ---------------------------------------------------------------- approvals badge

async function pollApprovals() {
  if (!state.meta) return;
  try {
    const found = (await api("GET", "/console/pending")).pending;
    state.pendingAll = found;
    const open = found.filter((p) => !p.expired).length;
    const b = $("#approvals-badge");
    b.textContent = String(open);
    b.hidden = open === 0;
    $("#approvals-link").title = `${open} call(s) wait for a decision`;
    if (state.view?.onApprovals) state.view.onApprovals(found);
  } catch {
    /* shown elsewhere */
  }
}

let pollTimer = null;
function startPolling() {
  clearInterval(pollTimer);
  pollApprovals();
  pollTimer = setInterval(pollApprovals, 4000);
}

// ---------------------------------------------------------------- sessions

class SessionsView {
  mount(main) {
    this.list = h("div", { class: "session-list", id: "session-list" }, h("p", { class: "muted" }, "Loading…"));
    this.pager = h("div", { class: "pager" });
    main.replaceChildren(
      h(
        "div",
        { class: "grid-2" },
        h("section", { class: "card" }, h("div", { class: "section-head" }, h("h1", {}, "Sessions"), h("button", { type: "button", class: "ghost", onclick: () => this.load() }, "Refresh")), this.list, this.pager),
        this.createForm(),
      ),
    );
    this.load();
  }

  onApprovals() {
    if (this.sessions) this.render();
  }

  async load() {
    try {
      this.sessions = await allSessions();
      this.render();
    } catch (e) {
      this.list.replaceChildren(h("p", { class: "error" }, e.message));
    }
  }

  render() {
    const pages = Math.max(1, Math.ceil(this.sessions.length / PAGE));
    state.sessionsPage = Math.min(state.sessionsPage, pages - 1);
    const start = state.sessionsPage * PAGE;
    const shown = this.sessions.slice(start, start + PAGE);
    if (!shown.length) {
      this.list.replaceChildren(h("p", { class: "empty" }, "No sessions yet. Create one →"));
    } else {
      this.list.replaceChildren(...shown.map((s) => this.row(s)));
    }
    this.pager.hidden = pages === 1;
    this.pager.replaceChildren(
      h("button", { type: "button", class: "ghost", disabled: state.sessionsPage === 0, onclick: () => { state.sessionsPage--; this.render(); } }, "← Newer"),
      h("span", { class: "muted" }, `Page ${state.sessionsPage + 1} of ${pages} · ${this.sessions.length} sessions`),
      h("button", { type: "button", class: "ghost", disabled: state.sessionsPage >= pages - 1, onclick: () => { state.sessionsPage++; this.render(); } }, "Older →"),
    );
  }

  row(s) {
    const waiting = state.pendingAll.filter((p) => p.session === s.id && !p.expired).length;
    let armed = false;
    const del = h("button", {
      type: "button",
      class: "ghost danger small",
      onclick: async (ev) => {
        ev.preventDefault();
        ev.stopPropagation();
        if (!armed) {
          armed = true;
          del.textContent = "Really delete?";
          setTimeout(() => { armed = false; del.textContent = "Delete"; }, 4000);
          return;
        }
        try {
          await api("DELETE", `/sessions/${encodeURIComponent(s.id)}`);
          toast(`Deleted ${s.id}`);
          this.load();
        } catch (e) {
          toast(e.message, "error");
        }
      },
    }, "Delete");
    return h(
      "a",
      { class: "session-row", href: `#/s/${encodeURIComponent(s.id)}`, dataset: { sessionId: s.id } },
      h("span", { class: "sid mono" }, s.id),
      h("span", { class: "agent" }, s.agent?.name || ""),
      badge(s.status),
      waiting ? h("span", { class: "count warn", title: "calls waiting for a decision" }, String(waiting)) : h("span", {}),
      h("span", { class: "muted when" }, when(s.created_at)),
      del,
    );
  }

  createForm() {
    const agents = state.meta?.agents || [];
    const select = h("select", { id: "agent", name: "agent" }, agents.map((a) => h("option", { value: a.name }, a.title && a.title !== a.name ? `${a.title} (${a.name})` : a.name)));
    const toolsBox = h("div", { class: "tool-picks", id: "tool-picks" });
    const fill = () => {
      const agent = agents.find((a) => a.name === select.value);
      const rows = (agent?.tools || []).map((t) => {
        const info = state.tools.get(t.name);
        const verdict = info?.verdict || "ask";
        const on = h("input", { type: "checkbox", checked: true, name: "tool", value: t.name, dataset: { tool: t.name } });
        const trust = h("input", { type: "checkbox", checked: verdict === "trust", disabled: verdict !== "trust", name: "trust", dataset: { trust: t.name } });
        return h(
          "div",
          { class: "tool-pick" },
          h("label", { class: "grow", title: t.description || "" }, on, h("span", { class: "mono" }, t.name)),
          h("span", { class: `verdict ${verdict}`, title: info ? `rule: ${info.rule}` : "" }, verdict),
          h("label", { class: "trust", title: verdict === "trust" ? "run without asking" : "the operator's policy asks for every call" }, trust, "trusted"),
        );
      });
      toolsBox.replaceChildren(...(rows.length ? rows : [h("p", { class: "muted" }, "This agent has no tools.")]));
    };
    select.addEventListener("change", fill);
    fill();
    return h(
      "form",
      {
        class: "card create",
        id: "create-session",
        onsubmit: async (ev) => {
          ev.preventDefault();
          const tools = [...toolsBox.querySelectorAll("input[data-tool]")]
            .filter((i) => i.checked)
            .map((i) => ({ name: i.value, trust: !!toolsBox.querySelector(`input[data-trust="${CSS.escape(i.value)}"]`)?.checked }));
          try {
            // The console can answer MCP servers' questions: it declares the elicitation tool.
            const r = await api("POST", "/sessions", { json: { agent: { name: select.value, tools }, tools: [ELICITATION_TOOL] } });
            location.hash = `#/s/${encodeURIComponent(r.sessionId)}`;
          } catch (e) {
            toast(e.message, "error");
          }
        },
      },
      h("h2", {}, "New session"),
      h("label", { for: "agent" }, "Agent"),
      select,
      h("div", { class: "label" }, "Tools and trust"),
      toolsBox,
      h("button", { type: "submit", class: "primary", id: "create" }, "Create session"),
    );
  }
}

// ---------------------------------------------------------------- one session

class SessionView {
  constructor(id) {
    this.id = id;
    this.path = `/sessions/${encodeURIComponent(id)}`;
    this.lastId = null;
    this.seen = new Set();
    this.cards = new Map(); // tool_use_id -> card element
    this.draft = null; // the agent.message being streamed
    this.thinkDraft = null;
    this.decisions = new Map(); // toolCallId -> {granted, reason}
    this.info = null;
    this.abort = new AbortController();
    this.files = [];
  }

  mount(main) {
    this.statusEl = h("span", { id: "session-status" });
    this.connEl = h("span", { class: "conn", id: "conn" }, "connecting…");
    this.cancelBtn = h("button", { type: "button", class: "ghost danger", id: "cancel", disabled: true, onclick: () => this.cancel() }, "Cancel turn");
    this.timeline = h("div", { class: "timeline", id: "timeline", "aria-live": "polite" });
    this.planBox = h("div", { id: "plan-box" });
    this.approvalNote = h("div", { id: "approval-note" });
    main.replaceChildren(
      h(
        "section",
        { class: "session" },
        h(
          "div",
          { class: "session-head" },
          h("a", { href: "#/sessions", class: "back", title: "All sessions" }, "←"),
          h("h1", { class: "mono" }, this.id),
          this.statusEl,
          h("span", { class: "spacer" }),
          this.connEl,
          this.cancelBtn,
        ),
        this.timeline,
        this.planBox,
        this.approvalNote,
        this.composer(),
      ),
    );
    window.turnstileConsole = { reconnect: () => this.streamAbort?.abort() };
    this.refresh();
    this.connect();
    this.timer = setInterval(() => this.refresh(), 5000);
  }

  unmount() {
    this.abort.abort();
    clearInterval(this.timer);
  }

  // -------- live stream: fetch + SSE parsing (EventSource cannot send the key in a header)

  async connect() {
    let backoff = 500;
    while (!this.abort.signal.aborted) {
      this.streamAbort = new AbortController();
      const stop = () => this.streamAbort.abort();
      this.abort.signal.addEventListener("abort", stop, { once: true });
      try {
        const headers = { Accept: "text/event-stream" };
        if (this.lastId) headers["Last-Event-ID"] = this.lastId;
        const resp = await api("GET", `${this.path}/events/stream`, { raw: true, headers, signal: this.streamAbort.signal });
        this.setConn("live", "live");
        backoff = 500;
        await readSse(resp.body, (f) => this.onFrame(f));
      } catch (e) {
        if (this.abort.signal.aborted) return;
        if (e.status === 404) {
          this.setConn("gone", "session not found");
          this.timeline.replaceChildren(h("p", { class: "error" }, e.message));
          return;
        }
      } finally {
        this.abort.signal.removeEventListener("abort", stop);
      }
      if (this.abort.signal.aborted) return;
      this.setConn("reconnecting", "reconnecting…");
      // Deltas sent while we were away are not replayed (the whole text comes in the stored
      // agent.message): the draft so far goes, and the next one starts with an ellipsis.
      this.dropDrafts();
      this.gap = true;
      await delay(backoff);
      backoff = Math.min(backoff * 2, 8000);
    }
  }

  setConn(cls, text) {
    this.connEl.className = `conn ${cls}`;
    this.connEl.textContent = text;
    document.body.dataset.stream = cls;
  }

  onFrame(f) {
    if (!f.data) return;
    let ev;
    try {
      ev = JSON.parse(f.data);
    } catch {
      return;
    }
    if (f.id) {
      if (this.seen.has(f.id)) return;
      this.seen.add(f.id);
      this.lastId = f.id;
      document.body.dataset.lastEventId = f.id;
    }
    const type = ev.type || f.event;
    const stick = this.nearBottom();
    if (f.id) this.gap = false;
    this.render(type, ev);
    if (f.id) this.afterPlan = type === "agent.message" && !!ev.plan;
    if (stick) this.timeline.scrollTop = this.timeline.scrollHeight;
    if (type === "user.message" || type === "agent.tool_use") {
      this.setRunning(true);
      if (type === "user.message") this.showStatus("running");
    }
    if (type === "turn.completed" || type === "turn.failed" || type === "turn.cancelled" || (type === "agent.message" && ev.plan)) {
      this.refresh();
      pollApprovals();
    }
  }

  nearBottom() {
    const t = this.timeline;
    return t.scrollHeight - t.scrollTop - t.clientHeight < 80;
  }

  render(type, ev) {
    switch (type) {
      case "agent.message.delta": {
        if (!this.draft) {
          this.draft = h("div", { class: "msg agent draft" }, h("div", { class: "who" }, "agent"), h("div", { class: "text" }, this.gap ? "… " : ""));
          this.timeline.append(this.draft);
          this.gap = false;
        }
        this.draft.querySelector(".text").append(ev.content);
        return;
      }
      case "agent.thinking.delta": {
        if (!this.thinkDraft) {
          this.thinkDraft = h("details", { class: "thinking draft" }, h("summary", {}, "Thinking…"), h("div", { class: "text" }));
          this.timeline.append(this.thinkDraft);
        }
        this.thinkDraft.querySelector(".text").append(ev.content);
        return;
      }
      case "user.message":
        this.dropDrafts();
        this.timeline.append(this.userMessage(ev));
        return;
      case "agent.thinking":
        this.dropThinking();
        this.timeline.append(h("details", { class: "thinking", dataset: { eventId: ev.id } }, h("summary", {}, "Thinking"), h("div", { class: "text" }, ev.content)));
        return;
      case "agent.message": {
        this.dropDrafts();
        if (!ev.content) return; // retracts the deltas streamed since the previous stored event
        if (ev.plan) {
          this.timeline.append(h("div", { class: "plan-card", dataset: { eventId: ev.id } }, h("div", { class: "who" }, "plan proposed"), h("div", { class: "text" }, ev.content)));
        } else if (ev.compaction) {
          this.timeline.append(h("details", { class: "note" }, h("summary", {}, "Earlier turns summarised for the model"), h("div", { class: "text" }, ev.content)));
        } else {
          this.timeline.append(h("div", { class: "msg agent", dataset: { eventId: ev.id } }, h("div", { class: "who" }, "agent"), h("div", { class: "text" }, ev.content)));
        }
        return;
      }
      case "agent.tool_use":
        this.dropDrafts();
        this.timeline.append(this.toolCard(ev));
        return;
      case "agent.tool_result":
        this.toolResult(ev);
        return;
      case "turn.completed": {
        this.dropDrafts();
        const u = ev.usage ? ` · ${ev.usage.input_tokens ?? "?"} in / ${ev.usage.output_tokens ?? "?"} out tokens` : "";
        const why = this.afterPlan ? "plan proposed · waiting for your decision" : { end_turn: "turn completed", tool_use: "waiting for decisions", max_tokens: "stopped: token limit", max_steps: "stopped: step budget spent", refusal: "the model refused" }[ev.stop_reason] || ev.stop_reason;
        this.timeline.append(h("div", { class: `turn-end ${ev.stop_reason}`, dataset: { eventId: ev.id } }, `${why}${u}`));
        return;
      }
      case "turn.failed":
        this.dropDrafts();
        this.timeline.append(h("div", { class: "turn-end failed", dataset: { eventId: ev.id } }, `turn failed (${ev.reason})${ev.message ? `: ${ev.message}` : ""}`));
        return;
      case "turn.cancelled":
        this.dropDrafts();
        this.timeline.append(h("div", { class: "turn-end cancelled", dataset: { eventId: ev.id } }, "turn cancelled"));
        return;
      default:
    }
  }

  dropDrafts() {
    this.draft?.remove();
    this.draft = null;
    this.dropThinking();
  }

  dropThinking() {
    this.thinkDraft?.remove();
    this.thinkDraft = null;
  }

  userMessage(ev) {
    const parts = [];
    const decisions = [];
    const content = ev.content;
    if (typeof content === "string") {
      if (content) parts.push(content);
    } else if (Array.isArray(content)) {
      for (const b of content) {
        if (b.type === "text") parts.push(b.text);
        else if (b.type === "tool_permission") decisions.push(b);
        else if (b.type === "tool_result") decisions.push({ ...b, result: true });
        else if (b.type === "image") parts.push("[image]");
        else if (b.type === "plan_decision") decisions.push({ plan: b });
      }
    } else if (content && typeof content === "object") {
      parts.push(pretty(content));
    }
    const edited = decisions.find((d) => d.plan?.decision === "confirmed" && d.plan.edits);
    if (edited) {
      return h("div", { class: "plan-card edited", dataset: { eventId: ev.id } }, h("div", { class: "who" }, "you confirmed the plan, edited"), h("div", { class: "text" }, edited.plan.edits));
    }
    if (!parts.length && !ev.files?.length) {
      return h(
        "div",
        { class: "decisions", dataset: { eventId: ev.id } },
        decisions.map((d) => {
          if (d.plan) {
            const p = d.plan;
            const rejected = p.decision === "rejected";
            return h("span", { class: `decision ${rejected ? "denied" : "granted"}` }, rejected ? `plan rejected${p.reason ? `: ${p.reason}` : ""}` : `plan confirmed${p.edits ? " with edits" : ""}`);
          }
          const call = d.tool_use_id || d.toolCallId;
          if (d.result) return h("span", { class: "decision" }, `result sent for ${call}`);
          return h("span", { class: `decision ${d.granted ? "granted" : "denied"}` }, `${d.granted ? "approved" : "denied"} ${this.cards.get(call)?.dataset.tool || call}${d.reason ? `: ${d.reason}` : ""}`);
        }),
      );
    }
    return h(
      "div",
      { class: "msg user", dataset: { eventId: ev.id } },
      h("div", { class: "who" }, "you"),
      h("div", { class: "text" }, parts.join("\n")),
      ev.files?.length ? h("div", { class: "files" }, ev.files.map(fileLink)) : null,
    );
  }

  toolCard(ev) {
    const info = state.tools.get(ev.name);
    const card = h(
      "div",
      { class: "tool", id: `call-${ev.tool_use_id}`, dataset: { callId: ev.tool_use_id, tool: ev.name, eventId: ev.id } },
      h(
        "div",
        { class: "tool-head" },
        h("span", { class: "tool-icon", "aria-hidden": "true" }, "⚙"),
        h("span", { class: "mono strong" }, info?.tool || ev.name),
        h("span", { class: "chip" }, info?.server || (ev.name.startsWith("mcp__") ? ev.name.split("__")[1] : "client")),
        info ? h("span", { class: `verdict ${info.verdict}`, title: `deciding rule: ${info.rule}` }, info.verdict) : null,
        h("span", { class: "spacer" }),
        h("span", { class: "muted mono small" }, ev.tool_use_id),
      ),
      h("pre", { class: "args" }, pretty(ev.input)),
      h("div", { class: "approval-slot" }),
      h("div", { class: "result pending-result" }, h("span", { class: "muted" }, "running…")),
    );
    this.cards.set(ev.tool_use_id, card);
    return card;
  }

  toolResult(ev) {
    let card = this.cards.get(ev.tool_use_id);
    if (!card) {
      card = this.toolCard({ tool_use_id: ev.tool_use_id, name: "(unknown tool)", input: {} });
      this.timeline.append(card);
    }
    card.querySelector(".approval-slot").replaceChildren();
    const text = typeof ev.content === "string"
      ? ev.content
      : Array.isArray(ev.content)
        ? ev.content.map((b) => (b.type === "text" ? b.text : b.type === "image" ? "[image]" : pretty(b))).join("\n")
        : pretty(ev.content);
    const denied = /^Tool call denied/.test(text);
    card.classList.toggle("error", !!ev.is_error && !denied);
    card.classList.toggle("denied", denied);
    card.classList.add("done");
    card.querySelector(".result").replaceWith(
      h(
        "div",
        { class: `result${ev.is_error ? " is-error" : ""}`, dataset: { eventId: ev.id } },
        h("div", { class: "result-label" }, /^Tool call denied: approval expired$/.test(text) ? "expired: no decision in time" : denied ? "denied" : ev.is_error ? "error" : "result"),
        h("pre", {}, text),
        ev.files?.length ? h("div", { class: "files" }, ev.files.map(fileLink)) : null,
      ),
    );
  }

  // -------- status, approvals, plan

  showStatus(status) {
    this.statusEl.replaceChildren(badge(status), h("span", { class: "muted small" }, ` ${this.info?.agent?.name || ""}`));
    document.body.dataset.sessionStatus = status;
  }

  setRunning(on) {
    this.cancelBtn.disabled = !on;
  }

  async refresh() {
    let info;
    try {
      const [i, asked] = await Promise.all([
        api("GET", this.path),
        api("GET", `/console/pending?session=${encodeURIComponent(this.id)}`).catch(() => ({ pending: [] })),
      ]);
      info = i;
      this.asked = new Map(asked.pending.map((p) => [p.toolCallId, p]));
    } catch (e) {
      if (e.status === 404) this.statusEl.replaceChildren(h("span", { class: "error" }, "deleted"));
      return;
    }
    this.info = info;
    this.showStatus(info.status);
    this.setRunning(info.status === "running" || !!info.turn_id || !!info.queued?.length);
    this.renderApprovals(info.pending || []);
    this.renderPlan(info.status === "plan_pending_approval" ? info.pending_plan : null);
  }

  renderApprovals(pending) {
    const perms = pending.filter((p) => p.kind === "permission");
    const live = new Set(pending.map((p) => p.toolCallId));
    for (const id of [...this.decisions.keys()]) if (!live.has(id)) this.decisions.delete(id);
    for (const p of perms) {
      const card = this.cards.get(p.toolCallId);
      if (!card) continue;
      const slot = card.querySelector(".approval-slot");
      const key = `${p.expired}|${this.decisions.has(p.toolCallId)}`;
      if (slot.dataset.key === key && !p.expires_at) continue;
      slot.dataset.key = key;
      slot.replaceChildren(this.approvalPanel(p));
    }
    const open = perms.filter((p) => !p.expired && !this.decisions.has(p.toolCallId));
    const client = pending.filter((p) => p.kind === "client" && !isQuestion(p));
    const questions = pending.filter(isQuestion);
    // A form keeps what the person typed across refreshes.
    this.questionForms ??= new Map();
    for (const id of [...this.questionForms.keys()]) if (!live.has(id)) this.questionForms.delete(id);
    for (const q of questions) if (!this.questionForms.has(q.toolCallId)) this.questionForms.set(q.toolCallId, this.questionForm(q));
    this.approvalNote.replaceChildren();
    append(this.approvalNote, [
      open.length
        ? h("div", { class: "banner warn" }, `${open.length} call${open.length > 1 ? "s" : ""} wait${open.length > 1 ? "" : "s"} for your decision. `, h("kbd", {}, "a"), " approve · ", h("kbd", {}, "d"), " deny · ", h("kbd", {}, "r"), " reason")
        : null,
      client.length ? h("div", { class: "banner" }, `${client.length} client tool call(s) wait for the application that declared them; this console cannot run them.`) : null,
      questions.map((q) => this.questionForms.get(q.toolCallId)),
    ]);
  }

  /** An MCP server's question as a form built from its requested schema (string, number,
   * integer, boolean and enum fields, defaults filled in); its buttons answer it. */
  questionForm(p) {
    const { server, message, requestedSchema: schema } = p.input;
    const required = new Set(schema.required || []);
    const inputs = [];
    const fields = Object.entries(schema.properties || {}).map(([name, s]) => {
      const choices = s.enum || (s.oneOf || s.anyOf || []).map((o) => o.const).filter((v) => v !== undefined);
      let input;
      if (choices.length) {
        input = h("select", {}, required.has(name) || "default" in s ? null : h("option", { value: "" }, "—"), choices.map((c, i) => h("option", { value: String(i) }, String((s.enumNames || [])[i] ?? (s.oneOf || s.anyOf || [])[i]?.title ?? c))));
        if ("default" in s) input.value = String(Math.max(0, choices.indexOf(s.default)));
      } else if (s.type === "boolean") {
        input = h("input", { type: "checkbox", checked: !!s.default });
      } else if (s.type === "number" || s.type === "integer") {
        input = h("input", { type: "number", step: s.type === "integer" ? "1" : "any", min: s.minimum, max: s.maximum });
        if ("default" in s) input.value = String(s.default);
      } else {
        input = h("input", { type: "text", maxlength: s.maxLength });
        if ("default" in s) input.value = String(s.default);
      }
      input.dataset.field = name;
      inputs.push({ name, s, input, choices });
      return h("label", { class: "field" }, h("span", {}, s.title || name, required.has(name) ? " *" : ""), input, s.description ? h("span", { class: "muted small" }, s.description) : null);
    });
    const read = () => {
      const content = {};
      for (const { name, s, input, choices } of inputs) {
        if (choices.length) {
          if (input.value !== "") content[name] = choices[Number(input.value)];
        } else if (s.type === "boolean") content[name] = input.checked;
        else if (input.value === "") continue;
        else if (s.type === "number" || s.type === "integer") content[name] = Number(input.value);
        else content[name] = input.value;
      }
      return content;
    };
    const answer = async (action) => {
      const body = action === "accept" ? { action, content: read() } : { action };
      this.setRunning(true);
      try {
        await api("POST", `${this.path}/turns`, { json: { messages: [{ role: "tool", toolCallId: p.toolCallId, content: JSON.stringify(body) }] } });
      } catch (e) {
        // A refused answer (a field that does not fit, named by the server) leaves the form as it was.
        if (e.name !== "AbortError") toast(`Answer not taken: ${e.message}`, "error");
      } finally {
        this.refresh();
        pollApprovals();
      }
    };
    return h(
      "form",
      { class: "card elicitation", dataset: { callId: p.toolCallId }, onsubmit: (ev) => (ev.preventDefault(), answer("accept")) },
      h("div", { class: "approval-head" }, h("strong", {}, "A question for you"), h("span", { class: "muted small" }, ` · from server ${server}`)),
      h("p", { class: "question" }, message),
      fields,
      h(
        "div",
        { class: "approval-actions" },
        h("button", { type: "submit", class: "primary accept" }, "Submit"),
        h("button", { type: "button", class: "decline", onclick: () => answer("decline") }, "Decline"),
        h("button", { type: "button", class: "danger cancel", onclick: () => answer("cancel") }, "Cancel"),
      ),
    );
  }

  approvalPanel(p) {
    // The verdict and rule that asked, as recorded when the call paused; else today's policy.
    const info = this.asked?.get(p.toolCallId)?.rule ? this.asked.get(p.toolCallId) : state.tools.get(p.name);
    const decided = this.decisions.get(p.toolCallId);
    const head = h(
      "div",
      { class: "approval-head" },
      h("strong", {}, p.expired ? "Approval expired" : decided ? (decided.granted ? "Approved" : "Denied") : "Needs your approval"),
      h("span", { class: "muted small" }, info ? ` · policy ${info.verdict} by rule ` : " · policy rule unknown", info ? h("code", {}, info.rule) : null, info ? ` · server ${info.server}` : ""),
      p.expires_at && !p.expired && !decided ? h("span", { class: "muted small expires" }, ` · expires in ${timeLeft(p.expires_at)}`) : null,
    );
    if (p.expired) {
      return h("div", { class: "approval expired", dataset: { callId: p.toolCallId } }, head, h("p", { class: "muted small" }, "No decision came in time: it is denied with \"approval expired\" when the session goes on."));
    }
    if (decided) {
      return h("div", { class: "approval decided", dataset: { callId: p.toolCallId } }, head, h("p", { class: "muted small" }, decided.reason ? `Reason: ${decided.reason}. ` : "", "Sent when every waiting call has a decision."));
    }
    const reason = h("input", { type: "text", class: "reason", placeholder: "Reason (optional, sent with a denial)", "aria-label": "Reason", dataset: { reasonFor: p.toolCallId }, onkeydown: (e) => {
      if (e.key === "Enter") this.decide(p.toolCallId, false, e.target.value);
    } });
    return h(
      "div",
      { class: "approval open", dataset: { callId: p.toolCallId } },
      head,
      h(
        "div",
        { class: "approval-actions" },
        reason,
        h("button", { type: "button", class: "primary approve", onclick: () => this.decide(p.toolCallId, true, reason.value) }, "Approve"),
        h("button", { type: "button", class: "danger deny", onclick: () => this.decide(p.toolCallId, false, reason.value) }, "Deny"),
      ),
    );
  }

  async decide(callId, granted, reason) {
    this.decisions.set(callId, { granted, reason: reason?.trim() || undefined });
    const pending = this.info?.pending || [];
    this.renderApprovals(pending);
    const waiting = pending.filter((p) => p.kind === "permission" && !p.expired);
    if (waiting.some((p) => !this.decisions.has(p.toolCallId))) return;
    const messages = waiting.map((p) => {
      const d = this.decisions.get(p.toolCallId);
      const m = { role: "tool_permission", toolCallId: p.toolCallId, granted: d.granted };
      if (!d.granted && d.reason) m.reason = d.reason;
      return m;
    });
    this.setRunning(true);
    try {
      await api("POST", `${this.path}/turns`, { json: { messages } });
    } catch (e) {
      if (e.name !== "AbortError") toast(`Decision not taken: ${e.message}`, "error");
    } finally {
      this.refresh();
      pollApprovals();
    }
  }

  /** For the keyboard: the first call still waiting for a decision, in log order. */
  firstOpen() {
    const perms = (this.info?.pending || []).filter((p) => p.kind === "permission" && !p.expired && !this.decisions.has(p.toolCallId));
    return perms[0];
  }

  key(ev) {
    const p = this.firstOpen();
    if (!p) return false;
    const reason = $(`input[data-reason-for="${CSS.escape(p.toolCallId)}"]`);
    if (ev.key === "a") this.decide(p.toolCallId, true, "");
    else if (ev.key === "d") this.decide(p.toolCallId, false, reason?.value || "");
    else if (ev.key === "r" && reason) {
      reason.focus();
    } else return false;
    return true;
  }

  renderPlan(plan) {
    if (!plan) {
      this.planBox.replaceChildren();
      this.planShown = null;
      return;
    }
    if (this.planShown === plan) return;
    this.planShown = plan;
    const text = h("textarea", { id: "plan-text", readonly: true, rows: Math.min(14, plan.split("\n").length + 1) });
    text.value = plan;
    const reason = h("input", { type: "text", id: "plan-reason", placeholder: "Why not? (sent to the model)" });
    const confirm = h("button", { type: "button", class: "primary", id: "plan-confirm", onclick: () => this.planDecision("confirm", text.readOnly || text.value === plan ? undefined : text.value) }, "Confirm plan");
    const edit = h("button", {
      type: "button",
      class: "ghost",
      id: "plan-edit",
      onclick: () => {
        text.readOnly = false;
        text.focus();
        confirm.textContent = "Confirm edited plan";
        edit.hidden = true;
      },
    }, "Edit");
    const reject = h("button", { type: "button", class: "danger", id: "plan-reject", onclick: () => this.planDecision("reject", undefined, reason.value) }, "Reject");
    this.planBox.replaceChildren(
      h("div", { class: "plan-panel card" }, h("div", { class: "approval-head" }, h("strong", {}, "The agent proposes a plan"), h("span", { class: "muted small" }, " · confirm it, edit it, or reject it with a reason")), text, h("div", { class: "approval-actions" }, confirm, edit, h("span", { class: "spacer" }), reason, reject)),
    );
  }

  async planDecision(kind, edits, reason) {
    const body = kind === "confirm" ? (edits !== undefined ? { edits } : {}) : reason?.trim() ? { reason: reason.trim() } : {};
    try {
      await api("POST", `${this.path}/plan/${kind}`, { json: body });
      toast(kind === "confirm" ? "Plan confirmed" : "Plan rejected");
      this.planBox.replaceChildren();
    } catch (e) {
      toast(e.message, "error");
    }
    this.refresh();
  }

  async cancel() {
    try {
      const r = await api("POST", `${this.path}/cancel`, { json: {} });
      toast(r.cancelled?.length ? `Cancelled ${r.cancelled.length} turn(s)` : "Nothing to cancel");
    } catch (e) {
      toast(e.message, "error");
    }
    this.refresh();
  }

  // -------- composer

  composer() {
    const text = h("textarea", { id: "message", rows: 2, placeholder: "Message the agent…  (Ctrl+Enter to send)", "aria-label": "Message" });
    const chips = h("div", { class: "chips", id: "attachments" });
    const fileInput = h("input", {
      type: "file",
      id: "attach",
      multiple: true,
      class: "visually-hidden",
      onchange: () => {
        this.files.push(...fileInput.files);
        fileInput.value = "";
        drawChips();
      },
    });
    const drawChips = () => {
      chips.replaceChildren(
        ...this.files.map((f, i) => h("span", { class: "chip file-chip" }, `${f.name} · ${bytes(f.size)}`, h("button", { type: "button", class: "x", "aria-label": `Remove ${f.name}`, onclick: () => { this.files.splice(i, 1); drawChips(); } }, "×"))),
      );
    };
    const plan = h("input", { type: "checkbox", id: "plan-first" });
    const send = h("button", { type: "submit", class: "primary", id: "send" }, "Send");
    const form = h(
      "form",
      {
        class: "composer",
        onsubmit: async (ev) => {
          ev.preventDefault();
          const content = text.value.trim();
          if (!content && !this.files.length) return;
          send.disabled = true;
          try {
            await this.send(content, plan.checked);
            text.value = "";
            plan.checked = false;
            this.files = [];
            drawChips();
          } catch (e) {
            toast(e.message, "error");
          } finally {
            send.disabled = false;
          }
        },
      },
      chips,
      h(
        "div",
        { class: "composer-row" },
        text,
        h(
          "div",
          { class: "composer-actions" },
          h("label", { class: "button ghost", for: "attach", title: "Attach files" }, "Attach"),
          fileInput,
          h("label", { class: "check", title: "Ask the agent for a plan first (runs API plan mode)" }, plan, "Plan first"),
          send,
        ),
      ),
    );
    text.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        form.requestSubmit();
      }
    });
    return form;
  }

  async send(content, planFirst) {
    if (this.files.length) {
      // Attachments: uploaded, then sent through the event log API (POST /messages).
      const ids = [];
      for (const f of this.files) {
        const r = await api("POST", `/files?filename=${encodeURIComponent(f.name)}`, { body: f, headers: { "Content-Type": f.type || "application/octet-stream" } });
        ids.push(r.id);
      }
      await api("POST", `${this.path}/messages`, { json: { content: content || "(files attached)", files: ids } });
      return;
    }
    if (planFirst) {
      await api("POST", `${this.path}/run`, { json: { goal: content, plan: true } });
      return;
    }
    // An AAP turn: an `ask` call pauses it for this console's decision. Its answer arrives
    // through the event stream; the request itself ends with the turn.
    this.setRunning(true);
    api("POST", `${this.path}/turns`, { json: { messages: [{ role: "user", content }] } }).catch((e) => {
      if (e.name !== "AbortError") toast(e.message, "error");
    });
  }
}

/** Read an SSE body, calling onFrame({id, event, data}) per frame. */
async function readSse(body, onFrame) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  let frame = { id: null, event: "message", data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let nl;
    while ((nl = buf.search(/\r\n|\n|\r/)) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + (buf[nl] === "\r" && buf[nl + 1] === "\n" ? 2 : 1));
      if (line === "") {
        if (frame.data.length) onFrame({ id: frame.id, event: frame.event, data: frame.data.join("\n") });
        frame = { id: null, event: "message", data: [] };
        continue;
      }
      if (line.startsWith(":")) continue;
      const i = line.indexOf(":");
      const field = i < 0 ? line : line.slice(0, i);
      let val = i < 0 ? "" : line.slice(i + 1);
      if (val.startsWith(" ")) val = val.slice(1);
      if (field === "data") frame.data.push(val);
      else if (field === "event") frame.event = val;
      else if (field === "id") frame.id = val;
    }
  }
}

// ---------------------------------------------------------------- approvals across sessions

class ApprovalsView {
  mount(main) {
    this.list = h("div", { id: "approvals-list" }, h("p", { class: "muted" }, "Loading…"));
    main.replaceChildren(h("section", { class: "card" }, h("h1", {}, "Approvals"), h("p", { class: "muted" }, "Calls of `ask` tools (and untrusted ones) that wait for a person, across your sessions. Open a session to decide."), this.list));
    this.onApprovals(state.pendingAll);
    pollApprovals();
  }

  onApprovals(found) {
    if (!found.length) {
      this.list.replaceChildren(h("p", { class: "empty" }, "Nothing waits for a decision."));
      return;
    }
    this.list.replaceChildren(
      ...found.map((p) => {
        return h(
          "a",
          { class: `approval-row${p.expired ? " expired" : ""}`, href: `#/s/${encodeURIComponent(p.session)}` },
          h("span", { class: "mono strong" }, p.name),
          p.rule ? h("span", { class: "muted small" }, `${p.verdict} by rule ${p.rule} · server ${p.server}`) : h("span", {}),
          h("span", { class: "mono small muted" }, p.session),
          p.expired ? h("span", { class: "badge expired" }, "expired") : h("span", { class: "muted small" }, `expires in ${timeLeft(p.expires_at)}`),
          h("pre", { class: "args small" }, pretty(p.input)),
        );
      }),
    );
  }
}

// ---------------------------------------------------------------- tools

class ToolsView {
  async mount(main) {
    this.servers = h("div", { id: "servers" }, h("p", { class: "muted" }, "Loading…"));
    this.table = h("tbody", {});
    const filter = h("input", { type: "search", placeholder: "Filter tools", "aria-label": "Filter tools", oninput: () => this.draw(filter.value) });
    main.replaceChildren(
      h("section", { class: "card" }, h("h1", {}, "MCP servers"), this.servers),
      h(
        "section",
        { class: "card" },
        h("div", { class: "section-head" }, h("h1", {}, "Tools"), filter),
        h("p", { class: "muted small" }, "Every federated tool with the operator's verdict and the first rule of the policy that decided it (precedence deny > ask > trust > default)."),
        h("div", { class: "table-wrap" }, h("table", { class: "tools", id: "tools-table" }, h("thead", {}, h("tr", {}, h("th", {}, "Tool"), h("th", {}, "Server"), h("th", {}, "Verdict"), h("th", {}, "Rule"), h("th", {}, "Description"))), this.table)),
      ),
    );
    await loadTools();
    this.draw("");
    try {
      const st = await api("GET", "/status");
      const servers = st.mcp_servers || [];
      this.servers.replaceChildren(
        servers.length
          ? h("div", { class: "server-grid" }, servers.map((s) => h(
            "div",
            { class: "server", dataset: { server: s.name } },
            h("div", { class: "tool-head" }, h("strong", {}, s.name), h("span", { class: `badge state-${s.state || "session"}` }, s.state || `${(s.instances || []).length} session instance(s)`)),
            h("div", { class: "muted small" }, `${s.scope} · ${s.tools ?? "–"} tools${s.pid ? ` · pid ${s.pid}` : ""} · ${s.restarts ?? 0} restarts`),
            s.last_call ? h("div", { class: "muted small" }, `last call ${when(s.last_call)}`) : null,
            s.last_error ? h("div", { class: "error small" }, s.last_error) : null,
          )))
          : h("p", { class: "empty" }, "No MCP servers are configured."),
      );
    } catch (e) {
      this.servers.replaceChildren(h("p", { class: "muted" }, `Server states are not available (${e.message}).`));
    }
  }

  draw(q) {
    const rows = [...state.tools.values()].filter((t) => !q || t.name.includes(q) || (t.description || "").toLowerCase().includes(q.toLowerCase()));
    this.table.replaceChildren(
      ...rows.map((t) => h("tr", { dataset: { tool: t.name } }, h("td", { class: "mono" }, t.name), h("td", {}, t.server), h("td", {}, h("span", { class: `verdict ${t.verdict}` }, t.verdict)), h("td", { class: "mono" }, t.rule), h("td", { class: "desc" }, t.description || ""))),
    );
    if (!rows.length) this.table.replaceChildren(h("tr", {}, h("td", { colspan: 5, class: "empty" }, "No tools.")));
  }
}

// ---------------------------------------------------------------- keyboard, boot

let gPressed = 0;
document.addEventListener("keydown", (ev) => {
  const t = ev.target;
  if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
  if (t instanceof HTMLInputElement || t instanceof HTMLTextAreaElement || t instanceof HTMLSelectElement) {
    if (ev.key === "Escape") t.blur();
    return;
  }
  if (ev.key === "?") {
    $("#help").showModal();
    ev.preventDefault();
    return;
  }
  if (ev.key === "g") {
    gPressed = Date.now();
    return;
  }
  if (Date.now() - gPressed < 1500) {
    gPressed = 0;
    const to = { s: "#/sessions", t: "#/tools", p: "#/approvals" }[ev.key];
    if (to) {
      location.hash = to;
      ev.preventDefault();
      return;
    }
  }
  if (ev.key === "/" && $("#message")) {
    $("#message").focus();
    ev.preventDefault();
    return;
  }
  if (state.view?.key && state.view.key(ev)) ev.preventDefault();
});

async function boot() {
  $("#help-button").onclick = () => $("#help").showModal();
  $("#help-close").onclick = () => $("#help").close();
  $("#signout").onclick = () => signedOut("Signed out.");
  try {
    await api("GET", "/sessions", { probe: true });
  } catch (e) {
    if (e.status === 401) return showSignin(state.key ? "Your key was refused." : "");
    $("#main").replaceChildren(h("p", { class: "error" }, e.message));
    return;
  }
  $("#signout").hidden = !state.key;
  delete document.body.dataset.signedOut;
  try {
    state.meta = await api("GET", "/meta");
  } catch (e) {
    toast(`/meta: ${e.message}`, "error");
  }
  await loadTools();
  startPolling();
  route();
}

window.addEventListener("hashchange", () => state.meta && route());
boot();
