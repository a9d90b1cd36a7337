// Herald console: optional niceties only; every page works without this file.
// Shows RFC 3339 times in the reader's own time zone (the UTC value stays in the title).
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  for (const el of document.querySelectorAll("time")) {
    const text = el.textContent.trim();
    const when = new Date(text);
    if (!text || Number.isNaN(when.getTime())) continue;
    el.setAttribute("datetime", text);
    el.title = text;
    el.textContent = when.toLocaleString();
  }
});
