// The run page's chart cards: which metrics share a chart, and a card that draws its series (one SeriesStore per
// metric and rank, series.js) as the page has loaded them: the overview, a zoomed window, the band across ranks.

import { PALETTE, line, unitAxis } from "./charts.js";
import { SeriesStore, eventXs } from "./series.js";
import { isFamilyMetric, isLayerMetric, vocab } from "./vocabulary.js";

const unitOf = (m) => (vocab().metrics.find((x) => x.name === m) || {}).unit || "";
/** How a chart's y axes range: by the unit of its first metric (charts.js's unitAxis: memory from 0, ...). */
const rangeOf = (metrics) => unitAxis(unitOf(metrics[0]));
/** The y axis of a chart of one metric: named by its unit and ranged by it (the compare page's charts). */
export const metricAxis = (m) => unitAxis(unitOf(m));

/** The chart groups of mindwatch.metrics; an axis list names one y axis per metric when scales differ. */
const knownGroups = () =>
  vocab().groups.map((g) => Object.assign({}, g, { axes: g.axes.length ? g.axes.map((name) => ({ name })) : undefined }));
export { isLayerMetric };

/** The charts of a run with these metrics: the known groups that have a curve, then one chart per other metric. A group's
 * metrics are its curves; its events (skip_steps' skipped steps) are marked on its chart, not drawn. */
export function chartGroups(metrics) {
  const known = knownGroups(),
    hidden = new Set(vocab().not_charted);
  const groups = known
    .map((g) => {
      const curves = g.metrics.filter((m) => !g.events.includes(m));
      const present = curves.filter((m) => metrics.includes(m));
      const axes =
        g.axes && present.length > 1
          ? curves.map((m, i) => g.axes[Math.min(i, g.axes.length - 1)]).filter((a, i) => present.includes(curves[i]))
          : undefined;
      const range = rangeOf(present);
      return Object.assign({}, g, {
        metrics: present,
        events: g.events.filter((m) => metrics.includes(m)),
        axes: (axes || [{ name: unitOf(present[0]) }]).map((a) => Object.assign({}, range, a)),
      });
    })
    .filter((g) => g.metrics.length);
  const used = new Set(known.flatMap((g) => g.metrics));
  for (const m of metrics) {
    if (!used.has(m) && !hidden.has(m) && !isFamilyMetric(m))
      groups.push({ id: m, title: m, metrics: [m], events: [], axes: [{ name: unitOf(m) }] });
  }
  return groups;
}

function seriesStores(runId, group, ranks) {
  const stores = [];
  group.metrics.forEach((m, mi) =>
    ranks.forEach((r, ri) =>
      stores.push(
        new SeriesStore(
          { run: runId, metric: m, rank: r },
          {
            key: `${m}@${r}`,
            name: ranks.length > 1 ? `${m} r${r}` : m,
            yAxisIndex: group.axes ? Math.min(mi, group.axes.length - 1) : 0,
            color: ranks.length > 1 ? PALETTE[(ri + mi * 3) % PALETTE.length] : undefined,
          },
        ),
      ),
    ),
  );
  return stores;
}

/** One chart of the run page: its group, its series (one SeriesStore per metric and rank), its events' series (marked,
 * not drawn) and the ECharts line chart. It draws what its stores hold; the page loads, zooms and merges them. */
export class ChartCard {
  /** x: the view's x ("step", "time" or "elapsed": time since the origin draw() is given). */
  constructor(el, runId, group, ranks, x) {
    this.el = el;
    this.runId = runId;
    this.group = group;
    this.x = x === "step" ? "step" : "time"; // what the stores hold: elapsed is time drawn from the origin
    this.defs = seriesStores(runId, group, ranks);
    this.eventDefs = group.events.flatMap((m) => ranks.map((r) => new SeriesStore({ run: runId, metric: m, rank: r })));
    this.chart = line(el, { title: group.title, series: this.defs, axes: group.axes, x });
  }

  /** Every series the card reads: its curves and its events (the live stream appends to both). */
  get allDefs() {
    return this.defs.concat(this.eventDefs);
  }

  /** The ECharts instance (the page connects the cards' zoom and downloads a card's PNG). */
  get echarts() {
    return this.chart.chart;
  }

  /** Each event's marks: the x of every rank's 1s, once. */
  events() {
    return this.group.events.map((m) => ({
      name: m,
      xs: [...new Set(this.eventDefs.filter((d) => d.metric === m).flatMap((d) => eventXs(d.points)))].sort((a, b) => a - b),
    }));
  }

  /** Whether the overview has arrived (a zoom before that takes its window from another card). */
  get loaded() {
    return this.defs.some((d) => d.loaded);
  }

  /** Back to the overview after a zoom out. */
  showOverview() {
    this.allDefs.forEach((d) => d.showOverview());
  }

  /** xOrigin: the epoch second an elapsed axis counts from. */
  draw(view, alerts, restarts, xOrigin) {
    this.chart.update({
      series: this.defs,
      alerts,
      restarts,
      events: this.events(),
      x: view.x,
      xOrigin,
      smoothing: view.smoothing,
      log: view.log,
      robust: view.robust,
    });
  }

  resize() {
    this.chart.resize();
  }
  dispose() {
    this.chart.dispose();
  }
}
