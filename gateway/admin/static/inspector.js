// parley session inspector (GET /). Plain ES2020, no dependencies.
//
// Views are driven by the URL fragment so a reload keeps the view:
//   #/                     sessions list (filters as a query: #/?channel=telegram&status=active)
//   #/session/<id>         one session
// Everything that comes from the API is untrusted: it only ever reaches the page through
// textContent / createElement (the el() helper from common.js), never through innerHTML.
// Needs common.js (the `parley` global) loaded first.
"use strict";

const { $, el, showError, hideError } = parley;
const PAGE_SESSIONS = 50;
const PAGE_TRANSCRIPT = 100;

const numberFormat = new Intl.NumberFormat();

let token = null;
// Bumped on every navigation; async loaders drop their result when it changed meanwhile,
// so a slow response for an old view never paints over the current one.
let viewGen = 0;

// ---------------------------------------------------------------- small helpers

const fmtInt = (n) => (typeof n === "number" ? numberFormat.format(n) : "–");
const fmtPct = (x) => (typeof x === "number" ? `${Math.round(x * 100)}%` : "–");

function fmtTime(iso) {
  if (!iso) return "–";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : date.toLocaleString();
}

const timeEl = (iso) => el("time", { datetime: iso, title: iso, text: fmtTime(iso) });

