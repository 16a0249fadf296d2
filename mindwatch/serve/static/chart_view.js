// How a page's line charts are drawn, as a person chose it: the x axis, the smoothing, log scale and the robust y range.
// The run page and the compare page keep it in the URL's hash (…?x=elapsed&smoothing=0.6&log=1&y=all), so a reload
// or a copied link draws the same charts.

export const X_KINDS = ["step", "time", "elapsed"];

/** {x, smoothing, log, robust} from a hash's query; anything missing or malformed is the default. */
export function chartViewFromParams(p) {
  const smoothing = Number(p.get("smoothing"));
  return {
    x: X_KINDS.includes(p.get("x")) ? p.get("x") : "step",
    smoothing: p.has("smoothing") && Number.isFinite(smoothing) && smoothing >= 0 && smoothing <= 0.99 ? smoothing : 0,
    log: p.get("log") === "1",
    robust: p.get("y") !== "all",
  };
}

/** The chart view into q (URLSearchParams): only what differs from the default. */
export function setChartViewParams(q, v) {
  if (v.x !== "step") q.set("x", v.x);
  if (v.smoothing) q.set("smoothing", String(v.smoothing));
  if (v.log) q.set("log", "1");
  if (!v.robust) q.set("y", "all");
  return q;
}
