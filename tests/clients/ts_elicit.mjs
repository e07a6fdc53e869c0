// A person at a TypeScript SDK host answers a sub-agent's approval (tests/it/approvals.rs runs this).
//
//   node tests/clients/ts_elicit.mjs SDK_DIR -- SERVE_COMMAND...
//
// SDK_DIR holds node_modules with @modelcontextprotocol/client (installed by .ci/run with the MCP
// Apps packages). The client connects over stdio with the initialize handshake declaring form
// elicitation, as "ts-sdk-host": the server pushes `elicitation/create`. The person reads the form
// for 3 s, then allows. Meanwhile the "model" behaves as a model does: it waits with `subagents`,
// answers every request the wait says is its own (waitsFor "you"), tries once to answer one that
// waits for a person (it must be refused), and waits again. The person's answer must be the one
// the child got, recorded as a person's at ts-sdk-host.
//
// Prints "ok" on success; any failure throws (exit code 1).

import { join } from "node:path";
import { pathToFileURL } from "node:url";
import assert from "node:assert/strict";

const [sdkDir, sep, ...serve] = process.argv.slice(2);
assert.ok(sdkDir && sep === "--" && serve.length, "usage: SDK_DIR -- SERVE_COMMAND...");
const dist = join(sdkDir, "node_modules/@modelcontextprotocol/client/dist");
const { Client } = await import(pathToFileURL(join(dist, "index.mjs")).href);
const { StdioClientTransport } = await import(pathToFileURL(join(dist, "stdio.mjs")).href);

const client = new Client({ name: "ts-sdk-host", version: "1.0.0" }, { capabilities: { elicitation: { form: {} } } });
const asked = [];
client.setRequestHandler("elicitation/create", async (request) => {
  asked.push(request.params.message);
  await new Promise((done) => setTimeout(done, 3000));
  return { action: "accept", content: { decision: "allow", text: "from the person" } };
});
await client.connect(new StdioClientTransport({ command: serve[0], args: serve.slice(1), stderr: "ignore" }));

const call = async (args) => (await client.callTool({ name: "subagents", arguments: args })).structuredContent;
const spawn = (await client.callTool({ name: "sessions_spawn", arguments: { task: "ask for a.txt" } })).structuredContent;
assert.equal(spawn.status, "accepted", JSON.stringify(spawn));

let outcome;
let refused = 0;
const deadline = Date.now() + 60000;
while (outcome === undefined) {
  assert.ok(Date.now() < deadline, "the child never finished");
  const waited = await call({ action: "wait", timeoutSeconds: 30 });
  if (waited.finished.length) {
    outcome = waited.finished[0].outcome;
    break;
  }
  for (const request of waited.requests) {
    if (request.waitsFor === "you") {
      await call({ action: "respond", requestId: request.requestId, decision: "deny", text: "from the model" });
    } else if (refused === 0) {
      assert.ok(!waited.note.includes('"respond"'), `the note invites the model: ${waited.note}`);
      const tried = await client.callTool({ name: "subagents", arguments: { action: "respond", requestId: request.requestId, decision: "deny" } });
      assert.equal(tried.structuredContent.status, "forbidden", JSON.stringify(tried.structuredContent));
      refused += 1;
    }
  }
}
assert.equal(asked.length, 1, JSON.stringify(asked));
assert.ok(asked[0].includes("asks for approval: May I write ask for a.txt?"), asked[0]);
assert.equal(refused, 1, "the model was told the approval waits for a person");
assert.ok(outcome.includes("Result: decision=allow answer=from the person\n"), outcome);
assert.ok(outcome.includes(": allow by a person at ts-sdk-host\n"), outcome);
await client.close();
console.log("ok");
