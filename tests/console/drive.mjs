// Drives turnstile's web console in the system's Chromium (playwright-core; never a browser
// download). Run by tests/console/ui.rs against a real turnstile binary and the fake upstream:
//   BASE=http://127.0.0.1:PORT SCENARIO=name SHOTS=dir [KEY=api-key] [FILE=path] node drive.mjs
// Each scenario does what a person would and asserts what they would see; screenshots of each
// state go to SHOTS/<scenario>-NN-<state>.png. Exit 0 and a last line `RESULT {json}` on success.

import { chromium } from "playwright-core";
import { mkdtempSync, rmSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const BASE = process.env.BASE;
const SCENARIO = process.env.SCENARIO;
const SHOTS = process.env.SHOTS;
const KEY = process.env.KEY || "";
const EXE = process.env.CHROMIUM || "/usr/bin/chromium";

function check(cond, message) {
  if (!cond) throw new Error(`check failed: ${message}`);
}

let shotNo = 0;
async function shot(page, name) {
  shotNo += 1;
  const file = join(SHOTS, `${SCENARIO}-${String(shotNo).padStart(2, "0")}-${name}.png`);
  await page.screenshot({ path: file });
  return file;
}

/** Open the console (already signed in, or keyless) and create a session with the default agent. */
async function createSession(page) {
  await page.goto(`${BASE}/console`);
  await page.locator("#create-session").waitFor();
  // The tool list comes from /meta and /tools.
  await page.locator("#create").click();
  await page.waitForURL(/#\/s\/sess_/);
  await page.locator("#conn.live").waitFor();
  return decodeURIComponent(page.url().split("#/s/")[1]);
}

async function send(page, text) {
  await page.locator("#message").fill(text);
  await page.locator("#send").click();
}

/** The text of the answer being streamed, or null when none is (read at once, no waiting). */
async function draftText(page) {
  return page.evaluate(() => document.querySelector(".msg.agent.draft .text")?.textContent ?? null);
}

/** The visible text of the agent's final (stored) messages. */
async function agentTexts(page) {
  return page.locator(".msg.agent:not(.draft) .text").allInnerTexts();
}

const scenarios = {
  // Sign in with a key (kept in sessionStorage, never in a URL), create a session, send a
  // message and watch the answer stream in; the list shows it; delete another one.
  async signin_stream(page) {
    await page.goto(`${BASE}/console`);
    await page.locator("form.signin").waitFor();
    await shot(page, "signin");
    await page.locator("#key").fill("not-the-key");
    await page.locator("form.signin button[type=submit]").click();
    await page.locator("#signin-error", { hasText: "refused" }).waitFor();
    await page.locator("#key").fill(KEY);
    await page.locator("form.signin button[type=submit]").click();
    await page.locator("#create-session").waitFor();
    check(!page.url().includes(KEY), "the key is never in the URL");
    const stored = await page.evaluate(() => sessionStorage.getItem("turnstile.console.key"));
    check(stored === KEY, "the key is kept in sessionStorage");
    check((await page.evaluate(() => localStorage.length)) === 0, "nothing in localStorage");
    await page.locator(".tool-pick").first().waitFor();
    await shot(page, "create-form");
    await page.locator("#create").click();
    await page.waitForURL(/#\/s\/sess_/);
    const sid = decodeURIComponent(page.url().split("#/s/")[1]);
    await page.locator("#conn.live").waitFor();
    await send(page, "Tell me about turnstiles.");
    await page.locator(".msg.user", { hasText: "Tell me about turnstiles." }).waitFor();
    // Deltas arrive before the stored message: a draft bubble grows.
    await page.locator(".msg.agent.draft").waitFor();
    const partial = await draftText(page);
    await shot(page, "streaming");
    const expected = process.env.ANSWER;
    await page.locator(".msg.agent:not(.draft)").waitFor();
    const texts = await agentTexts(page);
    check(texts.length === 1 && texts[0] === expected, `one answer, exactly the streamed text: ${JSON.stringify(texts)}`);
    check(partial !== null && partial.length < expected.length, `the answer was seen growing (${partial?.length} of ${expected.length} chars)`);
    await page.locator("[data-session-status=idle]").waitFor();
    await shot(page, "answered");
    // A second session, then the list: newest first, with status badges; delete the second.
    await page.goto(`${BASE}/console#/sessions`);
    await page.locator("#create").click();
    await page.waitForURL(/#\/s\/sess_/);
    const sid2 = decodeURIComponent(page.url().split("#/s/")[1]);
    await page.locator("[data-nav=sessions]").click();
    await page.locator(".session-row").nth(1).waitFor();
    const ids = await page.locator(".session-row").evaluateAll((rows) => rows.map((r) => r.dataset.sessionId));
    check(ids[0] === sid2 && ids[1] === sid, `newest first: ${ids}`);
    const badges = await page.locator(".session-row .badge").allInnerTexts();
    check(badges.every((b) => b === "idle"), `status badges: ${badges}`);
    await shot(page, "sessions");
    const row = page.locator(`.session-row[data-session-id="${sid2}"]`);
    await row.locator("button", { hasText: "Delete" }).click();
    await row.locator("button", { hasText: "Really delete?" }).click();
    await page.locator(`.session-row[data-session-id="${sid2}"]`).waitFor({ state: "detached" });
    // Sign out forgets the key.
    await page.locator("#signout").click();
    await page.locator("form.signin").waitFor();
    check((await page.evaluate(() => sessionStorage.getItem("turnstile.console.key"))) === null, "signed out");
    return { sid, deleted: sid2, partial_chars: partial?.length ?? 0 };
  },

  // Two `ask` calls: approve one (keyboard `a`), deny the other with a reason; both results show.
  // An MCP server asks a question mid-call: the console shows it as a form built from the
  // requested schema (defaults filled in); an answer missing a required field is refused
  // naming it and the form stays; a complete one goes through and the call goes on.
  async elicitation(page) {
    await createSession(page);
    await send(page, "Who am I?");
    const form = page.locator("form.elicitation");
    await form.waitFor();
    check((await form.locator(".question").innerText()) === "Who are you?", "the server's message");
    check((await form.locator("input[data-field=age]").inputValue()) === "30", "the default age");
    check(await form.locator("input[data-field=subscribe]").isChecked(), "the default boolean");
    const color = form.locator("select[data-field=color]");
    check((await color.locator("option:checked").innerText()) === "red", "the default choice");
    await shot(page, "question");
    await form.locator("button.accept").click();
    await page.locator(".toast.error", { hasText: "email: required" }).waitFor();
    check((await form.count()) === 1, "the form stays after a refused answer");
    await shot(page, "refused");
    await form.locator("input[data-field=email]").fill("ada@example.com");
    await form.locator("input[data-field=age]").fill("41");
    await color.selectOption({ label: "blue" });
    await form.locator("button.accept").click();
    await page.locator(".msg.agent:not(.draft)", { hasText: process.env.ANSWER }).waitFor();
    const result = await page.locator(".tool[data-call-id=call_ask] .result pre").innerText();
    check(result.includes("ada@example.com") && result.includes("blue") && result.includes("41"), `the server got the answer: ${result}`);
    // Once answered, the form goes (with the session's next refresh).
    await page.locator("form.elicitation").waitFor({ state: "detached" });
    await shot(page, "answered");
    return { result };
  },

  async approvals(page) {
    await page.goto(`${BASE}/console`);
    check(!(await page.locator("form.signin").count()), "no sign-in on a keyless loopback server");
    const sid = await createSession(page);
    await send(page, "Echo alpha and beta.");
    const panels = page.locator(".approval.open");
    await panels.nth(1).waitFor();
    await page.locator("#approval-note .banner.warn").waitFor();
    const first = page.locator(".tool[data-call-id=call_a]");
    check((await first.locator(".args").innerText()).includes('"text": "alpha"'), "pretty JSON arguments");
    const head = await first.locator(".approval-head").innerText();
    check(head.includes("mcp__ex__echo") && head.includes("server ex") && head.includes("ask"), `the deciding rule and server: ${head}`);
    // The badge counts waiting calls across sessions (polled).
    await page.locator("#approvals-badge:not([hidden])", { hasText: "2" }).waitFor();
    await page.locator("[data-session-status=awaiting_client]").waitFor();
    await shot(page, "waiting");
    // The approvals page lists both, across sessions, and leads back to the session.
    await page.locator("[data-nav=approvals]").click();
    await page.locator(".approval-row").nth(1).waitFor();
    await shot(page, "approvals-page");
    await page.locator(".approval-row").first().click();
    await page.locator(".approval.open").nth(1).waitFor();
    // `a` approves the first waiting call (call_a).
    await page.locator("#timeline").click({ position: { x: 5, y: 5 } });
    await page.keyboard.press("a");
    await page.locator(".tool[data-call-id=call_a] .approval.decided").waitFor();
    await page.locator(".tool[data-call-id=call_b] input.reason").fill("not this one");
    await page.locator(".tool[data-call-id=call_b] button.deny").click();
    await page.locator(".tool[data-call-id=call_b] .result pre").waitFor();
    await page.locator(".tool[data-call-id=call_a] .result pre").waitFor();
    const a = await page.locator(".tool[data-call-id=call_a] .result pre").innerText();
    const b = await page.locator(".tool[data-call-id=call_b] .result pre").innerText();
    check(a === "alpha", `the approved call ran: ${a}`);
    check(b === "Tool call denied: not this one", `the denied call: ${b}`);
    await page.locator(".msg.agent:not(.draft)", { hasText: process.env.ANSWER }).waitFor();
    await page.locator(".decision.granted").waitFor();
    await page.locator(".decision.denied", { hasText: "not this one" }).waitFor();
    await page.locator("#approvals-badge[hidden]").waitFor({ state: "attached" });
    await shot(page, "decided");
    // Tools view: verdicts and rules, the MCP server's state.
    await page.locator("[data-nav=tools]").click();
    const row = page.locator('tr[data-tool="mcp__ex__echo"]');
    await row.waitFor();
    const cells = await row.locator("td").allInnerTexts();
    check(cells[2].toLowerCase() === "ask" && cells[3] === "mcp__ex__echo", `tools row: ${cells}`);
    await page.locator('.server[data-server="ex"] .badge', { hasText: "up" }).waitFor();
    await shot(page, "tools");
    // Phone width and dark mode, for the eye.
    await page.goto(`${BASE}/console#/s/${encodeURIComponent(sid)}`);
    await page.locator(".tool[data-call-id=call_b] .result pre").waitFor();
    await page.emulateMedia({ colorScheme: "dark" });
    await shot(page, "dark");
    await page.setViewportSize({ width: 390, height: 844 });
    await page.emulateMedia({ colorScheme: "light" });
    await shot(page, "phone");
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    check(overflow <= 0, `no horizontal scrolling at phone width (${overflow}px too wide)`);
    return { sid };
  },

  // Plan first: the plan shows with Confirm / Edit / Reject; edit it and confirm.
  async plan(page) {
    await createSession(page);
    await page.locator("#plan-first").check();
    await send(page, "Write the release notes.");
    await page.locator("#plan-text").waitFor();
    await page.locator("[data-session-status=plan_pending_approval]").waitFor();
    check((await page.locator("#plan-text").inputValue()) === process.env.PLAN, "the proposed plan");
    await shot(page, "proposed");
    await page.locator("#plan-edit").click();
    await page.locator("#plan-text").fill(process.env.EDITED);
    await shot(page, "editing");
    await page.locator("#plan-confirm", { hasText: "Confirm edited plan" }).click();
    await page.locator(".plan-card.edited", { hasText: process.env.EDITED }).waitFor();
    await page.locator(".msg.agent:not(.draft)", { hasText: process.env.ANSWER }).waitFor();
    await page.locator("#plan-text").waitFor({ state: "detached" });
    await shot(page, "confirmed");
    return {};
  },

  // Attach a file, the agent delivers it back; download it and compare the bytes.
  async files(page) {
    await createSession(page);
    const original = readFileSync(process.env.FILE);
    await page.locator("#attach").setInputFiles({ name: "data.bin", mimeType: "application/octet-stream", buffer: original });
    await page.locator(".file-chip", { hasText: "data.bin" }).waitFor();
    await send(page, "Please hand this file back.");
    const link = page.locator('.tool[data-tool="deliver_file"] .result a.file');
    await link.waitFor();
    await page.locator(".msg.agent:not(.draft)", { hasText: process.env.ANSWER }).waitFor();
    await shot(page, "delivered");
    const [download] = await Promise.all([page.waitForEvent("download"), link.click()]);
    const saved = join(tmpdir(), `console-download-${process.pid}.bin`);
    await download.saveAs(saved);
    const got = readFileSync(saved);
    rmSync(saved, { force: true });
    check(download.suggestedFilename() === "data.bin", `file name ${download.suggestedFilename()}`);
    check(got.equals(original), `downloaded ${got.length} bytes, sent ${original.length}: the same bytes`);
    // The attachment shows on the user's message too.
    await page.locator(".msg.user a.file", { hasText: "data.bin" }).waitFor();
    return { bytes: got.length };
  },

  // A stream cut mid-answer resumes with Last-Event-ID; a reload mid-stream replays the log:
  // either way the answer shows once, whole.
  async reload(page) {
    const resumed = [];
    page.on("request", (r) => {
      if (r.url().includes("/events/stream") && r.headers()["last-event-id"]) resumed.push(r.headers()["last-event-id"]);
    });
    const sid = await createSession(page);
    const expected = process.env.ANSWER;
    await send(page, "A long answer, please.");
    await page.locator(".msg.agent.draft").waitFor();
    // Cut the stream (as a network drop would): it comes back after the last event seen.
    await page.waitForFunction(() => (document.querySelector(".msg.agent.draft .text")?.textContent.length || 0) > 20);
    const before = await page.evaluate(() => document.body.dataset.lastEventId);
    await page.evaluate(() => window.turnstileConsole.reconnect());
    await page.locator("#conn.live").waitFor();
    await page.waitForFunction(() => (document.querySelector(".msg.agent.draft .text")?.textContent.length || 0) > 0);
    check(resumed.includes(before), `resumed with Last-Event-ID ${before}: ${resumed}`);
    await shot(page, "mid-stream");
    // Reload while the answer still streams.
    const grown = await draftText(page);
    check(grown && grown.length < expected.length, `still streaming before the reload: ${grown}`);
    await page.reload();
    await page.locator("#conn.live").waitFor();
    await shot(page, "after-reload");
    await page.locator(".msg.agent:not(.draft)").waitFor({ timeout: 30000 });
    await page.locator("[data-session-status=idle]").waitFor();
    const texts = await agentTexts(page);
    check(texts.length === 1 && texts[0] === expected, `one answer, whole: ${JSON.stringify(texts)}`);
    check((await page.locator(".msg.user").count()) === 1, "one user message");
    check((await page.locator(".msg.draft").count()) === 0, "no draft left");
    check((await page.locator(".turn-end").count()) === 1, "one turn end");
    const ids = await page.locator("[data-event-id]").evaluateAll((els) => els.map((e) => e.dataset.eventId));
    check(new Set(ids).size === ids.length, `no event twice: ${ids}`);
    await shot(page, "whole");
    return { sid, events: ids.length, resumed };
  },
};

// Cancel a streaming turn; then an `ask` call left alone expires and shows as such.
scenarios.cancel_expiry = async (page) => {
  await createSession(page);
  await send(page, "Talk for a long time.");
  await page.locator(".msg.agent.draft").waitFor();
  await page.locator("#cancel:not([disabled])").click();
  await page.locator(".turn-end.cancelled").waitFor();
  await page.locator("[data-session-status=idle]").waitFor();
  await shot(page, "cancelled");
  await send(page, "Echo gamma.");
  await page.locator(".tool[data-call-id=call_g]").waitFor();
  // approval_ttl_s = 1: the server denies it ("approval expired"); the call shows as expired,
  // with no Approve button left, and the badge does not count it.
  await page.locator(".tool.denied[data-call-id=call_g] .result-label", { hasText: "expired" }).waitFor();
  check((await page.locator(".tool[data-call-id=call_g] .result pre").innerText()) === "Tool call denied: approval expired", "the expiry's denial");
  check(!(await page.locator(".tool[data-call-id=call_g] button.approve").count()), "no Approve on an expired call");
  await page.locator("#approvals-badge[hidden]").waitFor({ state: "attached" });
  await shot(page, "expired");
  return {};
};

async function main() {
  const profile = mkdtempSync(join(tmpdir(), "turnstile-console-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: EXE,
    headless: true,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
    viewport: { width: 1280, height: 800 },
    acceptDownloads: true,
  });
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(20000);
  const problems = [];
  page.on("console", (m) => {
    if (m.type() === "error") problems.push(m.text());
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  try {
    const result = await scenarios[SCENARIO](page);
    // A CSP violation or a script error is a failure even when the scenario passed.
    // (The elicitation scenario sends a refused answer on purpose: its 400 is expected.)
    const expected = SCENARIO === "elicitation" ? /status of (400|401|404|409)/ : /status of (401|404|409)/;
    const bad = problems.filter((p) => !(/Failed to load resource: the server responded/.test(p) && expected.test(p)));
    check(bad.length === 0, `browser console errors: ${bad.join(" | ")}`);
    console.log(`RESULT ${JSON.stringify(result)}`);
  } catch (e) {
    try {
      await shot(page, "FAILED");
    } catch {
      /* the page is gone */
    }
    console.error(`${SCENARIO}: ${e.stack || e}\nbrowser console: ${problems.join(" | ")}`);
    process.exitCode = 1;
  } finally {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  }
}

if (!scenarios[SCENARIO]) {
  console.error(`unknown SCENARIO ${SCENARIO}; one of ${Object.keys(scenarios).join(", ")}`);
  process.exit(2);
}
await main();
