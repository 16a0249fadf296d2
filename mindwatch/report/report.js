// The report's charts, drawn from the JSON embedded in the page. ECharts is inlined above as a classic script;
// mindwatch/report/html.py inlines charts.js and this file as one module (the import lines, one line each, are dropped there).
// A chart that cannot be drawn says "chart failed: …" in its box; the others are still drawn.

import { PALETTE, bestMark, esc, heatmap, line, severityColour, titleOption, unitAxis } from "../assets/charts.js";
import { expertLoad, expertsAt } from "../assets/charts.js";

const DATA = JSON.parse(document.getElementById("mindwatch-data").textContent);
const drawn = [];
const curveCharts = [];
// On paper (mindwatch/report/pdf.py opens the page as report.html#print; a browser's print dialog fires beforeprint)
// the page is laid out at the A4 column's width (template.html, body.print), so the charts are drawn at the size they
// print at, and without zoom sliders.
const onPaper = () => location.hash === "#print" || window.matchMedia("print").matches;
if (onPaper()) document.body.classList.add("print");

/** Draw one chart into el with draw(el); a failure is shown in the chart's place. */
function make(el, draw) {
  try {
    drawn.push(draw(el));
  } catch (e) {
    echarts.dispose(el);
    el.textContent = "chart failed: " + e;
  }
}

/** A chart from a full ECharts option (the histogram and the alert timeline, which only the report has). */
function plainChart(el, option) {
  const chart = echarts.init(el, null, { renderer: "canvas" });
  chart.setOption(Object.assign({ animation: false }, option));
  return chart;
}

/** A chart's box: wide (a row of its own), or a heat map (a row of its own on paper, where half a row is too narrow). */
function chartDiv(parent, id, wide, heat) {
  const div = document.createElement("div");
  div.className = ["chart", wide ? "wide" : "", heat ? "heat" : ""].filter(Boolean).join(" ");
  div.id = id;
  parent.appendChild(div);
  return div;
}

/** A heat map's box, tall enough for a readable row a layer (its labels would overprint each other on the paper's
 * 250 px); past 60 layers the axis names every n-th row instead of growing further. */
function heatDiv(parent, id, rows) {
  const div = chartDiv(parent, id, false, true);
  div.style.minHeight = `${Math.min(rows, 60) * HEAT_ROW_PX + HEAT_FRAME_PX}px`;
  return div;
}
const HEAT_ROW_PX = 14,
  HEAT_FRAME_PX = 110; // a row's label (11-12 px text), and the title, x axis and margins

// -- one chart per metric ------------------------------------------------------------------
// Its group's events (mindwatch.metrics' Metric.event: the steps skip_steps skipped) are dashed lines at the steps they
// happened, as on the dashboard, not curves; comparing runs, each run's in the colour of its first curve (charts.js's
// palette, as line() colours the series).
const curves = document.getElementById("curves");
DATA.metrics.forEach((m, i) =>
  make(chartDiv(curves, `chart-metric-${i}`), (el) => {
    const chart = line(el, {
      title: m.name,
      subtitle: m.points_note,
      log: m.log,
      slider: !onPaper(),
      axes: [unitAxis(m.unit)],
      xMin: DATA.step_range ? DATA.step_range[0] : undefined,
      xMax: DATA.step_range ? DATA.step_range[1] : undefined,
      series: m.series.map((s) => ({
        name: s.label,
        points: s.points, // the wire shape of analysis/lines.py; one mark where the values stop being finite
        nonfinite: s.nonfinite.slice(0, 1).map(([at]) => [at, `non-finite from step ${at}`]),
        abandoned: s.abandoned, // a rewind's abandoned branch, faint and dashed, as on the dashboard
        marker: m.marker, // an evaluation's: its points joined by a line, its best marked
        best: bestMark(s.best, "step"),
      })),
      events: m.events.map((e) => ({
        name: e.name,
        xs: e.xs,
        color: e.series === undefined ? undefined : PALETTE[e.series % PALETTE.length],
      })),
    });
    curveCharts.push(chart);
    return chart;
  }),
);

// -- the Evaluation chart: the dashboard's card (mindwatch.analysis.eval_table) --------------------------------
// the evaluation loss (else the primary) as points with its best marked, beside the training's loss on one axis
const evaluation = document.getElementById("evaluation");
(DATA.evaluation || []).forEach((ev, i) =>
  make(chartDiv(evaluation, `chart-evaluation-${i}`, true), (el) => {
    const chart = line(el, {
      title: ev.title,
      subtitle: ev.note,
      slider: !onPaper(),
      epochs: ev.epochs,
      xMin: DATA.step_range ? DATA.step_range[0] : undefined,
      xMax: DATA.step_range ? DATA.step_range[1] : undefined,
      series: ev.series.map((s) => ({
        name: s.label,
        points: s.points,
        nonfinite: s.nonfinite.slice(0, 1).map(([at]) => [at, `non-finite from step ${at}`]),
        abandoned: s.abandoned,
        marker: s.marker,
        best: bestMark(s.best, "step"),
      })),
    });
    curveCharts.push(chart);
    return chart;
  }),
);

