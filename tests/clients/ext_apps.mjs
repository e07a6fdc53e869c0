// MCP Apps against the extension's own contract (tests/it/mcp_apps.rs runs this).
//
//   node tests/clients/ext_apps.mjs validate|render EXT_APPS_DIR -- SERVE_COMMAND...
//
// EXT_APPS_DIR holds node_modules with @modelcontextprotocol/ext-apps (and, for `render`, its
// peers, puppeteer-core and esbuild), installed by .ci/run. The script starts SERVE_COMMAND (a
// `sessions-mcp serve`) over stdio declaring the `io.modelcontextprotocol/ui` extension, then:
//
// validate: every `_meta.ui` of tools/list against McpUiToolMeta and the package's own
//   getToolUiResourceUri, each resource's `_meta.ui` (list and read) against McpUiResourceMeta, the
//   declaration against McpUiClientCapabilities, the MIME type against RESOURCE_MIME_TYPE — all
//   from the package's generated JSON Schema (draft 2020-12, strict Ajv).
// render: spawns a sub-agent, then renders both views in headless Chromium inside a minimal host
//   built on the package's own AppBridge + PostMessageTransport (the classes its basic-host
//   example uses), the iframe sandboxed as hosts do (allow-scripts, opaque origin). The host
//   answers the app's tools/call through the real server; every ui/* message the app sends is
//   validated against the schema as well. It checks what the views show, and writes screenshots
//   to $EXT_APPS_SHOTS when set.
//
// Prints "ok <mode>" on success; any failure throws (exit code 1).

