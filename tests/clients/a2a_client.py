"""Drives sessions-mcp's A2A endpoint with the official Python A2A SDK (PyPI `a2a-sdk`), as a peer would.

    a2a_client.py BASE_URL TOKEN OTHER_TOKEN

BASE_URL is the agent's A2A URL (http://host:port/a2a/<agentId>); TOKEN and OTHER_TOKEN are the
client tokens of two different callers. The agent is the scripted one of tests/it/a2a_inbound.rs:
it echoes, asks an approval for a message containing "approve", sleeps on "slow", and on
"delegate" spawns a child that asks, and waits for it; on "type" it types its reply in pieces.

Checks, over JSON-RPC (streaming and not) and HTTP+JSON: the card and its bearer scheme; a wrong
token refused; a streamed reply that creates the session; the next turn in the same context;
input-required answered by the next message on the task, its run's own ask and a child's; cancel; the other caller's view of the
first caller's task (not found). Prints `session <key> <contextId>` of the first context, then
`ok a2a`, and exits 0; or raises.
"""

import asyncio
import sys
import uuid

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import a2a_pb2 as pb

BASE, TOKEN, OTHER = sys.argv[1:4]
S = pb.TaskState


def message(text, context_id=None, task_id=None):
    m = pb.Message(message_id=str(uuid.uuid4()), role=pb.Role.ROLE_USER, parts=[pb.Part(text=text)])
    if context_id:
        m.context_id = context_id
    if task_id:
        m.task_id = task_id
    return m


def client_for(card, token, streaming=True, binding="JSONRPC"):
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    config = ClientConfig(
        streaming=streaming, httpx_client=http, supported_protocol_bindings=[binding], use_client_preference=True
    )
    return ClientFactory(config).create(card)


async def events(client, request):
    return [e async for e in client.send_message(request)]


def final_task(evs):
    """The task an event list ends with: the Task event, updated by the status events after it."""
    task = None
    for e in evs:
        if e.HasField("task"):
            task = pb.Task()
            task.CopyFrom(e.task)
        elif e.HasField("status_update"):
            task.status.CopyFrom(e.status_update.status)
    return task


def text(msg):
    return "".join(p.text for p in msg.parts)


async def collect(stream):
    return [e async for e in stream]


async def refused(coro, what):
    try:
        await coro
    except Exception as e:  # the SDK's own error types, by name
        return type(e).__name__ + ": " + str(e)
    raise AssertionError(f"{what} was not refused")


async def wait_state(client, task_id, states):
    for _ in range(600):
        task = await client.get_task(pb.GetTaskRequest(id=task_id))
        if task.status.state in states:
            return task
        await asyncio.sleep(0.1)
    raise AssertionError(f"task {task_id} never reached {states}: {task}")