function fmtJson(value) {
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

/** One line, at most `max` characters: for <summary> previews. */
function preview(value, max = 90) {
  const text = (typeof value === "string" ? value : JSON.stringify(value) || "").replace(/\s+/g, " ").trim();
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

function isEmpty(value) {
  if (value === null || value === undefined || value === "") return true;
  if (Array.isArray(value)) return value.length === 0;
  return typeof value === "object" && Object.keys(value).length === 0;
}

// ---------------------------------------------------------------- errors and token

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function promptForToken(reason) {
  token = null;
  $("#app").hidden = true;
  parley.showTokenForm(reason);
}

/**
 * fetch() a JSON API route with the bearer token. Non-2xx answers show the server's
 * `message` in the error banner and reject with ApiError; a 401 asks for the token again.
 */
async function api(path, { method = "GET", body } = {}) {
  if (!token) throw new ApiError(401, "unauthorized", "no token");
  const headers = { Authorization: `Bearer ${token}`, Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    showError(`Cannot reach the parley server (${err.message}).`);
    throw new ApiError(0, "network", err.message);
  }
  let data = null;
  try {
    data = await response.json();
  } catch {
    // not JSON (a proxy error page, say): handled below by the status
  }
  if (response.status === 401) {
    promptForToken((data && data.message) || "The token was rejected. Enter it again.");
    throw new ApiError(401, "unauthorized", "unauthorized");
  }
  if (!response.ok) {
    const message = (data && data.message) || `HTTP ${response.status} ${response.statusText}`;
    showError(message);
    throw new ApiError(response.status, data && data.error, message);
  }
  return data;
}

// ---------------------------------------------------------------- routing

function route() {
  hideError();
  const hash = location.hash || "#/";
  const match = /^#\/session\/([^/?#]+)/.exec(hash);
  if (match) {
    showSession(decodeURIComponent(match[1]));
  } else {
    const query = hash.indexOf("?") >= 0 ? hash.slice(hash.indexOf("?") + 1) : "";
    showList(new URLSearchParams(query));
  }
}

function start() {
  token = parley.storedToken();
  if (!token) {
    promptForToken();
    return;
  }
  parley.hideTokenForm();
  $("#app").hidden = false;
  loadHealth();
  route();
}

// ---------------------------------------------------------------- health pill

/** "name: detail" for each failed check; "channels" nests one check per channel. */
function failingChecks(checks, prefix = "") {
  return Object.entries(checks).flatMap(([name, check]) => {
    if (!check || typeof check !== "object") return [];
    if (typeof check.ok !== "boolean") return failingChecks(check, `${prefix}${name}/`);
    return check.ok ? [] : [`${prefix}${name}: ${check.detail}`];
  });
}

async function loadHealth() {
  const pill = $("#health");
  try {
    const response = await fetch("/health");
    const data = await response.json();
    const failing = failingChecks(data.checks || {});
    pill.dataset.state = data.status === "ok" ? "ok" : "degraded";
    pill.textContent = data.ready ? data.status : `${data.status}, not ready`;
    pill.title = failing.length ? failing.join("\n") : "all checks pass";
  } catch {
    pill.dataset.state = "down";
    pill.textContent = "unreachable";
    pill.title = "";
  }
  pill.hidden = false;
}

// ---------------------------------------------------------------- sessions list

const FILTERS = ["channel", "agent", "status", "q"];
const list = { params: new URLSearchParams(), cursor: null };

function showList(params) {
  const gen = ++viewGen;
  document.title = "parley · sessions";
  $("#session-view").hidden = true;
  $("#list-view").hidden = false;
  list.params = new URLSearchParams();
  for (const name of FILTERS) {
    const value = params.get(name) || "";
    $(`#filter-${name}`).value = value;
    if (value) list.params.set(name, value);
  }
  $("#sessions-table tbody").replaceChildren();
  loadSessions(null, gen);
}

async function loadSessions(cursor, gen) {
  const more = $("#sessions-more");
  const status = $("#sessions-status");
  more.disabled = true;
  status.textContent = "Loading…";
  const query = new URLSearchParams(list.params);
  query.set("limit", String(PAGE_SESSIONS));
  if (cursor) query.set("cursor", cursor);
  try {
    const data = await api(`/api/sessions?${query}`);
    if (gen !== viewGen) return;
    const body = $("#sessions-table tbody");
    for (const session of data.items) body.append(sessionRow(session));
    list.cursor = data.next_cursor;
    more.hidden = !data.next_cursor;
    const count = body.rows.length;
    status.textContent = count === 0
      ? "No sessions match."
      : `${count} session${count === 1 ? "" : "s"}${data.next_cursor ? " shown" : ""}`;
  } catch {
    if (gen === viewGen) status.textContent = "";
  } finally {
    more.disabled = false;
  }
}

function sessionRow(s) {
  const href = `#/session/${encodeURIComponent(s.id)}`;
  const name = s.display_name || s.key;
  const row = el(
    "tr",
    { class: "session-row", tabindex: "0", dataset: { sessionId: s.id, status: s.status } },
    el("td", {}, timeEl(s.updated_at)),
    el("td", {},
      el("a", { href, text: name }),
      s.display_name ? el("div", { class: "muted small mono", text: s.key }) : null),
    el("td", {},
      s.channel,
      el("div", { class: "muted small", text: [s.account, s.chat_type].filter(Boolean).join(" · ") })),
    el("td", { text: s.agent_id }),
    el("td", {},
      el("span", { class: "badge", dataset: { state: s.status }, text: s.status }),
      s.archived_reason ? el("div", { class: "muted small", text: s.archived_reason }) : null),
    el("td", { class: "num", text: fmtInt(s.turn_count) }),
    el("td", { class: "num", text: fmtInt(s.context_tokens) }),
    el("td", { class: "num", text: fmtInt(s.compaction_count) }),
    el("td", { class: "small", text: s.model || "default" }),
  );
  // The name cell is a real link (middle-click, copy address); the rest of the row too.
  row.addEventListener("click", (event) => {
    if (event.target.closest("a") === null) location.hash = href;
  });
  row.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && event.target === row) location.hash = href;
  });
  return row;
}

function applyFilters(event) {
  event.preventDefault();
  const params = new URLSearchParams();
  for (const name of FILTERS) {
    const value = $(`#filter-${name}`).value.trim();
    if (value) params.set(name, value);
  }
  const query = params.toString();
  const target = query ? `#/?${query}` : "#/";
  if (location.hash === target) route(); // same filters: reload
  else location.hash = target;
}

// ---------------------------------------------------------------- one session

const view = { id: null, detail: null, cursor: null, toolNames: new Map() };