// -- gradient-norm histogram ------------------------------------------------------------------
const dist = document.getElementById("distributions");
if (DATA.histogram) {
  const hist = DATA.histogram;
  make(chartDiv(dist, "chart-grad-norm-histogram", false), (el) =>
    plainChart(el, {
      title: titleOption(`${hist.metric} distribution`, hist.note),
      tooltip: {
        trigger: "axis",
        formatter: (ps) =>
          [
            `${esc(hist.metric)} ${esc(hist.ranges[ps[0].dataIndex])}`,
            ...ps.map((p) => `${esc(p.seriesName)}: ${p.value} steps`),
          ].join("<br>"),
      },
      legend: hist.series.length > 1 ? { right: 10, top: 6 } : undefined,
      grid: { left: 56, right: 24, top: 58, bottom: 48 },
      xAxis: {
        type: "category",
        data: hist.labels,
        name: hist.log ? `${hist.metric} (log bins)` : hist.metric,
        nameLocation: "middle",
        nameGap: 28,
        axisTick: { alignWithLabel: true, interval: (i) => hist.labels[i] !== "" },
        axisLabel: { interval: 0, fontSize: 11 },
      },
      yAxis: { type: "value", name: "steps", minInterval: 1 },
      series: hist.series.map((s) => ({ name: s.label, type: "bar", data: s.counts, barGap: "5%", barCategoryGap: "10%" })),
    }),
  );
}

// -- attention-entropy heat map (binned by mindwatch.analysis.heatmap, like the dashboard's) ---------
if (DATA.heatmap) {
  const hm = DATA.heatmap;
  make(heatDiv(dist, "chart-attention-entropy", hm.layers.length), (el) =>
    heatmap(el, hm, { title: hm.title, subtitle: hm.note }),
  );
}

// -- the stable rank of every weight matrix (docs/layers.md), weights x steps -------------------------------------
if (DATA.weights) {
  const hm = DATA.weights;
  make(heatDiv(document.getElementById("layers"), "chart-stable-rank", hm.layers.length), (el) =>
    heatmap(el, hm, { title: hm.title, subtitle: hm.note }),
  );
}

// -- the MoE layers' routing: each expert's load at a step (the newest; the slider picks another, not on paper) ---------
// and the per-MoE-layer families over the steps (mindwatch.metrics.MOE_FAMILIES)
const moe = document.getElementById("moe");
if (DATA.experts) {
  const ex = DATA.experts;
  const slider = document.createElement("input");
  Object.assign(slider, { type: "range", className: "step-slider", id: "chart-expert-load-step", min: 0, step: 1 });
  slider.setAttribute("aria-label", `step of ${ex.title}`);
  const box = document.createElement("div");
  box.className = "stepped";
  box.appendChild(slider);
  moe.appendChild(box);
  make(heatDiv(box, "chart-expert-load", expertsAt(ex, -1).layers.length), (el) =>
    expertLoad(el, ex, { title: ex.title, subtitle: ex.note, slider }),
  );
}
for (const hm of DATA.moe || []) {
  make(heatDiv(moe, hm.id, hm.layers.length), (el) => heatmap(el, hm, { title: hm.title, subtitle: hm.note }));
}

// -- per-layer health (docs/layers.md): the last norms side by side, and heat maps over steps -------------
if (DATA.layers) {
  const ly = DATA.layers;
  const box = document.getElementById("layers");
  make(chartDiv(box, "chart-layer-norms", true), (el) =>
    plainChart(el, {
      title: titleOption("per-layer L2 norms", ly.note),
      tooltip: { trigger: "axis" },
      legend: { right: 10, top: 6 },
      grid: { left: 64, right: 24, top: 58, bottom: 110 },
      xAxis: { type: "category", data: ly.layers, axisLabel: { rotate: 50, fontSize: 10 } },
      yAxis: { type: "log", name: "L2 norm" },
      series: ly.bars.map(([k, name]) => ({ name, type: "bar", data: ly.last[k].map((v) => (v > 0 ? v : "-")) })),
    }),
  );
  for (const [stat, title] of ly.maps) {
    make(heatDiv(box, `chart-layers-${stat}`, ly.heatmaps[stat].layers.length), (el) =>
      heatmap(el, ly.heatmaps[stat], { title, log: true }),
    );
  }
  for (const [kind, what] of [
    ["weights", "weights"],
    ["grads", "gradients"],
  ]) {
    const hm = ly[`histogram_${kind}`];
    if (hm)
      make(heatDiv(box, `chart-histogram-${kind}`, hm.layers.length), (el) =>
        heatmap(el, hm, {
          title: `${what} per layer at step ${hm.step} (log colour: count)`,
          xName: "value / max |value|",
          log: true,
        }),
      );
  }
}

// -- alerts timeline -------------------------------------------------------------------------
if (DATA.alerts && DATA.alerts.series.length) {
  const al = DATA.alerts;
  make(chartDiv(document.getElementById("alerts-chart"), "chart-alerts", true), (el) =>
    plainChart(el, {
      title: titleOption("alerts", al.note),
      tooltip: { trigger: "item", formatter: (p) => p.data.tip }, // tip: HTML escaped in html.py
      legend: { right: 10, top: 6 },
      grid: { left: 80, right: 24, top: 50, bottom: 36 },
      xAxis: { type: "value", name: "step", min: al.min_step, max: al.max_step },
      yAxis: { type: "category", data: al.severities },
      series: al.series.map((s) => ({
        name: s.label,
        type: "scatter",
        symbolSize: 11,
        symbol: s.symbol,
        data: s.points.map((p) => ({
          value: [p.step, p.severity],
          tip: p.tip,
          itemStyle: { color: severityColour(p.severity) },
        })),
      })),
    }),
  );
}

function resizeAll() {
  drawn.forEach((c) => c.resize());
}

/** Lay the page out for paper (on) or the screen: the print column's width, no zoom sliders. */
function paper(on) {
  document.body.classList.toggle("print", on);
  curveCharts.forEach((c) => c.update({ slider: !on }));
  resizeAll();
}
window.addEventListener("resize", resizeAll);
window.addEventListener("beforeprint", () => paper(true));
window.addEventListener("afterprint", () => paper(location.hash === "#print"));
