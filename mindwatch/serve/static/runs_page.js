// The runs page: every run under LOGDIR, live, as a table a team reads: columns chosen from config keys, tags and
// summary values, sorted and filtered (a rule of the check language) on the server. The view lives in the URL:
// #/?columns=config.optimizer.lr,final_loss&sort=-final_loss&filter=lr%20>%201e-3&project=gpt&tag=mode
// so a copied link shows the same table; changing the view rewrites the hash and the page is built again from it.

import { getJSON, openLive } from "./api.js";
import { formatDuration } from "./charts.js";
import { $, badge, h } from "./dom.js";

const DEFAULT_COLUMNS = ["final_loss", "best_loss", "best_eval"];
// the fixed columns (the first: the checkboxes), each a column the server sorts by but "tags"; their headers are the server's
const FIXED = ["", "run", "project", "tags", "state", "steps", "last_time", "alerts", "duration"];
/** A column's header: the server's words for summary values (mindwatch.analysis.summary.LABELS), "lr" for
 * config.optimizer.lr, "#mode" for tag.mode. */
const label = (col, labels) => labels[col] || col.replace(/^config\./, "").replace(/^tag\./, "#");

function cell(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(5)));
  return String(v);
}

/** What a cell says beside its value (the server's value_notes: the metric of the best eval). */
const cellNote = (note) => (note ? h("span", { class: "muted cell-note" }, ` ${note}`) : null);

export class RunsPage {
  /** params: the hash's query (columns, sort, filter, project, tag). */
  constructor(main, params) {
    this.view = {
      columns: params.has("columns") ? params.get("columns").split(",").filter(Boolean) : DEFAULT_COLUMNS.slice(),
      sort: params.get("sort") || "",
      filter: params.get("filter") || "",
      project: params.get("project") || "",
      tag: params.get("tag") || "",
    };
    this.selected = new Set();
    this.runs = [];
    this.available = [];
    this.serverOffset = 0; // our clock minus the server's, so "last point … ago" is right on a skewed laptop
    this.live = null;
    this.disposed = false;
    this.total = undefined; // runs under LOGDIR before the filter, once the server said
    this.projectSel = h("select", { id: "filter-project", onchange: (e) => this.go({ project: e.target.value }) });
    this.tagInput = h("input", {
      id: "filter-tag",
      placeholder: "tag, e.g. mode=graph",
      value: this.view.tag,
      oninput: (e) => {
        this.view.tag = e.target.value.trim();
        this.render();
      },
      onchange: () => this.go({}),
    });
    this.filterInput = h("input", {
      id: "filter-expr",
      size: 40,
      value: this.view.filter,
      onchange: (e) => this.go({ filter: e.target.value.trim() }),
    });
    this.filterError = h("span", { class: "error", id: "filter-error" });
    this.columnInput = h("input", {
      id: "add-column",
      list: "column-names",
      placeholder: "add column: config key, tag, summary",
      onchange: (e) => {
        const c = e.target.value.trim();
        if (c && !this.view.columns.includes(c)) this.go({ columns: this.view.columns.concat([c]) });
      },
    });
    this.columnNames = h("datalist", { id: "column-names" });
    this.compareBtn = h(
      "button",
      {
        id: "compare-btn",
        disabled: true,
        onclick: () => {
          location.hash = `#/compare?runs=${[...this.selected].map(encodeURIComponent).join(",")}`;
        },
      },
      "Compare selected",
    );
    this.head = h("tr");
    this.tbody = h("tbody");
    this.count = h("span", { class: "muted", id: "runs-count" });
    this.empty = h("p", { class: "empty" }, "Waiting for runs… (start a training with the monitor on)");
    document.title = "mindwatch: runs";
    main.replaceChildren(
      h(
        "section",
        { class: "toolbar" },
        h("label", {}, "project ", this.projectSel),
        h("label", {}, "tag ", this.tagInput),
        h("label", {}, "filter ", this.filterInput),
        this.filterError,
        this.compareBtn,
        h("span", { class: "live-dot", id: "runs-live", title: "live updates" }, "live"),
      ),
      h("section", { class: "toolbar" }, h("label", {}, this.columnInput, this.columnNames), this.count),
      h("table", { class: "runs", id: "runs-table" }, h("thead", {}, this.head), this.tbody),
      this.empty,
    );
    this.renderHead();
    this.connect();
    this.tick = setInterval(() => this.render(), 1000);
  }

