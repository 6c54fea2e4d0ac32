// parley web chat (GET /chat). Plain ES2020, no dependencies.
//
// One websocket to /chat/ws speaking "parley.chat.v1"; the token rides in the
// Sec-WebSocket-Protocol header ("bearer.<token>"), never in the URL. Each message carries a
// client-made id and stays "pending" until the server acks it (it is then durable in the
// inbox); after a reconnect (or a reload: pending messages are kept in localStorage) every
// pending message is sent again with the same id and the server drops the duplicates.
//
// Replies stream: "draft" frames show a reply while it is written (one bubble per draft
// id, replaced whole each time); the "reply" naming that draft takes its bubble. The
// conversation is kept in localStorage for this browser profile (its client id) and merged
// with the server's "history" on every hello, so a reload, a restart of parley or a reply
// that came while no tab was open all show. Bot text is untrusted: chat_render.js builds
// it with DOM calls only. Needs common.js (the `parley` global) and chat_render.js first.
"use strict";

const { $, showError, hideError } = parley;
const CLIENT_KEY = "parley.chat.client";
const LOG_PREFIX = "parley.chat.log.";
const ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";
const BACKOFF_MIN_MS = 1000;
const BACKOFF_MAX_MS = 10000;
// The server repeats "typing" every 10 s while it works; silence this long means it stopped.
const TYPING_TIMEOUT_MS = 30000;
// What the browser keeps of the conversation (localStorage holds ~5 MB per site).
const LOG_ENTRIES = 200;
const LOG_CHARS = 1500000;

const state = {
  token: null,
  clientId: null,
  ws: null,
  ready: false, // the server answered our hello
  backoff: BACKOFF_MIN_MS,
  retryTimer: null,
  typingTimer: null,
  pending: new Map(), // client message id -> {text, node}, in send order
  shown: new Set(), // "user:<id>" and "bot:<id>" of every message on screen
  drafts: new Map(), // draft id -> its bubble, while the reply is being written
  finished: new Set(), // draft ids whose reply arrived: a late draft is ignored
};

// ---------------------------------------------------------------- helpers

/** A random id of [A-Za-z0-9_-] (crypto.randomUUID needs a secure context; this does not). */
function randomId(length = 22) {
  const bytes = crypto.getRandomValues(new Uint8Array(length));
  return Array.from(bytes, (b) => ID_ALPHABET[b & 63]).join("");
}

function loadClientId() {
  let id = null;
  try {
    id = localStorage.getItem(CLIENT_KEY);
    if (!id || !/^[A-Za-z0-9_-]{1,64}$/.test(id)) {
      // Lowercase: the server treats client ids case-insensitively (26 chars, ~136 bits).
      id = randomId(26).toLowerCase();
      localStorage.setItem(CLIENT_KEY, id);
    }
  } catch {
    id = id || randomId(26).toLowerCase(); // storage disabled: a per-page identity still works
  }
  return id.toLowerCase();
}

function setStatus(kind, text) {
  const status = $("#chat-status");
  status.dataset.state = kind;
  status.textContent = text || kind;
  status.title = text || kind;
}

/** "14:05" today, "Mon 14:05" before. */
function clock(at) {
  const when = at ? new Date(at) : new Date();
  if (Number.isNaN(when.getTime())) return "";
  const time = when.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  if (when.toDateString() === new Date().toDateString()) return time;
  return `${when.toLocaleDateString([], { weekday: "short", day: "numeric", month: "short" })} ${time}`;
}

// ---------------------------------------------------------------- the browser's copy

const logKey = () => LOG_PREFIX + state.clientId;

function readLog() {
  try {
    const entries = JSON.parse(localStorage.getItem(logKey()) || "[]");
    return Array.isArray(entries) ? entries.filter((e) => e && typeof e.id === "string") : [];
  } catch {
    return [];
  }
}

function writeLog(entries) {
  let kept = entries.slice(-LOG_ENTRIES);
  while (kept.length && JSON.stringify(kept).length > LOG_CHARS) kept = kept.slice(1);
  for (;;) {
    try {
      localStorage.setItem(logKey(), JSON.stringify(kept));
      return;
    } catch {
      if (!kept.length) return; // storage disabled or full of other things: keep nothing
      kept = kept.slice(Math.ceil(kept.length / 2)); // over quota: the older half goes
    }
  }
}

