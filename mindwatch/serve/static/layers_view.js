// The run page's layers view (docs/layers.md): a heat map of layers x steps for one statistic, coloured on a log
// scale, and the curves of the layer a click (or an alert that names it) picks.

import { api } from "./api.js";
import { heatmap, line } from "./charts.js";
import { h } from "./dom.js";
import { chartFrame, csvUrl } from "./chart_tools.js";
import { SeriesStore } from "./series.js";
import { isLayerMetric, layerFamilies } from "./vocabulary.js";

/** The per-layer statistics a run has (the optimizer's moments only with an Adam-family optimizer). */
const familiesOf = (own) => {
  const present = layerFamilies().filter((f) => own.some((m) => m.startsWith(`${f.name}/`)));
  return present.length ? present : layerFamilies();
};

/** Whether a run has per-layer statistics. */
export const hasLayers = (metrics) => metrics.some(isLayerMetric);

export class LayersView {
  /** metrics: the run's metric names (the layers' own, ``<statistic>/<layer>``, for the search and the CSV). */
  constructor(container, runId, rank, metrics) {
    this.runId = runId;
    this.rank = rank;
    const own = (metrics || []).filter(isLayerMetric);
    this.families = familiesOf(own);
    // the statistics a layer's curves show (mindwatch.metrics: the heat-mapped ones), one y axis each
    this.curveFamilies = this.families.filter((f) => f.heat);
    this.stat = this.families[0].name;
    this.layers = []; // layer names, in the heat map's row order
    this.picked = null; // the layer whose curves are shown
    this.heat = null;
    this.curve = null;
    this.select = h(
      "select",
      { id: "layer-stat", title: "statistic" },
      ...this.families.map((f) => h("option", { value: f.name }, f.title)),
    );
    this.select.addEventListener("change", () => {
      this.stat = this.select.value;
      this.refresh();
    });
    this.heatEl = h("div", { class: "chart heat layers", id: "chart-layers" });
    this.curveEl = h("div", { class: "chart heat", id: "chart-layer" });
    const ofStat = () => own.filter((m) => m.startsWith(`${this.stat}/`));
    const ofPicked = () => this.curveFamilies.map((f) => `${f.name}/${this.picked}`);
    this.curveFrame = chartFrame(this.curveEl, {
      name: "layer",
      chart: () => this.curve && this.curve.chart,
      csv: () => csvUrl(runId, ofPicked(), [rank], "layer"),
    });
    this.curveFrame.hidden = true;
    this.el = h(
      "section",
      { class: "layers-view", id: "layers", "data-metrics": own.join(",") },
      h("h3", {}, "Layers ", this.select, h("span", { class: "muted" }, " click a cell for the layer's curves")),
      chartFrame(this.heatEl, {
        name: "layers",
        chart: () => this.heat && this.heat.chart,
        csv: () => csvUrl(runId, ofStat(), [rank], "layers"),
      }),
      this.curveFrame,
    );
    container.append(this.el);
  }

  async refresh() {
    const d = await api.heatmap(this.runId, this.rank, `${this.stat}/`);
    const prefix = `${this.stat}/`;
    this.layers = d.layers.map((m) => m.slice(prefix.length));
    const data = Object.assign({}, d, { layers: this.layers });
    this.data = data;
    if (!this.heat) {
      this.heat = heatmap(this.heatEl, data, this.heatOptions());
      this.heat.chart.on("click", (p) => {
        if (p.seriesType === "heatmap") this.pick(this.layers[p.value[1]]);
      });
    } else {
      this.heat.update(data, this.heatOptions());
    }
    if (this.picked) await this.loadCurves();
  }

  /** The heat map's title and colour scale, and the picked layer's row outlined. */
  heatOptions() {
    const title = `${layerFamilies().find((f) => f.name === this.stat).title} per layer (log colour)`;
    return { title, log: true, selected: this.picked };
  }

  /** Show the curves of ``layer`` (a click on the heat map, or an alert that names it). */
  async pick(layer) {
    this.picked = layer;
    this.curveFrame.hidden = false;
    if (this.heat && this.data) this.heat.update(this.data, this.heatOptions());
    this.el.scrollIntoView({ block: "nearest" });
    await this.loadCurves();
  }

  async loadCurves() {
    const curves = this.curveFamilies;
    const series = curves.map(
      ({ name: stat, title: name }, i) =>
        new SeriesStore({ run: this.runId, metric: `${stat}/${this.picked}`, rank: this.rank }, { name, yAxisIndex: i }),
    );
    await Promise.all(series.map((s) => s.load("step")));
    const opts = { title: `layer ${this.picked}`, series, axes: curves.map((f) => ({ name: f.title })), x: "step" };
    if (this.curve) this.curve.update(opts);
    else this.curve = line(this.curveEl, opts);
  }

  resize() {
    if (this.heat) this.heat.resize();
    if (this.curve) this.curve.resize();
  }

  dispose() {
    if (this.heat) this.heat.dispose();
    if (this.curve) this.curve.dispose();
    this.el.remove();
  }
}
