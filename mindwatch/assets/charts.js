// MWCharts: ECharts options from plain point arrays, for the dashboard and the HTML report.
// Usage: import { line, heatmap } from "./charts.js";
//        const c = line(el, {title, series: [{name, points: [[x, y], ...]}], alerts, x: "step"});
//        c.update({series}); heatmap(el, {layers, steps, values}, {title});
//        expertLoad(el, {layers: ["blocks.0.moe/0", ...], steps, values}, {title, slider}); // experts x MoE layers at a step
// An ES module that needs the global `echarts` (a classic script loaded first). No network access here:
// callers pass data in, so the report inlines this file (mindwatch/report/html.py) and works offline.

export const PALETTE = [
  "#5470c6",
  "#ee6666",
  "#91cc75",
  "#fac858",
  "#73c0de",
  "#3ba272",
  "#fc8452",
  "#9a60b4",
  "#ea7ccc",
  "#2f4554",
];

/** Exponential moving average like TensorBoard's smoothing (debiased), skipping nulls. */
export function ema(points, weight) {
  if (!weight) return points.map(([x, y]) => [x, y === null ? "-" : y]); // "-": a gap in the line
  let last = 0,
    n = 0;
  return points.map(([x, y]) => {
    if (y === null || !Number.isFinite(y)) return [x, "-"];
    last = last * weight + (1 - weight) * y;
    n += 1;
    return [x, last / (1 - Math.pow(weight, n))];
  });
}

