// botgw console: the one script (served from 'self', as the Content-Security-Policy allows). The pages work
// without it; it adds what needs a script: changes sent with the CSRF header, confirmation of destructive
// changes, live refresh of [data-refresh] parts. Pages' own behaviour hangs on data- attributes.
"use strict";
(function () {
  const csrf = () => (document.querySelector('meta[name="csrf-token"]') || {}).content || "";

  // fetch with the session's CSRF token on every change; JSON in and out.
  window.consoleFetch = async function (url, options) {
    options = options || {};
    const headers = Object.assign({ "X-CSRF-Token": csrf(), "Accept": "application/json" }, options.headers || {});
    const response = await fetch(url, Object.assign({}, options, { headers, credentials: "same-origin" }));
    let body = null;
    try { body = await response.json(); } catch (e) { body = null; }
    return { ok: response.ok, status: response.status, body };
  };

  // <form data-confirm="…">: asked before it is sent.
  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) event.preventDefault();
  });

  // <x data-refresh="url" data-every="5">: its inner HTML replaced by the url's answer (an HTML fragment).
  function refresh(node) {
    const every = Math.max(2, parseInt(node.dataset.every || "5", 10)) * 1000;
    const tick = async () => {
      try {
        const response = await fetch(node.dataset.refresh, { credentials: "same-origin", headers: { "Accept": "application/x-console-fragment" } });
        if (response.status === 401) { window.location.reload(); return; }
        if (response.ok) {
          node.innerHTML = await response.text();
          node.dataset.updated = String(Date.now());
        }
      } catch (e) { /* the next tick tries again */ }
      setTimeout(tick, every);
    };
    setTimeout(tick, every);
  }
  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("[data-refresh]").forEach(refresh);
    // <input type=checkbox data-check-all="name">: ticks every box of that name.
    document.querySelectorAll("[data-check-all]").forEach((box) => box.addEventListener("change", () => {
      document.querySelectorAll(`input[name="${box.dataset.checkAll}"]`).forEach((other) => { other.checked = box.checked; });
    }));
  });
})();
