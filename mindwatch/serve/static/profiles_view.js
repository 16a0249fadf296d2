// The run page's profiles (the profile action, docs/profiling.md), as /api/profiles gives them
// (mindwatch/analysis/profile_summary.py): each profile's steps, ranks, who or which alert asked and why, and its state;
// its summary, the top op types by time with every rank side by side (ms and share of its op time; the rank that spent
// the most on a row marked) and the profiled steps' mean step time against the steps before; each rank's trace to
// download and the folder to open in MindStudio Insight. Hidden until the run has a profile; the page fetches it again
// as alerts come, while a profile is not done, and when the run's state changes, so a profile appears live.

import { api } from "./api.js";
import { fmtNumber } from "./charts.js";
import { h } from "./dom.js";

export class ProfilesView {
  constructor(runId) {
    this.runId = runId;
    this.profiles = [];
    this.folded = new Set(); // the first steps of the entries a person closed: they stay closed on the next refresh
    this.el = h("section", { class: "profiles", id: "profiles", hidden: true });
  }

  /** Ask the server again and draw what changed; whether anything did. */
  async refresh() {
    const { profiles } = await api.profiles(this.runId);
    if (JSON.stringify(profiles) === JSON.stringify(this.profiles)) return false;
    this.profiles = profiles;
    this.render();
    return true;
  }

  /** A profile still recording or being analysed on a rank: its state, step times and op types still change. */
  busy() {
    return this.profiles.some((p) => !p.ended);
  }

  /** The first step of the profile an alert asked for or reported (its rule and step among the profile's alerts); null: none. */
  profileOf(alert) {
    const p = this.profiles.find((p) => p.alerts.some(([rule, step]) => rule === alert.rule && step === alert.step));
    return p ? p.first_step : null;
  }

  /** Open a profile's entry and scroll to it. */
  reveal(firstStep) {
    const entry = this.el.querySelector(`#profile-${firstStep}`);
    if (!entry) return;
    this.folded.delete(firstStep);
    entry.open = true;
    entry.scrollIntoView({ block: "start" });
  }

  render() {
    this.el.hidden = !this.profiles.length;
    this.el.replaceChildren(
      h("h3", {}, `Profiles (${this.profiles.length})`),
      ...this.profiles.map((p) => {
        const el = profileEntry(this.runId, p, !this.folded.has(p.first_step));
        el.addEventListener("toggle", () => (el.open ? this.folded.delete(p.first_step) : this.folded.add(p.first_step)));
        return el;
      }),
    );
  }
}

function profileEntry(runId, p, open) {
  return h(
    "details",
    { class: "profile", id: `profile-${p.first_step}`, "data-first-step": p.first_step, open },
    h(
      "summary",
      {},
      h("b", {}, `steps ${p.first_step}–${p.last_step}`),
      ` · ${p.ranks_text} · `,
      h("span", { class: `profile-state profile-${p.ended ? "ended" : "busy"}` }, p.state),
      ` · asked by ${p.asked}`,
    ),
    h("div", { class: "profile-body" }, opsTable(p), rankFiles(runId, p)),
  );
}

const ms = (v) => (v === null || v === undefined ? "-" : `${fmtNumber(Number(v.toPrecision(4)))} ms`);
const percent = (v) => (v === null || v === undefined ? "-" : `${(100 * v).toFixed(1)} %`);

/** The top op types (a row each) with every rank side by side (ms, share), then each rank's step times. */
function opsTable(p) {
  const head = [
    h("tr", {}, h("th", { rowspan: 2 }, "op type"), ...p.ranks.map((r) => h("th", { colspan: 2 }, `rank ${r}`))),
    h("tr", {}, ...p.ranks.flatMap(() => [h("th", {}, "time"), h("th", {}, "share")])),
  ];
  const rows = p.ops.map((op) =>
    h(
      "tr",
      { "data-op": op.op_type },
      h("th", {}, op.op_type),
      ...p.ranks.flatMap((r, i) => [
        h(
          "td",
          {
            class: i === op.most ? "num most" : "num",
            "data-rank": r,
            "data-ms": op.ms[i] ?? "",
            title: i === op.most ? `rank ${r} spent the most on ${op.op_type}` : null,
          },
          ms(op.ms[i]),
        ),
        h("td", { class: "num share" }, percent(op.share[i])),
      ]),
    ),
  );
  // each rank's: the profiled steps' mean step time (s, "during"), the steps before's, and how many times as long
  const times = (label, key, text) =>
    h(
      "tr",
      { "data-times": key },
      h("th", {}, label),
      ...p.step_times.map((t) => h("td", { class: "num", colspan: 2, "data-value": t[key] ?? "" }, text(t[key]))),
    );
  const secs = (v) => ms(v === null ? null : 1000 * v);
  const foot = [
    times(`step time, steps ${p.first_step}–${p.last_step}`, "during", secs),
    times(`step time, the ${p.steps_before} steps before`, "before", secs),
    times("times as long", "ratio", (v) => (v === null ? "-" : `×${v.toFixed(2)}`)),
  ];
  const empty = p.ops.length ? null : h("caption", {}, "no op statistics yet: MindSpore writes them when the profile stops");
  return h(
    "table",
    { class: "profile-ops", "data-first-step": p.first_step },
    empty,
    h("thead", {}, ...head),
    h("tbody", {}, ...rows),
    h("tfoot", { class: "profile-times" }, ...foot),
  );
}

/** Each rank's trace to download, and its folder to open in MindStudio Insight. */
function rankFiles(runId, p) {
  return h(
    "ul",
    { class: "profile-files" },
    ...p.rank_parts.map((part) =>
      h(
        "li",
        { "data-rank": part.rank },
        part.trace
          ? h(
              "a",
              { class: "profile-trace", href: api.profileTraceUrl(runId, p.first_step, part.rank), download: "" },
              `trace (rank ${part.rank})`,
            )
          : h("span", { class: "muted" }, `trace (rank ${part.rank}): ${p.ended ? "none" : "once MindSpore has analysed it"}`),
        part.folder ? [" · open ", h("code", { class: "profile-folder" }, part.folder), " in MindStudio Insight"] : "",
        part.error ? h("span", { class: "error" }, ` · ${part.error}`) : "",
      ),
    ),
  );
}