  /** The server's query for this view. */
  query() {
    const q = { runs: 1, columns: this.view.columns.join(",") };
    if (this.view.sort) q.sort = this.view.sort;
    if (this.view.filter) q.filter = this.view.filter;
    return q;
  }

  /** Show the view with ``patch`` applied: it goes into the URL, and the router builds the page from it. */
  go(patch) {
    const v = Object.assign({}, this.view, patch);
    const q = new URLSearchParams();
    q.set("columns", v.columns.join(","));
    for (const k of ["sort", "filter", "project", "tag"]) if (v[k]) q.set(k, v[k]);
    location.hash = `#/?${q.toString()}`;
  }

  async connect() {
    // the JSON endpoint first: a bad filter is a 400 with a message, which an EventSource cannot read
    const q = this.query();
    try {
      this.show(await getJSON(`/api/runs?${new URLSearchParams(q)}`));
    } catch (e) {
      this.filterError.textContent = e.message;
      this.empty.hidden = true;
      return;
    }
    if (this.disposed) return;
    this.live = openLive(q, {
      runs: (d) => {
        $("#runs-live").classList.add("on");
        this.show(d);
      },
      error: () => $("#runs-live") && $("#runs-live").classList.remove("on"),
    });
  }

  show(d) {
    this.runs = d.runs;
    this.total = d.total;
    this.serverOffset = Date.now() / 1000 - d.now;
    this.filterError.textContent = d.error || "";
    if (d.labels && !this.labels) {
      this.labels = d.labels;
      this.filterInput.placeholder = d.filter_example;
      this.renderHead();
    }
    if (d.columns.length !== this.available.length) {
      this.available = d.columns;
      this.columnNames.replaceChildren(...d.columns.map((c) => h("option", { value: c })));
    }
    this.render();
  }

  sortButton(key, text) {
    if (!key) return text;
    const on = this.view.sort.replace(/^-/, "") === key;
    const desc = on && this.view.sort.startsWith("-");
    return h(
      "button",
      { type: "button", class: "sort link", "data-sort": key, onclick: () => this.go({ sort: on && !desc ? `-${key}` : key }) },
      text,
      on ? (desc ? " ▼" : " ▲") : "",
    );
  }

  renderHead() {
    this.head.replaceChildren(
      ...FIXED.map((key) => h("th", {}, this.sortButton(key === "tags" ? "" : key, key && label(key, this.labels || {})))),
      ...this.view.columns.map((c) =>
        h(
          "th",
          { "data-column": c, title: c },
          this.sortButton(c, label(c, this.labels || {})),
          h(
            "button",
            {
              type: "button",
              class: "remove link",
              title: "remove column",
              "aria-label": `remove column ${c}`,
              onclick: () => this.go({ columns: this.view.columns.filter((x) => x !== c) }),
            },
            " ×",
          ),
        ),
      ),
    );
  }

  shownRuns() {
    const { project, tag } = this.view;
    return this.runs.filter((r) => (!project || r.project === project) && (!tag || r.tag_texts.some((t) => t.includes(tag))));
  }

  render() {
    const projects = [...new Set(this.runs.map((r) => r.project))].sort();
    if (this.projectSel.options.length !== projects.length + 1) {
      this.projectSel.replaceChildren(h("option", { value: "" }, "all"), ...projects.map((p) => h("option", { value: p }, p)));
      this.projectSel.value = this.view.project;
    }
    const now = Date.now() / 1000 - this.serverOffset;
    const shown = this.shownRuns();
    this.patchRows(shown.map((r) => this.row(r, now)));
    this.count.textContent = this.total !== undefined ? `${shown.length} of ${this.total} run(s)` : "";
    this.empty.hidden = this.total !== 0;
  }

