// MWCharts: ECharts options from plain point arrays, for the dashboard and the HTML report.
// Usage: import { line, heatmap } from "./charts.js";
//        const c = line(el, {title, series: [{name, points: [[x, y], ...]}], alerts, x: "step"});
//        c.update({series}); heatmap(el, {layers, steps, values}, {title});
// An ES module that needs the global `echarts` (a classic script loaded first). No network access here:
// callers pass data in, so the report inlines this file (mindwatch/report/html.py) and works offline.

export const PALETTE = ["#5470c6", "#ee6666", "#91cc75", "#fac858", "#73c0de", "#3ba272", "#fc8452", "#9a60b4", "#ea7ccc", "#2f4554"];

/** Exponential moving average like TensorBoard's smoothing (debiased), skipping nulls. */
export function ema(points, weight) {
  if (!weight) return points.map(([x, y]) => [x, y === null ? "-" : y]);  // "-": a gap in the line
  let last = 0, n = 0;
  return points.map(([x, y]) => {
    if (y === null || !Number.isFinite(y)) return [x, "-"];
    last = last * weight + (1 - weight) * y;
    n += 1;
    return [x, last / (1 - Math.pow(weight, n))];
  });
}

export function fmtX(x, kind) {
  if (kind === "time") return new Date(x * 1000).toLocaleTimeString();
  if (kind === "elapsed") return `${(x / 60).toFixed(1)} min`;
  return String(x);
}

