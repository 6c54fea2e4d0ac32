// parley admin pages: what the session inspector (inspector.js) and the web chat (chat.js)
// share. Plain ES2020, no dependencies; loaded before the page script and exposing one
// global, `parley`. Page scripts take what they use from it (`const { $, el } = parley;`).
//
// Both pages expect the same markup: #error-banner (.banner-text, .banner-close),
// #token-form (#token-hint, #token-input) and #forget-token.
"use strict";

const parley = (() => {
  /** sessionStorage key of the bearer token; one tab, both pages. */
  const TOKEN_KEY = "parley.token";

  const $ = (selector) => document.querySelector(selector);

  /**
   * Create an element. Attributes: class, text, dataset, title…; children: nodes or strings.
   * Untrusted text only ever goes through textContent / text nodes, never innerHTML.
   */
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = String(value);
      else if (key === "dataset") Object.assign(node.dataset, value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  // ---------------------------------------------------------------- error banner

  function showError(message) {
    const banner = $("#error-banner");
    banner.querySelector(".banner-text").textContent = message;
    banner.hidden = false;
  }

  function hideError() {
    $("#error-banner").hidden = true;
  }

  // ---------------------------------------------------------------- token

  /** The token kept for this tab, or null. */
  const storedToken = () => sessionStorage.getItem(TOKEN_KEY);

  /** Take a token handed over in the fragment (#token=…) and drop it from the address bar. */
  function adoptTokenFromFragment() {
    const match = /^#token=([^&]+)/.exec(location.hash);
    if (!match) return;
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }

  /**
   * Forget the stored token and show the token form, with `reason` as a hint when given.
   * The page hides its own content and drops its in-memory copy of the token first.
   */
  function showTokenForm(reason) {
    sessionStorage.removeItem(TOKEN_KEY);
    const hint = $("#token-hint");
    hint.textContent = reason || "";
    hint.hidden = !reason;
    $("#token-form").hidden = false;
    const input = $("#token-input");
    input.value = "";
    input.focus();
  }

  function hideTokenForm() {
    $("#token-form").hidden = true;
  }

  /**
   * Wire what both pages share: adopt a #token= fragment, store the token the form submits
   * and call `onToken`, call `onForget` for #forget-token, dismiss the error banner.
   */
  function initToken({ onToken, onForget }) {
    adoptTokenFromFragment();
    $("#token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const value = $("#token-input").value.trim();
      if (!value) return;
      sessionStorage.setItem(TOKEN_KEY, value);
      hideError();
      onToken();
    });
    $("#forget-token").addEventListener("click", () => onForget());
    $("#error-banner .banner-close").addEventListener("click", hideError);
  }

  return Object.freeze({
    TOKEN_KEY,
    $,
    el,
    showError,
    hideError,
    storedToken,
    adoptTokenFromFragment,
    showTokenForm,
    hideTokenForm,
    initToken,
  });
})();