function showSession(id) {
  const gen = ++viewGen;
  const changed = view.id !== id;
  view.id = id;
  view.cursor = null;
  view.toolNames = new Map();
  $("#list-view").hidden = true;
  $("#session-view").hidden = false;
  if (changed) {
    view.detail = null;
    $("#session-title").textContent = "Loading…";
    $("#session-status").textContent = "";
    $("#session-facts").replaceChildren();
    $("#action-result").hidden = true;
    $("#memory-results").replaceChildren();
    window.scrollTo(0, 0);
  }
  $("#transcript").replaceChildren();
  loadDetail(gen);
  loadTranscript(null, gen);
  loadContext(gen);
  loadCompactions(gen);
}

const sessionPath = (suffix = "") => `/api/sessions/${encodeURIComponent(view.id)}${suffix}`;

async function loadDetail(gen) {
  let detail;
  try {
    detail = await api(sessionPath());
  } catch (err) {
    if (gen === viewGen && err.status === 404) $("#session-title").textContent = "Session not found";
    return;
  }
  if (gen !== viewGen) return;
  view.detail = detail;
  const title = detail.display_name || detail.key;
  document.title = `parley · ${title}`;
  $("#session-title").textContent = title;
  const badge = $("#session-status");
  badge.textContent = detail.status;
  badge.dataset.state = detail.status;
  setActionsEnabled();
  $("#session-facts").replaceChildren(...sessionFacts(detail));
}

function sessionFacts(d) {
  const t = d.tokens || {};
  const facts = [
    ["Key", el("span", { class: "mono", text: d.key })],
    ["Session id", el("span", { class: "mono small", text: d.id })],
    ["Channel", [d.channel, d.account, d.chat_type].filter(Boolean).join(" · ")],
    ["Peer", isEmpty(d.peer) ? "–" : preview(d.peer, 120)],
    ["Agent", d.agent_id],
    ["Model", d.model || "default"],
    ["Created", timeEl(d.created_at)],
    ["Updated", timeEl(d.updated_at)],
    ["Turns / entries", `${fmtInt(d.turn_count)} / ${fmtInt(d.entry_count)}`],
    ["Tokens in / out", `${fmtInt(t.input)} / ${fmtInt(t.output)}`],
    ["Cache read / write", `${fmtInt(t.cache_read)} / ${fmtInt(t.cache_write)}`],
    ["Cache-read share", fmtPct(d.cache_read_share)],
    ["Compactions", fmtInt(d.compaction_count)],
  ];
  if (d.parent_key) facts.push(["Parent", el("span", { class: "mono", text: d.parent_key })]);
  if (d.status === "archived") {
    facts.push(["Archived", `${fmtTime(d.archived_at)}${d.archived_reason ? ` (${d.archived_reason})` : ""}`]);
  }
  if (!isEmpty(d.last_route)) facts.push(["Last route", preview(d.last_route, 160)]);
  if (!isEmpty(d.settings)) facts.push(["Settings", preview(d.settings, 160)]);
  if (d.delivery_error) facts.push(["Delivery error", String(d.delivery_error), "fact-error"]);
  return facts.map(([label, value, cls]) =>
    el("div", { class: cls }, el("dt", { text: label }), el("dd", {}, value)));
}

// ---------------------------------------------------------------- transcript

async function loadTranscript(cursor, gen) {
  const more = $("#transcript-more");
  more.disabled = true;
  const query = new URLSearchParams({ limit: String(PAGE_TRANSCRIPT) });
  if (cursor) query.set("cursor", cursor);
  try {
    const data = await api(sessionPath(`/transcript?${query}`));
    if (gen !== viewGen) return;
    const box = $("#transcript");
    for (const entry of data.items) box.append(renderEntry(entry));
    view.cursor = data.next_cursor;
    more.hidden = !data.next_cursor;
    const shown = box.children.length;
    $("#transcript-count").textContent = shown === data.total
      ? `${fmtInt(data.total)} entries`
      : `${fmtInt(shown)} of ${fmtInt(data.total)} entries`;
    if (data.total === 0) box.append(el("p", { class: "muted", text: "No entries yet." }));
  } catch {
    // the banner already says what went wrong
  } finally {
    more.disabled = false;
  }
}

