// Record timestamps in the reader's own time zone: each <time class="ts" data-ms="MS">
// (milliseconds since the epoch) shows its local date and time; the server's UTC text
// stays as the tooltip.
document.querySelectorAll("time.ts").forEach(function (el) {
  var ms = Number(el.getAttribute("data-ms"));
  if (!isFinite(ms) || ms < 0) return;
  var d = new Date(ms);
  var pad = function (n, w) { return String(n).padStart(w || 2, "0"); };
  el.title = el.textContent;
  var offset = -d.getTimezoneOffset();
  var zone = (offset >= 0 ? "+" : "-") + pad(Math.floor(Math.abs(offset) / 60)) + ":" + pad(Math.abs(offset) % 60);
  el.textContent = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
    pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + "." + pad(d.getMilliseconds(), 3) +
    " " + zone;
});
