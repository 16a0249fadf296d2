// The compare page: several runs side by side. Every chart group of the vocabulary, one chart per metric with one
// line per run (a run keeps its colour on every chart), drawn like the run page's (run_charts.js, charts.js: smoothing
// with the raw line faint behind, log scale, x by step, time or elapsed, the robust y range); the config keys that
// differ between the runs; their summaries (mindwatch.analysis.summary.RunSummary). The view lives in the URL's hash:
// #/compare?runs=p/a,p/b&smoothing=0.6&log=1&y=all&x=elapsed&config=all

import { api } from "./api.js";
import { PALETTE, bestMark, line } from "./charts.js";
import { chartViewFromParams, setChartViewParams } from "./chart_view.js";
import { badge, h } from "./dom.js";
import { chartGroups, metricAxis } from "./run_charts.js";
import { POINTS, SeriesStore, eventXs } from "./series.js";
import { chartControls } from "./run_panels.js";
import { loadVocabulary } from "./vocabulary.js";

/** A run's colour on every chart and in the tables: its place in the URL's list. */
export const runColor = (i) => PALETTE[i % PALETTE.length];
/** What a run is called here, as on the runs page: its display name (notes.json), else its id. */
const runName = (r) => r.summary.name || r.id;
/** A run's name with its colour; its id beside a display name (two runs may share a name), in full on hover. */
const runLabel = (r, i) => [
  h("span", { class: "swatch", style: `background:${runColor(i)}` }),
  " ",
  h("span", { class: "run-label", title: r.id }, runName(r)),
  r.summary.name ? h("span", { class: "muted run-id" }, ` ${r.id}`) : null,
];

/** The summary rows, in the order a person reads them: [RunSummary field, its value of a run's {summary, text, rank_text}];
 * each row's label comes from the server (/api/compare/runs' labels: mindwatch.analysis.summary.LABELS), like the runs
 * table's headers, and so does each number's and duration's text (as the report prints them). */
const SUMMARY_ROWS = [
  ["state", (r) => badge(r.summary.state)],
  ["last_step", (r) => (r.summary.last_step ?? "–") + (r.summary.total_steps ? ` of ${r.summary.total_steps}` : "")],
  ["best_loss", (r) => number(r, "best_loss") + (r.summary.best_loss_step != null ? ` (step ${r.summary.best_loss_step})` : "")],
  ["final_loss", (r) => number(r, "final_loss")],
  [
    "best_eval",
    (r) =>
      number(r, "best_eval") +
      (r.summary.best_eval_metric ? ` (${r.summary.best_eval_metric}, step ${r.summary.best_eval_step})` : ""),
  ],
  ["duration", (r) => number(r, "duration")],
  ["ranks", (r) => r.rank_text],
  ["alert_count", (r) => String(r.summary.alert_count)],
  ["samples_per_second_p50", (r) => number(r, "samples_per_second_p50")],
  ["max_grad_norm", (r) => number(r, "max_grad_norm")],
  ["started_at", (r) => (r.summary.started_at ? new Date(r.summary.started_at * 1000).toLocaleString() : "–")],
  ["error", (r) => (r.text && r.text.error) || ""], // what went wrong (analysis/state_text.py's headline), not its first characters
];

/** A table cell of run r (the i-th); long text (an error, a list) wraps, the rest stays on one line. On a phone the table
 * stacks, and each cell says whose it is (data-label, style.css). */
const cell = (r, i, content) =>
  h(
    "td",
    {
      "data-run": r.id,
      "data-label": runName(r),
      style: `--run-color:${runColor(i)}`,
      class: typeof content === "string" && content.length > 40 ? "long" : "",
    },
    content,
  );
/** A summary number as the report prints it: the server's text (mindwatch.units.format_number, 4 significant digits). */
const number = (r, field) => (r.text && r.text[field]) || "–";
const configText = (v, present) => (!present ? "(not set)" : typeof v === "string" ? v : JSON.stringify(v));

/** The compare page's view from the hash's query: the runs, the chart view (chart_view.js), all config keys or not. */
export function compareViewFromParams(p) {
  return Object.assign(chartViewFromParams(p), {
    runs: (p.get("runs") || "").split(",").filter(Boolean),
    allConfig: p.get("config") === "all",
  });
}

function compareHash(v) {
  const q = new URLSearchParams({ runs: v.runs.join(",") });
  setChartViewParams(q, v);
  if (v.allConfig) q.set("config", "all");
  return `#/compare?${q.toString().replaceAll("%2C", ",").replaceAll("%2F", "/")}`;
}

