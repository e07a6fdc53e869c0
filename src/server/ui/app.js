// The sessions-mcp dashboard: reads /ui/api/view, stays live through /ui/api/events (server-sent
// events read with fetch, so the token travels in the Authorization header and never in a URL),
// and acts through POST /ui/api/act. Every text from the server is set with textContent.
"use strict";

const state = {
  token: sessionStorage.getItem("sessions-mcp-token") || "",
  view: null,
  roots: 50,
  filter: "",
  period: "hourly",
  open: null, // the session whose transcript is open
  firstSeq: null,
  stream: null, // AbortController of the live stream
  clockSkew: 0, // server time - local time, from the view's generatedAt
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("data-") || k.startsWith("aria-") || k === "role" || k === "type" || k === "for" || k === "title")
      node.setAttribute(k, v === true ? "" : String(v));
    else node[k] = v;
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (state.token) h.Authorization = "Bearer " + state.token;
  return h;
}

async function api(path, options) {
  const res = await fetch(path, Object.assign({ headers: headers(), cache: "no-store" }, options || {}));
  const body = await res.json().catch(() => ({}));
  if (!res.ok) {
    const err = new Error(body.error || res.statusText);
    err.status = res.status;
    throw err;
  }
  return body;
}

// ---- formatting ----
// One formatter each: building an Intl formatter per call costs more than the rest of a render.
const NUMBER = new Intl.NumberFormat("en-US");
const DATE = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
const num = (n) => NUMBER.format(n ?? 0);
const usd = (c) => (c === null || c === undefined ? "—" : "$" + Number(c).toFixed(c < 0.01 && c > 0 ? 4 : 2));
function when(ms) {
  if (!ms) return "—";
  return DATE.format(new Date(ms));
}
function duration(ms) {
  if (ms === null || ms === undefined) return "—";
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
}
const now = () => Date.now() + state.clockSkew;

/// A run's runtime: ended ones as recorded, running ones ticking (data-started lets the timer update it).
function runtimeCell(run) {
  if (!run || !run.startedAt) return el("span", { text: "—" });
  if (run.endedAt) return el("span", { text: duration(run.endedAt - run.startedAt) });
  return el("span", { class: "ticking", "data-started": run.startedAt, text: duration(now() - run.startedAt) });
}

const STATE_WORDS = {
  idle: "idle", queued: "queued", running: "running", waiting: "waiting for an answer", completed: "completed",
  failed: "failed", timeout: "timed out", cancelled: "cancelled", interrupted: "interrupted",
  budget_exceeded: "budget exceeded",
};
const badge = (s) => el("span", { class: "badge s-" + s, "data-state": s, text: STATE_WORDS[s] || s });

function budgetText(b) {
  if (!b || !b.limit) return null;
  const parts = [];
  for (const [dim, limit] of Object.entries(b.limit)) {
    const spent = (b.spent || {})[dim] ?? 0;
    const fmt = dim === "costUsd" ? usd : dim === "runtimeSeconds" ? (v) => duration(v * 1000) : num;
    parts.push(fmt(spent) + " of " + fmt(limit) + " " + (dim === "tokens" ? "tokens" : ""));
  }
  return "budget " + parts.join(", ").replace(/\s+,/g, ",").trim() + (b.exceeded ? " — exceeded" : "");
}

// ---- acting ----
function notice(text, isError) {
  const n = $("notice");
  n.textContent = text;
  n.classList.toggle("error", !!isError);
}

async function act(body, label) {
  try {
    const r = await api("/ui/api/act", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify(body),
    });
    notice(label + ": " + (r.note || "done"));
  } catch (e) {
    notice(label + " failed: " + e.message, true);
  }
}

// ---- trees ----
/// Why a run that did not succeed ended (the first line of its error), shown beside its state.
function reasonOf(run) {
  return run && run.reason ? el("span", { class: "reason error-text", "data-reason": "", text: run.reason }) : null;
}