/** Text made safe for a tooltip formatter (ECharts renders a formatter's string as HTML). */
export function esc(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

/** A number for an axis or tooltip: 6 significant digits, exponent form when very small or large. */
export function fmtNumber(v) {
  if (v === null || v === undefined) return "";
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(3) : String(Number(v.toPrecision(6)));
}

/** The title every chart has: a name and an optional note under it. */
export function titleOption(text, subtext) {
  return { text, subtext: subtext || "", left: 8, top: 4, textStyle: { fontSize: 13, fontWeight: 600 }, subtextStyle: { fontSize: 11 } };
}

function alertMarks(alerts, metric, kind) {
  const pts = [], lines = [];
  for (const a of alerts || []) {
    const x = kind === "time" ? a.t : a.step;
    if (x === undefined || x === null) continue;
    const label = `${a.rule || "alert"}${a.rank !== undefined ? " r" + a.rank : ""}: ${a.message || ""}`;
    const color = a.severity === "error" ? "#d7263d" : "#f4a259";
    if (metric && a.metric === metric && typeof a.value === "number") {
      pts.push({ coord: [x, a.value], value: "!", name: label, itemStyle: { color } });
    } else if (!metric) {
      lines.push({ xAxis: x, name: label, lineStyle: { color, type: "dashed" } });
    }
  }
  return { pts, lines };
}

/** A solid grey line where each attempt after the first started: [{step, t, attempt}]. */
function restartMarks(restarts, kind) {
  return (restarts || []).filter((r) => (kind === "time" ? r.t : r.step) != null).map((r) => ({
    xAxis: kind === "time" ? r.t : r.step, name: `restart: attempt ${r.attempt}`,
    lineStyle: { color: "#52606d", type: "solid", width: 1.5 }, label: { formatter: `attempt ${r.attempt}` },
  }));
}

/** Fewer finite values than this on an axis: every value sets the range (a percentile of a handful means nothing). */
const ROBUST_MIN_POINTS = 10;

/**
 * The y range that ignores outliers: the 1st to 99th percentile (nearest rank, rounded inwards, so one spike among
 * a hundred points is left out) of the finite values, plus a 10 % margin; computed in log10 on a log axis.
 * Returns {min, max} with only the clipped sides set ({} when nothing lies outside: ECharts' own range then).
 */
export function robustRange(values, log) {
  const v = values.filter((y) => Number.isFinite(y) && (!log || y > 0)).map((y) => (log ? Math.log10(y) : y)).sort((a, b) => a - b);
  if (v.length < ROBUST_MIN_POINTS) return {};
  const lo = v[Math.ceil(0.01 * (v.length - 1))], hi = v[Math.floor(0.99 * (v.length - 1))];
  const margin = 0.1 * (hi - lo || Math.abs(hi) || 1);
  const out = {};
  if (v[0] < lo - margin) out.min = lo - margin;
  if (v[v.length - 1] > hi + margin) out.max = hi + margin;
  if (log) for (const k of Object.keys(out)) out[k] = Math.pow(10, out[k]);
  return out;
}

/** Per y axis: the robust range of the points of its series inside the x window win ([lo, hi] or null). */
function axisRanges(o, nAxes, win) {
  return Array.from({ length: nAxes }, (_, ai) => {
    const ys = [];
    for (const s of o.series) {
      if ((s.yAxisIndex || 0) !== ai) continue;
      for (const [x, y] of s.points) if (y !== null && (!win || (x >= win[0] && x <= win[1]))) ys.push(y);
    }
    return o.robust ? robustRange(ys, o.log) : {};
  });
}

/** The points of s outside range, drawn at the chart's edge: triangles pointing the way the value lies. */
function offScale(s, range, color) {
  const data = [];
  for (const [x, y] of s.points) {
    if (y === null) continue;
    if (range.max !== undefined && y > range.max) data.push({ value: [x, range.max, y], symbol: "triangle" });
    else if (range.min !== undefined && y < range.min) data.push({ value: [x, range.min, y], symbol: "triangle", symbolRotate: 180 });
  }
  if (!data.length) return null;
  return { name: `${s.name} off scale`, type: "scatter", data, symbolSize: 9, itemStyle: { color }, yAxisIndex: s.yAxisIndex || 0,
    clip: false, animation: false, z: 5, tooltip: { show: false },
    label: { show: false }, emphasis: { label: { show: true, position: "right", formatter: (p) => `${fmtNumber(p.value[2])} (off scale)` } } };
}

function lineOption(o, win) {
  const series = [];
  const axes = o.axes || [{}];
  const ranges = axisRanges(o, axes.length, win);
  o.series.forEach((s, i) => {
    const color = s.color || PALETTE[i % PALETTE.length];
    const marks = alertMarks(o.alerts, s.metric, o.x);
    const nonfinite = (s.nonfinite || []).slice(0, 50).map(([x, v]) => ({
      xAxis: x, name: `${s.name} = ${v}`, lineStyle: { color: "#d7263d", type: "dotted" }, label: { formatter: v },
    }));
    // alerts of no metric and restarts: once per chart
    const lines = (i === 0 ? marks.lines.concat(restartMarks(o.restarts, o.x)) : []).concat(nonfinite);
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
      markLine: lines.length ? { symbol: "none", silent: false, data: lines, label: { show: nonfinite.length > 0 || (i === 0 && (o.restarts || []).length > 0) } } : undefined,
    });
    const off = offScale(s, ranges[s.yAxisIndex || 0], color);
    if (off) series.push(off);
  });
  return {
    animation: false,
    title: titleOption(o.title, o.subtitle),
    color: PALETTE,
    grid: { left: axes.length > 1 ? 64 : 56, right: axes.length > 1 ? 64 : 16, top: o.subtitle ? 56 : 36, bottom: 56 },
    tooltip: { trigger: "axis", axisPointer: { type: "cross", snap: true }, valueFormatter: (v) => (typeof v === "number" ? (+v.toPrecision(5)).toString() : v) },
    legend: { top: 4, right: 8, type: "scroll", width: "60%", textStyle: { fontSize: 11 },
      data: o.series.map((s) => s.name) },
    xAxis: { type: o.x === "step" || o.x === "elapsed" ? "value" : "time", min: o.xMin, max: o.xMax,
      axisLabel: o.x === "elapsed" ? { formatter: (v) => fmtX(v, "elapsed") } : {}, scale: true },
    yAxis: axes.map((a, i) => ({ type: o.log ? "log" : "value", scale: true, name: a.name, position: i ? "right" : "left",
      min: ranges[i].min, max: ranges[i].max, axisLabel: { formatter: fmtNumber },
      nameLocation: "middle", nameGap: 44, nameTextStyle: { color: "#7b8794" }, splitLine: { show: i === 0 } })),
    dataZoom: [{ type: "inside", filterMode: "none" }, { type: "slider", height: 18, bottom: 8, filterMode: "none" }],
    series,
  };
}

