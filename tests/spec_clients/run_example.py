# The Python client example of the runs spec (spec/002, "Consuming SSE in Python"), exactly as
# written there, run against a real turnstile by tests/api/runs.rs. Only the base URL and the
# session id are not the spec's: they come from the command line:
#
#     python3 run_example.py http://127.0.0.1:8787 sess_…
import json, sseclient, requests
import sys

BASE, SESSION = sys.argv[1], sys.argv[2]

# Trigger the run
requests.post(
    f'{BASE}/sessions/{SESSION}/run',
    json={'goal': '列出文件'},
)

# Subscribe to the events
resp = requests.get(
    f'{BASE}/sessions/{SESSION}/events',
    stream=True,
)
client = sseclient.SSEClient(resp)
for event in client.events():
    data = json.loads(event.data)
    if event.event == 'message':
        for block in data.get('content', []):
            if block.get('type') == 'text':
                print(block['text'])
    elif event.event == 'done':
        print('完成:', data['finish_reason'])
        break
