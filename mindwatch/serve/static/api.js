// The dashboard's only way to the server: JSON from /api/* and the live stream (server-sent events).

/** The JSON body of ``url``; a 401 sends the browser to the sign-in page, any other error throws its message. */
export async function getJSON(url) {
  const r = await fetch(url, { credentials: "same-origin" });
  if (r.status === 401) {
    location.href = "/login";
    throw new Error("sign in");
  }
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

/** POST ``body`` as JSON to ``url``; the answer's JSON, or an Error with the server's message. */
export async function postJSON(url, body) {
  const r = await fetch(url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  const answer = await r.json();
  if (!r.ok) throw new Error(answer.error || r.statusText);
  return answer;
}

const query = (params) => new URLSearchParams(params).toString();

export const api = {
  run: (run) => getJSON(`/api/run?${query({ run })}`),
  alerts: (run) => getJSON(`/api/alerts?${query({ run })}`),
  /** params: {run, metric, rank, x, points, lo?, hi?} */
  series: (params) => getJSON(`/api/series?${query(params)}`),
  band: (run, metric, points) => getJSON(`/api/band?${query({ run, metric, points })}`),
  /** The k ranks most often the max or min of metric across ranks, most first. */
  outliers: (run, metric, k) => getJSON(`/api/outliers?${query({ run, metric, k })}`),
  /** A family's members ``<prefix><layer>`` binned over steps (mindwatch.analysis.heatmap's bucket policy). */
  heatmap: (run, rank, prefix) => getJSON(`/api/heatmap?${query({ run, prefix, rank })}`),
  /** The layers' last histograms of weights and gradients (mindwatch.analysis.histograms): {weights, grads}. */
  histograms: (run, rank) => getJSON(`/api/histograms?${query({ run, rank })}`),
  /** One metric of every run: {series: [{run, points, nonfinite, state}]}; x "elapsed" counts from each run's start. */
  compare: (runs, metric, x, points) =>
    getJSON(`/api/compare?runs=${runs.map(encodeURIComponent).join(",")}&${query({ metric, x, points })}`),
  /** The runs' summaries (mindwatch.analysis.summary) and config keys: {runs: [{id, summary, rank_text, metrics}], config}. */
  compareRuns: (runs) => getJSON(`/api/compare/runs?runs=${runs.map(encodeURIComponent).join(",")}`),
  /** The profile action's profiles, each summarised (mindwatch.analysis.profile_summary): {profiles: [...]}. */
  profiles: (run) => getJSON(`/api/profiles?${query({ run })}`),
  /** Where a rank's Chrome trace of the profile from ``step`` downloads (a file, not JSON). */
  profileTraceUrl: (run, step, rank) => `/api/profile-trace?${query({ run, step, rank })}`,
};

/**
 * The live stream /api/live?<params>: each named event's JSON goes to handlers[name];
 * handlers.open and handlers.error (no data) follow the connection. Returns the EventSource (close() it).
 */
export function openLive(params, handlers) {
  const es = new EventSource(`/api/live?${query(params)}`);
  for (const [name, fn] of Object.entries(handlers)) {
    if (name === "open" || name === "error") es.addEventListener(name, () => fn());
    else es.addEventListener(name, (e) => fn(JSON.parse(e.data)));
  }
  return es;
}
