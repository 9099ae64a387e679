// What a web page the user visits can make their browser send to a keyless turnstile on
// loopback, in the system's Chromium (playwright-core; never a browser download). Run by
// tests/console/browser_guard.rs against the real binary:
//   TARGET=http://127.0.0.1:PORT CHROMIUM=/usr/bin/chromium node attack.mjs
// Two attackers:
// - "other_port": a page served from another loopback port (this script's own HTTP server)
//   posts to turnstile the ways a page may without asking: a no-cors fetch with a text/plain
//   body, a no-cors fetch with an untyped Blob, an HTML form (text/plain and urlencoded), and
//   tries to read /status with a CORS fetch;
// - "rebinding": a page at http://rebind.test:PORT/ (Chromium maps rebind.test to 127.0.0.1, as
//   a rebinding DNS server would after the page loaded), whose same-origin fetches reach
//   turnstile naming the attacker's host.
// The last line is `RESULT {json}`: what each page could see. What turnstile did is checked by
// the Rust test from its side (calls that reached the MCP server, sessions made).

import { chromium } from "playwright-core";
import { createServer } from "node:http";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const TARGET = process.env.TARGET;
const EXE = process.env.CHROMIUM || "/usr/bin/chromium";
const port = new URL(TARGET).port;

/** The attacker's script: every request a page can send without a preflight. */
const attack = (target) => `
<!doctype html><title>attacking</title>
<iframe name="sink"></iframe>
<script>
const T = ${JSON.stringify(target)};
const goal = JSON.stringify({ goal: '/call mcp__ex__echo {"text":"from-the-page"}' });
async function main() {
  const out = {};
  try {
    await fetch(T + "/run", { method: "POST", mode: "no-cors", headers: { "Content-Type": "text/plain" }, body: goal });
    out.text_plain = "sent";
  } catch (e) { out.text_plain = "blocked: " + e; }
  try {
    await fetch(T + "/run", { method: "POST", mode: "no-cors", body: new Blob([goal]) });
    out.blob = "sent";
  } catch (e) { out.blob = "blocked: " + e; }
  for (const enctype of ["text/plain", "application/x-www-form-urlencoded"]) {
    await new Promise((done) => {
      const f = document.createElement("form");
      f.method = "POST"; f.action = T + "/run"; f.enctype = enctype; f.target = "sink";
      const i = document.createElement("input");
      // text/plain: the body is name=value, so the JSON is split around a '='.
      i.name = goal.slice(0, -2); i.value = '"}'; f.appendChild(i);
      document.body.appendChild(f);
      const frame = document.querySelector("iframe");
      frame.onload = done;
      setTimeout(done, 3000);
      f.submit();
    });
  }
  out.form = "sent";
  try {
    const r = await fetch(T + "/status");
    out.read_status = r.status + " " + (await r.text()).slice(0, 200);
  } catch (e) { out.read_status = "blocked: " + e; }
  // Same origin (only when the page's host is turnstile's port: the rebinding case).
  if (T === "") {
    const r = await fetch("/run", { method: "POST", headers: { "Content-Type": "application/json" }, body: goal });
    out.same_origin_run = r.status + " " + (await r.text()).slice(0, 300);
    const s = await fetch("/status");
    out.same_origin_status = s.status + " " + (await s.text()).slice(0, 300);
  }
  document.title = "done";
  window.RESULT = out;
}
main();
</script>`;

const page_server = createServer((req, res) => {
  res.writeHead(200, { "content-type": "text/html" });
  res.end(attack(TARGET));
});
await new Promise((ok) => page_server.listen(0, "127.0.0.1", ok));
const other = `http://127.0.0.1:${page_server.address().port}/`;

const profile = mkdtempSync(join(tmpdir(), "turnstile-attack-"));
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
    // rebind.test resolves to loopback, as a rebinding name does once the page has loaded.
    "--host-resolver-rules=MAP rebind.test 127.0.0.1",
    // Browsers without Chromium's local-network-access checks (and Chromium with them
    // allowed) send these requests; turnstile must refuse them itself.
    "--disable-features=LocalNetworkAccessChecks,BlockInsecurePrivateNetworkRequests,PrivateNetworkAccessSendPreflights",
  ],
});

const result = {};
try {
  const page = await context.newPage();
  await page.goto(other);
  await page.waitForFunction(() => document.title === "done", null, { timeout: 60000 });
  result.other_port = await page.evaluate(() => window.RESULT);

  // The rebinding page: the document comes from "the attacker" (fulfilled here), everything
  // it fetches goes to 127.0.0.1:PORT naming rebind.test.
  const rebound = `http://rebind.test:${port}/`;
  await context.route(rebound, (route) =>
    route.fulfill({ status: 200, contentType: "text/html", body: attack("") })
  );
  const page2 = await context.newPage();
  await page2.goto(rebound);
  await page2.waitForFunction(() => document.title === "done", null, { timeout: 60000 });
  result.rebinding = await page2.evaluate(() => window.RESULT);
} finally {
  await context.close();
  page_server.close();
  rmSync(profile, { recursive: true, force: true });
}
console.log("RESULT " + JSON.stringify(result));
