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
