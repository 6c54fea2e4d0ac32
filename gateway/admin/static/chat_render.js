// parley web chat: bot text on screen. Plain ES2020, no dependencies.
//
// The server parses Markdown (channels/web_markdown.py) into a tree of whitelisted nodes;
// this file builds it with createElement and text nodes only. No HTML string is ever
// parsed (no innerHTML), so no text can become markup; the tag whitelist and the link
// check are repeated here so that even a broken server cannot make the page load or run
// anything: links must be http(s), images are never loaded.
"use strict";

const parleyRender = (() => {
  const TAGS = new Set([
    "p", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "s", "code", "pre", "a",
    "ul", "ol", "li", "blockquote", "hr", "br", "table", "thead", "tbody", "tr", "th", "td",
  ]);
  const SAFE_HREF = /^https?:\/\/[^\s]+$/i;
  const MAX_HANG = 30;
  const MAX_DEPTH = 64;

  function build(parent, nodes, depth) {
    if (!Array.isArray(nodes) || depth > MAX_DEPTH) return;
    for (const node of nodes) {
      if (typeof node === "string") {
        parent.append(document.createTextNode(node));
      } else if (node && typeof node === "object") {
        parent.append(element(node, depth));
      }
    }
  }

  function element(node, depth) {
    if (node.t === "aligned") return aligned(node);
    const tag = TAGS.has(node.t) ? node.t : "span";
    const el = document.createElement(tag);
    if (tag === "a") {
      const href = typeof node.href === "string" ? node.href : "";
      if (SAFE_HREF.test(href)) {
        el.href = href;
        el.rel = "noopener noreferrer nofollow";
        el.target = "_blank";
      } else {
        const span = document.createElement("span"); // not a link: its words only
        build(span, node.c, depth + 1);
        return span;
      }
    }
    if (tag === "pre" && typeof node.lang === "string") el.dataset.lang = node.lang.slice(0, 32);
    if (tag === "ol" && Number.isInteger(node.start) && node.start > 0) el.start = node.start;
    build(el, node.c, depth + 1);
    if (tag === "table") {
      // A wide table scrolls inside the bubble instead of stretching the page.
      const wrap = document.createElement("div");
      wrap.className = "table-scroll";
      wrap.append(el);
      return wrap;
    }
    return el;
  }

  /** Text laid out with spaces: each line wraps to its own text column (a hanging indent). */
  function aligned(node) {
    const box = document.createElement("div");
    box.className = "aligned";
    const lines = Array.isArray(node.c) ? node.c : [];
    const hangs = Array.isArray(node.hang) ? node.hang : [];
    lines.forEach((line, i) => {
      const row = document.createElement("div");
      const hang = Number.isInteger(hangs[i]) ? Math.min(Math.max(hangs[i], 0), MAX_HANG) : 0;
      row.style.paddingLeft = `${hang}ch`;
      row.style.textIndent = `-${hang}ch`;
      row.textContent = typeof line === "string" && line ? line : "\u00a0";
      box.append(row);
    });
    return box;
  }

  /** Text without a tree (an old server, a reply too long to render): ``` fences as code. */
  function plain(container, text) {
    const parts = text.split("```");
    if (parts.length % 2 === 0) {
      const tail = parts.pop(); // an unclosed fence stays literal
      parts[parts.length - 1] += `\`\`\`${tail}`;
    }
    parts.forEach((part, i) => {
      if (i % 2 === 0) {
        let words = i > 0 ? part.replace(/^\n/, "") : part;
        if (i < parts.length - 1) words = words.replace(/\n$/, "");
        if (words) {
          const p = document.createElement("p");
          p.className = "plain";
          p.textContent = words;
          container.append(p);
        }
        return;
      }
      let code = part;
      const pre = document.createElement("pre");
      const newline = code.indexOf("\n");
      const label = newline >= 0 ? code.slice(0, newline).trim() : "";
      if (newline >= 0 && (label === "" || /^[\w+#.-]{1,20}$/.test(label))) {
        if (label) pre.dataset.lang = label;
        code = code.slice(newline + 1);
      }
      const codeNode = document.createElement("code");
      codeNode.textContent = code.replace(/\n$/, "");
      pre.append(codeNode);
      container.append(pre);
    });
  }

  /** Fill ``container`` with a reply or draft: its tree when it has one, else its text. */
  function body(container, frame) {
    container.replaceChildren();
    if (Array.isArray(frame.blocks)) build(container, frame.blocks, 0);
    else plain(container, String(frame.text ?? ""));
  }

  return { body };
})();