/// A session as a row names it: its label, its key, and the task it was spawned with.
function sessionCell(key, label, task) {
  if (!key) return el("td", { text: "—" });
  const open = el("button", { type: "button", class: "link", onclick: () => openTranscript(key),
    "aria-label": "Open the transcript of " + (label ? label + ", " : "") + key });
  if (label) open.append(el("strong", { text: label }), " ");
  open.append(el("span", { class: "key-inline", text: key }));
  return el("td", {}, open, task ? el("div", { class: "meta task", text: task }) : null);
}

function treeNode(node, isRoot) {
  const row = el("div", { class: "node-row" });
  const open = el("button", { type: "button", class: "link open", "data-key": node.key,
    "aria-label": "Open the transcript of " + (node.label ? node.label + ", " : "") + node.key,
    onclick: () => openTranscript(node.key) });
  if (node.label) open.append(el("strong", { text: node.label }), " ");
  open.append(el("span", { class: "key-inline", text: node.key }));
  row.append(
    badge(node.state),
    open,
    node.task ? el("span", { class: "meta task", text: node.task }) : null,
    reasonOf(node.run),
    el("span", { class: "meta", text: node.agent }),
    el("span", { class: "meta" }, "runtime ", runtimeCell(node)),
    el("span", { class: "meta", text: num(node.tokens.in + node.tokens.out) + " tokens" }),
    el("span", { class: "meta", text: usd(node.costUsd) }),
  );
  const budget = budgetText(node.budget);
  if (budget) row.append(el("span", { class: "meta budget" + (node.budget.exceeded ? " over" : ""), text: budget }));
  if (node.openAsks) row.append(el("a", { class: "asks-badge", href: "#asks", text: node.openAsks + " pending" }));
  if (!isRoot && ["queued", "running", "waiting"].includes(node.state)) {
    row.append(el("button", { type: "button", class: "act cancel", "data-act": "cancel",
      "aria-label": "Cancel " + node.key + " and its descendants",
      onclick: () => act({ action: "cancel", sessionKey: node.key }, "cancel " + node.key), text: "Cancel" }));
  }
  const li = el("li", { "data-key": node.key, "data-state": node.state }, row);
  if (node.children && node.children.length) {
    li.append(el("ul", {}, ...node.children.map((c) => treeNode(c, false))));
  }
  if (node.descendantsTotal > node.descendantsShown) {
    li.append(el("p", { class: "count", text: "showing " + node.descendantsShown + " of " + node.descendantsTotal + " descendants" }));
  }
  return li;
}

function renderTrees(view) {
  const t = view.trees;
  const shown = t.roots.length;
  $("trees-count").textContent = shown === 0 ? "No sessions yet." : "Showing " + shown + " of " + num(t.rootsTotal) + " roots.";
  $("tree-list").replaceChildren(...t.roots.map((r) => treeNode(r, true)));
  $("more-roots").hidden = !(t.rootsTotal > shown);
  $("filter-form").hidden = !view.viewer.operator;
}

// ---- runs ----
function deliveryBadges(ds) {
  if (!ds || !ds.length) return el("span", { class: "meta", text: "—" });
  return el("span", {}, ...ds.map((d) => el("span", { class: "badge d-" + d.status, "data-delivery": d.status,
    text: d.kind + ": " + d.status, title: d.lastError || "" })));
}

function renderRuns(view) {
  const rows = view.runs.map((r) => el("tr", { "data-run-id": r.runId, "data-status": r.status, "data-state": r.state },
    sessionCell(r.sessionKey, r.label, r.task),
    el("td", { text: r.mode }),
    el("td", {}, badge(r.state), reasonOf(r)),
    el("td", { text: when(r.startedAt || r.createdAt) }),
    el("td", {}, runtimeCell(r)),
    el("td", { text: num(r.tokens.in + r.tokens.out) }),
    el("td", { text: usd(r.costUsd) }),
    el("td", {}, deliveryBadges(r.deliveries)),
  ));
  const body = $("runs-table").tBodies[0];
  body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colSpan: 8, text: "No runs yet." }))]));
}

