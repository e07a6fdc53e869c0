"""Drives sessions-mcp with the official Python MCP SDK (PyPI `mcp`), as a real client would.

    python_sdk.py ME stdio BINARY ARG...  (the server command)
    python_sdk.py ME http URL TOKEN       (streamable HTTP)
    python_sdk.py ME sse URL TOKEN        (the legacy HTTP+SSE transport, URL ends in /sse)

ME is the session key the client acts as. With SESSIONS_MCP_ROOT set, the client declares that
directory as its one root, and a spawn asked to work in the project must work there.

Over each transport: list the tools, list sessions, read history, subscribe to the caller's own
transcript, spawn a sub-agent, wait for the transcript-updated notification its announce causes,
read the transcript as a resource, then send to the child and wait for the reply. Prints
`ok <transport>` and exits 0, or raises (non-zero exit) with what went wrong.
"""

import os
import sys
from contextlib import asynccontextmanager

import anyio
import mcp
from mcp import types
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

TOOLS = {"agents_list", "sessions_history", "sessions_list", "sessions_send", "sessions_spawn", "subagents"}


@asynccontextmanager
async def connect(kind, args):
    if kind == "stdio":
        params = StdioServerParameters(command=args[0], args=args[1:])
        async with stdio_client(params) as (read, write):
            yield read, write
    elif kind == "http":
        url, token = args
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
            async with streamable_http_client(url, http_client=http) as streams:
                yield streams[0], streams[1]
    elif kind == "sse":
        url, token = args
        async with sse_client(url, headers={"Authorization": f"Bearer {token}"}) as (read, write):
            yield read, write
    else:
        raise SystemExit(f"unknown transport {kind!r}: stdio, http or sse")


def structured(result):
    assert not result.is_error, f"tool error: {result}"
    return result.structured_content


async def exercise(me, kind, args):
    updated = anyio.Event()
    updated_uris = []

    async def on_message(message):
        if isinstance(message, types.ResourceUpdatedNotification):
            updated_uris.append(message.params.uri)
            updated.set()

    root = os.environ.get("SESSIONS_MCP_ROOT")

    async def list_roots(context):
        return types.ListRootsResult(roots=[types.Root(uri=f"file://{root}", name="project")])

    roots = {"list_roots_callback": list_roots} if root else {}
    async with connect(kind, args) as (read, write):
        async with mcp.ClientSession(read, write, message_handler=on_message, **roots) as session:
            await session.initialize()
            if root:
                spawn = structured(await session.call_tool("sessions_spawn", {"task": "where", "workspace": "project"}))
                assert spawn["workspace"] == {"mode": "project", "path": root}, spawn
            tools = {t.name for t in (await session.list_tools()).tools}
            assert tools == TOOLS, f"tools: {tools}"

            listing = structured(await session.call_tool("sessions_list", {}))
            keys = [s["key"] for s in listing["sessions"]]
            assert me in keys, f"{me} not in {keys}"
            history = structured(await session.call_tool("sessions_history", {"sessionKey": me}))
            assert history["status"] == "ok", history

            uri = f"sessions://history/{me}"
            await session.subscribe_resource(uri)
            spawn = structured(await session.call_tool("sessions_spawn", {"task": "compute"}))
            assert spawn["status"] == "accepted", spawn
            child = spawn["childSessionKey"]
            with anyio.fail_after(30):
                while True:
                    await updated.wait()
                    text = (await session.read_resource(uri)).contents[0].text
                    if "Status: completed successfully" in text:
                        break
                    updated = anyio.Event()
            assert uri in updated_uris, updated_uris
            # Done with the updates: the send's reply below lands in this transcript too, and the
            # SDK's legacy-SSE reader raises if a notification arrives while the session closes.
            await session.unsubscribe_resource(uri)

            send = structured(
                await session.call_tool("sessions_send", {"sessionKey": child, "message": "again?", "timeoutSeconds": 20})
            )
            assert send["status"] == "ok" and send["reply"] == "ECHO: again?", send

            # The SDK validates structuredContent against the output schema it was given.
            waited = structured(
                await session.call_tool("subagents", {"action": "wait", "childSessionKeys": [child]})
            )
            assert waited["finished"][0]["outcome"].startswith("Status: completed successfully"), waited
            tree = structured(await session.call_tool("subagents", {"action": "list"}))
            assert tree["children"][0]["sessionKey"] == child and tree["children"][0]["announce"] == "read", tree
    print(f"ok {kind}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    anyio.run(exercise, sys.argv[1], sys.argv[2], sys.argv[3:])
