// Herald console: optional niceties only; every page works without this file.
// A time reads relative to the page ("3 min ago") with its exact UTC time in the title;
// this adds the reader's own time zone to that title, leaving the text as it is.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  for (const el of document.querySelectorAll("time[datetime]")) {
    const exact = el.getAttribute("datetime");
    const when = new Date(exact);
    if (Number.isNaN(when.getTime())) continue;
    el.title = `${when.toLocaleString()} (${exact})`;
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
