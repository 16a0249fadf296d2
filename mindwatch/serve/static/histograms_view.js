// The run page's histograms of each layer's weights and gradients (layers.histogram_every): the last recorded step,
// a heat map of layers x bins (a bin: value / the layer's max|value|), coloured by count on a log scale. Refreshed
// as new steps arrive, so a live run's histograms move with it.

import { api } from "./api.js";
import { heatmap } from "./charts.js";
import { h } from "./dom.js";

const TITLES = { weights: "weights", grads: "gradients" };

export class HistogramsView {
  constructor(container, runId, rank) {
    this.runId = runId;
    this.rank = rank;
    this.maps = {}; // kind -> its heat map, once the run has histograms of it
    // the metric search matches it by these words (its data are the layers' histograms, not a metric's values)
    this.el = h("section", {
      class: "layers-view",
      id: "histograms",
      hidden: true,
      "data-metrics": "histograms,weights,gradients",
    });
    container.append(this.el);
  }

  async refresh() {
    const d = await api.histograms(this.runId, this.rank);
    for (const kind of Object.keys(TITLES)) {
      const g = d[kind];
      if (!g) continue;
      const data = { layers: g.layers, steps: g.bins, values: g.values };
      const opts = {
        title: `${TITLES[kind]} per layer at step ${g.step}`,
        subtitle: "count per bin of value / max|value| (log colour)",
        log: true,
        xName: "value / max|value|",
      };
      if (!this.maps[kind]) {
        const el = h("div", { class: "chart heat layers", id: `chart-histogram-${kind}`, "data-step": g.step });
        this.el.append(el);
        this.el.hidden = false;
        this.maps[kind] = heatmap(el, data, opts);
      } else {
        this.maps[kind].update(data, opts);
        this.maps[kind].chart.getDom().dataset.step = g.step;
      }
    }
  }

  resize() {
    Object.values(this.maps).forEach((m) => m.resize());
  }
  dispose() {
    Object.values(this.maps).forEach((m) => m.dispose());
  }
}
