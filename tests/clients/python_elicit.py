"""Answers a sub-agent's approval through MCP elicitation with the official Python SDK (PyPI `mcp`).

    python_elicit.py MODE BINARY ARG...   (the server command)

MODE `legacy` connects with the initialize handshake (2025-11-25): the server pushes
`elicitation/create`. MODE `2026-07-28` connects without one: the server answers a tool call
`input_required` and the SDK retries it with the answer (multi round-trip requests).

Spawns a sub-agent whose task makes it ask for approval and waits with `subagents wait`; the
elicitation callback allows, with a note; the sub-agent continues in the same run and its outcome
carries the answer. Prints `ok MODE` and exits 0, or raises with what went wrong.
"""

import sys

import anyio
from mcp import Client, types
from mcp.client.stdio import StdioServerParameters


def text_of(message):
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content or [])


async def exercise(mode, command, args):
    asked = []

    async def on_elicit(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": "allow", "text": "from the host"})

    server = StdioServerParameters(command=command, args=args)
    async with Client(server, mode=mode, elicitation_callback=on_elicit) as client:
        spawn = (await client.call_tool("sessions_spawn", {"task": "ask for a.txt"})).structured_content
        assert spawn["status"] == "accepted", spawn
        child = spawn["childSessionKey"]
        waited = None
        with anyio.fail_after(60):
            while True:
                result = await client.call_tool("subagents", {"action": "wait", "timeoutSeconds": 30})
                waited = result.structured_content
                if waited["status"] == "ok" and waited["finished"]:
                    break
                # `attention` while the host's answer is on its way (push): wait again.
                assert waited["status"] == "attention", waited
                await anyio.sleep(0.2)
        outcome = waited["finished"][0]["outcome"]
        assert "Result: decision=allow answer=from the host" in outcome, outcome
        assert len(asked) == 1, asked
        assert "asks for approval: May I write ask for a.txt?" in asked[0], asked
        history = (await client.call_tool("sessions_history", {"sessionKey": child})).structured_content
        texts = [text_of(m) for m in history["messages"]]
        assert any("via elicitation, a person at " in t and "] allow: from the host" in t for t in texts), texts
    print(f"ok {mode}")


if __name__ == "__main__":
    anyio.run(exercise, sys.argv[1], sys.argv[2], sys.argv[3:])