export class ComparePage {
  /** params: the hash's query (compareViewFromParams). */
  constructor(main, params) {
    this.view = compareViewFromParams(params);
    this.runs = []; // /api/compare/runs: [{id, summary, rank_text, metrics, evaluation}]
    this.config = [];
    this.labels = {};
    this.charts = []; // [{metric, events, chart, series, marks}]
    this.disposed = false;
    this.controls = h("section", { class: "toolbar", id: "compare-controls" });
    this.summary = h("section", { class: "compare-table", id: "compare-summary" });
    this.configBox = h("section", { class: "compare-table", id: "compare-config" });
    this.grid = h("section", { class: "charts", id: "compare-charts" });
    this.key = h("div", { class: "compare-key", id: "compare-key" });
    document.title = "mindwatch: compare";
    main.replaceChildren(
      h("h2", {}, `Compare ${this.view.runs.length} run(s)`),
      this.controls,
      this.summary,
      this.configBox,
      h("h3", { class: "compare-heading" }, "Charts"),
      this.key,
      this.grid,
    );
    this.onResize = () => this.charts.forEach((c) => c.chart.resize());
    window.addEventListener("resize", this.onResize);
    this.renderControls();
    if (!this.view.runs.length) {
      this.grid.replaceChildren(h("p", { class: "empty" }, "Select runs on the runs page, then “Compare selected”."));
      return;
    }
    this.keepView();
    this.build().catch((e) => this.grid.replaceChildren(h("p", { class: "error" }, e.message)));
  }

  renderControls() {
    const redraw = () => {
      this.keepView();
      this.drawAll();
    };
    this.controls.replaceChildren(
      h("a", { href: "#/" }, "← runs"),
      ...chartControls(this.view, {
        smoothing: (v) => {
          this.view.smoothing = v;
          redraw();
        },
        log: (on) => {
          this.view.log = on;
          redraw();
        },
        robust: (on) => {
          this.view.robust = on;
          redraw();
        },
        x: async (kind) => {
          this.view.x = kind;
          this.keepView();
          await this.loadAll();
        },
      }),
    );
  }

  /** The view into the URL's hash, without a new history entry: a reload or a copied link shows the same. */
  keepView() {
    const hash = compareHash(this.view);
    if (location.hash !== hash) history.replaceState(null, "", hash);
  }

  async build() {
    const [d] = await Promise.all([api.compareRuns(this.view.runs), loadVocabulary()]); // the chart groups: the vocabulary's
    if (this.disposed) return;
    this.runs = d.runs;
    this.config = d.config;
    this.labels = d.labels;
    this.renderSummary();
    this.renderConfig();
    this.renderKey();
    this.buildCharts();
    await this.loadAll();
  }

  renderSummary() {
    const head = h(
      "tr",
      {},
      h("th", {}, ""),
      ...this.runs.map((r, i) =>
        h(
          "th",
          { "data-run": r.id },
          h("a", { href: `#/run/${encodeURIComponent(r.id)}` }, ...runLabel(r, i)),
          " ",
          h(
            "button",
            {
              type: "button",
              class: "link remove-run",
              title: `leave ${runName(r)} out`,
              "aria-label": `leave ${runName(r)} out`,
              onclick: () => this.removeRun(r.id),
            },
            "×",
          ),
        ),
      ),
    );
    const rows = SUMMARY_ROWS.map(([field, value]) =>
      h("tr", { "data-row": field }, h("th", {}, this.labels[field] || field), ...this.runs.map((r, i) => cell(r, i, value(r)))),
    );
    this.summary.replaceChildren(
      h("h3", {}, "Summary"),
      h(
        "div",
        { class: "scroll" },
        h("table", { class: "runs", id: "summary-table" }, h("thead", {}, head), h("tbody", {}, ...rows)),
      ),
    );
  }

