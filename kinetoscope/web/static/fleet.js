/* kscope serve, Fleet and job pages: draws the Plotly charts from the page's embedded JSON
   (<script type="application/json" id="fleet-charts">) with the bundled plotly.js; no network.
   A click on a bar or a line opens that job's page (same-site paths only). */
(function () {
  "use strict";
  var el = document.getElementById("fleet-charts");
  if (!el) { return; }
  var charts = JSON.parse(el.textContent) || {};
  var config = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["sendDataToCloud"] };
  var drawn = 0;
  Object.keys(charts).forEach(function (id) {
    var div = document.getElementById(id);
    if (!div) { return; }
    var c = charts[id];
    if (typeof Plotly === "undefined") {
      div.textContent = "This chart needs JavaScript (Plotly did not load).";
      return;
    }
    var layout = c.figure.layout || {};
    layout.height = c.height;
    Plotly.newPlot(div, c.figure.data || [], layout, config).then(function () {
      div.setAttribute("data-rendered", "1");
    });
    var links = c.links || [];
    div.on("plotly_click", function (ev) {
      var p = ev && ev.points && ev.points[0];
      if (!p) { return; }
      var href = c.link_by === "curve" ? links[p.curveNumber] : links[p.pointNumber];
      if (typeof href === "string" && /^\/[^\/\\]/.test(href)) { window.location.href = href; }
    });
    drawn += 1;
  });
  document.body.setAttribute("data-charts-rendered", String(drawn));
})();