  /**
   * Make the table's rows these (fresh, detached) rows, in this order, touching only what changed: a row stays the
   * same element, and a cell is replaced only when its content differs, so focus (a ticked checkbox) and a text
   * selection (a run id being copied) survive the live updates.
   */
  patchRows(fresh) {
    const old = new Map([...this.tbody.rows].map((tr) => [tr.dataset.run, tr]));
    fresh.forEach((tr, i) => {
      const kept = old.get(tr.dataset.run);
      old.delete(tr.dataset.run);
      let row = tr;
      if (kept) {
        row = kept;
        if (kept.className !== tr.className) kept.className = tr.className;
        if (kept.cells.length !== tr.cells.length) kept.replaceChildren(...tr.cells);
        else
          [...tr.cells].forEach((td, ci) => {
            if (ci > 0 && kept.cells[ci].outerHTML !== td.outerHTML) kept.cells[ci].replaceWith(td);
          });
        const box = kept.cells[0].querySelector("input");
        if (box && box.checked !== this.selected.has(tr.dataset.run)) box.checked = !box.checked;
      }
      if (this.tbody.rows[i] !== row) this.tbody.insertBefore(row, this.tbody.rows[i] || null);
    });
    for (const tr of old.values()) tr.remove();
  }

  /** A run's row; each cell names its column (data-label), which a phone shows when the table stacks (style.css). */
  row(r, now) {
    const steps = r.last_step ?? "–";
    const td = (i, attrs, ...content) =>
      h("td", Object.assign({ "data-label": FIXED[i] && label(FIXED[i], this.labels || {}) }, attrs), ...content);
    return h(
      "tr",
      { "data-run": r.id, class: `row-${r.state}` },
      td(
        0,
        {},
        h("input", {
          type: "checkbox",
          checked: this.selected.has(r.id),
          "aria-label": `select ${r.name || r.run_id}`,
          onchange: (e) => {
            e.target.checked ? this.selected.add(r.id) : this.selected.delete(r.id);
            this.compareBtn.disabled = this.selected.size < 1;
          },
        }),
      ),
      td(
        1,
        { class: "run-name" },
        h("a", { href: `#/run/${encodeURIComponent(r.id)}` }, r.name || r.run_id),
        r.name ? h("span", { class: "muted run-id" }, ` ${r.run_id}`) : null,
        r.note ? h("div", { class: "note" }, r.note) : null,
      ),
      td(2, {}, r.project),
      td(3, {}, ...r.tag_texts.map((t) => h("span", { class: "tag" }, t))),
      // what went wrong (analysis/state_text.py's headline); the whole error on hover
      td(4, {}, badge(r.state), r.error ? h("div", { class: "err", title: r.error }, `⚠ ${r.error_headline}`) : null),
      td(5, { class: "num" }, r.total_steps ? `${steps}/${r.total_steps}` : steps),
      td(
        6,
        { class: "num age", "data-t": r.last_time ?? "" },
        r.last_time ? `${formatDuration(Math.max(0, now - r.last_time))} ago` : "–",
      ),
      td(7, { class: "num" }, r.alert_count ? h("span", { class: "alerts" }, r.alert_count) : "0"),
      td(8, { class: "num" }, formatDuration(r.duration)),
      ...this.view.columns.map((c) =>
        h(
          "td",
          { class: "num", "data-column": c, "data-label": label(c, this.labels || {}) },
          cell(r.values[c]),
          cellNote((r.value_notes || {})[c]),
        ),
      ),
    );
  }

  dispose() {
    this.disposed = true;
    if (this.live) this.live.close();
    clearInterval(this.tick);
  }
}
