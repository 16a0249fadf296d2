// The run page's chart cards: which metrics share a chart, and a card that draws its series (one SeriesStore per
// metric and rank, series.js) as the page has loaded them: the overview, a zoomed window, the band across ranks.

import { PALETTE, bestMark, line, unitAxis } from "./charts.js";
import { SeriesStore, eventXs } from "./series.js";
import { isEvalMetric, isFamilyMetric, isLayerMetric, vocab } from "./vocabulary.js";

const unitOf = (m) => (vocab().metrics.find((x) => x.name === m) || {}).unit || "";
/** How a chart's y axes range: by the unit of its first metric (charts.js's unitAxis: memory from 0, ...). */
const rangeOf = (metrics) => unitAxis(unitOf(metrics[0]));
/** The y axis of a chart of one metric: named by its unit and ranged by it (the compare page's charts). */
export const metricAxis = (m) => unitAxis(unitOf(m));

/** The chart groups of mindwatch.metrics; an axis list names one y axis per metric when scales differ. */
const knownGroups = () =>
  vocab().groups.map((g) => Object.assign({}, g, { axes: g.axes.length ? g.axes.map((name) => ({ name })) : undefined }));
export { isLayerMetric };

/** The Evaluation card of a run whose evaluations are /api/run's `evaluation` (mindwatch.analysis.eval_table): its
 * curve (an evaluation loss, else the primary) as points, on one axis with the training's loss beside it when the curve
 * is an evaluation loss; the epoch (not drawn) for the tooltip. null without an evaluation. */
export function evaluationGroup(metrics, evaluation) {
  if (!evaluation || !evaluation.curve || !metrics.includes(evaluation.curve)) return null;
  const ev = vocab().evaluation;
  const beside = evaluation.beside && metrics.includes(evaluation.beside) ? [evaluation.beside] : [];
  const curves = beside.concat([evaluation.curve]);
  return {
    id: "evaluation",
    title: ev.title,
    metrics: curves,
    events: [],
    marked: [evaluation.curve],
    context: metrics.includes(ev.epoch) ? [ev.epoch] : [],
    axes: [Object.assign({}, rangeOf(curves), { name: unitOf(evaluation.curve) })],
  };
}

/** The charts of a run with these metrics: the known groups that have a curve, the Evaluation card (given the run's
 * evaluation: evaluationGroup) after the group of the loss it draws beside, then one chart per other metric. A group's
 * metrics are its curves; its events (skip_steps' skipped steps) are marked on its chart, not drawn; its marked metrics
 * (evaluations) are drawn as points with their best marked; its context (the epoch) is read for the tooltip. */
export function chartGroups(metrics, evaluation) {
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
        marked: [],
        context: [],
      });
    })
    .filter((g) => g.metrics.length);
  const used = new Set(known.flatMap((g) => g.metrics));
  const evalGroup = evaluationGroup(metrics, evaluation);
  if (evalGroup) {
    const after = groups.findIndex((g) => evalGroup.metrics.some((m) => g.metrics.includes(m))); // the loss card
    groups.splice(after + 1, 0, evalGroup);
    evalGroup.marked.forEach((m) => used.add(m)); // drawn there, not again on a card of its own
  }
  const epoch = metrics.includes(vocab().evaluation.epoch) ? [vocab().evaluation.epoch] : [];
  for (const m of metrics) {
    if (used.has(m) || hidden.has(m) || isFamilyMetric(m)) continue;
    const evaluated = isEvalMetric(m);
    groups.push({
      id: m,
      title: m,
      metrics: [m],
      events: [],
      axes: [{ name: unitOf(m) }],
      marked: evaluated ? [m] : [],
      context: evaluated ? epoch : [],
    });
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
            marker: group.marked.includes(m),
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
    // the epoch of the first rank shown, for the tooltip: read, not drawn
    this.contextDefs = group.context.map((m) => new SeriesStore({ run: runId, metric: m, rank: ranks[0] }));
    this.chart = line(el, { title: group.title, series: this.defs, axes: group.axes, x });
  }

  /** Every series the card reads: its curves, its events and its context (the live stream appends to each). */
  get allDefs() {
    return this.defs.concat(this.eventDefs, this.contextDefs);
  }

  /** What the card draws: its stores, an evaluation's with its best marked (evaluation: /api/run's). */
  drawnSeries(evaluation, x) {
    return this.defs.map((d) =>
      d.marker && evaluation && evaluation.rank === d.rank
        ? Object.assign({}, d, { best: bestMark(evaluation.bests[d.metric], x) })
        : d,
    );
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

  /** xOrigin: the epoch second an elapsed axis counts from; evaluation: the run's (/api/run's), whose bests it marks. */
  draw(view, alerts, restarts, xOrigin, evaluation) {
    this.chart.update({
      series: this.drawnSeries(evaluation, view.x),
      epochs: this.contextDefs.length ? this.contextDefs[0].points : undefined,
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
