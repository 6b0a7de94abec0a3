/* kscope serve: progress of a background task, polled from /api/tasks/{id}. Values are put in
   the page with textContent only (never parsed as HTML). */
(function () {
  "use strict";
  var root = document.getElementById("task");
  if (!root) { return; }
  var id = root.getAttribute("data-task-id");
  function setText(elId, v) {
    var e = document.getElementById(elId);
    if (e) { e.textContent = v === null || v === undefined ? "" : String(v); }
  }
  function clear(e) { while (e.firstChild) { e.removeChild(e.firstChild); } }
  function list(elId, items) {
    var ul = document.getElementById(elId);
    if (!ul) { return; }
    var box = document.getElementById(elId + "-box");  // heading + list, hidden while empty
    if (box) { box.hidden = !(items && items.length); }
    clear(ul);
    (items || []).forEach(function (s) {
      var li = document.createElement("li");
      li.textContent = String(s);
      ul.appendChild(li);
    });
  }
  function humanBytes(n) {  // as fmt_bytes in kinetoscope/report/sections.py
    if (n === null || n === undefined || isNaN(n)) { return "–"; }
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], v = Number(n), i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return i === 0 ? v.toFixed(0) + " B" : v.toFixed(1) + " " + units[i];
  }
  function link(elId, href) {
    var a = document.getElementById(elId);
    if (!a) { return; }
    if (typeof href === "string" && /^\/[^\/\\]/.test(href)) {  // same-site paths only
      a.setAttribute("href", href);
      a.hidden = false;
    } else {
      a.hidden = true;
    }
  }
  function render(t) {
    root.setAttribute("data-state", t.state);
    var st = document.getElementById("task-state");
    if (st) { st.className = "badge s-" + String(t.state).replace(/[^a-z]/g, ""); }
    setText("task-state", t.state);
    setText("task-phase", t.phase);
    setText("task-message", t.message);
    var tb = document.getElementById("task-files");
    if (tb) {
      clear(tb);
      (t.files || []).forEach(function (f) {
        var tr = document.createElement("tr");
        [f.rank === null ? "–" : f.rank, f.host, f.pid, f.file, humanBytes(f.bytes),
         f.delivered ? "yes" : "no", f.complete ? "yes" : "no"].forEach(function (v, i) {
          var td = document.createElement("td");
          td.textContent = String(v);
          if (i === 4) { td.className = "num"; td.title = f.bytes === null ? "" : f.bytes + " bytes"; }
          tr.appendChild(td);
        });
        tb.appendChild(tr);
      });
    }
    list("task-errors", t.errors);
    list("task-notes", t.notes);
    setText("task-log", (t.log || []).join("\n"));
    var links = t.links || {};
    link("link-trace", links.trace);
    link("link-analysis", links.analysis);
    link("link-report", links.report);
  }
  function poll() {
    fetch("/api/tasks/" + encodeURIComponent(id), { headers: { "Accept": "application/json" } })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
      .then(function (d) {
        render(d.task);
        if (!d.task.finished) { setTimeout(poll, 1000); }
      })
      .catch(function () { setTimeout(poll, 2000); });
  }
  if (root.getAttribute("data-state") !== "done" && root.getAttribute("data-state") !== "failed") {
    setTimeout(poll, 500);
  }
})();