/**
 * A line chart: series [{name, points, nonfinite?: [[x, value]], color?, yAxisIndex?, band?: {lower, upper}}].
 * Options: title, subtitle?, axes?, alerts?, restarts? ([{step, t, attempt}]), x ("step", "time" or "elapsed"), xMin?, xMax?, smoothing, log,
 * robust (default true: the y range ignores outliers, see robustRange; false: every point sets it).
 */
export function line(el, opts) {
  const chart = echarts.init(el, null, { renderer: "canvas" });
  const state = { opts: Object.assign({ x: "step", smoothing: 0, log: false, robust: true, alerts: [] }, opts) };
  chart.setOption(lineOption(state.opts), { notMerge: true });
  return {
    chart,
    update(patch) {
      Object.assign(state.opts, patch);
      const zoom = chart.getOption() && chart.getOption().dataZoom;
      const opt = lineOption(state.opts, zoom && zoom[0] && !(zoom[0].start <= 0 && zoom[0].end >= 100) ? this.window() : null);
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

function heatmapOption(d, opts) {
  // opts.log: colour by log10 of the value (per-layer norms span decades); the tooltip keeps the value itself
  const cells = opts.log ? d.values.map(([x, y, v]) => [x, y, v > 0 ? Math.log10(v) : "-", v]) : d.values;
  const vals = cells.map((v) => v[2]).filter((v) => typeof v === "number");
  return {
    animation: false,
    title: titleOption(opts.title || "attention entropy per layer", opts.subtitle),
    tooltip: { formatter: (p) => `${esc(d.layers[p.value[1]])} @ step ~${d.steps[p.value[0]]}: ${fmtNumber(p.value[opts.log ? 3 : 2])}` },
    grid: { left: 140, right: 100, top: opts.subtitle ? 56 : 36, bottom: 40 },
    xAxis: { type: "category", data: d.steps, name: "step" },
    yAxis: { type: "category", data: d.layers, axisLabel: { width: 130, overflow: "truncate" } },
    visualMap: { min: vals.length ? Math.min(...vals) : 0, max: vals.length ? Math.max(...vals) : 1, calculable: true,
      orient: "vertical", right: 4, top: 36, itemHeight: 120, precision: opts.log ? 1 : 3, dimension: 2,
      formatter: opts.log ? (v) => `1e${(+v).toFixed(1)}` : undefined,
      inRange: { color: ["#313695", "#4575b4", "#abd9e9", "#fee090", "#f46d43", "#a50026"] } },
    series: [{ type: "heatmap", data: cells, progressive: 0 }],
  };
}

/**
 * A heat map of per-layer values over step buckets: {layers, steps, values: [[bucket, layer, v], ...]};
 * opts {title, subtitle?, log?} (log: colour on a log scale).
 */
export function heatmap(el, data, opts) {
  const chart = echarts.init(el, null, { renderer: "canvas" });
  let shown = opts || {};
  chart.setOption(heatmapOption(data, shown), { notMerge: true });
  return {
    chart,
    update(d, newOpts) { shown = newOpts || shown; chart.setOption(heatmapOption(d, shown), { notMerge: true }); },
    resize() { chart.resize(); },
    dispose() { chart.dispose(); },
  };
}