  renderConfig() {
    const differ = this.config.filter((k) => k.differs);
    const shown = this.view.allConfig ? this.config : differ;
    const toggle = h(
      "label",
      {},
      h("input", {
        type: "checkbox",
        id: "config-all",
        checked: this.view.allConfig,
        onchange: (e) => {
          this.view.allConfig = e.target.checked;
          this.keepView();
          this.renderConfig();
        },
      }),
      ` show all ${this.config.length} keys`,
    );
    const head = h("tr", {}, h("th", {}, "key"), ...this.runs.map((r, i) => h("th", { "data-run": r.id }, ...runLabel(r, i))));
    const rows = shown.map((k) =>
      h(
        "tr",
        { "data-key": k.key, class: k.differs ? "differs" : "" },
        h("th", {}, k.key),
        ...k.values.map((v, i) => cell(this.runs[i], i, configText(v, k.present[i]))),
      ),
    );
    const note = differ.length
      ? `${differ.length} of ${this.config.length} config keys differ`
      : `The configs are the same (${this.config.length} keys)`;
    this.configBox.replaceChildren(
      h("h3", {}, "Config"),
      h("div", { class: "toolbar" }, h("span", { class: "muted", id: "config-note" }, note), toggle),
      shown.length
        ? h(
            "div",
            { class: "scroll" },
            h("table", { class: "runs", id: "config-table" }, h("thead", {}, head), h("tbody", {}, ...rows)),
          )
        : "",
    );
  }

  /** Which colour is which run, once above the charts and in full: a chart's own legend cuts long names that share
   * a prefix (run_20261201_1935...) and scrolls the runs past the third out of sight. It stays in view (sticky). */
  renderKey() {
    this.key.replaceChildren(...this.runs.map((r, i) => h("span", { class: "key-run", "data-run": r.id }, ...runLabel(r, i))));
  }

  /** One chart per metric of each chart group any run has (run_charts.chartGroups), in the groups' order; a chart
   * whose group holds several metrics names the group under its title; the group's events are marked on each of its charts. */
  buildCharts() {
    const metrics = [...new Set(this.runs.flatMap((r) => r.metrics))];
    this.grid.replaceChildren();
    for (const g of chartGroups(metrics)) {
      for (const m of g.metrics) {
        const el = h("div", { class: "chart", id: `compare-${m}`, "data-metric": m, "data-group": g.id });
        this.grid.append(el);
        const subtitle = g.metrics.length > 1 || g.title !== m ? g.title : "";
        this.charts.push({
          metric: m,
          events: g.events,
          marked: g.marked.includes(m), // an evaluation: each run's points, its best marked
          series: [],
          marks: [],
          chart: line(el, { title: m, subtitle, series: [], axes: [metricAxis(m)], x: this.view.x, legend: false }),
        });
      }
    }
    echarts.connect(this.charts.map((c) => c.chart.chart)); // this page's own line() charts
  }

  /** Every chart's points: one request per metric for all runs (and per event its chart marks). */
  async loadAll() {
    const names = Object.fromEntries(this.runs.map((r) => [r.id, runName(r)]));
    await Promise.all(
      this.charts.map(async (c) => {
        const [d, ...events] = await Promise.all(
          [c.metric, ...c.events].map((m) => api.compare(this.view.runs, m, this.view.x, POINTS)),
        );
        if (this.disposed) return;
        c.series = d.series
          .map((s, i) => {
            const look = { name: names[s.run] || s.run, color: runColor(i), marker: c.marked };
            if (c.marked) {
              // the server draws each run's elapsed x from its own start: its best's time too
              const evaluation = this.runs[i].evaluation;
              const best = evaluation && evaluation.rank === s.rank ? evaluation.bests[c.metric] : undefined;
              look.best = bestMark(best, this.view.x, this.view.x === "elapsed" ? s.elapsed_origin : 0);
            }
            const store = new SeriesStore({ run: s.run, metric: c.metric }, look);
            store.take(s); // one request for every run's series: /api/compare, each in the wire shape of /api/series
            return store;
          })
          .filter((s) => s.points.length);
        // each run's events in its colour
        c.marks = events
          .flatMap((e) => e.series.map((s, i) => ({ name: e.metric, color: runColor(i), xs: eventXs(s.points) })))
          .filter((e) => e.xs.length);
        this.draw(c);
      }),
    );
  }

  draw(c) {
    // elapsed: the server counts each run's x from its own start
    c.chart.update({
      series: c.series,
      events: c.marks,
      x: this.view.x,
      xOrigin: 0,
      smoothing: this.view.smoothing,
      log: this.view.log,
      robust: this.view.robust,
    });
  }

  drawAll() {
    this.charts.forEach((c) => this.draw(c));
  }

  removeRun(id) {
    this.view.runs = this.view.runs.filter((r) => r !== id);
    location.hash = compareHash(this.view); // a new page: the colours follow the list
  }

  dispose() {
    this.disposed = true;
    window.removeEventListener("resize", this.onResize);
    this.charts.forEach((c) => c.chart.dispose());
  }
}
