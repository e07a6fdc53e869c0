"""A small remote agent on the official Python A2A SDK (PyPI `a2a-sdk`, pinned in
tests/clients/requirements.txt): the remote child of tests/it/a2a_outbound.rs.

    python a2a_agent.py LOG_FILE [--no-streaming]

Serves the JSON-RPC binding and its card on 127.0.0.1 (a free port, printed as `PORT <n>`),
wants `Authorization: Bearer $A2A_AGENT_TOKEN` on every call but the card's, and records what
it did, one line per event, in LOG_FILE (`card` for each fetch of its card, `message`, `cancel`,
`done`). What it does, by the message's text:

- `ask: <question>`: goes input-required with the question (`auth: <what>`: auth-required); the
  next message into the task completes it with `answer was: <text>`.
- `slow <seconds>`: works that long, then completes with `slow done`.
- `big <bytes>`: one artifact of that many `x`, sent in pieces of 64 KiB, then completes.
- `move`: moves its JSON-RPC endpoint from `/a2a` to `/a2b` (the card says so from then on;
  `/a2a` answers 404), then completes with `moved`.
- anything else: one artifact `echo: <text>`, then completes with `done`, reporting usage in
  the task's metadata.
"""

import asyncio
import socket
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import JSONResponse

from a2a.helpers.proto_helpers import new_task_from_user_message, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Role, TaskState

LOG = sys.argv[1]
STREAMING = "--no-streaming" not in sys.argv
TOKEN = __import__("os").environ.get("A2A_AGENT_TOKEN", "")
# Where the JSON-RPC endpoint is: `move` changes it.
ENDPOINT = {"path": "/a2a"}


def log(line: str) -> None:
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def agent_text(text: str, updater: TaskUpdater):
    return new_text_message(text, context_id=updater.context_id, task_id=updater.task_id, role=Role.ROLE_AGENT)


class Agent(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue) -> None:
        text = context.get_user_input()
        task = context.current_task
        if task is None:
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        log(f"message {task.context_id} {task.id} {text}")
        if task.status.state in (TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED):
            await updater.complete(agent_text(f"answer was: {text}", updater))
            return
        await updater.start_work()
        if text.startswith("ask: "):
            await updater.requires_input(agent_text(text[len("ask: "):], updater))
            return
        if text.startswith("auth: "):
            await updater.requires_auth(agent_text(text[len("auth: "):], updater))
            return
        if text.startswith("slow "):
            await asyncio.sleep(float(text.split()[1]))
            log(f"done {task.id}")
            await updater.complete(agent_text("slow done", updater))
            return
        if text.startswith("big "):
            size = int(text.split()[1])
            for start in range(0, size, 65536):
                piece = min(size - start, 65536)
                last = start + piece == size
                await updater.add_artifact(
                    [new_text_part("x" * piece)], artifact_id="big", name="big", append=start > 0, last_chunk=last
                )
            await updater.complete(agent_text("big done", updater))
            return
        if text == "move":
            ENDPOINT["path"] = "/a2b"
            await updater.complete(agent_text("moved", updater))
            return
        await updater.add_artifact([new_text_part(f"echo: {text}")], name="echo")
        usage = {"usage": {"inputTokens": 12, "outputTokens": 3, "costUsd": 0.001}}
        await updater.update_status(TaskState.TASK_STATE_COMPLETED, agent_text("done", updater), metadata=usage)

    async def cancel(self, context: RequestContext, event_queue) -> None:
        log(f"cancel {context.task_id}")
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()


class Bearer(BaseHTTPMiddleware):
    async def dispatch(self, request, call_next):
        path = request.url.path
        if path.startswith("/.well-known/"):
            log("card")
            return await call_next(request)
        if path in ("/a2a", "/a2b") and path != ENDPOINT["path"]:
            return JSONResponse({"error": "not here"}, status_code=404)
        if not TOKEN:
            return await call_next(request)
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        return await call_next(request)


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    card = AgentCard(
        name="python remote",
        description="a remote child for the tests",
        version="1.0.0",
        supported_interfaces=[AgentInterface(url=f"{url}/a2a", protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=STREAMING),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="echoes, asks, waits", tags=["test"])],
    )
    handler = DefaultRequestHandler(agent_executor=Agent(), task_store=InMemoryTaskStore(), agent_card=card)
    async def where_it_is(served: AgentCard) -> AgentCard:
        moved = AgentCard()
        moved.CopyFrom(served)
        moved.supported_interfaces[0].url = f"{url}{ENDPOINT['path']}"
        return moved

    routes = (
        create_agent_card_routes(card, card_modifier=where_it_is)
        + create_jsonrpc_routes(handler, "/a2a")
        + create_jsonrpc_routes(handler, "/a2b")
    )
    app = Starlette(routes=routes)
    app.add_middleware(Bearer)
    print(f"PORT {port}", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
