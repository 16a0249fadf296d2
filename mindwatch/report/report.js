// Draws the report's charts from the JSON embedded in the page (ECharts is inlined above).
// window.mindwatchReport = {ready, charts, errors} lets tests and the PDF printer know when it is done.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("mindwatch-data").textContent);
  var charts = [];
  var errors = [];
  var SEV_COLORS = { error: "#c62828", warning: "#e09100", info: "#1e88e5" };

  function make(el, option) {
    try {
      var chart = echarts.init(el, null, { renderer: "canvas" });
      option.animation = false;
      chart.setOption(option);
      charts.push(chart);
    } catch (e) {
      errors.push(String(e));
      el.textContent = "chart failed: " + e;
    }
  }

  function chartDiv(parent, id, wide) {
    var div = document.createElement("div");
    div.className = wide ? "chart wide" : "chart";
    div.id = id;
    parent.appendChild(div);
    return div;
  }

  function title(text, sub) {
    return { text: text, subtext: sub || "", left: 10, top: 6, textStyle: { fontSize: 13 }, subtextStyle: { fontSize: 11 } };
  }

  function esc(text) {
    return String(text).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }

  function fmt(v) {
    if (v === null || v === undefined) return "";
    var a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(3) : String(Number(v.toPrecision(6)));
  }

  // -- one chart per metric ------------------------------------------------------------------
  var curves = document.getElementById("curves");
  DATA.metrics.forEach(function (m, i) {
    var series = m.series.map(function (s) {
      var out = {
        name: s.label, type: "line", data: s.data, showSymbol: s.data.length <= 60, symbolSize: 4,
        lineStyle: { width: 1.3 }, connectNulls: false, emphasis: { disabled: true }
      };
      if (s.nonfinite && s.nonfinite.length) {
        out.markLine = {
          symbol: "none", silent: true, lineStyle: { color: "#c62828", type: "dashed" },
          label: { formatter: "non-finite from step " + s.nonfinite[0], color: "#c62828", fontSize: 10 },
          data: [{ xAxis: s.nonfinite[0] }]
        };
      }
      return out;
    });
    var sub = m.points_note || "";
    make(chartDiv(curves, "chart-metric-" + i), {
      title: title(m.name, sub),
      tooltip: { trigger: "axis", valueFormatter: fmt },
      legend: series.length > 1 ? { type: "scroll", right: 10, top: 6, width: "45%" } : undefined,
      grid: { left: 64, right: 24, top: sub ? 58 : 44, bottom: 36 },
      xAxis: { type: "value", name: "step", nameLocation: "end", nameGap: 4,
               min: DATA.step_range ? DATA.step_range[0] : "dataMin", max: DATA.step_range ? DATA.step_range[1] : "dataMax" },
      yAxis: { type: m.log ? "log" : "value", scale: true, axisLabel: { formatter: fmt } },
      dataZoom: [{ type: "inside" }],
      series: series
    });
  });

  // -- gradient-norm histogram ------------------------------------------------------------------
  var dist = document.getElementById("distributions");
  if (DATA.histogram) {
    var h = DATA.histogram;
    make(chartDiv(dist, "chart-grad-norm-histogram", false), {
      title: title("grad_norm distribution", h.note),
      tooltip: { trigger: "axis" },
      legend: h.series.length > 1 ? { right: 10, top: 6 } : undefined,
      grid: { left: 56, right: 24, top: 58, bottom: 56 },
      xAxis: { type: "category", data: h.labels, name: h.log ? "grad_norm (log bins)" : "grad_norm", nameLocation: "middle", nameGap: 40,
               axisLabel: { rotate: 40, fontSize: 10 } },
      yAxis: { type: "value", name: "steps" },
      series: h.series.map(function (s) { return { name: s.label, type: "bar", data: s.counts, barGap: "5%", barCategoryGap: "10%" }; })
    });
  }

  // -- attention-entropy heat map ---------------------------------------------------------------
  if (DATA.heatmap) {
    var hm = DATA.heatmap;
    make(chartDiv(dist, "chart-attention-entropy", false), {
      title: title("attention entropy (nats) per layer", hm.note),
      tooltip: { position: "top", formatter: function (p) { return esc(hm.layers[p.value[1]]) + " @ step " + hm.steps[p.value[0]] + ": " + fmt(p.value[2]); } },
      grid: { left: 150, right: 24, top: 58, bottom: 72 },
      xAxis: { type: "category", data: hm.steps, name: "step", splitArea: { show: true } },
      yAxis: { type: "category", data: hm.layers, axisLabel: { fontSize: 10, width: 140, overflow: "truncate" } },
      visualMap: { min: hm.min, max: hm.max, calculable: true, orient: "horizontal", left: "center", bottom: 4, itemHeight: 120,
                   inRange: { color: ["#313695", "#4575b4", "#abd9e9", "#fee090", "#f46d43", "#a50026"] } },
      series: [{ type: "heatmap", data: hm.data, emphasis: { disabled: true } }]
    });
  }

  // -- alerts timeline -------------------------------------------------------------------------
  if (DATA.alerts && DATA.alerts.series.length) {
    var al = DATA.alerts;
    make(chartDiv(document.getElementById("alerts-chart"), "chart-alerts", true), {
      title: title("alerts", al.note),
      tooltip: { trigger: "item", formatter: function (p) { return p.data.tip; } },
      legend: { right: 10, top: 6 },
      grid: { left: 80, right: 24, top: 50, bottom: 36 },
      xAxis: { type: "value", name: "step", min: al.min_step, max: al.max_step },
      yAxis: { type: "category", data: al.severities },
      series: al.series.map(function (s) {
        return { name: s.label, type: "scatter", symbolSize: 11, symbol: s.symbol, data: s.points.map(function (p) {
          return { value: [p.step, p.severity], tip: p.tip, itemStyle: { color: SEV_COLORS[p.severity] || "#777" } };
        }) };
      })
    });
  }

  function resizeAll() { charts.forEach(function (c) { c.resize(); }); }
  window.addEventListener("resize", resizeAll);
  window.addEventListener("beforeprint", resizeAll);
  window.mindwatchReport = { ready: true, charts: charts.length, errors: errors };
})();