function entryHead(entry, ...extra) {
  return el("div", { class: "entry-head" },
    ...extra,
    timeEl(entry.ts),
    el("span", { class: "mono", title: entry.id, text: `#${entry.index}` }));
}

function renderEntry(entry) {
  if (entry.type === "message") return renderMessage(entry);
  if (entry.type === "compaction") return renderCompactionEntry(entry);
  const name = entry.type === "custom" ? entry.custom_type || "custom" : entry.type;
  return el("div", { class: "entry custom", dataset: { type: entry.type === "custom" ? "custom" : entry.type } },
    entryHead(entry, el("span", { class: "role", text: name })),
    isEmpty(entry.data) ? null : el("div", { class: "custom-data", text: preview(entry.data, 300) }));
}

function renderMessage(entry) {
  const message = entry.message || {};
  const role = message.role || "unknown";
  const usage = entry.usage;
  const usageText = usage
    ? [`in ${fmtInt(usage.input ?? usage.input_tokens)}`,
      `out ${fmtInt(usage.output ?? usage.output_tokens)}`,
      (usage.cache_read ?? usage.cache_read_input_tokens)
        ? `cache ${fmtInt(usage.cache_read ?? usage.cache_read_input_tokens)}` : null]
      .filter(Boolean).join(" · ")
    : null;
  const node = el("div", { class: `entry message ${role}`, dataset: { type: "message", role } },
    entryHead(entry,
      el("span", { class: "role", text: role.replace(/_/g, " ") }),
      usageText ? el("span", { text: usageText }) : null));
  const content = typeof message.content === "string"
    ? [{ type: "text", text: message.content }]
    : message.content || [];
  for (const block of content) node.append(renderBlock(block));
  return node;
}

function renderBlock(block) {
  switch (block.type) {
    case "text":
      // The gateway appends a <turn-context> block (time, channel, sender) to each user turn.
      if (/^<turn-context>/.test(block.text || "")) {
        return el("div", { class: "text turn-context", text: block.text });
      }
      return el("div", { class: "text", text: block.text });
    case "tool_use":
      view.toolNames.set(block.id, block.name);
      return el("details", { class: "tool-call", dataset: { toolUseId: block.id } },
        el("summary", {},
          "Tool call ", el("span", { class: "tool-name", text: block.name }), " ",
          el("span", { class: "preview", text: preview(block.input, 70) })),
        el("pre", { text: fmtJson(block.input ?? {}) }));
    case "tool_result": {
      const name = view.toolNames.get(block.tool_use_id);
      const body = typeof block.content === "string" ? block.content : fmtJson(block.content);
      return el("details", {
        class: `tool-result${block.is_error ? " is-error" : ""}`,
        dataset: { toolUseId: block.tool_use_id },
      },
      el("summary", {},
        block.is_error ? "Tool error" : "Tool result",
        name ? ` (${name}) ` : " ",
        el("span", { class: "preview", text: preview(body, 70) })),
      el("pre", { text: body }));
    }
    case "image": {
      // Only well-known raster types become a data: URL; anything else is described.
      if (/^image\/(png|jpeg|gif|webp)$/.test(block.media_type || "") && block.data) {
        return el("img", { src: `data:${block.media_type};base64,${block.data}`, alt: "image" });
      }
      return el("div", { class: "muted small", text: `[image ${block.media_type || ""}]` });
    }
    default:
      return el("div", { class: "muted small mono", text: `[${block.type}] ${preview(block, 200)}` });
  }
}

function tokensChange(before, after) {
  if (typeof before !== "number" || typeof after !== "number") return "";
  const saved = before > 0 ? ` (−${Math.round((1 - after / before) * 100)}%)` : "";
  return `${fmtInt(before)} → ${fmtInt(after)} tokens${saved}`;
}

function renderCompactionEntry(entry) {
  return el("div", { class: "entry compaction", dataset: { type: "compaction" } },
    entryHead(entry,
      el("span", { class: "compaction-title", text: `Compacted (${entry.trigger || "unknown"})` }),
      el("span", { text: tokensChange(entry.tokens_before, entry.tokens_after) })),
    el("details", {},
      el("summary", { class: "small", text: "Summary" }),
      el("div", { class: "summary-text", text: entry.summary || "" })));
}