/** Add or update one entry; read first, so tabs writing in turn do not drop each other's. */
function saveEntry(entry) {
  const entries = readLog();
  const i = entries.findIndex((e) => e.role === entry.role && e.id === entry.id);
  if (i >= 0) entries[i] = { ...entries[i], ...entry };
  else entries.push(entry);
  writeLog(entries);
}

/** Show the entries not on screen yet, in order (a pending message is queued to send). */
function showEntries(entries) {
  for (const entry of entries) {
    if (state.shown.has(`${entry.role}:${entry.id}`)) continue;
    if (entry.role === "user") {
      const node = addUserMessage(String(entry.text ?? ""), entry.id, entry.at);
      if (entry.pending) {
        state.pending.set(entry.id, { text: String(entry.text ?? ""), node });
        setMessageState(node, "queued");
      } else {
        setMessageState(node, "acked");
      }
    } else if (entry.role === "bot") {
      addBotMessage(entry);
    }
  }
}

// ---------------------------------------------------------------- token

function promptForToken(reason) {
  state.token = null;
  disconnect();
  setStatus("disconnected");
  $("#chat").hidden = true;
  parley.showTokenForm(reason);
}

function start() {
  state.token = parley.storedToken();
  if (!state.token) {
    promptForToken();
    return;
  }
  parley.hideTokenForm();
  $("#chat").hidden = false;
  showEntries(readLog());
  scrollToEnd(true);
  $("#chat-input").focus();
  state.backoff = BACKOFF_MIN_MS;
  connect();
}

// ---------------------------------------------------------------- messages on screen

function scrollToEnd(force) {
  const box = $("#messages");
  const nearEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 120;
  if (force || nearEnd) box.scrollTop = box.scrollHeight;
}

function addMessage(node) {
  $("#chat-empty")?.remove();
  $("#messages").append(node);
}

function setMessageState(node, messageState, note) {
  node.dataset.state = messageState;
  const labels = { queued: "queued", sending: "sending…", acked: "", failed: "not sent" };
  const label = note || labels[messageState] || "";
  node.querySelector(".meta").textContent = label ? `${node.dataset.time} · ${label}` : node.dataset.time;
}

function addUserMessage(text, id, at) {
  const node = document.createElement("div");
  node.className = "message user";
  node.dataset.id = id;
  node.dataset.time = clock(at);
  const body = document.createElement("div");
  body.className = "body";
  body.textContent = text; // a person's words are shown as typed, never as Markdown
  const meta = document.createElement("span");
  meta.className = "meta";
  node.append(body, meta);
  addMessage(node);
  state.shown.add(`user:${id}`);
  scrollToEnd(true);
  return node;
}

function bubble(node, frame, metaText) {
  const body = document.createElement("div");
  body.className = "body";
  parleyRender.body(body, frame);
  const meta = document.createElement("span");
  meta.className = "meta";
  meta.textContent = metaText;
  node.replaceChildren(body, meta);
}

function addBotMessage(frame) {
  const node = document.createElement("div");
  node.className = "message bot";
  finishBot(node, frame);
  addMessage(node);
  scrollToEnd(false);
}

function finishBot(node, frame) {
  node.classList.remove("draft");
  node.removeAttribute("aria-busy");
  delete node.dataset.draft;
  if (frame.id) node.dataset.id = frame.id;
  if (frame.reply_to) node.dataset.replyTo = frame.reply_to;
  bubble(node, frame, clock(frame.at));
  state.shown.add(`bot:${frame.id}`);
}

function onDraft(frame) {
  if (typeof frame.id !== "string" || state.finished.has(frame.id)) return;
  let node = state.drafts.get(frame.id);
  if (frame.reset === "withdrawn" || (frame.reset && !frame.text)) {
    // Nothing more is coming (a silent reply) or what was shown is void: take it away.
    node?.remove();
    state.drafts.delete(frame.id);
    if (frame.reset !== "withdrawn") showTyping(); // a retry or a tool: still working
    else hideTyping();
    return;
  }
  hideTyping();
  if (!node) {
    node = document.createElement("div");
    node.className = "message bot draft";
    node.dataset.draft = frame.id;
    node.setAttribute("aria-busy", "true");
    state.drafts.set(frame.id, node);
    addMessage(node);
  }
  // What the agent is busy with besides writing (a tool, a compaction), else "writing".
  bubble(node, frame, typeof frame.status === "string" ? `${frame.status}…` : "writing…");
  scrollToEnd(false);
}