// ---- deliveries ----
function renderDeliveries(view) {
  const operator = view.viewer.operator;
  const rows = view.deliveries.map((d) => {
    const acts = el("td", {});
    if (operator && d.mode === "channel" && ["failed", "expired"].includes(d.status)) {
      acts.append(el("button", { type: "button", class: "act", "data-act": "retry", text: "Retry",
        "aria-label": "Retry delivery " + d.id, onclick: () => act({ action: "retry", deliveryId: d.id }, "retry #" + d.id) }));
    }
    if (operator && ["failed", "expired", "undeliverable"].includes(d.status)) {
      acts.append(el("button", { type: "button", class: "act", "data-act": "dismiss", text: "Dismiss",
        "aria-label": "Dismiss delivery " + d.id, onclick: () => act({ action: "dismiss", deliveryId: d.id }, "dismiss #" + d.id) }));
    }
    return el("tr", { "data-delivery-id": d.id, "data-status": d.status },
      el("td", { text: "#" + d.id }),
      sessionCell(d.sessionKey, d.label, d.task),
      el("td", { text: d.kind }),
      el("td", { text: d.channel ? d.mode + " (" + d.channel + ")" : d.mode }),
      el("td", {}, el("span", { class: "badge d-" + d.status, text: d.status })),
      el("td", { text: String(d.attempts) }),
      el("td", { class: "error-text", text: d.lastError || "" }),
      acts);
  });
  $("deliveries-table").tBodies[0].replaceChildren(
    ...(rows.length ? rows : [el("tr", {}, el("td", { colSpan: 8, text: "Nothing delivered yet." }))]));
}

// ---- asks ----
// A live refresh keeps the items of the asks still open and unchanged, so an answer being typed
// keeps its text and focus, and a click lands on the button it aimed at (before, every refresh
// rebuilt them: typed text was lost, and a click could hit a button already detached).
function renderAsks(view) {
  const list = $("ask-list");
  const kept = new Map([...list.querySelectorAll("li[data-request-id]")].map((li) => [li.dataset.requestId, li]));
  const items = view.asks.map((a) => {
    const old = kept.get(a.requestId), sig = JSON.stringify(a);
    if (old && old.dataset.sig === sig) return old;
    const fresh = askItem(a);
    fresh.dataset.sig = sig;
    // What changed is shown afresh; what the person typed so far stays.
    if (old) fresh.querySelector("input").value = old.querySelector("input").value;
    return fresh;
  });
  if (items.length && items.length === list.children.length && items.every((li, i) => list.children[i] === li)) return;
  list.replaceChildren(...(items.length ? items : [el("li", { class: "meta", text: "Nothing is waiting for an answer." })]));
}

function askItem(a) {
  const id = "answer-" + a.requestId;
  const text = el("input", { id, type: "text", placeholder: "optional text for the sub-agent" });
  const answer = (decision) => act({ action: "respond", requestId: a.requestId, decision, text: text.value || undefined },
    decision + " " + a.requestId);
  return el("li", { "data-request-id": a.requestId },
    el("p", {}, el("strong", { text: a.kind === "approval" ? "Approval" : "Question" }), " from ",
      el("button", { type: "button", class: "link", text: a.sessionKey, onclick: () => openTranscript(a.sessionKey) }),
      el("span", { class: "meta", text: " asked of " + a.askedOf + ", until " + when(a.deadlineAt) })),
    // What the store records of its routes: whom it was put to; the operator can always answer.
    el("p", { class: "meta routes", text: "Routes: put to " + a.askedOf + " (its host or its model); open to the operator here and by `sessions-mcp respond " + a.requestId + "`." }),
    el("p", { class: "ask-text", text: a.text }),
    a.details ? el("pre", { class: "details", text: JSON.stringify(a.details, null, 2) }) : null,
    el("div", { class: "ask-acts" },
      el("label", { for: id, text: "Answer" }), text,
      el("button", { type: "button", class: "act", "data-act": "allow", onclick: () => answer("allow"), text: "Allow" }),
      el("button", { type: "button", class: "act deny", "data-act": "deny", onclick: () => answer("deny"), text: "Deny" })));
}

