// The runs page: every run under LOGDIR, live, filtered by project and tag; pick runs to compare.

import { openLive } from "./api.js";
import { $, ago, badge, h, tagList } from "./dom.js";

const COLUMNS = ["", "run", "project", "tags", "state", "last step", "last point", "alerts", "duration"];

export class RunsPage {
  constructor(main) {
    this.filters = { project: "", tag: "" };
    this.selected = new Set();
    this.runs = [];
    this.serverOffset = 0;  // our clock minus the server's, so "last point … ago" is right on a skewed laptop
    this.projectSel = h("select", { id: "filter-project", onchange: (e) => { this.filters.project = e.target.value; this.render(); } });
    this.tagInput = h("input", { id: "filter-tag", placeholder: "tag, e.g. mode=graph",
      oninput: (e) => { this.filters.tag = e.target.value.trim(); this.render(); } });
    this.compareBtn = h("button", { id: "compare-btn", disabled: true, onclick: () => {
      location.hash = `#/compare?runs=${[...this.selected].map(encodeURIComponent).join(",")}&metric=loss`;
    } }, "Compare selected");
    this.tbody = h("tbody");
    this.empty = h("p", { class: "empty" }, "Waiting for runs… (start a training with the monitor on)");
    document.title = "mindwatch: runs";
    main.replaceChildren(
      h("section", { class: "toolbar" }, h("label", {}, "project ", this.projectSel), h("label", {}, "tag ", this.tagInput), this.compareBtn,
        h("span", { class: "live-dot", id: "runs-live", title: "live updates" }, "live")),
      h("table", { class: "runs", id: "runs-table" }, h("thead", {}, h("tr", {}, ...COLUMNS.map((t) => h("th", {}, t)))), this.tbody),
      this.empty);
    this.live = openLive({ runs: 1 }, {
      runs: (d) => {
        this.runs = d.runs;
        this.serverOffset = Date.now() / 1000 - d.now;
        $("#runs-live").classList.add("on");
        this.render();
      },
      error: () => $("#runs-live") && $("#runs-live").classList.remove("on"),
    });
    this.tick = setInterval(() => this.render(), 1000);
  }

  shownRuns() {
    const { project, tag } = this.filters;
    const shown = this.runs.filter((r) => (!project || r.project === project) && (!tag || tagList(r.tags).some((t) => t.includes(tag))));
    return shown.sort((a, b) => (b.started_at || 0) - (a.started_at || 0));
  }

  render() {
    const projects = [...new Set(this.runs.map((r) => r.project))].sort();
    if (this.projectSel.options.length !== projects.length + 1) {
      this.projectSel.replaceChildren(h("option", { value: "" }, "all"), ...projects.map((p) => h("option", { value: p }, p)));
      this.projectSel.value = this.filters.project;
    }
    const now = Date.now() / 1000 - this.serverOffset;
    this.tbody.replaceChildren(...this.shownRuns().map((r) => this.row(r, now)));
    this.empty.hidden = this.runs.length > 0;
  }

  row(r, now) {
    return h("tr", { "data-run": r.id, class: `row-${r.state}` },
      h("td", {}, h("input", { type: "checkbox", checked: this.selected.has(r.id), onchange: (e) => {
        e.target.checked ? this.selected.add(r.id) : this.selected.delete(r.id);
        this.compareBtn.disabled = this.selected.size < 1;
      } })),
      h("td", {}, h("a", { href: `#/run/${encodeURIComponent(r.id)}` }, r.run_id)),
      h("td", {}, r.project),
      h("td", {}, ...tagList(r.tags).map((t) => h("span", { class: "tag" }, t))),
      h("td", {}, badge(r.state), r.error ? h("span", { class: "err", title: r.error }, " ⚠") : null),
      h("td", { class: "num" }, r.last_step ?? "–"),
      h("td", { class: "num age", "data-t": r.last_time ?? "" }, r.last_time ? ago(now - r.last_time) + " ago" : "–"),
      h("td", { class: "num" }, r.alert_count ? h("span", { class: "alerts" }, r.alert_count) : "0"),
      h("td", { class: "num" }, ago(r.duration)));
  }

  dispose() {
    this.live.close();
    clearInterval(this.tick);
  }
}