function onReply(frame) {
  hideTyping();
  if (frame.id && state.shown.has(`bot:${frame.id}`)) return; // a flush repeating one
  const at = new Date().toISOString();
  const draft = typeof frame.draft === "string" ? state.drafts.get(frame.draft) : null;
  if (typeof frame.draft === "string") {
    state.finished.add(frame.draft);
    state.drafts.delete(frame.draft);
  }
  if (draft) {
    finishBot(draft, { ...frame, at });
    $("#messages").append(draft); // after anything that came in while it was written
    scrollToEnd(false);
  } else {
    addBotMessage({ ...frame, at });
  }
  if (frame.id) {
    const { id, reply_to: replyTo, text, blocks } = frame;
    saveEntry({ role: "bot", id, reply_to: replyTo ?? null, text, blocks, at });
  }
}

function showTyping() {
  // A bubble being written says it already.
  if (state.drafts.size) return;
  $("#typing").hidden = false;
  scrollToEnd(false);
  clearTimeout(state.typingTimer);
  state.typingTimer = setTimeout(hideTyping, TYPING_TIMEOUT_MS);
}

function hideTyping() {
  clearTimeout(state.typingTimer);
  $("#typing").hidden = true;
}

// ---------------------------------------------------------------- websocket

function wsUrl() {
  return `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}/chat/ws`;
}

function disconnect() {
  clearTimeout(state.retryTimer);
  state.retryTimer = null;
  const ws = state.ws;
  state.ws = null; // its close event is ignored from now on
  state.ready = false;
  if (ws) ws.close(1000, "bye");
}

function connect() {
  disconnect();
  if (!state.token) return;
  setStatus("connecting", "connecting…");
  let ws;
  try {
    ws = new WebSocket(wsUrl(), ["parley.chat.v1", `bearer.${state.token}`]);
  } catch {
    // SyntaxError: a subprotocol name may not hold some characters ("/", "=", spaces…),
    // so the browser cannot present this token on a websocket at all.
    promptForToken("This token has characters (such as / or =) that a browser cannot send on a websocket.");
    return;
  }
  state.ws = ws;
  let opened = false;
  ws.addEventListener("open", () => {
    opened = true;
    ws.send(JSON.stringify({ type: "hello", client_id: state.clientId, history: true }));
  });
  ws.addEventListener("message", (event) => {
    if (ws === state.ws) onFrame(event.data);
  });
  ws.addEventListener("close", (event) => {
    if (ws !== state.ws) return;
    state.ws = null;
    state.ready = false;
    onClose(event.code, opened);
  });
}

async function onClose(code, opened) {
  hideTyping();
  // A draft cut off by the disconnect will not be finished on this socket: the reply
  // comes after the next hello (kept by the server), so its half-written bubble goes.
  for (const node of state.drafts.values()) node.remove();
  state.drafts.clear();
  for (const { node } of state.pending.values()) setMessageState(node, "queued");
  if (code === 4401) {
    promptForToken("The server rejected the token. Enter it again.");
    return;
  }
  // A refused upgrade (401) looks like any network failure to a browser (close code 1006
  // before "open"), so ask a plain API route whether the token is still good.
  if (!opened && (await tokenRejected())) {
    promptForToken("The server rejected the token. Enter it again.");
    return;
  }
  if (!state.token) return;
  const delay = state.backoff;
  state.backoff = Math.min(state.backoff * 2, BACKOFF_MAX_MS);
  setStatus("disconnected", `disconnected — retrying in ${Math.round(delay / 1000)}s`);
  state.retryTimer = setTimeout(connect, delay);
}

async function tokenRejected() {
  if (!state.token) return false;
  try {
    const response = await fetch("/api/sessions?limit=1", {
      headers: { Authorization: `Bearer ${state.token}` },
    });
    return response.status === 401;
  } catch {
    return false; // server unreachable: keep retrying
  }
}

