// Chart building for mindwatch (dashboard and reports): ECharts options from plain point arrays.
// Usage: const c = MWCharts.line(el, {title, series: [{name, points: [[x, y], ...]}], alerts, x: "step"});
//        c.update({series}); MWCharts.heatmap(el, {layers, steps, values});
// No network access here: callers pass data in, so the HTML report can reuse this file offline.
(function (global) {
  "use strict";
  const PALETTE = ["#5470c6", "#ee6666", "#91cc75", "#fac858", "#73c0de", "#3ba272", "#fc8452", "#9a60b4", "#ea7ccc", "#2f4554"];

  /** Exponential moving average like TensorBoard's smoothing (debiased), skipping nulls. */
  function ema(points, weight) {
    if (!weight) return points.map(([x, y]) => [x, y === null ? "-" : y]);  // "-": a gap in the line
    let last = 0, n = 0;
    return points.map(([x, y]) => {
      if (y === null || !Number.isFinite(y)) return [x, "-"];
      last = last * weight + (1 - weight) * y;
      n += 1;
      return [x, last / (1 - Math.pow(weight, n))];
    });
  }

  function fmtX(x, kind) {
    if (kind === "time") return new Date(x * 1000).toLocaleTimeString();
    if (kind === "elapsed") return `${(x / 60).toFixed(1)} min`;
    return String(x);
  }

  function alertMarks(alerts, metric, kind) {
    const pts = [], lines = [];
    for (const a of alerts || []) {
      const x = kind === "time" ? a.t : a.step;
      if (x === undefined || x === null) continue;
      const label = `${a.rule || "alert"}${a.rank !== undefined ? " r" + a.rank : ""}: ${a.message || ""}`;
      const color = a.severity === "critical" || a.severity === "error" ? "#d7263d" : "#f4a259";
      if (metric && a.metric === metric && typeof a.value === "number") {
        pts.push({ coord: [x, a.value], value: "!", name: label, itemStyle: { color } });
      } else if (!metric) {
        lines.push({ xAxis: x, name: label, lineStyle: { color, type: "dashed" } });
      }
    }
    return { pts, lines };
  }

  /** A line chart: series [{name, points, color?, yAxisIndex?, band?: {lower, upper}}]. */
  function line(el, opts) {
    const chart = global.echarts.init(el, null, { renderer: "canvas" });
    const state = { opts: Object.assign({ x: "step", smoothing: 0, log: false, alerts: [] }, opts) };
    function build() {
      const o = state.opts;
      const series = [];
      const axes = o.axes || [{}];
      o.series.forEach((s, i) => {
        const color = s.color || PALETTE[i % PALETTE.length];
        const marks = alertMarks(o.alerts, s.metric, o.x);
        const nonfinite = (s.nonfinite || []).slice(0, 50).map(([x, v]) => ({
          xAxis: x, name: `${s.name} = ${v}`, lineStyle: { color: "#d7263d", type: "dotted" }, label: { formatter: v },
        }));
        if (s.band && s.band.lower.length) {
          series.push({ name: `${s.name} min`, type: "line", data: s.band.lower, showSymbol: false, lineStyle: { opacity: 0 },
            stack: `band${i}`, silent: true, yAxisIndex: s.yAxisIndex || 0, tooltip: { show: false } });
          series.push({ name: `${s.name} range`, type: "line", data: s.band.upper, showSymbol: false, lineStyle: { opacity: 0 },
            areaStyle: { color, opacity: 0.15 }, stack: `band${i}`, silent: true, yAxisIndex: s.yAxisIndex || 0 });
        }
        series.push({
          name: s.name, type: "line", showSymbol: false, sampling: undefined, connectNulls: false, animation: false,
          yAxisIndex: s.yAxisIndex || 0, data: ema(s.points, o.smoothing),
          lineStyle: { width: s.width || 1.5, color, opacity: s.opacity || 1 }, itemStyle: { color },
          markPoint: marks.pts.length ? { symbol: "pin", symbolSize: 28, data: marks.pts, label: { color: "#fff" } } : undefined,
          markLine: (marks.lines.length || nonfinite.length) && i === 0
            ? { symbol: "none", silent: false, data: marks.lines.concat(nonfinite), label: { show: nonfinite.length > 0 } } : undefined,
        });
      });
      return {
        animation: false,
        title: { text: o.title, left: 8, top: 4, textStyle: { fontSize: 13, fontWeight: 600 } },
        color: PALETTE,
        grid: { left: axes.length > 1 ? 64 : 56, right: axes.length > 1 ? 64 : 16, top: 36, bottom: 56 },
        tooltip: { trigger: "axis", axisPointer: { type: "cross", snap: true }, valueFormatter: (v) => (typeof v === "number" ? (+v.toPrecision(5)).toString() : v) },
        legend: { top: 4, right: 8, type: "scroll", width: "60%", textStyle: { fontSize: 11 },
          data: o.series.map((s) => s.name) },
        xAxis: { type: o.x === "step" || o.x === "elapsed" ? "value" : "time", min: o.xMin, max: o.xMax,
          axisLabel: o.x === "elapsed" ? { formatter: (v) => fmtX(v, "elapsed") } : {}, scale: true },
        yAxis: axes.map((a, i) => ({ type: o.log ? "log" : "value", scale: true, name: a.name, position: i ? "right" : "left",
          nameLocation: "middle", nameGap: 44, nameTextStyle: { color: "#7b8794" }, splitLine: { show: i === 0 } })),
        dataZoom: [{ type: "inside", filterMode: "none" }, { type: "slider", height: 18, bottom: 8, filterMode: "none" }],
        series,
      };
    }
    chart.setOption(build(), { notMerge: true });
    return {
      chart,
      update(patch) {
        Object.assign(state.opts, patch);
        const zoom = chart.getOption() && chart.getOption().dataZoom;
        const opt = build();
        if (zoom && zoom[0]) opt.dataZoom = opt.dataZoom.map((z, i) => Object.assign(z, { start: zoom[i].start, end: zoom[i].end }));
        chart.setOption(opt, { notMerge: true, lazyUpdate: true });
      },
      /** The x window shown, in data units, or null when the whole range is shown. */
      window() {
        const z = chart.getOption().dataZoom[0];
        if (!z || (z.start <= 0 && z.end >= 100)) return null;
        const axis = chart.getModel().getComponent("xAxis", 0).axis;
        const [lo, hi] = axis.scale.getExtent();
        return [lo, hi];
      },
      get opts() { return state.opts; },
      resize() { chart.resize(); },
      dispose() { chart.dispose(); },
    };
  }

  /** A heat map of per-layer values over step buckets: {layers, steps, values: [[bucket, layer, v], ...]}. */
  function heatmap(el, data, title) {
    const chart = global.echarts.init(el, null, { renderer: "canvas" });
    function build(d) {
      const vals = d.values.map((v) => v[2]);
      return {
        animation: false,
        title: { text: title || "attention entropy per layer", left: 8, top: 4, textStyle: { fontSize: 13, fontWeight: 600 } },
        tooltip: { formatter: (p) => `${d.layers[p.value[1]]} @ step ~${d.steps[p.value[0]]}: ${p.value[2]}` },
        grid: { left: 140, right: 100, top: 36, bottom: 40 },
        xAxis: { type: "category", data: d.steps, name: "step" },
        yAxis: { type: "category", data: d.layers },
        visualMap: { min: vals.length ? Math.min(...vals) : 0, max: vals.length ? Math.max(...vals) : 1, calculable: true,
          orient: "vertical", right: 4, top: 36, itemHeight: 120, precision: 3,
          inRange: { color: ["#313695", "#4575b4", "#abd9e9", "#fee090", "#f46d43", "#a50026"] } },
        series: [{ type: "heatmap", data: d.values, progressive: 0 }],
      };
    }
    chart.setOption(build(data), { notMerge: true });
    return { chart, update(d) { chart.setOption(build(d), { notMerge: true }); }, resize() { chart.resize(); }, dispose() { chart.dispose(); } };
  }

  global.MWCharts = { line, heatmap, ema, fmtX, PALETTE };
})(window);
