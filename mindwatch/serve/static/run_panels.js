// The run page's panels that only show data: the toolbar, the state banner, the side bar (alerts, tags, config).

import { formatDuration } from "./charts.js";
import { badge, h } from "./dom.js";

/** Above this many ranks the overlay draws the band and the top outlier ranks, not a line per rank. */
export const MANY_RANKS = 16;

/** The toolbar; on: {smoothing(v), filter(text), log(on), robust(on), x(kind), rank(value)} called when the user changes one. */
export function runControls(runId, ranks, view, on) {
  const many = ranks.length > MANY_RANKS;
  const rankSel = h(
    "select",
    { id: "rank", onchange: (e) => on.rank(e.target.value) },
    many ? h("option", { value: "top" }, "top outlier ranks") : null,
    ...(many ? [] : ranks).map((r) => h("option", { value: String(r) }, `rank ${r}`)),
    ranks.length > 1 && !many ? h("option", { value: "all" }, "all ranks") : null,
    many && !["top", "all"].includes(view.rank) ? h("option", { value: view.rank }, `rank ${view.rank}`) : null,
  );
  rankSel.value = view.rank;
  // with many ranks, any one by number
  const pick = many
    ? h("input", {
        id: "rank-pick",
        type: "number",
        min: 0,
        max: Math.max(...ranks),
        placeholder: "rank #",
        onchange: (e) => {
          if (ranks.includes(Number(e.target.value))) on.rank(String(Number(e.target.value)));
        },
      })
    : null;
  return [
    h("a", { href: "#/" }, "← runs"),
    ...chartControls(view, on),
    h("input", {
      id: "metric-filter",
      type: "search",
      placeholder: "search metrics",
      "aria-label": "show only the charts of metrics matching",
      value: view.filter,
      oninput: (e) => on.filter(e.target.value),
    }),
    h("label", {}, rankSel, pick),
    h("a", { href: `#/compare?runs=${encodeURIComponent(runId)}` }, "compare…"),
    h("span", { class: "live-dot", id: "run-live", title: "live updates" }, "live"),
  ];
}

/** The line charts' controls (chart_view.js): smoothing, log scale, y: all points, x; on: {smoothing, log, robust, x}. */
export function chartControls(view, on) {
  const shown = h("span", { id: "smoothing-v" }, view.smoothing.toFixed(2)); // its own span: no page-wide lookup
  return [
    h(
      "label",
      {},
      "smoothing ",
      h("input", {
        id: "smoothing",
        type: "range",
        min: 0,
        max: 0.99,
        step: 0.01,
        value: view.smoothing,
        oninput: (e) => {
          const v = Number(e.target.value);
          shown.textContent = v.toFixed(2);
          on.smoothing(v);
        },
      }),
      shown,
    ),
    h(
      "label",
      {},
      h("input", { id: "logscale", type: "checkbox", checked: view.log, onchange: (e) => on.log(e.target.checked) }),
      " log scale",
    ),
    h(
      "label",
      { title: "by default the y range ignores outliers (1st–99th percentile); points outside it are triangles at the edge" },
      h("input", { id: "y-all", type: "checkbox", checked: !view.robust, onchange: (e) => on.robust(!e.target.checked) }),
      " y: all points",
    ),
    h("label", {}, "x ", xSelect(view.x, on.x)),
  ];
}

function xSelect(value, onX) {
  const sel = h(
    "select",
    { id: "xaxis", onchange: (e) => onX(e.target.value) },
    h("option", { value: "step" }, "step"),
    h("option", { value: "time" }, "time"),
    h("option", { value: "elapsed" }, "elapsed"),
  );
  sel.value = value;
  return sel;
}

/** The side bar: the last 200 alerts (newest first), then tags, the run's meta and config; an alert that names a layer
 * links to it (``onLayer(layer)``), one that asked for a profile or reported it links to the profile (``profiles``:
 * the run page's ProfilesView, its ``profileOf(alert)`` and ``reveal(firstStep)``). Two sections: on a narrow screen the
 * alerts come before the charts (style.css). */