import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { readFileSync, mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { pathToFileURL } from "node:url";
import assert from "node:assert/strict";

const [mode, extDir, sep, ...serve] = process.argv.slice(2);
assert.ok(["validate", "render"].includes(mode) && extDir && sep === "--" && serve.length, "usage: validate|render EXT_APPS_DIR -- SERVE_COMMAND...");
const modules = join(extDir, "node_modules");
const require = createRequire(join(modules, "noop.js"));
const pkgDir = join(modules, "@modelcontextprotocol/ext-apps");
const pkg = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8"));
const schema = JSON.parse(readFileSync(join(pkgDir, "dist/src/generated/schema.json"), "utf8"));
const server = await import(pathToFileURL(join(pkgDir, "dist/src/server/index.js")).href);
const { EXTENSION_ID, RESOURCE_MIME_TYPE, RESOURCE_URI_META_KEY } = server;

const Ajv2020 = require("ajv/dist/2020").default;
const ajv = new Ajv2020({ strict: true, allErrors: true, logger: { log() {}, warn(m) { throw new Error("ajv: " + m); }, error(m) { throw new Error("ajv: " + m); } } });
ajv.addSchema(schema, "ext-apps");
const check = (def, value, what) => {
  const validate = ajv.getSchema(`ext-apps#/$defs/${def}`);
  assert.ok(validate, `the schema has no ${def}`);
  if (!validate(value)) throw new Error(`${what} is not a valid ${def}: ${ajv.errorsText(validate.errors)}\n${JSON.stringify(value)}`);
};

// --- A line-delimited JSON-RPC client for the server over stdio. ---
class Mcp {
  constructor(argv) {
    this.child = spawn(argv[0], argv.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
    this.next = 1;
    this.waiting = new Map();
    let buf = "";
    this.child.stdout.setEncoding("utf8");
    this.child.stdout.on("data", (chunk) => {
      buf += chunk;
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (!line.trim()) continue;
        const msg = JSON.parse(line);
        if (msg.id !== undefined && msg.method === undefined && this.waiting.has(msg.id)) {
          this.waiting.get(msg.id)(msg);
          this.waiting.delete(msg.id);
        }
      }
    });
  }
  send(msg) { this.child.stdin.write(JSON.stringify(msg) + "\n"); }
  request(method, params) {
    const id = this.next++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no answer to ${method}`)), 30000);
      this.waiting.set(id, (m) => { clearTimeout(timer); resolve(m); });
      this.send({ jsonrpc: "2.0", id, method, params });
    });
  }
  async result(method, params) {
    const m = await this.request(method, params);
    if (m.error) throw new Error(`${method}: ${JSON.stringify(m.error)}`);
    return m.result;
  }
  close() { this.child.stdin.end(); }
}

const declaration = { mimeTypes: [RESOURCE_MIME_TYPE] };
check("McpUiClientCapabilities", declaration, "our declaration");
const mcp = new Mcp(serve);
const init = await mcp.result("initialize", {
  protocolVersion: "2025-11-25",
  capabilities: { extensions: { [EXTENSION_ID]: declaration } },
  clientInfo: { name: "ext-apps-check", version: pkg.version },
});
assert.ok(init.serverInfo, "initialize answered");
mcp.send({ jsonrpc: "2.0", method: "notifications/initialized", params: {} });

const { tools } = await mcp.result("tools/list", {});
const { getToolUiResourceUri } = await import(pathToFileURL(join(pkgDir, "dist/src/app-bridge.js")).href).catch(() => ({}));
const linked = {};
for (const tool of tools) {
  const ui = tool._meta && tool._meta.ui;
  if (!ui) continue;
  check("McpUiToolMeta", ui, `${tool.name}'s _meta.ui`);
  assert.equal(tool._meta[RESOURCE_URI_META_KEY], ui.resourceUri, `${tool.name}: the legacy key agrees`);
  if (getToolUiResourceUri) assert.equal(getToolUiResourceUri(tool), ui.resourceUri, `${tool.name}: the host's reading`);
  assert.ok(ui.resourceUri.startsWith("ui://"), ui.resourceUri);
  linked[tool.name] = ui.resourceUri;
}
assert.deepEqual(Object.keys(linked).sort(), ["sessions_spawn", "subagents"], "the linked tools");

const { resources } = await mcp.result("resources/list", {});
const html = {};
for (const uri of new Set(Object.values(linked))) {
  const listed = resources.find((r) => r.uri === uri);
  assert.ok(listed, `resources/list has ${uri}`);
  assert.equal(listed.mimeType, RESOURCE_MIME_TYPE, `${uri} listed`);
  check("McpUiResourceMeta", listed._meta.ui, `${uri}'s listed _meta.ui`);
  const read = await mcp.result("resources/read", { uri });
  assert.equal(read.contents.length, 1, uri);
  const [content] = read.contents;
  assert.equal(content.uri, uri);
  assert.equal(content.mimeType, RESOURCE_MIME_TYPE, `${uri} read`);
  check("McpUiResourceMeta", content._meta.ui, `${uri}'s read _meta.ui`);
  assert.ok(content.text.startsWith("<!doctype html>"), `${uri} is HTML`);
  html[uri] = content.text;
}

if (mode === "validate") {
  mcp.close();
  console.log(`ok validate (ext-apps ${pkg.version}: ${Object.entries(linked).map(([t, u]) => `${t} -> ${u}`).join(", ")})`);
  process.exit(0);
}

// --- render ---
const callTool = async (name, args) => (await mcp.result("tools/call", { name, arguments: args }));
const spawnArgs = { task: "count the sheep", label: "sheep-counter" };
const spawned = await callTool("sessions_spawn", spawnArgs);
assert.equal(spawned.structuredContent.status, "accepted", JSON.stringify(spawned));
const childKey = spawned.structuredContent.childSessionKey;
// The scripted child answers at once; wait for its run to end so both views show an outcome.
let listedResult;
for (let i = 0; i < 100; i++) {
  listedResult = await callTool("subagents", { action: "list" });
  const row = listedResult.structuredContent.children.find((r) => r.sessionKey === childKey);
  if (row && row.runState === "completed") break;
  await new Promise((r) => setTimeout(r, 200));
}

const esbuild = require("esbuild");
const hostBundle = esbuild.buildSync({
  stdin: {
    contents: `import { AppBridge, PostMessageTransport } from "@modelcontextprotocol/ext-apps/app-bridge";
               window.ExtApps = { AppBridge, PostMessageTransport };`,
    resolveDir: extDir,
  },
  bundle: true, format: "iife", platform: "browser", write: false, logLevel: "silent",
}).outputFiles[0].text;

// The host page: a container of the given width; the app in a sandboxed srcdoc iframe.
const hostPage = (width) => `<!doctype html><html><head><meta charset="utf-8"><style>
  body{margin:0;background:#888} iframe{border:0;width:${width}px;height:200px;display:block;background:transparent}
</style></head><body><div id="slot"></div><script>${hostBundle.replace(/<\/script/gi, "<\\/script")}</script></body></html>`;

const puppeteer = require("puppeteer-core");
const profile = mkdtempSync(join(tmpdir(), "ext-apps-chromium-"));
const browser = await puppeteer.launch({
  executablePath: process.env.SESSIONS_MCP_CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", `--user-data-dir=${profile}`],
});
const shots = process.env.EXT_APPS_SHOTS;

async function render({ uri, tool, args, result, theme, width, expect, name }) {
  const page = await browser.newPage();
  const problems = [];
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  page.on("console", (m) => { if (m.type() === "error") problems.push("console: " + m.text()); });
  const sent = [];
  const calls = [];
  await page.exposeFunction("hostRecord", (msg) => { sent.push(msg); });
  await page.exposeFunction("hostCallTool", async (params) => { calls.push(params.name); return await callTool(params.name, params.arguments); });
  await page.setViewport({ width: width + 40, height: 900 });
  await page.setContent(hostPage(width), { waitUntil: "load" });
  await page.evaluate(async ({ html, toolDef, args, result, theme }) => {
    const { AppBridge, PostMessageTransport } = window.ExtApps;
    const iframe = document.createElement("iframe");
    iframe.setAttribute("sandbox", "allow-scripts");
    iframe.title = "MCP App";
    document.getElementById("slot").append(iframe);
    window.addEventListener("message", (e) => { if (e.source === iframe.contentWindow) window.hostRecord(e.data); });
    const bridge = new AppBridge(null, { name: "ext-apps-test-host", version: "1" },
      { serverTools: {}, openLinks: {} },
      { hostContext: { theme, displayMode: "inline", platform: "web", toolInfo: { tool: toolDef },
                       styles: { variables: theme === "dark" ? { "--color-background-primary": "#101214" } : {} } } });
    bridge.oncalltool = (params) => window.hostCallTool(params);
    bridge.onsizechange = ({ height }) => { if (height) iframe.style.height = height + "px"; };
    bridge.oninitialized = async () => {
      await bridge.sendToolInput({ arguments: args });
      await bridge.sendToolResult(result);
    };
    await bridge.connect(new PostMessageTransport(iframe.contentWindow, iframe.contentWindow));
    iframe.srcdoc = html;
  }, { html: html[uri], toolDef: tools.find((t) => t.name === tool), args, result, theme });

  const frame = await (async () => {
    for (let i = 0; i < 100; i++) {
      const f = page.frames().find((f) => f !== page.mainFrame());
      if (f) return f;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error("no app frame");
  })();
  let text = "";
  for (let i = 0; i < 100; i++) {
    text = await frame.evaluate(() => document.body.innerText).catch(() => "");
    if (expect.every((e) => text.includes(e))) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  for (const e of expect) assert.ok(text.includes(e), `${name}: the view shows ${JSON.stringify(e)}; it shows:\n${text}\nproblems: ${problems.join("; ")}`);
  assert.deepEqual(problems, [], `${name}: no errors in the host or the app`);

  // Every message the app sent is valid JSON-RPC of the protocol; the ui/* ones against the schema.
  const defs = {
    "ui/initialize": "McpUiInitializeRequest",
    "ui/notifications/initialized": "McpUiInitializedNotification",
    "ui/notifications/size-changed": "McpUiSizeChangedNotification",
  };
  const methods = sent.map((m) => m.method).filter(Boolean);
  for (const m of ["ui/initialize", "ui/notifications/initialized", "ui/notifications/size-changed"]) assert.ok(methods.includes(m), `${name}: the app sent ${m} (${methods})`);
  for (const msg of sent) {
    assert.equal(msg.jsonrpc, "2.0");
    if (defs[msg.method]) check(defs[msg.method], { method: msg.method, params: msg.params }, `${name}: the app's ${msg.method}`);
    else assert.ok(msg.method === "tools/call" || msg.method === undefined, `${name}: unexpected ${msg.method}`);
  }
  // Keyboard: Tab reaches the Refresh button, and it is enabled (the host proxies tools/call).
  const refresh = await frame.evaluate(() => { const b = document.getElementById("refresh"); return { disabled: b.disabled, label: b.textContent }; });
  assert.equal(refresh.disabled, false, `${name}: Refresh is enabled`);
  const applied = await frame.evaluate(() => ({ theme: document.documentElement.dataset.theme, bg: getComputedStyle(document.body).backgroundColor }));
  assert.equal(applied.theme, theme, `${name}: the host's theme is applied`);
  if (shots) await page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });
  await page.close();
  return { calls, theme: applied };
}

try {
  const tree = await render({
    name: "tree-wide-light", uri: linked.subagents, tool: "subagents", args: { action: "list" },
    result: listedResult, theme: "light", width: 760, expect: ["sheep-counter", "completed", "Children"],
  });
  assert.deepEqual(tree.calls, [], "the tree renders the tool's result without calling back");
  // A wait result is not a list: the tree view fetches the list itself through the host.
  const waited = await callTool("subagents", { action: "wait", childSessionKeys: [childKey], timeoutSeconds: 0 });
  const again = await render({
    name: "tree-narrow-dark", uri: linked.subagents, tool: "subagents", args: { action: "wait" },
    result: waited, theme: "dark", width: 320, expect: ["sheep-counter", "completed"],
  });
  assert.ok(again.calls.includes("subagents"), `the tree refreshed through the host (${again.calls})`);
  assert.equal(again.theme.bg, "rgb(16, 18, 20)", "the host's style variables are honoured");
  const child = await render({
    name: "child-wide-dark", uri: linked.sessions_spawn, tool: "sessions_spawn", args: spawnArgs,
    result: spawned, theme: "dark", width: 640, expect: ["sheep-counter", "completed", "Last outcome", "child: count the sheep", "Task: count the sheep"],
  });
  assert.ok(child.calls.includes("subagents") && child.calls.includes("sessions_history"), `the child view refreshed (${child.calls})`);
  await render({
    name: "child-narrow-light", uri: linked.sessions_spawn, tool: "sessions_spawn", args: spawnArgs,
    result: spawned, theme: "light", width: 300, expect: ["sheep-counter", "Last outcome"],
  });
  var version = await browser.version();
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
  mcp.close();
}
console.log(`ok render (ext-apps ${pkg.version}, ${version})`);
