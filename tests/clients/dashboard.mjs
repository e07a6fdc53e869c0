// Drives the dashboard (/ui) in a real headless Chromium through puppeteer-core, for
// tests/it/dashboard_browser.rs, and measures its first paint for BENCHMARKS.md.
//
//   node dashboard.mjs check  '{"base", "operator", "desk", "child", "otherChild", "screenshots"?}'
//   node dashboard.mjs bench  '{"base", "operator", "rounds"}'
//   node dashboard.mjs reasons '{"base", "token", "child"}'
//
// $SESSIONS_MCP_PUPPETEER is the node_modules folder holding puppeteer-core (.ci/run installs it
// in .ci/browser); $SESSIONS_MCP_CHROMIUM the browser (default /usr/bin/chromium). Prints one JSON
// line: {"ok": true, ...} or {"ok": false, "error"}.
import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [mode, raw] = process.argv.slice(2);
const args = JSON.parse(raw || "{}");
const require = createRequire(join(process.env.SESSIONS_MCP_PUPPETEER || "", "/"));
const puppeteer = require("puppeteer-core");

const profile = mkdtempSync(join(tmpdir(), "dashboard-chromium-"));
const browser = await puppeteer.launch({
  executablePath: process.env.SESSIONS_MCP_CHROMIUM || "/usr/bin/chromium",
  headless: true,
  userDataDir: profile,
  // The machine's network is closed: no background connections, no first-run pages.
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
});

function fail(why) {
  throw new Error(why);
}

/// A fresh page (its own context, so no token is shared), signed in with `token`.
async function signedIn(token, viewport) {
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  await page.setViewport(viewport || { width: 1280, height: 900 });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
  await page.goto(args.base + "/ui", { waitUntil: "domcontentloaded" });
  await page.waitForSelector("#signin:not([hidden])");
  await page.type("#token", token);
  await page.keyboard.press("Enter");
  await page.waitForSelector("#board:not([hidden])");
  await page.waitForSelector("#live[data-state=on]");
  return { page, context, errors };
}

const keysOnPage = (page) => page.$$eval("#tree-list li[data-key]", (lis) => lis.map((li) => li.dataset.key));

async function check() {
  const out = { ok: true };
  const { page, errors } = await signedIn(args.operator);
  let navigations = 0;
  page.on("framenavigated", (f) => { if (f === page.mainFrame()) navigations++; });
  // The tree made by real spawns, the child running...
  const child = `#tree-list li[data-key="${args.child}"]`;
  await page.waitForSelector(child);
  out.firstState = await page.$eval(child, (li) => li.dataset.state);
  if (!["queued", "running"].includes(out.firstState)) fail("the child was " + out.firstState + " at first");
  if (args.screenshots) await page.screenshot({ path: join(args.screenshots, "dashboard-trees.png"), fullPage: true });
  // ... then completed, without a reload.
  await page.waitForSelector(`${child}[data-state=completed]`, { timeout: 30000 });
  if (navigations !== 0) fail("the page reloaded");
  out.runRow = await page.$eval(`#runs-table tr[data-state=completed]`, (tr) => tr.dataset.status);
  // Keyboard: the child's transcript opens with Enter on its focused button, and Escape closes it.
  // (A live re-render can land between the focus and the key under load: press again then.)
  const opened = `#transcript:not([hidden])[data-key="${args.child}"]`;
  for (let attempt = 1; ; attempt++) {
    await page.focus(`${child} > .node-row button.open`);
    await page.keyboard.press("Enter");
    try {
      await page.waitForSelector(opened, { timeout: 10000 });
      break;
    } catch (e) {
      if (attempt === 3) throw e;
    }
  }
  await page.waitForSelector("#transcript-list li.msg[data-from=agent]");
  out.transcript = await page.$$eval("#transcript-list li.msg", (lis) =>
    lis.map((li) => ({ from: li.dataset.from, head: li.querySelector(".msg-head strong").textContent,
      text: li.querySelector(".msg-text").textContent })));
  if (args.screenshots) await page.screenshot({ path: join(args.screenshots, "dashboard-transcript.png") });
  await page.keyboard.press("Escape");
  await page.waitForSelector("#transcript[hidden]", { hidden: true });
  out.operatorKeys = await keysOnPage(page);
  // A child's approval, answered with a click; it leaves the list without a reload.
  if (args.asking) {
    const ask = "#ask-list li[data-request-id]";
    await page.waitForSelector(ask);
    out.askText = await page.$eval(ask + " .ask-text", (p) => p.textContent);
    await page.waitForSelector(`#tree-list li[data-key="${args.asking}"][data-state=waiting]`);
    if (args.screenshots) {
      await page.evaluate(() => document.getElementById("asks").scrollIntoView());
      await page.screenshot({ path: join(args.screenshots, "dashboard-requests.png") });
    }
    await page.type(ask + " input", "ship it");
    await page.click(ask + " button[data-act=allow]");
    await page.waitForSelector(`#tree-list li[data-key="${args.asking}"][data-state=completed]`, { timeout: 30000 });
    out.askNotice = await page.$eval("#notice", (p) => p.textContent);
    out.asksLeft = await page.$$eval(ask, (l) => l.length);
  }
  // Every control has a name a screen reader says; every input a label.
  out.unnamed = await page.$$eval("button, input, a", (els) => els.filter((e) => {
    if (e.closest("[hidden]")) return false;
    const label = e.getAttribute("aria-label") || e.textContent.trim() || (e.id && document.querySelector(`label[for="${e.id}"]`));
    return !label && !(e.closest("label"));
  }).map((e) => e.outerHTML.slice(0, 80)));
  if (args.screenshots) {
    await page.evaluate(() => document.getElementById("deliveries").scrollIntoView());
    await page.screenshot({ path: join(args.screenshots, "dashboard-ledger.png") });
  }
  out.errors = errors;

  // A client token's view: its own tree only.
  const desk = await signedIn(args.desk);
  await desk.page.waitForSelector(`#tree-list li[data-key="${args.child}"]`);
  out.deskKeys = await keysOnPage(desk.page);
  out.deskWho = await desk.page.$eval("#who", (p) => p.textContent);
  out.deskHasOther = (await desk.page.content()).includes(args.otherChild);
  // A phone.
  const phone = await signedIn(args.operator, { width: 390, height: 844, isMobile: true, hasTouch: true });
  await phone.page.waitForSelector(child);
  out.phoneOverflow = await phone.page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  if (args.screenshots) await phone.page.screenshot({ path: join(args.screenshots, "dashboard-phone.png") });
  return out;
}