async def main():
    async with httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, BASE).get_agent_card()
    assert card.capabilities.streaming, card
    assert "bearer" in card.security_schemes, card
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer", card
    assert card.skills and card.skills[0].description, card

    # A wrong token is refused before anything runs.
    bad = client_for(card, "not-a-token")
    why = await refused(events(bad, pb.SendMessageRequest(message=message("hello"))), "a wrong token")
    assert "401" in why, why

    # A streamed reply: the first message creates the session (a new context).
    alice = client_for(card, TOKEN)
    evs = await events(alice, pb.SendMessageRequest(message=message("hello there")))
    assert evs[0].HasField("task"), evs
    assert any(e.HasField("artifact_update") for e in evs), evs
    first = final_task(evs)
    assert first.status.state == S.TASK_STATE_COMPLETED, first
    assert text(first.status.message) == "ECHO: hello there", first
    context = first.context_id
    assert context, first

    # The reply as it is typed: pieces of the `reply` artifact, then the whole of it.
    evs = await events(alice, pb.SendMessageRequest(message=message("type a long answer", context_id=context)))
    pieces = [e.artifact_update for e in evs if e.HasField("artifact_update") and not e.artifact_update.last_chunk]
    assert len(pieces) > 1 and not pieces[0].append and pieces[1].append, evs
    whole = "typed for you: type a long answer"
    assert "".join(text(p.artifact) for p in pieces) == whole, pieces
    assert text(final_task(evs).status.message) == whole, evs

    # The next turn in the same context is a new task of the same context (the same session).
    evs = await events(alice, pb.SendMessageRequest(message=message("second turn", context_id=context)))
    second = final_task(evs)
    assert second.context_id == context and second.id != first.id, second
    got = await alice.get_task(pb.GetTaskRequest(id=second.id))
    assert got.status.state == S.TASK_STATE_COMPLETED and text(got.status.message) == "ECHO: second turn", got
    assert got.metadata["sessionKey"] == first.metadata["sessionKey"], (got, first)

    # input-required: the blocking send returns at the ask; the next message on the task answers it.
    plain = client_for(card, TOKEN, streaming=False)
    evs = await events(plain, pb.SendMessageRequest(message=message("approve the deploy")))
    asking = evs[0].task
    assert asking.status.state == S.TASK_STATE_INPUT_REQUIRED, asking
    assert "May I deploy?" in text(asking.status.message), asking
    evs = await events(plain, pb.SendMessageRequest(message=message("allow go ahead", task_id=asking.id)))
    done = await wait_state(plain, asking.id, [S.TASK_STATE_COMPLETED, S.TASK_STATE_FAILED])
    assert text(done.status.message) == "decision=allow answer=go ahead", done

    # A descendant's approval: the task of the run that waits on its child goes input-required.
    evs = await events(plain, pb.SendMessageRequest(message=message("delegate the release")))
    waiting = evs[0].task
    assert waiting.status.state == S.TASK_STATE_INPUT_REQUIRED, waiting
    question = text(waiting.status.message)
    assert "May I deploy?" in question and ":subagent:" in question, question
    await events(plain, pb.SendMessageRequest(message=message("allow ship it", task_id=waiting.id)))
    done = await wait_state(plain, waiting.id, [S.TASK_STATE_COMPLETED, S.TASK_STATE_FAILED])
    assert "decision=allow answer=ship it" in text(done.status.message), done

    # Cancel, over HTTP+JSON, while a JSON-RPC SubscribeToTask follows the task to its end.
    rest = client_for(card, TOKEN, streaming=False, binding="HTTP+JSON")
    request = pb.SendMessageRequest(message=message("slow please"))
    request.configuration.return_immediately = True
    evs = await events(rest, request)
    slow = evs[0].task
    assert slow.status.state in (S.TASK_STATE_SUBMITTED, S.TASK_STATE_WORKING), slow
    await wait_state(rest, slow.id, [S.TASK_STATE_WORKING])
    followed = asyncio.create_task(collect(alice.subscribe(pb.SubscribeToTaskRequest(id=slow.id))))
    await asyncio.sleep(0.5)
    cancelled = await rest.cancel_task(pb.CancelTaskRequest(id=slow.id))
    assert cancelled.status.state == S.TASK_STATE_CANCELED, cancelled
    seen = await asyncio.wait_for(followed, 60)
    assert seen[0].HasField("task") and seen[0].task.id == slow.id, seen
    assert seen[-1].status_update.status.state == S.TASK_STATE_CANCELED, seen
    why = await refused(rest.cancel_task(pb.CancelTaskRequest(id=slow.id)), "a second cancel")
    assert "NotCancelable" in why, why
    why = await refused(collect(alice.subscribe(pb.SubscribeToTaskRequest(id=slow.id))), "a subscribe to an ended task")
    assert "Unsupported" in why, why

    # Another caller's task looks exactly like a missing one, on both bindings.
    for binding in ("JSONRPC", "HTTP+JSON"):
        bob = client_for(card, OTHER, streaming=False, binding=binding)
        for task_id in (first.id, str(uuid.uuid4())):
            why = await refused(bob.get_task(pb.GetTaskRequest(id=task_id)), f"bob's GetTask over {binding}")
            assert "TaskNotFound" in why, why
            why = await refused(bob.cancel_task(pb.CancelTaskRequest(id=task_id)), f"bob's CancelTask over {binding}")
            assert "TaskNotFound" in why, why
        # And bob's message with alice's context id starts bob's own session.
        evs = await events(bob, pb.SendMessageRequest(message=message("mine", context_id=context)))
        assert evs[0].task.metadata["sessionKey"] != first.metadata["sessionKey"], evs
    print("session", first.metadata["sessionKey"], context)
    print("ok a2a")


asyncio.run(main())