/** Python's round(): to the nearest integer, a tie to the even one. */
function roundHalfEven(x) {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** Python's f"{x:.1f}": a tie (an exact x.x5: in binary only a quarter is one) goes to the even tenth, where toFixed
 * takes the larger. */
function fixed1(x) {
  if (!Number.isInteger(x * 4) || Number.isInteger(x * 2)) return x.toFixed(1);
  const tenths = Math.floor(Math.abs(x) * 10);
  return `${x < 0 ? "-" : ""}${((tenths % 2 === 0 ? tenths : tenths + 1) / 10).toFixed(1)}`;
}

/**
 * A duration as a person reads it, wherever they look: mindwatch.units.format_duration's rule, "1h 02m 03s", "1m 23s",
 * "4.3 s"; "-" when unknown (tests/test_dashboard_vocabulary_browser.py holds the two to the same text).
 */
export function formatDuration(secs) {
  if (secs === null || secs === undefined || !Number.isFinite(secs)) return "-";
  const whole = roundHalfEven(secs),
    h = Math.floor(whole / 3600),
    rem = whole - h * 3600;
  const m = Math.floor(rem / 60),
    s = rem - m * 60;
  const pad = (n) => String(n).padStart(2, "0");
  return h ? `${h}h ${pad(m)}m ${pad(s)}s` : m ? `${m}m ${pad(s)}s` : `${fixed1(secs)} s`;
}

/** A tick of the elapsed axis, a clock's: "4:05" (long: "1:04:05"), as the axis's name says ("elapsed (m:ss)"). */
function clockTick(secs, long) {
  const a = Math.round(Math.abs(secs)),
    sign = secs < 0 ? "-" : "";
  const pad = (n) => String(n).padStart(2, "0");
  const hh = Math.floor(a / 3600),
    mm = Math.floor((a % 3600) / 60),
    ss = a % 60;
  return long || hh ? `${sign}${hh}:${pad(mm)}:${pad(ss)}` : `${sign}${mm}:${pad(ss)}`;
}

/** An x value as a tooltip reads it: a step, a wall-clock time (x in ms on the time axis), or a place on the elapsed axis. */
export function fmtX(x, kind) {
  if (kind === "time") return new Date(x).toLocaleString();
  if (kind === "elapsed") return clockTick(x, Math.abs(x) >= 3600);
  return Number.isInteger(x) ? String(x) : String(Number(x.toPrecision(6)));
}

/** Text made safe for a tooltip formatter (ECharts renders a formatter's string as HTML). */
export function esc(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

/** A number for an axis or tooltip: 6 significant digits, or 4 in exponent form when very small or large. */
export function fmtNumber(v) {
  if (v === null || v === undefined) return "";
  const a = Math.abs(v);
  // 4 significant digits in exponent form, trailing zeros dropped as in the plain form (1.7e-4, not 1.700e-4)
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? Number(v.toPrecision(4)).toExponential() : String(Number(v.toPrecision(6)));
}

/** The title every chart has: a name and an optional note under it. */
export function titleOption(text, subtext) {
  return {
    text,
    subtext: subtext || "",
    left: 8,
    top: 4,
    textStyle: { fontSize: 13, fontWeight: 600 },
    subtextStyle: { fontSize: 11 },
  };
}

/** The x a chart draws for a data x: milliseconds on the time axis (the data holds epoch seconds), seconds since
 * xOrigin on an elapsed axis, the step itself on a step axis; and back. */
function xScale(o) {
  if (o.x === "time") return { to: (x) => x * 1000, from: (v) => v / 1000 };
  if (o.x === "elapsed") {
    const t0 = o.xOrigin || 0;
    return { to: (x) => x - t0, from: (v) => v + t0 };
  }
  return { to: (x) => x, from: (v) => v };
}

/** An alert severity's colour: the page's ``--sev-<severity>`` variable (mindwatch/analysis/state_colours.py, in the
 * page's style: the dashboard's vocabulary, the report's template); grey where the page has none. */
export function severityColour(severity) {
  const v = getComputedStyle(document.documentElement)
    .getPropertyValue(`--sev-${severity || "warning"}`)
    .trim();
  return v || "#777";
}

function alertMarks(alerts, metric, o, px) {
  const pts = [],
    lines = [];
  for (const a of alerts || []) {
    const x = o.x === "step" ? a.step : a.t;
    if (x === undefined || x === null) continue;
    const label = `${a.rule || "alert"}${a.rank !== undefined ? " r" + a.rank : ""}: ${a.message || ""}`;
    const color = severityColour(a.severity);
    if (metric && a.metric === metric && typeof a.value === "number") {
      pts.push({ coord: [px(x), a.value], value: "!", name: label, itemStyle: { color } });
    } else if (!metric) {
      lines.push({ xAxis: px(x), name: label, lineStyle: { color, type: "dashed" } });
    }
  }
  return { pts, lines };
}

/** A solid grey line where each attempt after the first started: [{step, t, attempt}]. */
function restartMarks(restarts, o, px) {
  const at = (r) => (o.x === "step" ? r.step : r.t);
  return (restarts || [])
    .filter((r) => at(r) != null)
    .map((r) => ({
      xAxis: px(at(r)),
      name: `restart: attempt ${r.attempt}`,
      lineStyle: { color: "#52606d", type: "solid", width: 1.5 },
      label: { formatter: `attempt ${r.attempt}` },
    }));
}

/** Events marked with their name beside them up to this many on a chart; past it, the lines alone (the names would overprint). */
const NAMED_EVENTS = 20;
/** At most this many events are marked on a chart. */
const MAX_EVENTS = 500;
const EVENT_COLOR = "#9a60b4";

/** A dashed line at each x an event happened, named by its event (a step skip_steps skipped):
 * [{name, xs, color?}]. */
function eventMarks(events, o, px) {
  const all = (events || []).flatMap((e) => e.xs.map((x) => ({ e, x }))).slice(0, MAX_EVENTS);
  const named = all.length <= NAMED_EVENTS;
  return all.map(({ e, x }) => ({
    xAxis: px(x),
    name: `${e.name} at ${o.x === "step" ? "step " : ""}${fmtX(px(x), o.x)}`,
    lineStyle: { color: e.color || EVENT_COLOR, type: "dashed", width: 1.5 },
    label: { show: named, formatter: e.name, color: e.color || EVENT_COLOR },
    emphasis: { label: { show: true } },
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
  const v = values
    .filter((y) => Number.isFinite(y) && (!log || y > 0))
    .map((y) => (log ? Math.log10(y) : y))
    .sort((a, b) => a - b);
  if (v.length < ROBUST_MIN_POINTS) return {};
  const lo = v[Math.ceil(0.01 * (v.length - 1))],
    hi = v[Math.floor(0.99 * (v.length - 1))];
  const margin = 0.1 * (hi - lo || Math.abs(hi) || 1);
  const out = {};
  if (v[0] < lo - margin) out.min = lo - margin;
  if (v[v.length - 1] > hi + margin) out.max = hi + margin;
  if (log) for (const k of Object.keys(out)) out[k] = Math.pow(10, out[k]);
  return out;
}

/** Ticks a person reads: 1, 2, 2.5 or 5 times a power of ten, about `ticks` of them over span. */
export function niceStep(span, ticks = 5) {
  const raw = span / ticks,
    e = Math.floor(Math.log10(raw)),
    f = raw / Math.pow(10, e);
  return [1, 2, 2.5, 5, 10].find((m) => m >= f - 1e-9) * Math.pow(10, e);
}

/** The decimals that write `step` exactly (0.25 -> 2, 5 -> 0). */
function decimalsOf(step) {
  for (let d = 0; d < 15; d++) {
    const x = step * Math.pow(10, d);
    if (x >= 1 - 1e-9 && Math.abs(Math.round(x) - x) < 1e-6 * x) return d;
  }
  return 15;
}

/** One number format for a whole axis (not 5.000e-4 beside 0.001): fixed decimals, or one exponent form. */
export function axisFormat(min, max, step) {
  const m = Math.max(Math.abs(min), Math.abs(max));
  if (m >= 1e5 || (m > 0 && m < 1e-3)) {
    const digits = Math.max(0, Math.min(6, Math.floor(Math.log10(m)) - Math.floor(Math.log10(step))));
    return (v) => (v === 0 ? "0" : v.toExponential(digits));
  }
  const d = decimalsOf(step);
  return (v) => v.toFixed(d);
}

/**
 * A linear y axis over ys: nice bounds on whole ticks (no full-precision edge label over the ticks), the range of
 * robustRange when `robust`, from 0 when `fromZero` and nothing is negative; a flat series (a constant lr, with or
 * without float noise) gets a range around its value, not six identical ticks. {min, max, interval, format, clipped}.
 */
export function linearAxis(ys, { robust = true, fromZero = false } = {}) {
  const v = ys.filter(Number.isFinite);
  if (!v.length) return { clipped: {} };
  let lo = Math.min(...v),
    hi = Math.max(...v);
  const r = robust ? robustRange(v, false) : {};
  if (r.min !== undefined) lo = r.min;
  if (r.max !== undefined) hi = r.max;
  if (fromZero && lo >= 0) lo = 0;
  if (hi - lo <= 1e-6 * Math.max(Math.abs(hi), Math.abs(lo))) {
    // flat (float32 noise is ~1e-7): a readable range around it
    const half = Math.abs(hi) / 2 || 1;
    lo = fromZero && hi >= 0 ? 0 : hi - half;
    hi += half;
  }
  const step = niceStep(hi - lo);
  const d = decimalsOf(step);
  const min = Number((Math.floor(lo / step + 1e-9) * step).toFixed(d)),
    max = Number((Math.ceil(hi / step - 1e-9) * step).toFixed(d));
  return {
    min,
    max,
    interval: step,
    format: axisFormat(min, max, step),
    clipped: { min: r.min !== undefined ? min : undefined, max: r.max !== undefined ? max : undefined },
  };
}

/** How a y axis ranges by the unit of its metric (mindwatch.metrics): amounts (memory, a share) from 0 and every point
 * shown, so the newest, highest points (a leak) are on the chart and a flat 1.24 GB does not read as a climb; others
 * (timings, losses) ignore outliers. The dashboard's charts and the report's both range their axes by it. */
const RANGE_BY_UNIT = { GB: { fromZero: true, robust: false }, "%": { fromZero: true, robust: false } };

/** A y axis for a metric of this unit: {name: the unit, fromZero?, robust?} (the `axes` entry of line()). */
export function unitAxis(unit) {
  return Object.assign({}, RANGE_BY_UNIT[unit || ""] || {}, { name: unit || "" });
}

/** Per y axis: its range over the points of its series inside the x window win ([lo, hi] or null). */
function axisRanges(o, axes, win) {
  return axes.map((a, ai) => {
    const ys = [];
    for (const s of o.series) {
      if ((s.yAxisIndex || 0) !== ai) continue;
      for (const [x, y] of s.points) if (y !== null && (!win || (x >= win[0] && x <= win[1]))) ys.push(y);
    }
    const robust = o.robust && a.robust !== false;
    if (o.log) {
      const r = robust ? robustRange(ys, true) : {};
      return { min: r.min, max: r.max, clipped: r };
    }
    return linearAxis(ys, { robust, fromZero: a.fromZero });
  });
}

/** The points of s outside range, drawn at the chart's edge: triangles pointing the way the value lies. */
function offScale(s, range, color, px) {
  const data = [];
  for (const [x, y] of s.points) {
    if (y === null) continue;
    if (range.max !== undefined && y > range.max) data.push({ value: [px(x), range.max, y], symbol: "triangle" });
    else if (range.min !== undefined && y < range.min)
      data.push({ value: [px(x), range.min, y], symbol: "triangle", symbolRotate: 180 });
  }
  if (!data.length) return null;
  return {
    name: `${s.name} off scale`,
    type: "scatter",
    data,
    symbolSize: 9,
    itemStyle: { color },
    yAxisIndex: s.yAxisIndex || 0,
    clip: false,
    animation: false,
    z: 5,
    tooltip: { show: false },
    label: { show: false },
    emphasis: { label: { show: true, position: "right", formatter: (p) => `${fmtNumber(p.value[2])} (off scale)` } },
  };
}

/** The suffix of the faint raw line drawn behind a smoothed one. */
export const RAW = " (raw)";

/** The x axis: a time axis in ms, a duration axis, or whole steps; always named. */
function xAxisOption(o, px) {
  const bounds = { min: o.xMin !== undefined ? px(o.xMin) : undefined, max: o.xMax !== undefined ? px(o.xMax) : undefined };
  const common = { nameLocation: "middle", nameGap: 26, nameTextStyle: { color: "#52606d" }, ...bounds };
  if (o.x === "time") return { type: "time", name: "time", ...common, axisLabel: { hideOverlap: true } };
  if (o.x === "elapsed") {
    const xs = o.series.flatMap((s) => s.points.map((p) => px(p[0])));
    const span = xs.length ? Math.max(...xs) - Math.min(...xs) : 60;
    const long = xs.length > 0 && Math.max(...xs) >= 3600;
    const interval =
      [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400].find((d) => span / d <= 7) ||
      86400 * Math.ceil(span / 86400 / 7);
    // the range's ends on whole intervals: ticks then fall on round durations (never 0:01 twice on a short run)
    const ends = {
      min: bounds.min ?? ((v) => Math.floor(v.min / interval) * interval),
      max: bounds.max ?? ((v) => Math.ceil(v.max / interval) * interval),
    };
    return {
      type: "value",
      scale: true,
      interval,
      name: long ? "elapsed (h:mm:ss)" : "elapsed (m:ss)",
      ...common,
      ...ends,
      axisLabel: { formatter: (v) => clockTick(v, long), hideOverlap: true },
    };
  }
  return {
    type: "value",
    scale: true,
    minInterval: 1,
    name: "step",
    ...common,
    axisLabel: { formatter: (v) => (Number.isInteger(v) ? String(v) : "") },
  };
}

/** The value of a step function at x: the y of the last point at or before x (points sorted by x); undefined before
 * the first. What the tooltip says of the epoch a step is in. */
export function valueAt(points, x) {
  let lo = 0,
    hi = (points || []).length - 1,
    found;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (points[mid][0] <= x) {
      found = points[mid][1];
      lo = mid + 1;
    } else hi = mid - 1;
  }
  return found === null ? undefined : found;
}

/** The axis tooltip: the x (and its epoch, given the epochs), then each series' value (the raw value beside the smoothed
 * one); a series of points (evaluations) names the x of the point it shows when that is not the pointer's. */
function tooltipText(params, o, epochs, markerNames) {
  const list = Array.isArray(params) ? params : [params];
  if (!list.length) return "";
  const x = list[0].axisValue;
  const rows = list
    .filter((p) => Array.isArray(p.value) && typeof p.value[1] === "number")
    .map((p) => {
      const at =
        markerNames.has(p.seriesName) && p.value[0] !== x ? ` (${o.x === "step" ? "step " : ""}${fmtX(p.value[0], o.x)})` : "";
      return `${p.marker}${esc(p.seriesName)}: <b>${esc(fmtNumber(p.value[1]))}</b>${esc(at)}`;
    });
  const epoch = epochs.length ? valueAt(epochs, x) : undefined;
  const head = epoch === undefined ? fmtX(x, o.x) : `${o.x === "step" ? "step " : ""}${fmtX(x, o.x)} · epoch ${epoch}`;
  return [esc(head)].concat(rows).join("<br>");
}

/** The colour of the best evaluation's mark. */
const BEST_COLOR = "#2f9e44";

/** A series' best point (an evaluation metric's best: /api/run's evaluation.bests, mindwatch.store.best_eval) as
 * line() marks it: {x, y, name}, x the step or (x "time" or "elapsed") the time; undefined without one. origin: what
 * the series' own x counts from, where the server already drew it from the run's start (the compare page's elapsed). */
export function bestMark(best, x, origin = 0) {
  if (!best) return undefined;
  const at = x === "step" ? best.step : best.t === null || best.t === undefined ? undefined : best.t - origin;
  if (at === undefined) return undefined;
  const where = `step ${best.step}${best.epoch !== null && best.epoch !== undefined ? `, epoch ${best.epoch}` : ""}`;
  return { x: at, y: best.value, name: `best ${best.metric}: ${fmtNumber(best.value)} at ${where} (${best.mode})` };
}

/** The mark of a series' best point: a diamond with "best" over it. */
function bestPoint(best, px) {
  return {
    coord: [px(best.x), best.y],
    name: best.name,
    value: best.y,
    symbol: "diamond",
    symbolSize: 16,
    itemStyle: { color: BEST_COLOR, borderColor: "#fff", borderWidth: 1 },
    label: { show: true, position: "top", formatter: "best", color: BEST_COLOR, fontWeight: 600 },
  };
}

function lineOption(o, win) {
  const series = [];
  const px = xScale(o).to;
  const axes = o.axes || [{ name: o.yName }];
  const ranges = axisRanges(o, axes, win);
  const at = (pts) => pts.map(([x, y]) => [px(x), y]);
  const epochs = (o.epochs || []).filter((p) => p[1] !== null).map(([x, e]) => [px(x), e]);
  const markerNames = new Set(o.series.filter((s) => s.marker).map((s) => s.name));
  o.series.forEach((s, i) => {
    const color = s.color || PALETTE[i % PALETTE.length];
    const marks = alertMarks(o.alerts, s.metric, o, px);
    const nonfinite = (s.nonfinite || []).slice(0, 50).map(([x, v]) => ({
      xAxis: px(x),
      name: `${s.name} = ${v}`,
      lineStyle: { color: severityColour("error"), type: "dotted" },
      label: { formatter: v },
    }));
    // alerts of no metric, restarts and events: once per chart
    const lines = (i === 0 ? marks.lines.concat(restartMarks(o.restarts, o, px), eventMarks(o.events, o, px)) : []).concat(
      nonfinite,
    );
    const yAxisIndex = s.yAxisIndex || 0;
    if (s.band && s.band.lower.length) {
      series.push({
        name: `${s.name} min`,
        type: "line",
        data: at(s.band.lower),
        showSymbol: false,
        lineStyle: { opacity: 0 },
        stack: `band${i}`,
        silent: true,
        yAxisIndex,
        tooltip: { show: false },
      });
      series.push({
        name: `${s.name} range`,
        type: "line",
        data: at(s.band.upper),
        showSymbol: false,
        lineStyle: { opacity: 0 },
        areaStyle: { color, opacity: 0.15 },
        stack: `band${i}`,
        silent: true,
        yAxisIndex,
      });
    }
    if (s.abandoned && s.abandoned.length) {
      // a rewind's abandoned branch: faint, behind the line the run went on with
      series.push({
        name: `${s.name} abandoned`,
        type: "line",
        showSymbol: false,
        connectNulls: false,
        animation: false,
        silent: true,
        yAxisIndex,
        z: 0,
        tooltip: { show: false },
        data: at(s.abandoned.map(([x, y]) => [x, y ?? "-"])),
        lineStyle: { width: 1, color, opacity: 0.3, type: "dashed" },
      });
    }
    const pinned = marks.pts.concat(s.best ? [bestPoint(s.best, px)] : []);
    const pins = pinned.length ? { symbol: "pin", symbolSize: 28, data: pinned, label: { color: "#fff" } } : undefined;
    // one point draws as a point; a line of many shows no symbols; a series of evaluations (marker) shows each
    const showSymbol = s.marker || s.points.filter((p) => p[1] !== null).length === 1;
    const smoothed = o.smoothing > 0 && !s.marker; // an evaluation is drawn as it is: few points, each one meant
    if (smoothed) {
      // the data itself, faint behind the smoothed line, carrying the pins (they sit on raw values)
      series.push({
        name: s.name + RAW,
        type: "line",
        showSymbol,
        connectNulls: false,
        animation: false,
        yAxisIndex,
        z: 1,
        data: at(ema(s.points, 0)),
        lineStyle: { width: 1, color, opacity: 0.25 },
        itemStyle: { color, opacity: 0.4 },
        markPoint: pins,
      });
    }
    series.push({
      name: s.name,
      type: "line",
      showSymbol,
      sampling: undefined,
      connectNulls: false,
      animation: false,
      yAxisIndex,
      z: 2,
      data: at(ema(s.points, smoothed ? o.smoothing : 0)),
      symbol: s.marker ? "circle" : undefined,
      symbolSize: s.marker ? 7 : undefined,
      lineStyle: { width: s.width || 1.5, color, opacity: s.opacity || 1 },
      itemStyle: { color },
      markPoint: smoothed ? undefined : pins,
      markLine: lines.length
        ? {
            symbol: "none",
            silent: false,
            data: lines,
            label: { show: nonfinite.length > 0 || (i === 0 && (o.restarts || []).length > 0) },
          }
        : undefined,
    });
    const off = offScale(s, ranges[yAxisIndex].clipped, color, px);
    if (off) series.push(off);
  });
  return {
    animation: false,
    title: titleOption(o.title, o.subtitle),
    color: PALETTE,
    grid: {
      left: axes.length > 1 ? 64 : 56,
      right: axes.length > 1 ? 64 : 16,
      top: o.subtitle ? 56 : 36,
      bottom: o.slider ? 66 : 40,
    },
    tooltip: {
      trigger: "axis",
      axisPointer: { type: "cross", snap: true },
      formatter: (p) => tooltipText(p, o, epochs, markerNames),
    },
    legend:
      o.legend === false
        ? undefined
        : { top: 4, right: 8, type: "scroll", width: "60%", textStyle: { fontSize: 11 }, data: o.series.map((s) => s.name) },
    xAxis: xAxisOption(o, px),
    yAxis: axes.map((a, i) => {
      const r = ranges[i];
      const clippedLog = o.log && (r.min !== undefined || r.max !== undefined);
      return {
        type: o.log ? "log" : "value",
        scale: true,
        name: a.name,
        position: i ? "right" : "left",
        min: r.min,
        max: r.max,
        interval: r.interval,
        axisLabel: {
          formatter: r.format || fmtNumber,
          showMinLabel: clippedLog ? false : undefined,
          showMaxLabel: clippedLog ? false : undefined,
        },
        nameLocation: "middle",
        nameGap: 44,
        nameTextStyle: { color: "#52606d" },
        splitLine: { show: i === 0 },
      };
    }),
    dataZoom: [{ type: "inside", filterMode: "none" }].concat(
      o.slider ? [{ type: "slider", height: 18, bottom: 6, filterMode: "none" }] : [],
    ),
    series,
  };
}

/**
 * A line chart: series [{name, points, nonfinite?: [[x, value]], color?, yAxisIndex?, band?: {lower, upper}, abandoned?:
 * [[x, y | null]] (the steps a rewind went back over: drawn faint and dashed, a null between branches), marker? (a
 * series of evaluations: each point drawn, joined by a line, never smoothed), best? ({x, y, name}: bestMark's, marked
 * with a diamond)}], x in data units (steps, or epoch seconds for "time" and "elapsed").
 * Options: title, subtitle?, axes? ([{name, robust?, fromZero?}]), yName?, alerts?, restarts? ([{step, t, attempt}]),
 * events? ([{name, xs, color?}]: a dashed line at each x in xs, named; what happened at a step, not a curve),
 * x ("step", "time" or "elapsed"), xOrigin? (elapsed: the data x of 0 s), xMin?, xMax?, smoothing (the raw line
 * stays, faint), log, robust (default true: the y range ignores outliers, see robustRange; false: every point sets it),
 * slider (default true: a zoom slider under the x axis; false on paper, where it cannot be used), legend (default true;
 * false where the page names the series once for every chart, as the compare page's key of its runs), epochs? ([[x,
 * epoch]]: the tooltip names the epoch of the x it shows).
 */
export function line(el, opts) {
  const chart = echarts.init(el, null, { renderer: "canvas" });
  const state = { opts: Object.assign({ x: "step", smoothing: 0, log: false, robust: true, alerts: [], slider: true }, opts) };
  chart.setOption(lineOption(state.opts), { notMerge: true });
  return {
    chart,
    update(patch) {
      Object.assign(state.opts, patch);
      const zoom = chart.getOption() && chart.getOption().dataZoom;
      const opt = lineOption(state.opts, zoom && zoom[0] && !(zoom[0].start <= 0 && zoom[0].end >= 100) ? this.window() : null);
      if (zoom && zoom[0]) opt.dataZoom = opt.dataZoom.map((z) => Object.assign(z, { start: zoom[0].start, end: zoom[0].end }));
      chart.setOption(opt, { notMerge: true, lazyUpdate: true });
    },
    /** The x window shown, in data units, or null when the whole range is shown. */
    window() {
      const z = chart.getOption().dataZoom[0];
      if (!z || (z.start <= 0 && z.end >= 100)) return null;
      const axis = chart.getModel().getComponent("xAxis", 0).axis;
      const back = xScale(state.opts).from;
      const [lo, hi] = axis.scale.getExtent();
      return [back(lo), back(hi)];
    },
    /** Show the x window [lo, hi] (data units). */
    zoomTo(win) {
      const to = xScale(state.opts).to;
      chart.dispatchAction({ type: "dataZoom", startValue: to(win[0]), endValue: to(win[1]) });
    },
    get opts() {
      return state.opts;
    },
    resize() {
      chart.resize();
    },
    dispose() {
      chart.dispose();
    },
  };
}

/** A heat-map row's name that fits its column: the end of the name is kept (it tells the layers apart). */
function rowLabel(name, selected) {
  const text = name.length > ROW_CHARS ? `…${name.slice(-(ROW_CHARS - 1))}` : name;
  return name === selected ? `▶ ${text}` : text;
}
const ROW_CHARS = 22;

function heatmapOption(d, opts) {
  // opts.log: colour by log10 of the value (per-layer norms span decades); the tooltip keeps the value itself
  const cells = opts.log ? d.values.map(([x, y, v]) => [x, y, v > 0 ? Math.log10(v) : "-", v]) : d.values;
  const vals = cells.map((v) => v[2]).filter((v) => typeof v === "number");
  return {
    animation: false,
    title: titleOption(opts.title || "attention entropy per layer", opts.subtitle),
    tooltip: {
      formatter: (p) =>
        `${esc(d.layers[p.value[1]])} @ ${opts.xName ? `${esc(opts.xName)} ` : "step ~"}${esc(d.steps[p.value[0]])}: ${fmtNumber(p.value[opts.log ? 3 : 2])}`,
    },
    grid: { left: 140, right: 100, top: opts.subtitle ? 56 : 36, bottom: 40 },
    xAxis: { type: "category", data: d.steps, name: opts.xName || "step", nameLocation: "middle", nameGap: 26 },
    yAxis: { type: "category", data: d.layers, axisLabel: { formatter: (v) => rowLabel(v, opts.selected) } },
    visualMap: {
      min: opts.range ? opts.range[0] : vals.length ? Math.min(...vals) : 0,
      max: opts.range ? opts.range[1] : vals.length ? Math.max(...vals) : 1,
      calculable: true,
      orient: "vertical",
      right: 4,
      top: 36,
      itemHeight: 120,
      precision: opts.log ? 1 : 3,
      dimension: 2,
      seriesIndex: 0,
      formatter: opts.log
        ? (v) => fmtNumber(Number(Math.pow(10, v).toPrecision(2)))
        : (v) => fmtNumber(Number((+v).toPrecision(3))),
      inRange: { color: ["#313695", "#4575b4", "#abd9e9", "#fee090", "#f46d43", "#a50026"] },
    },
    series: [{ type: "heatmap", data: cells, progressive: 0 }].concat(rowOutline(d.layers.indexOf(opts.selected))),
  };
}

/** An outline around the heat map's row `row` (the selected layer), across the whole grid; none for -1. */
function rowOutline(row) {
  if (row < 0) return [];
  return [
    {
      type: "custom",
      name: "selected layer",
      silent: true,
      z: 10,
      tooltip: { show: false },
      data: [[0, row]],
      encode: { x: 0, y: 1 },
      renderItem: (params, api) => {
        const [, y] = api.coord([0, api.value(1)]);
        const height = api.size([1, 1])[1];
        const grid = params.coordSys;
        return {
          type: "rect",
          shape: { x: grid.x, y: y - height / 2, width: grid.width, height },
          style: { fill: "none", stroke: "#1f2933", lineWidth: 2 },
        };
      },
    },
  ];
}

/**
 * A heat map of per-layer values over step buckets: {layers, steps, values: [[bucket, layer, v], ...]};
 * opts {title, subtitle?, log?, xName?, selected?, range?} (log: colour on a log scale; xName: what the columns are,
 *   default "step"; selected: a row's name, outlined and marked ▶; range: [min, max] of the colour scale, default the
 *   values').
 */
export function heatmap(el, data, opts) {
  const chart = echarts.init(el, null, { renderer: "canvas" });
  let shown = opts || {};
  chart.setOption(heatmapOption(data, shown), { notMerge: true });
  return {
    chart,
    update(d, newOpts) {
      shown = newOpts || shown;
      chart.setOption(heatmapOption(d, shown), { notMerge: true });
    },
    resize() {
      chart.resize();
    },
    dispose() {
      chart.dispose();
    },
  };
}

/**
 * One step column of a per-expert family's grid (rows "<prefix><layer>/<expert>" x steps, mindwatch.analysis.heatmap's
 * family_grid) as MoE layers (rows) x experts (columns), for heatmap(): each row split at its last "/".
 *   expertsAt({layers: ["blocks.0.moe/0", "blocks.0.moe/1"], steps: [10, 20], values: [[1, 0, 0.4], [1, 1, 0.6]]}, 1)
 *   -> {layers: ["blocks.0.moe"], steps: ["0", "1"], values: [[0, 0, 0.4], [1, 0, 0.6]]}
 */
export function expertsAt(d, column, prefix = "") {
  const layers = [],
    experts = [];
  const cells = d.layers.map((row) => {
    const cut = row.lastIndexOf("/");
    const layer = row.slice(row.startsWith(prefix) ? prefix.length : 0, cut),
      expert = row.slice(cut + 1);
    if (!layers.includes(layer)) layers.push(layer);
    if (!experts.includes(expert)) experts.push(expert);
    return [experts.indexOf(expert), layers.indexOf(layer)];
  });
  const values = d.values.filter(([j]) => j === column).map(([, row, v]) => [...cells[row], v]);
  return { layers, steps: experts, values };
}

/** The column of a grown grid's steps ``fresh`` to show after column ``column`` of ``steps``: the newest while that
 * was the newest (the view follows a live run), else the one nearest the step shown (past 300 measured steps the
 * columns are buckets, which move as the run grows). */
export function columnAfter(steps, column, fresh) {
  if (column >= steps.length - 1) return fresh.length - 1;
  let best = fresh.length - 1;
  fresh.forEach((s, j) => {
    if (Math.abs(s - steps[column]) < Math.abs(fresh[best] - steps[column])) best = j;
  });
  return best;
}

/**
 * The load of each expert of each MoE layer at one step: heatmap() of expertsAt() for the step ``opts.slider`` (an
 * <input type=range>, placed by the caller) picks, on one colour scale for every step (0 to the largest share), so
 * moving the slider compares like with like. It opens at the newest step and follows new steps (update(d)) while the
 * slider is there. d: a per-expert family's grid (rows "<prefix><layer>/<expert>"); opts {title, subtitle?, prefix?,
 * slider}.
 */
export function expertLoad(el, d, opts) {
  let grid = d,
    column = d.steps.length - 1;
  const slider = opts.slider;
  const shown = () => ({
    title: `${opts.title} at step ${column < 0 ? "-" : grid.steps[column]}`,
    subtitle: opts.subtitle,
    xName: "expert",
    range: [0, grid.values.reduce((top, v) => (Number.isFinite(v[2]) && v[2] > top ? v[2] : top), 0) || 1],
  });
  const map = heatmap(el, expertsAt(grid, column, opts.prefix), shown());
  const draw = () => {
    slider.max = String(Math.max(0, grid.steps.length - 1));
    slider.value = String(column);
    slider.setAttribute("aria-valuetext", `step ${column < 0 ? "-" : grid.steps[column]}`);
    map.update(expertsAt(grid, column, opts.prefix), shown());
  };
  slider.addEventListener("input", () => {
    column = Number(slider.value);
    draw();
  });
  draw();
  return {
    chart: map.chart,
    update(fresh) {
      column = columnAfter(grid.steps, column, fresh.steps);
      grid = fresh;
      draw();
    },
    resize() {
      map.resize();
    },
    dispose() {
      map.dispose();
    },
  };
}
