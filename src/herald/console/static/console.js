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
// "Copy as curl": the command is in a <pre> for everyone; with a clipboard, a button copies it.
document.addEventListener("DOMContentLoaded", () => {
  if (!navigator.clipboard) return;
  for (const button of document.querySelectorAll("button.copy[data-copy]")) {
    const source = document.getElementById(button.dataset.copy);
    if (!source) continue;
    button.hidden = false;
    button.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(source.textContent);
        button.textContent = "Copied";
      } catch {
        button.textContent = "Copy failed: select the text above";
      }
    });
  }
});
