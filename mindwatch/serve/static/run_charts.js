// The run page's chart cards: which metrics share a chart, one series per metric and rank, and how a card
// loads its points (the overview, or the detail of a zoomed window) and its min..max band across ranks.

import { api } from "./api.js";
import { PALETTE, line, unitAxis } from "./charts.js";
import { isFamilyMetric, isLayerMetric, vocab } from "./vocabulary.js";

/** Points per series the server sends: the overview, and the detail of a zoomed window. */
export const POINTS = 2000;

const unitOf = (m) => (vocab().metrics.find((x) => x.name === m) || {}).unit || "";
/** How a chart's y axes range: by the unit of its first metric (charts.js's unitAxis: memory from 0, ...). */
const rangeOf = (metrics) => unitAxis(unitOf(metrics[0]));
/** The y axis of a chart of one metric: named by its unit and ranged by it (the compare page's charts). */
export const metricAxis = (m) => unitAxis(unitOf(m));

/** The chart groups of mindwatch.metrics; an axis list names one y axis per metric when scales differ. */
const knownGroups = () => vocab().groups.map((g) => Object.assign({}, g, { axes: g.axes.length ? g.axes.map((name) => ({ name })) : undefined }));
export { isLayerMetric };

/** The charts of a run with these metrics: the known groups that have a curve, then one chart per other metric. A group's
 * metrics are its curves; its events (skip_steps' skipped steps) are marked on its chart, not drawn. */
export function chartGroups(metrics) {
  const known = knownGroups(), hidden = new Set(vocab().not_charted);
  const groups = known.map((g) => {
    const curves = g.metrics.filter((m) => !g.events.includes(m));
    const present = curves.filter((m) => metrics.includes(m));
    const axes = g.axes && present.length > 1 ? curves.map((m, i) => g.axes[Math.min(i, g.axes.length - 1)]).filter((a, i) => present.includes(curves[i])) : undefined;
    const range = rangeOf(present);
    return Object.assign({}, g, { metrics: present, events: g.events.filter((m) => metrics.includes(m)),
      axes: (axes || [{ name: unitOf(present[0]) }]).map((a) => Object.assign({}, range, a)) });
  }).filter((g) => g.metrics.length);
  const used = new Set(known.flatMap((g) => g.metrics));
  for (const m of metrics) {
    if (!used.has(m) && !hidden.has(m) && !isFamilyMetric(m)) groups.push({ id: m, title: m, metrics: [m], events: [], axes: [{ name: unitOf(m) }] });
  }
  return groups;
}

/** The steps (or times) at which an event's series is 1: where a chart marks it. */
export const eventXs = (points) => points.filter((p) => p[1] > 0).map((p) => p[0]);

function seriesDefs(group, ranks) {
  const defs = [];
  group.metrics.forEach((m, mi) => ranks.forEach((r, ri) => defs.push({
    key: `${m}@${r}`, metric: m, rank: r, name: ranks.length > 1 ? `${m} r${r}` : m,
    yAxisIndex: group.axes ? Math.min(mi, group.axes.length - 1) : 0,
    color: ranks.length > 1 ? PALETTE[(ri + mi * 3) % PALETTE.length] : undefined,
    points: [], nonfinite: [],
  })));
  return defs;
}

/** One chart of the run page: its group, its series (one per metric and rank), its events' series (marked, not drawn)
 * and the ECharts line chart. */
export class ChartCard {
  /** x: the view's x ("step", "time" or "elapsed": time since the origin draw() is given). */
  constructor(el, runId, group, ranks, x) {
    this.el = el;
    this.runId = runId;
    this.group = group;
    this.x = x === "step" ? "step" : "time";  // what the server sends: elapsed is time drawn from the origin
    this.defs = seriesDefs(group, ranks);
    this.eventDefs = group.events.flatMap((m) => ranks.map((r) => ({ key: `${m}@${r}`, metric: m, rank: r, points: [], nonfinite: [] })));
    this.chart = line(el, { title: group.title, series: this.defs, axes: group.axes, x });
  }

  /** Every series the card reads: its curves and its events (the live stream appends to both). */
  get allDefs() { return this.defs.concat(this.eventDefs); }

  /** Each event's marks: the x of every rank's 1s, once. */
  events() {
    return this.group.events.map((m) => ({ name: m,
      xs: [...new Set(this.eventDefs.filter((d) => d.metric === m).flatMap((d) => eventXs(d.points)))].sort((a, b) => a - b) }));
  }

  /** Whether the overview has arrived (a zoom before that takes its window from another card). */
  get loaded() { return this.defs.some((d) => d.overview && d.overview.length); }

  /** Fetch the overview, or with win = [lo, hi] the detail of that window (the overview outside it). */
  async load(win) {
    await Promise.all(this.allDefs.map(async (d) => {
      const q = { run: this.runId, metric: d.metric, rank: d.rank, x: this.x, points: POINTS };
      if (win) Object.assign(q, { lo: win[0], hi: win[1] });
      const s = await api.series(q);
      if (win) {
        d.points = d.overview.filter((p) => p[0] < win[0]).concat(s.points, d.overview.filter((p) => p[0] > win[1]));
      } else {
        d.overview = s.points;
        d.points = s.points.slice();
        d.nonfinite = s.nonfinite;
        d.abandoned = s.abandoned || [];  // the steps a rewind went back over, drawn faint
      }
    }));
  }

  /** Back to the overview after a zoom out. */
  showOverview() { this.allDefs.forEach((d) => { d.points = d.overview.slice(); }); }

  /** Across ranks: the min..max band of each metric behind the per-rank lines (mindwatch.analysis.bands). */
  async loadBands(bandMetrics) {
    await Promise.all(this.group.metrics.filter((m) => bandMetrics.includes(m)).map(async (m) => {
      const b = await api.band(this.runId, m, POINTS);
      const first = this.defs.find((d) => d.metric === m);
      first.band = { lower: b.points.map((p) => [p[0], p[1] ?? "-"]),
        upper: b.points.map((p) => [p[0], p[3] === null || p[1] === null ? "-" : p[3] - p[1]]) };
    }));
  }

  /** xOrigin: the epoch second an elapsed axis counts from. */
  draw(view, alerts, restarts, xOrigin) {
    this.chart.update({ series: this.defs, alerts, restarts, events: this.events(), x: view.x, xOrigin, smoothing: view.smoothing, log: view.log,
      robust: view.robust });
  }

  resize() { this.chart.resize(); }
  dispose() { this.chart.dispose(); }
}
