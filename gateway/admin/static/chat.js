// parley web chat (GET /chat). Plain ES2020, no dependencies.
//
// One websocket to /chat/ws speaking "parley.chat.v1"; the token rides in the
// Sec-WebSocket-Protocol header ("bearer.<token>"), never in the URL. Each message carries a
// client-made id and stays "pending" until the server acks it (it is then durable in the
// inbox); after a reconnect every pending message is sent again with the same id and the
// server drops the duplicates. Bot text is untrusted: it is rendered with textContent only.
// Needs common.js (the `parley` global) loaded first.
"use strict";

const { $, showError, hideError } = parley;
const CLIENT_KEY = "parley.chat.client";
const ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";
const BACKOFF_MIN_MS = 1000;
const BACKOFF_MAX_MS = 10000;
// The server repeats "typing" while it works; if it goes quiet without a reply, stop showing it.
const TYPING_TIMEOUT_MS = 30000;

const state = {
  token: null,
  clientId: null,
  ws: null,
  ready: false, // the server answered our hello
  backoff: BACKOFF_MIN_MS,
  retryTimer: null,
  typingTimer: null,
  pending: new Map(), // client message id -> {text, node}, in send order
  seenReplies: new Set(), // server reply ids, in case a flush repeats one
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
  return id;
}

function setStatus(kind, text) {
  const status = $("#chat-status");
  status.dataset.state = kind;
  status.textContent = text || kind;
}

const clock = () => new Date().toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });

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

/** Append text, turning ``` fences into <pre><code> (built with DOM APIs, never HTML). */
function renderText(container, text) {
  const parts = text.split("```");
  // An odd number of fences leaves the last one unclosed: keep that one as literal text.
  if (parts.length % 2 === 0) {
    const tail = parts.pop();
    parts[parts.length - 1] += `\`\`\`${tail}`;
  }
  parts.forEach((part, i) => {
    if (i % 2 === 0) {
      // Drop the newline right next to a fence: <pre> is a block already.
      let plain = i > 0 ? part.replace(/^\n/, "") : part;
      if (i < parts.length - 1) plain = plain.replace(/\n$/, "");
      if (plain) container.append(document.createTextNode(plain));
      return;
    }
    let code = part;
    const pre = document.createElement("pre");
    const newline = code.indexOf("\n");
    const label = newline >= 0 ? code.slice(0, newline).trim() : "";
    if (newline >= 0 && (label === "" || /^[\w+#.-]{1,20}$/.test(label))) {
      if (label) pre.dataset.lang = label; // ```python
      code = code.slice(newline + 1);
    }
    const codeNode = document.createElement("code");
    codeNode.textContent = code.replace(/\n$/, "");
    pre.append(codeNode);
    container.append(pre);
  });
}

function setMessageState(node, messageState, note) {
  node.dataset.state = messageState;
  const labels = { queued: "queued", sending: "sending…", acked: "", failed: "not sent" };
  const label = note || labels[messageState] || "";
  node.querySelector(".meta").textContent = label ? `${node.dataset.time} · ${label}` : node.dataset.time;
}

function addUserMessage(text, id) {
  const node = document.createElement("div");
  node.className = "message user";
  node.dataset.id = id;
  node.dataset.time = clock();
  node.append(document.createTextNode(text));
  const meta = document.createElement("span");
  meta.className = "meta";
  node.append(meta);
  addMessage(node);
  scrollToEnd(true);
  return node;
}

function addBotMessage(frame) {
  const node = document.createElement("div");
  node.className = "message bot";
  if (frame.id) node.dataset.id = frame.id;
  if (frame.reply_to) node.dataset.replyTo = frame.reply_to;
  renderText(node, String(frame.text ?? ""));
  const meta = document.createElement("span");
  meta.className = "meta";
  meta.textContent = clock();
  node.append(meta);
  addMessage(node);
  scrollToEnd(false);
}

function showTyping() {
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
    ws.send(JSON.stringify({ type: "hello", client_id: state.clientId }));
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
    case "ack": {
      const pending = state.pending.get(frame.id);
      if (pending) {
        state.pending.delete(frame.id);
        setMessageState(pending.node, "acked");
      }
      break;
    }
    case "typing":
      showTyping();
      break;
    case "reply":
      hideTyping();
      if (frame.id) {
        if (state.seenReplies.has(frame.id)) break;
        state.seenReplies.add(frame.id);
      }
      addBotMessage(frame);
      break;
    case "error": {
      showError(frame.message || "The server refused a frame.");
      // A refused message would be refused again: stop resending it.
      const pending = frame.id ? state.pending.get(frame.id) : null;
      if (pending) {
        state.pending.delete(frame.id);
        setMessageState(pending.node, "failed", `not sent: ${frame.message || "error"}`);
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
  state.ws.send(JSON.stringify({ type: "message", id, text }));
  if (pending) setMessageState(pending.node, "sending");
}

function send(text) {
  const id = randomId();
  const node = addUserMessage(text, id);
  state.pending.set(id, { text, node });
  setMessageState(node, "queued");
  transmit(id, text); // or later, when the socket is (back) up
}

// ---------------------------------------------------------------- composer

function autosize() {
  const input = $("#chat-input");
  input.style.height = "auto";
  input.style.height = `${input.scrollHeight + 2}px`;
}

function submit(event) {
  event.preventDefault();
  const input = $("#chat-input");
  const text = input.value;
  if (!text.trim()) return;
  send(text);
  input.value = "";
  autosize();
  input.focus();
}

function init() {
  state.clientId = loadClientId();
  parley.initToken({ onToken: start, onForget: () => promptForToken() });
  $("#chat-form").addEventListener("submit", submit);
  const input = $("#chat-input");
  input.addEventListener("input", autosize);
  input.addEventListener("keydown", (event) => {
    // Enter sends, Shift+Enter is a new line; never send in the middle of an IME composition.
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("#chat-form").requestSubmit();
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