function onFrame(raw) {
  let frame;
  try {
    frame = JSON.parse(raw);
  } catch {
    return;
  }
  switch (frame.type) {
    case "ready":
      state.ready = true;
      state.backoff = BACKOFF_MIN_MS;
      setStatus("connected");
      hideError();
      for (const [id, { text }] of state.pending) transmit(id, text);
      break;
    case "history":
      if (Array.isArray(frame.messages)) {
        const entries = frame.messages.filter((e) => e && typeof e.id === "string");
        showEntries(entries);
        const known = readLog();
        const have = new Set(known.map((e) => `${e.role}:${e.id}`));
        writeLog([...known, ...entries.filter((e) => !have.has(`${e.role}:${e.id}`))]);
        scrollToEnd(true);
      }
      break;
    case "ack": {
      const pending = state.pending.get(frame.id);
      if (pending) {
        state.pending.delete(frame.id);
        setMessageState(pending.node, "acked");
        saveEntry({ role: "user", id: frame.id, pending: false });
      }
      break;
    }
    case "typing":
      showTyping();
      break;
    case "draft":
      onDraft(frame);
      break;
    case "reply":
      onReply(frame);
      break;
    case "error": {
      showError(frame.message || "The server refused a frame.");
      // A refused message would be refused again: stop resending it.
      const pending = frame.id ? state.pending.get(frame.id) : null;
      if (pending) {
        state.pending.delete(frame.id);
        setMessageState(pending.node, "failed", `not sent: ${frame.message || "error"}`);
        saveEntry({ role: "user", id: frame.id, pending: false, failed: true });
      }
      break;
    }
    default:
      break; // newer server, unknown frame: ignore
  }
}

function transmit(id, text) {
  const pending = state.pending.get(id);
  if (!state.ws || !state.ready) return;
  const frame = { type: "message", id, text };
  // Files ride in the frame (base64); the server checks their size and kind.
  if (pending && pending.files && pending.files.length) frame.files = pending.files;
  state.ws.send(JSON.stringify(frame));
  if (pending) setMessageState(pending.node, "sending");
}

function send(text, files = []) {
  const id = randomId();
  const at = new Date().toISOString();
  const names = files.map((f) => `[${f.name}]`).join(" ");
  const node = addUserMessage(names ? `${names} ${text}`.trim() : text, id, at);
  state.pending.set(id, { text, node, files });
  setMessageState(node, "queued");
  saveEntry({ role: "user", id, text, at, pending: true });
  transmit(id, text); // or later, when the socket is (back) up
}

// ---------------------------------------------------------------- composer

function autosize() {
  const input = $("#chat-input");
  input.style.height = "auto";
  input.style.height = `${input.scrollHeight + 2}px`;
}

// Files chosen with the attach button, read as base64 when the message is sent.
const MAX_FILE_BYTES = 10 * 1024 * 1024; // the server's default ([channels.web] max_upload_bytes)

function readFile(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => {
      const url = String(reader.result);
      resolve({ name: file.name, type: file.type || "", data: url.slice(url.indexOf(",") + 1) });
    };
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

function chosenFiles() {
  return Array.from($("#chat-file").files || []);
}

function showChosen() {
  const names = chosenFiles().map((f) => f.name);
  $("#chat-files").textContent = names.length ? names.join(", ") : "";
}

async function submit(event) {
  event.preventDefault();
  const input = $("#chat-input");
  const text = input.value;
  const chosen = chosenFiles();
  if (!text.trim() && !chosen.length) return;
  const big = chosen.find((f) => f.size > MAX_FILE_BYTES);
  if (big) {
    showError(`${big.name} is larger than the limit of ${MAX_FILE_BYTES / 1048576} MB.`);
    return;
  }
  let files = [];
  try {
    files = await Promise.all(chosen.map(readFile));
  } catch (err) {
    showError(`A file could not be read: ${err}`);
    return;
  }
  $("#chat-file").value = "";
  showChosen();
  send(text, files);
  input.value = "";
  autosize();
  input.focus();
}

function init() {
  state.clientId = loadClientId();
  parley.initToken({ onToken: start, onForget: () => promptForToken() });
  $("#chat-form").addEventListener("submit", submit);
  $("#chat-attach").addEventListener("click", () => $("#chat-file").click());
  $("#chat-file").addEventListener("change", showChosen);
  const input = $("#chat-input");
  input.addEventListener("input", autosize);
  input.addEventListener("keydown", (event) => {
    // Enter sends, Shift+Enter is a new line; never send in the middle of an IME composition.
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("#chat-form").requestSubmit();
    }
  });
  // Another tab of this browser wrote the conversation: show what it added (what a
  // person typed there; replies reach every tab anyway).
  window.addEventListener("storage", (event) => {
    if (event.key === logKey() && state.token) {
      showEntries(readLog().filter((e) => !e.pending));
      scrollToEnd(false);
    }
  });
  // Back online: retry now instead of waiting out the backoff.
  window.addEventListener("online", () => {
    if (state.token && !state.ws) {
      state.backoff = BACKOFF_MIN_MS;
      connect();
    }
  });
  start();
}

init();
