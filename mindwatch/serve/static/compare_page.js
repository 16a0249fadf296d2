// The compare page: one metric of several runs on one chart, by step or by time since each run's start.

import { api } from "./api.js";
import { line } from "./charts.js";
import { h } from "./dom.js";
import { vocab } from "./vocabulary.js";

export class ComparePage {
  /** params: the hash's query (runs=a,b&metric=loss&x=step). */
  constructor(main, params) {
    this.ids = (params.get("runs") || "").split(",").filter(Boolean);
    this.chart = null;
    const metric = params.get("metric") || vocab.metrics[0].name;
    const x = params.get("x") || "step";
    const el = h("div", { class: "chart big", id: "compare-chart" });
    const metricInput = h("input", { id: "compare-metric", list: "metric-names", value: metric });
    const names = h("datalist", { id: "metric-names" });
    const xSel = h("select", { id: "compare-x" }, h("option", { value: "step" }, "step"), h("option", { value: "elapsed" }, "time since start"));
    xSel.value = x;
    const go = () => {
      location.hash = `#/compare?runs=${this.ids.map(encodeURIComponent).join(",")}&metric=${encodeURIComponent(metricInput.value)}&x=${xSel.value}`;
    };
    metricInput.addEventListener("change", go);
    xSel.addEventListener("change", go);
    document.title = "mindwatch: compare";
    main.replaceChildren(h("section", { class: "toolbar" }, h("a", { href: "#/" }, "← runs"), h("label", {}, "metric ", metricInput, names),
      h("label", {}, "x ", xSel), h("span", { class: "muted" }, `${this.ids.length} run(s)`)), el);
    this.onResize = () => this.chart && this.chart.resize();
    window.addEventListener("resize", this.onResize);
    if (!this.ids.length) { el.replaceWith(h("p", { class: "empty" }, "Select runs on the runs page, then “Compare selected”.")); return; }
    this.chart = line(el, { title: metric, series: [], x });
    api.run(this.ids[0]).then((i) => names.replaceChildren(...i.metrics.map((m) => h("option", { value: m }))));
    api.compare(this.ids, metric, x).then((d) => {
      this.chart.update({ series: d.series.map((s) => ({ name: `${s.run} (${s.state})`, points: s.points, nonfinite: s.nonfinite })), x: d.x });
    }).catch((e) => el.replaceWith(h("p", { class: "error" }, e.message)));
  }

  dispose() {
    window.removeEventListener("resize", this.onResize);
    if (this.chart) this.chart.dispose();
  }
}
