// The JavaScript client example of the runs spec (spec/002, "Consuming SSE in JavaScript"),
// exactly as written there, run against a real turnstile by tests/api/runs.rs. Only what a
// script outside a browser needs is added: the import of the `eventsource` package (v3 and
// later export a WHATWG-compatible `EventSource` by name) and the base URL and session id,
// taken from the command line:
//
//     node run_example.mjs http://127.0.0.1:8787 sess_…
import { EventSource } from 'eventsource';

const [BASE, SESSION] = process.argv.slice(2);

// First, POST to trigger the run
await fetch(`${BASE}/sessions/${SESSION}/run`, {
  method: 'POST',
  headers: { 'Content-Type': 'application/json' },
  body: JSON.stringify({ goal: '列出文件' }),
});

// Then subscribe to the events
const evtSource = new EventSource(`${BASE}/sessions/${SESSION}/events`);

evtSource.addEventListener('tool_call', (e) => {
  const data = JSON.parse(e.data);
  console.log(`[工具] ${data.name}`);
});

evtSource.addEventListener('message', (e) => {
  const data = JSON.parse(e.data);
  for (const block of data.content) {
    if (block.type === 'text') console.log(block.text);
  }
});

evtSource.addEventListener('done', (e) => {
  const data = JSON.parse(e.data);
  console.log('完成:', data.finish_reason);
  evtSource.close();
});