// ---- usage ----
/// The period's buckets, empty ones included, oldest first (the server leaves empty ones out).
function slots(view) {
  const hourly = state.period === "hourly";
  const size = hourly ? 3600000 : 86400000, count = hourly ? 48 : 30;
  const byStart = new Map((view.usage[state.period] || []).map((b) => [b.start, b]));
  const last = Math.floor(now() / size) * size;
  const out = [];
  for (let i = count - 1; i >= 0; i--) {
    const start = last - i * size;
    out.push(byStart.get(start) || { start, runs: 0, tokensIn: 0, tokensOut: 0, costUsd: 0 });
  }
  return out;
}

function renderUsage(view) {
  const buckets = slots(view);
  const total = buckets.reduce((t, b) => ({ tokens: t.tokens + b.tokensIn + b.tokensOut, cost: t.cost + b.costUsd, runs: t.runs + b.runs }),
    { tokens: 0, cost: 0, runs: 0 });
  $("usage-total").textContent = num(total.runs) + " runs ended, " + num(total.tokens) + " tokens, " + usd(total.cost) +
    (state.period === "hourly" ? " in the last 48 hours." : " in the last 30 days.");
  const chart = $("usage-chart");
  if (!total.runs) {
    chart.replaceChildren(el("p", { class: "meta", text: "No usage in this period." }));
    return;
  }
  const max = Math.max(...buckets.map((b) => b.tokensIn + b.tokensOut), 1);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  const w = 600, h = 120, step = w / buckets.length, bw = Math.max(2, step - 2);
  svg.setAttribute("viewBox", `0 0 ${w} ${h + 18}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", "Tokens per " + (state.period === "hourly" ? "hour" : "day") + ", at most " + num(max));
  const text = (x, anchor, content) => {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", x);
    t.setAttribute("y", h + 14);
    t.setAttribute("text-anchor", anchor);
    t.textContent = content;
    return t;
  };
  buckets.forEach((b, i) => {
    const tokens = b.tokensIn + b.tokensOut;
    if (!tokens && !b.runs) return;
    const bh = Math.max(2, Math.round((tokens / max) * h));
    const rect = document.createElementNS(ns, "rect");
    rect.setAttribute("x", i * step);
    rect.setAttribute("y", h - bh);
    rect.setAttribute("width", bw);
    rect.setAttribute("height", bh);
    const title = document.createElementNS(ns, "title");
    title.textContent = when(b.start) + ": " + num(tokens) + " tokens, " + usd(b.costUsd) + ", " + b.runs + " runs";
    rect.append(title);
    svg.append(rect);
  });
  svg.append(text(0, "start", when(buckets[0].start)), text(w, "end", "now · peak " + num(max) + " tokens"));
  const used = buckets.filter((b) => b.runs);
  const table = el("table", { class: "usage-table" },
    el("caption", { text: "The same figures as a table" }),
    el("thead", {}, el("tr", {}, el("th", { scope: "col", text: "From" }), el("th", { scope: "col", text: "Runs" }),
      el("th", { scope: "col", text: "Tokens in" }), el("th", { scope: "col", text: "Tokens out" }), el("th", { scope: "col", text: "Cost" }))),
    el("tbody", {}, ...used.map((b) => el("tr", {}, el("td", { text: when(b.start) }), el("td", { text: num(b.runs) }),
      el("td", { text: num(b.tokensIn) }), el("td", { text: num(b.tokensOut) }), el("td", { text: usd(b.costUsd) })))));
  const details = el("details", {}, el("summary", { text: "Show the figures" }), table);
  chart.replaceChildren(svg, details);
}

/// Where the keyboard focus is, said so that it survives a re-render: the row it is in (by its
/// data key) and the control (by its action or role). None for the page's fixed controls.
const HOLDERS = ["data-key", "data-run-id", "data-delivery-id", "data-request-id"];
function focusPath(e) {
  const holder = e && e.closest && e.closest(HOLDERS.map((a) => `[${a}]`).join(","));
  if (!holder || e.id && !e.id.startsWith("answer-")) return e && e.id ? "#" + CSS.escape(e.id) : null;
  const attr = HOLDERS.find((a) => holder.hasAttribute(a));
  const inner = e.dataset.act ? `[data-act="${e.dataset.act}"]` : e.classList.contains("open") ? ".open" : e.tagName.toLowerCase();
  return `[${attr}="${CSS.escape(holder.getAttribute(attr))}"] ${inner}`;
}

function render(view) {
  // A live update must not take the keyboard focus, nor what someone is typing in an answer.
  const focused = focusPath(document.activeElement);
  const typed = new Map([...document.querySelectorAll("#ask-list input")].map((i) => [i.id, i.value]));
  renderView(view);
  for (const [id, value] of typed) if ($(id)) $(id).value = value;
  const again = focused && document.querySelector(focused);
  if (again && again !== document.activeElement) again.focus({ preventScroll: true });
}

function renderView(view) {
  state.view = view;
  if (view.generatedAt) state.clockSkew = view.generatedAt - Date.now();
  $("who").textContent = view.viewer.operator ? "Operator: every session" : "Viewing as " + view.viewer.name;
  renderTrees(view);
  renderRuns(view);
  renderDeliveries(view);
  renderAsks(view);
  renderUsage(view);
  document.body.dataset.rendered = String(view.generatedAt || Date.now());
}

// ---- transcript ----
function speaker(m) {
  const f = m.from || {};
  switch (f.kind) {
    case "agent": return "the agent";
    case "tool": return "tool result";
    case "session": return "session " + (f.session || "?") + (f.via ? " via " + f.via : "");
    case "system": return "system" + (f.via ? " (" + f.via + ")" : "");
    case "user":
      if (f.name || f.sender) return "user " + (f.name || f.sender) + (f.channel ? " on " + f.channel : "");
      return f.via === "inject" ? "the operator" : "user";
    default: return m.role;
  }
}

function messageItem(m) {
  const kind = (m.from && m.from.kind) || m.role;
  return el("li", { class: "msg from-" + kind, "data-role": m.role, "data-from": kind, "data-seq": m.seq },
    el("p", { class: "msg-head" }, el("strong", { text: speaker(m) }), el("span", { class: "meta", text: " #" + m.seq + " · " + when(m.timestamp) }),
      m.redacted ? el("span", { class: "meta", text: " · secrets masked" }) : null),
    el("div", { class: "msg-text", text: m.text }),
    m.cut ? el("p", { class: "meta", text: "cut: " + num(m.cut) + " characters in all" }) : null);
}

async function loadTranscript(before) {
  const key = state.open;
  const q = new URLSearchParams({ session: key });
  if (before) q.set("before", before);
  try {
    const t = await api("/ui/api/transcript?" + q);
    if (state.open !== key) return;
    const items = t.messages.map(messageItem);
    const list = $("transcript-list");
    if (before) list.prepend(...items);
    else list.replaceChildren(...(items.length ? items : [el("li", { class: "meta", text: "No messages yet." })]));
    state.firstSeq = before ? t.firstSeq ?? state.firstSeq : t.firstSeq;
    $("transcript-earlier").hidden = !t.moreBefore;
    $("transcript").dataset.key = key;
    if (!before) list.lastElementChild?.scrollIntoView({ block: "nearest" });
  } catch (e) {
    $("transcript-list").replaceChildren(el("li", { class: "error", text: e.message }));
  }
}

function openTranscript(key) {
  state.open = key;
  $("transcript").hidden = false;
  $("transcript-key").textContent = key;
  loadTranscript();
  connect();
  $("transcript-close").focus();
}

function closeTranscript() {
  state.open = null;
  $("transcript").hidden = true;
  connect();
}

// ---- live ----
function live(s, text) {
  $("live").dataset.state = s;
  $("live").textContent = text;
}

/// Reads the event stream until it ends; reconnects with a growing pause.
async function connect() {
  if (state.stream) state.stream.abort();
  const ctl = new AbortController();
  state.stream = ctl;
  let pause = 1000;
  while (!ctl.signal.aborted) {
    const q = new URLSearchParams({ roots: state.roots });
    if (state.filter) q.set("filter", state.filter);
    if (state.open) q.set("session", state.open);
    try {
      const res = await fetch("/ui/api/events?" + q, { headers: headers({ Accept: "text/event-stream" }), signal: ctl.signal });
      if (res.status === 401) return signedOut("The token is no longer valid.");
      if (!res.ok || !res.body) throw new Error(res.statusText);
      live("on", "live");
      pause = 1000;
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let end;
        while ((end = buf.indexOf("\n\n")) >= 0) {
          dispatch(buf.slice(0, end));
          buf = buf.slice(end + 2);
        }
      }
    } catch (e) {
      if (ctl.signal.aborted) return;
    }
    live("off", "reconnecting…");
    await new Promise((r) => setTimeout(r, pause));
    pause = Math.min(pause * 2, 10000);
  }
}

function dispatch(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  if (!data.length) return;
  const payload = JSON.parse(data.join("\n"));
  if (event === "view") render(payload);
  else if (event === "transcript" && payload.sessionKey === state.open) loadTranscript();
}

// ---- start ----
function signedOut(why) {
  if (state.stream) state.stream.abort();
  $("board").hidden = true;
  $("signout").hidden = true;
  $("signin").hidden = false;
  $("signin-error").textContent = why || "";
  live("off", "not connected");
  $("token").focus();
}

async function start() {
  if (!state.token) {
    // Without a token, only a loopback server started with --as answers; ask before trying.
    const hello = await api("/ui/api/hello").catch(() => ({}));
    if (!hello.anonymous) return signedOut("");
  }
  try {
    const first = await api("/ui/api/view?" + new URLSearchParams({ roots: state.roots }));
    performance.mark("view-read");
    render(first);
    performance.mark("view-rendered");
  } catch (e) {
    if (e.status === 401) return signedOut(state.token ? "That token was refused." : "");
    return signedOut("The server could not be read: " + e.message);
  }
  $("signin").hidden = true;
  $("board").hidden = false;
  $("signout").hidden = !state.token;
  connect();
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.token = $("token").value.trim();
    $("token").value = "";
    sessionStorage.setItem("sessions-mcp-token", state.token);
    start();
  });
  $("signout").addEventListener("click", () => {
    sessionStorage.removeItem("sessions-mcp-token");
    state.token = "";
    signedOut("Signed out.");
  });
  $("filter-form").addEventListener("submit", (ev) => ev.preventDefault());
  let typing;
  $("filter").addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { state.filter = $("filter").value.trim(); connect(); }, 300);
  });
  $("more-roots").addEventListener("click", () => { state.roots = Math.min(state.roots * 2, 1000); connect(); });
  for (const r of document.querySelectorAll("input[name=period]")) {
    r.addEventListener("change", () => { state.period = r.value; if (state.view) renderUsage(state.view); });
  }
  $("transcript-close").addEventListener("click", closeTranscript);
  $("transcript-earlier").addEventListener("click", () => loadTranscript(state.firstSeq));
  document.addEventListener("keydown", (ev) => { if (ev.key === "Escape" && state.open) closeTranscript(); });
  setInterval(() => {
    for (const t of document.querySelectorAll(".ticking")) t.textContent = duration(now() - Number(t.dataset.started));
  }, 1000);
  start();
});
