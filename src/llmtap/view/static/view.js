// llmtap view: live updates (server-sent events) and keyboard navigation. No inline scripts:
// the Content-Security-Policy allows only this file. Markup comes from the server, escaped there.
"use strict";
(function () {
  const body = document.body;

  function replaceLive(html) {
    const parsed = new DOMParser().parseFromString(html, "text/html");
    const target = document.getElementById("live");
    if (!target) return;
    const selected = document.querySelector("tr.selected");
    const selectedHref = selected ? selected.dataset.href : null;
    target.replaceChildren(...parsed.body.childNodes);
    if (selectedHref) {
      const again = document.querySelector(`tr[data-href="${CSS.escape(selectedHref)}"]`);
      if (again) again.classList.add("selected");
    }
    document.dispatchEvent(new CustomEvent("llmtap:updated"));
  }

  function startLive() {
    const events = body.dataset.live;
    const fragment = body.dataset.fragment;
    if (!events || !fragment || !window.EventSource) return;
    const state = document.getElementById("live-state");
    const source = new EventSource(events);
    let pending = false;
    source.addEventListener("open", () => { if (state) state.hidden = false; });
    source.addEventListener("error", () => { if (state) state.hidden = true; });
    source.addEventListener("changed", async () => {
      if (pending) return;
      pending = true;
      try {
        const response = await fetch(fragment + window.location.search, { credentials: "same-origin" });
        if (response.ok) replaceLive(await response.text());
      } finally {
        pending = false;
      }
    });
  }

  function rowKeys(event) {
    const rows = Array.from(document.querySelectorAll("tr[data-href]"));
    if (!rows.length) return;
    let at = rows.findIndex((row) => row.classList.contains("selected"));
    if (event.key === "j" || event.key === "k") {
      if (at >= 0) rows[at].classList.remove("selected");
      at = event.key === "j" ? Math.min(rows.length - 1, at + 1) : Math.max(0, at - 1);
      rows[at].classList.add("selected");
      rows[at].scrollIntoView({ block: "nearest" });
    } else if (event.key === "Enter" && at >= 0) {
      window.location.assign(rows[at].dataset.href);
    }
  }

  function callKeys(event) {
    const target = event.key === "j" ? body.dataset.next : event.key === "k" ? body.dataset.prev : null;
    if (target) window.location.assign(target);
  }

  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const tag = (event.target && event.target.tagName) || "";
    if (tag === "INPUT" || tag === "SELECT" || tag === "TEXTAREA") return;
    if (body.dataset.keys === "call") callKeys(event);
    else if (body.dataset.keys === "rows") rowKeys(event);
  });

  document.addEventListener("click", (event) => {
    const toggle = event.target.closest && event.target.closest(".fold-toggle");
    if (toggle) {
      // A run of unchanged calls on the compare page: its rows are the next tbody, hidden until asked for.
      const folded = toggle.closest("tbody").nextElementSibling;
      const open = toggle.getAttribute("aria-expanded") !== "true";
      toggle.setAttribute("aria-expanded", String(open));
      toggle.textContent = (open ? "▾" : "▸") + toggle.textContent.slice(1);
      if (folded) folded.hidden = !open;
      return;
    }
    const row = event.target.closest && event.target.closest("tr[data-href]");
    if (row && !event.target.closest("a")) window.location.assign(row.dataset.href);
  });

  startLive();
})();
