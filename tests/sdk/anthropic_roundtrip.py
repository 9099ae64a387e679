"""A tool loop with thinking, driven by the official `anthropic` SDK against a Messages API.

Usage: anthropic_roundtrip.py BASE_URL. Streams one answer, then sends the SDK's own follow-up
(the answer's content blocks as the assistant turn, then a tool result), streamed too. Prints one
JSON line: the first answer as the SDK parsed it (its content blocks and usage).
"""

import json
import sys

import anthropic

client = anthropic.Anthropic(base_url=sys.argv[1], api_key="sk-ant-sdk", max_retries=0)
tools = [{"name": "get_weather", "description": "weather",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
thinking = {"type": "enabled", "budget_tokens": 1024}
messages = [{"role": "user", "content": "Paris?"}]

with client.messages.stream(model="claude-test", max_tokens=2048, thinking=thinking,
                            tools=tools, messages=messages) as stream:
    first = stream.get_final_message()

call = next(b for b in first.content if b.type == "tool_use")
messages += [
    {"role": "assistant", "content": first.content},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                  "content": "21C"}]},
]
with client.messages.stream(model="claude-test", max_tokens=2048, thinking=thinking,
                            tools=tools, messages=messages) as stream:
    second = stream.get_final_message()

print(json.dumps({
    "content": [b.model_dump(include={"type", "thinking", "signature", "data", "text", "id",
                                      "name", "input"}) for b in first.content],
    "usage": first.usage.model_dump(include={"input_tokens", "output_tokens",
                                             "cache_read_input_tokens",
                                             "cache_creation_input_tokens"}),
    "stop_reason": first.stop_reason,
    "second": second.content[-1].text,
}))