// ---------------------------------------------------------------- context bar

async function loadContext(gen) {
  let ctx;
  try {
    ctx = await api(sessionPath("/context"));
  } catch {
    return;
  }
  if (gen !== viewGen) return;
  const win = ctx.window_tokens || 0;
  const sections = ctx.sections || [];
  const pctOfWindow = (tokens) => (win > 0 ? (tokens / win) * 100 : 0);

  $("#context-bar").replaceChildren(...sections.map((s) => {
    const segment = el("div", {
      class: "context-segment",
      dataset: { kind: s.kind, tokens: String(s.tokens) },
      title: `${s.name} (${s.kind}): ${fmtInt(s.tokens)} tokens`,
    });
    segment.style.width = `${pctOfWindow(s.tokens).toFixed(3)}%`;
    return segment;
  }));

  // The same sections scaled to the total: with a large window the bar above is a sliver.
  const sum = sections.reduce((acc, s) => acc + s.tokens, 0);
  $("#context-mix").replaceChildren(...sections.map((s) => {
    const part = el("div", {
      class: "mix-segment",
      dataset: { kind: s.kind },
      title: `${s.name} (${s.kind}): ${fmtInt(s.tokens)} tokens, ${fmtPct(sum ? s.tokens / sum : 0)} of the context`,
    });
    part.style.width = `${(sum ? (s.tokens / sum) * 100 : 0).toFixed(3)}%`;
    return part;
  }));

  // The figures exactly as /status and /context word them (one report serves all three):
  // the window and its source, the next request's estimate, the last call's report.
  const share = typeof ctx.share === "number" ? ctx.share : pctOfWindow(ctx.total_tokens) / 100;
  const lines = (ctx.figures && ctx.figures.lines) || [];
  const total = $("#context-total");
  total.replaceChildren(...lines.map((line) => el("div", { class: "figure", text: line })));
  total.classList.toggle("over", share > 1);

  $("#context-legend").replaceChildren(...sections.map((s) =>
    el("li", { dataset: { kind: s.kind } },
      el("span", { class: "swatch", dataset: { kind: s.kind } }),
      el("span", { class: "name" }, s.name, " ", el("span", { class: "kind", text: s.kind })),
      el("span", { class: "num", text: fmtInt(s.tokens) }))));

  const pruned = ctx.pruned || {};
  const prunedBits = [
    pruned.trimmed ? `${pruned.trimmed} tool results trimmed` : null,
    pruned.cleared ? `${pruned.cleared} cleared` : null,
    pruned.dropped_turns ? `${pruned.dropped_turns} old turns dropped` : null,
  ].filter(Boolean);
  const prunedLine = $("#context-pruned");
  prunedLine.textContent = prunedBits.length ? `Pruned for the next turn: ${prunedBits.join(", ")}.` : "";
  prunedLine.hidden = prunedBits.length === 0;

  const report = $("#context-report");
  report.hidden = isEmpty(ctx.report);
  report.querySelector("pre").textContent = isEmpty(ctx.report) ? "" : fmtJson(ctx.report);
}

// ---------------------------------------------------------------- compaction history

async function loadCompactions(gen) {
  let data;
  try {
    data = await api(sessionPath("/compactions"));
  } catch {
    return;
  }
  if (gen !== viewGen) return;
  const box = $("#compactions");
  if (!data.items.length) {
    box.replaceChildren(el("p", { class: "muted", text: "No compactions yet." }));
    return;
  }
  box.replaceChildren(...data.items.map((c) =>
    el("div", { class: "compaction-item", dataset: { entryId: c.entry_id } },
      el("div", { class: "item-head" },
        el("span", { class: "badge", text: c.trigger || "unknown" }),
        el("span", { text: tokensChange(c.tokens_before, c.tokens_after) }),
        el("span", { class: "muted small" }, timeEl(c.ts))),
      el("div", { class: "summary-text", text: c.summary || "" }),
      isEmpty(c.ledger) ? null : el("details", {},
        el("summary", { class: "small", text: "Ledger" }),
        el("pre", { text: fmtJson(c.ledger) })))));
}

