// Each chart's tools: a PNG of the chart as drawn, a CSV of every recorded point of its series (from /api/csv, not
// the thinned points drawn), and full screen. Buttons above the chart, not ECharts' toolbox: a keyboard reaches them.
// Usage: const frame = chartFrame(el, { name: "loss", chart: () => card.chart.chart, csv: () => csvUrl(runId, metrics, ranks, "loss") });
//        grid.append(frame);   // el (the chart's own div) sits inside the frame

import { h } from "./dom.js";

/** The CSV of every point of ``metrics`` on ``ranks`` (mindwatch.serve.api.series_csv: step,time,metric,rank,value), its
 * file named after the run and ``chart`` by the server (mindwatch.serve.api.csv_file_name). */
export function csvUrl(runId, metrics, ranks, chart) {
  const q = new URLSearchParams({ run: runId, metrics: metrics.join(","), ranks: (ranks || []).join(",") });
  if (chart) q.set("name", chart);
  return `/api/csv?${q.toString()}`;
}

/** The name the server gives the file at ``url`` (its Content-Disposition, asked with HEAD: no points are read), with
 * ``extension`` for its own; null when it gives none. */
async function fileNameOf(url, extension) {
  const r = await fetch(url, { method: "HEAD", credentials: "same-origin" });
  const name = /filename="([^"]+)"/.exec(r.headers.get("Content-Disposition") || "");
  return name ? name[1].replace(/\.[^.]*$/, `.${extension}`) : null;
}

function download(href, fileName) {
  const a = h("a", { href, download: fileName || "", hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
}

/**
 * The frame of one chart: its tools above it, the chart's element inside. opts: {name (the chart's, for the buttons'
 * labels), chart() (the ECharts instance, once drawn), csv() (the CSV's URL, whose file name the PNG takes; or null: no
 * CSV button), wide (a full-width card), controls (elements of the chart's own before the buttons: a step slider)}.
 */
export function chartFrame(el, opts) {
  const frame = h("div", { class: `card${opts.wide ? " wide" : ""}`, "data-chart": el.id });
  const button = (cls, label, title, onclick) =>
    h("button", { type: "button", class: `tool ${cls}`, title, "aria-label": `${title}: ${opts.name}`, onclick }, label);
  const png = button("tool-png", "PNG", "download the chart as a PNG image", async () => {
    const chart = opts.chart();
    if (!chart) return;
    const image = chart.getDataURL({ type: "png", pixelRatio: 2, backgroundColor: "#fff" });
    download(image, (opts.csv && (await fileNameOf(opts.csv(), "png").catch(() => null))) || "chart.png");
  });
  const csv = opts.csv
    ? button("tool-csv", "CSV", "download every recorded point of the chart's series (not only those drawn) as CSV", () =>
        download(opts.csv(), ""),
      )
    : null;
  const full = button("tool-full", "full screen", "full screen (Esc leaves it)", () => {
    if (document.fullscreenElement === frame) document.exitFullscreen();
    else frame.requestFullscreen().catch(() => {});
  });
  frame.addEventListener("fullscreenchange", () => {
    const on = document.fullscreenElement === frame;
    full.setAttribute("aria-pressed", String(on));
    full.textContent = on ? "exit full screen" : "full screen";
    const chart = opts.chart();
    if (chart) chart.resize();
  });
  frame.append(h("div", { class: "chart-tools" }, opts.controls || [], png, csv, full), el);
  return frame;
}
