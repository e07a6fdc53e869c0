// Compiles every published JSON schema with Ajv in strict mode, as Ajv-based MCP clients (the
// TypeScript SDK, Gemini CLI, the Inspector) compile them, and fails on any warning or error: a
// client logs `unknown format "uint" ignored` for what strict Ajv reports here.
//   node conformance/check-schemas.mjs [schemas-dir] [--binary path/to/sessions-mcp]
// With --binary it also compiles the input and output schema of every tool the server lists
// (`serve` over stdio in a throwaway state dir), so what clients get is checked, not only the files.
import { spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

// The formats JSON Schema 2020-12 defines, as ajv-formats implements them (the list
// STANDARD_FORMATS in src/tools/mod.rs keeps to). Not all of ajv-formats: its OpenAPI extras
// (`int64`, `double`, ...) are unknown to a client that loads plain Ajv.
const STANDARD_FORMATS = [
  "date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uri-reference",
  "uri-template", "uuid", "json-pointer", "relative-json-pointer", "regex",
];

/** The problems of one schema: Ajv's warnings and errors, or the exception of a failed compile. */
function problems(schema) {
  const found = [];
  const collect = (...parts) => found.push(parts.map(String).join(" "));
  const ajv = new Ajv2020({ strict: true, allErrors: true, logger: { log() {}, warn: collect, error: collect } });
  addFormats(ajv, STANDARD_FORMATS);
  try {
    ajv.compile(schema);
  } catch (e) {
    found.push(e.message);
  }
  return found;
}

/** `[name, schema]` for every `.json` file of `dir`. */
function filesIn(dir) {
  return readdirSync(dir)
    .filter((f) => f.endsWith(".json"))
    .sort()
    .map((f) => [join(dir, f), JSON.parse(readFileSync(join(dir, f), "utf8"))]);
}

/** `[name, schema]` for the input and output schema of every tool `binary serve` lists. */
async function listedBy(binary) {
  const state = mkdtempSync(join(tmpdir(), "check-schemas-"));
  const server = spawn(binary, ["serve"], {
    env: { ...process.env, SESSIONS_MCP_STATE_DIR: state },
    stdio: ["pipe", "pipe", "inherit"],
  });
  const send = (message) => server.stdin.write(JSON.stringify({ jsonrpc: "2.0", ...message }) + "\n");
  const lines = createInterface({ input: server.stdout });
  try {
    send({ id: 1, method: "initialize", params: {
      protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "check-schemas", version: "1" },
    } });
    for await (const line of lines) {
      const message = JSON.parse(line);
      if (message.id === 1) {
        send({ method: "notifications/initialized" });
        send({ id: 2, method: "tools/list" });
      } else if (message.id === 2) {
        if (!message.result) throw new Error(`tools/list failed: ${line}`);
        return message.result.tools.flatMap((t) =>
          [["inputSchema", t.inputSchema], ["outputSchema", t.outputSchema]]
            .filter(([, schema]) => schema)
            .map(([field, schema]) => [`tools/list ${t.name} ${field}`, schema]),
        );
      }
    }
    throw new Error(`${binary} serve closed stdout before answering tools/list`);
  } finally {
    server.kill();
    rmSync(state, { recursive: true, force: true });
  }
}

const args = process.argv.slice(2);
const at = args.indexOf("--binary");
const binary = at >= 0 ? args.splice(at, 2)[1] : undefined;
const dir = args[0] ?? new URL("../schemas", import.meta.url).pathname;
const schemas = [...filesIn(dir), ...(binary ? await listedBy(binary) : [])];
let failed = 0;
for (const [name, schema] of schemas) {
  const found = problems(schema);
  failed += found.length > 0;
  for (const p of found) console.error(`${name}: ${p}`);
}
if (failed > 0) {
  console.error(`${failed} of ${schemas.length} schemas draw warnings or errors from strict Ajv`);
  process.exit(1);
}
console.log(`${schemas.length} schemas compile in strict Ajv (draft 2020-12) without a warning`);