/// A failed child's reason and its label, read from the tree, the Runs table and the ledger
/// without opening a transcript, on a page signed in with `args.token`.
async function reasons() {
  const { page, errors } = await signedIn(args.token);
  const node = `#tree-list li[data-key="${args.child}"][data-state=failed]`;
  await page.waitForSelector(node + " > .node-row .reason", { timeout: 30000 });
  const out = { ok: true, errors };
  out.treeReason = await page.$eval(node + " > .node-row .reason", (e) => e.textContent);
  out.treeLabel = await page.$eval(node + " > .node-row button.open strong", (e) => e.textContent);
  const row = "#runs-table tr[data-state=failed]";
  await page.waitForSelector(row + " .reason");
  out.runReason = await page.$eval(row + " .reason", (e) => e.textContent);
  out.runSession = await page.$eval(row + " td", (td) => td.textContent);
  out.ledgerSessions = await page.$$eval("#deliveries-table tbody tr td:nth-child(2)", (tds) => tds.map((td) => td.textContent));
  out.transcriptOpen = await page.$eval("#transcript", (t) => !t.hidden);
  return out;
}

/// First paint: from navigation to the first rendered view, the token already in the tab.
async function bench() {
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  await page.evaluateOnNewDocument((t) => sessionStorage.setItem("sessions-mcp-token", t), args.operator);
  const samples = [], walls = [];
  let nodes = 0;
  for (let i = 0; i < (args.rounds || 10); i++) {
    const t0 = Date.now();
    await page.goto(args.base + "/ui", { waitUntil: "domcontentloaded" });
    await page.waitForSelector("body[data-rendered]");
    walls.push(Date.now() - t0);
    // The page's own clock: navigation start → the first view in the DOM.
    samples.push(await page.evaluate(() => Math.round(performance.getEntriesByName("view-rendered")[0].startTime)));
    nodes = await page.$$eval("#tree-list li[data-key]", (l) => l.length);
  }
  // Where the last round's time went, in ms from navigation start.
  const paint = await page.evaluate(() => Object.fromEntries([
    ...performance.getEntriesByType("paint").map((p) => [p.name, Math.round(p.startTime)]),
    ...performance.getEntriesByType("mark").map((m) => [m.name, Math.round(m.startTime)]),
    ["domContentLoaded", Math.round(performance.getEntriesByType("navigation")[0].domContentLoadedEventEnd)],
  ]));
  const q = (xs, p) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(p * xs.length))];
  return { ok: true, rounds: samples.length, p50: q(samples, 0.5), p90: q(samples, 0.9), max: q(samples, 1),
    wallP50: q(walls, 0.5), nodes, lastRound: paint };
}

try {
  const result = mode === "bench" ? await bench() : mode === "reasons" ? await reasons() : await check();
  console.log(JSON.stringify(result));
} catch (e) {
  console.log(JSON.stringify({ ok: false, error: String(e && e.stack || e) }));
  process.exitCode = 1;
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