// ---------------------------------------------------------------- actions

function setNotice(text, outcome) {
  const notice = $("#action-result");
  notice.textContent = text;
  notice.dataset.outcome = outcome || "";
  notice.hidden = !text;
}

/** Compact and reset apply to an active session only (the API answers 409 otherwise). */
function setActionsEnabled() {
  const active = !view.detail || view.detail.status === "active";
  $("#compact-btn").disabled = !active;
  $("#reset-btn").disabled = !active;
  $("#compact-focus").disabled = !active;
}

async function runAction(work) {
  const buttons = [$("#compact-btn"), $("#reset-btn")];
  for (const b of buttons) b.disabled = true;
  try {
    await work();
  } catch {
    setNotice("");
  } finally {
    setActionsEnabled();
  }
  if (view.id) showSession(view.id); // refresh every panel
}

function compact() {
  const focusInput = $("#compact-focus");
  const focus = focusInput.value.trim();
  return runAction(async () => {
    setNotice("Compacting… (this asks the model for a summary and can take a while)");
    const r = await api(sessionPath("/compact"), { method: "POST", body: focus ? { focus } : {} });
    const change = tokensChange(r.tokens_before, r.tokens_after);
    setNotice(`${r.outcome}: ${r.message}${change ? ` — ${change}` : ""}`, r.outcome);
    focusInput.value = "";
  });
}

function reset() {
  const name = view.detail ? view.detail.display_name || view.detail.key : view.id;
  const question = `Reset session “${name}”?\n\nIt is archived; the next message in this chat starts a fresh session.`;
  if (!window.confirm(question)) return;
  runAction(async () => {
    const r = await api(sessionPath("/reset"), { method: "POST" });
    setNotice(`Session ${r.status} (${r.archived_reason}).`, "ok");
  });
}

// ---------------------------------------------------------------- memory search

async function searchMemory(event) {
  event.preventDefault();
  const q = $("#memory-query").value.trim();
  if (!q) return;
  const query = new URLSearchParams({ q, limit: "8" });
  const scope = $("#memory-scope").value.trim();
  if (scope) query.set("scope", scope);
  const box = $("#memory-results");
  box.replaceChildren(el("p", { class: "muted", text: "Searching…" }));
  let data;
  try {
    data = await api(`/api/memory/search?${query}`);
  } catch {
    box.replaceChildren();
    return;
  }
  const head = el("p", { class: "muted small memory-summary",
    text: `${data.items.length} result${data.items.length === 1 ? "" : "s"} · ${data.mode}` });
  const notes = (data.notes || []).map((n) => el("p", { class: "muted small", text: n }));
  const hits = data.items.map((hit) =>
    el("div", { class: "memory-hit" },
      el("div", { class: "item-head" },
        el("span", { class: "path", text: `${hit.path}:${hit.start_line}-${hit.end_line}` }),
        el("span", { class: "badge", title: "score", text: Number(hit.score).toFixed(3) }),
        el("span", { class: "badge audience", title: hit.scope, text: hit.audience || hit.scope }),
        el("span", { class: "muted small", text: hit.source || "" })),
      el("pre", { text: hit.snippet || "" })));
  box.replaceChildren(head, ...notes, ...hits);
}

// ---------------------------------------------------------------- wiring

function init() {
  parley.initToken({ onToken: start, onForget: () => promptForToken() });
  $("#filters").addEventListener("submit", applyFilters);
  $("#filter-clear").addEventListener("click", () => {
    location.hash = "#/";
  });
  $("#filter-status").addEventListener("change", () => $("#filters").requestSubmit());
  $("#sessions-more").addEventListener("click", () => loadSessions(list.cursor, viewGen));
  $("#transcript-more").addEventListener("click", () => loadTranscript(view.cursor, viewGen));
  $("#compact-btn").addEventListener("click", compact);
  $("#reset-btn").addEventListener("click", reset);
  $("#memory-form").addEventListener("submit", searchMemory);
  window.addEventListener("hashchange", () => {
    if (token) route();
  });
  start();
}

init();