export function sidePanel(info, alerts, onLayer, profiles) {
  const layerLink = (a) => {
    if (!a.layer || !onLayer) return "";
    const link = h("button", { type: "button", class: "layer-link link", "data-layer": a.layer }, `layer ${a.layer}`);
    link.addEventListener("click", () => onLayer(a.layer));
    return h("span", {}, " → ", link);
  };
  const profileLink = (a) => {
    const first = profiles ? profiles.profileOf(a) : null;
    if (first === null) return "";
    const link = h(
      "button",
      { type: "button", class: "profile-link link", "data-first-step": first },
      `profile from step ${first}`,
    );
    link.addEventListener("click", () => profiles.reveal(first));
    return h("span", {}, " → ", link);
  };
  return [
    h(
      "section",
      { class: "side-alerts", id: "side-alerts" },
      h("h3", {}, `Alerts (${alerts.length})`),
      h(
        "ul",
        { class: "alert-list", id: "alert-list" },
        ...alerts
          .slice(-200)
          .reverse()
          .map((a) =>
            h(
              "li",
              { class: `sev-${a.severity || "warning"}` },
              h("b", {}, `step ${a.step ?? "?"}`),
              ` r${a.rank ?? 0} `,
              h("span", { class: "rule" }, a.rule || ""),
              " ",
              a.message || `${a.metric} = ${a.value}`,
              layerLink(a),
              profileLink(a),
            ),
          ),
      ),
    ),
    h(
      "section",
      { class: "side-info" },
      h("h3", {}, "Tags"),
      h("div", {}, ...info.tag_texts.map((t) => h("span", { class: "tag" }, t))),
      h("h3", {}, "Run"),
      h("pre", { class: "config" }, JSON.stringify(info.meta, null, 1)),
      h("h3", {}, "Config"),
      h("pre", { class: "config", id: "config" }, JSON.stringify(info.config, null, 1)),
    ),
  ];
}

/** The state badge next to the title. */
export function stateBadge(st) {
  return [badge(st.state)]; // the step is the progress line's, from the newest points (the status file's lags a beat)
}

/** What the banner says about a run in this state ("" while it runs): the server's sentence (analysis/state_text.py). */
export function bannerText(st) {
  return st.state === "running" ? "" : st.banner || "";
}

/** The header's progress: a bar of steps done out of planned, steps/s (recent, or an ended run's average), TFLOPS and MFU, and the ETA;
 * "total unknown" without a plan. */
export function progressBar(p, state) {
  if (!p || p.step === null || p.step === undefined) return [];
  // an ended run has no current pace: its average over all steps, said as such
  const avg = p.rate === "average";
  const rate = p.steps_per_second
    ? h(
        "span",
        {
          class: "muted",
          id: "progress-rate",
          title: avg ? "the average over all its steps (it is not running)" : "over the last minute",
        },
        ` ${avg ? "average " : ""}${p.steps_per_second.toPrecision(3)} steps/s`,
      )
    : "";
  // per device, the median of the same steps; MFU where the device's peak is known
  const [flops, utilization] = [p.tflops, p.mfu];
  const pace = flops
    ? h(
        "span",
        { class: "muted", id: "progress-tflops", title: `per device, the median over ${avg ? "its steps" : "the last minute"}` },
        ` · ${flops.toPrecision(3)} TFLOPS${utilization ? ` · MFU ${utilization.toFixed(1)} %` : ""}`,
      )
    : "";
  if (!p.total_steps) {
    return [h("span", { id: "progress-text" }, `step ${p.step.toLocaleString("en")} (total unknown)`), rate, pace];
  }
  const pct = Math.floor(100 * p.fraction);
  const eta = state === "running" && p.eta_secs !== null && p.eta_secs !== undefined ? formatDuration(p.eta_secs) : null;
  return [
    h("progress", { id: "progress-bar", max: p.total_steps, value: p.step, title: `${pct} %` }),
    h("span", { id: "progress-text" }, ` ${p.step.toLocaleString("en")}/${p.total_steps.toLocaleString("en")} (${pct} %)`),
    rate,
    pace,
    eta ? h("span", { id: "progress-eta" }, ` · ETA ${eta}`) : "",
  ];
}
