// The run page: the charts of one run, kept live by the stream; zoom fetches the window's detail.
// State: what the user chose (view), what the server said (info, alerts), what is drawn (cards, heats),
// and the live stream with the timers that batch its redraws. The view lives in the URL's hash, so a reload or a
// copied link shows the same charts: #/run/<id>?smoothing=0.6&log=1&y=all&x=time&rank=all&zoom=120,480&q=norm

import { api, openLive } from "./api.js";
import { expertLoad, heatmap } from "./charts.js";
import { chartViewFromParams, setChartViewParams } from "./chart_view.js";
import { $, h } from "./dom.js";
import { mergePoints } from "./series.js";
import { chartFrame, csvUrl } from "./chart_tools.js";
import { LayersView, hasLayers } from "./layers_view.js";
import { HistogramsView } from "./histograms_view.js";
import { ProfilesView } from "./profiles_view.js";
import { ChartCard, chartGroups } from "./run_charts.js";
import { POINTS } from "./series.js";
import { expertFamilies, heatFamilies, isEvalMetric, loadVocabulary, perWords, vocab } from "./vocabulary.js";
import { RunActions } from "./run_actions.js";
import { RunNotes } from "./run_notes.js";
import { MANY_RANKS, bannerText, progressBar, runControls, sidePanel, stateBadge } from "./run_panels.js";

const DRAW_MS = 100; // live points are drawn at most this often
const DERIVED_MS = 1000; // the heat map, the bands, the best evaluations, the profiles are the server's: fetched again at most this often
const ZOOM_MS = 250;
const RESCAN_MS = 10000;
const OUTLIER_RANKS = 5;
const WAITING_MS = 1000; // the "waiting for the first step" clock ticks this often

/** The run page's view from the hash's query; anything missing or malformed is the default. */
export function viewFromParams(p) {
  const zoom = (p.get("zoom") || "").split(",").map(Number);
  return Object.assign(chartViewFromParams(p), {
    rank: p.get("rank") || "0",
    zoom: zoom.length === 2 && zoom.every(Number.isFinite) && zoom[0] < zoom[1] ? zoom : null,
    filter: p.get("q") || "",
  });
}

/** The hash's query for a view: only what differs from the default. */
function viewParams(v, pickedRank) {
  const q = setChartViewParams(new URLSearchParams(), v);
  if (pickedRank) q.set("rank", v.rank);
  if (v.filter) q.set("q", v.filter);
  if (v.zoom) q.set("zoom", v.zoom.map((x) => Number(x.toPrecision(12))).join(","));
  return q.toString().replaceAll("%2C", ",");
}

export class RunPage {
  /** params: the hash's query (viewFromParams). */
  constructor(main, runId, params) {
    this.runId = runId;
    this.view = viewFromParams(params || new URLSearchParams());
    this.info = null;
    this.alerts = [];
    this.cards = [];
    this.heats = new Map(); // family prefix -> its heat map (the expert load's: at a step), when the run records it
    this.layers = null; // the layers view, when the run has per-layer statistics
    this.histograms = null; // the layers' weight and gradient histograms, beside the layers view
    this.live = null;
    this.serverOffset = 0; // our clock minus the server's
    this.disposed = false;
    this.outliers = []; // many ranks: the ranks the overlay draws by default
    this.pickedRank = (params && params.has("rank")) || false;
    this.timers = { draw: null, derived: null, zoom: null, evaluation: null, profiles: null };
    this.zoomOrigin = null;
    this.status = null; // the run's state, as the server last said it (the live stream's "state")
    this.progressNow = null; // its progress, as the server last said it (the live stream's "progress")
    this.building = null; // the build under way: build() never runs twice at once
    this.buildAgain = false; // asked for while one ran: one more when it ends
    this.banner = h("div", { class: "banner", id: "banner", hidden: true });
    this.waiting = h("div", { class: "waiting", id: "run-waiting", role: "status", hidden: true });
    this.progress = h("span", { class: "progress", id: "run-progress" });
    this.controls = h("section", { class: "toolbar" });
    this.actions = new RunActions(runId); // stop / checkpoint / lr buttons, only with --allow-control
    this.grid = h("section", { class: "charts", id: "charts" });
    this.side = h("aside", { class: "side" });
    this.profiles = new ProfilesView(runId); // the profile action's profiles, above the charts once the run has one
    document.title = `mindwatch: ${runId}`;
    this.notes = new RunNotes(runId); // its display name and note; rename / note buttons only with --allow-control
    main.replaceChildren(
      h("div", { class: "run-head" }, this.notes.title, h("span", { id: "run-state" }), this.progress, this.actions.el),
      this.notes.el,
      this.banner,
      this.controls,
      this.waiting,
      h("div", { class: "run-body" }, h("div", { class: "run-main" }, this.profiles.el, this.grid), this.side),
    );
    this.onResize = () => this.views().forEach((v) => v.resize());
    window.addEventListener("resize", this.onResize);
    this.rescan = setInterval(() => this.rebuildIfGrown(), RESCAN_MS);
    this.waitClock = setInterval(() => this.showWaiting(), WAITING_MS);
    this.build().catch((e) => this.showError(e.message));
  }

  /** Everything drawn: the chart cards, the heat maps, the layers view and the histograms (each resize()s and dispose()s). */
  views() {
    return [...this.cards, ...this.heats.values(), this.layers, this.histograms].filter(Boolean);
  }

  ranksShown() {
    if (this.view.rank === "all") return this.info.ranks.length ? this.info.ranks : [0];
    if (this.view.rank === "top") return this.outliers.length ? this.outliers : [this.info.ranks[0] ?? 0];
    return [Number(this.view.rank)];
  }

  bandsShown() {
    return this.view.x === "step" && (this.ranksShown().length > 1 || this.view.rank === "top");
  }

  /** With many ranks: the ranks most often at the edge of the first band metric (step_time first: the stragglers). */
  async loadOutliers() {
    const bands = this.info.band_metrics || [];
    const metric = [...vocab().stragglers].reverse().find((m) => bands.includes(m)) || bands[0];
    this.outliers = metric ? (await api.outliers(this.runId, metric, OUTLIER_RANKS)).ranks : [];
  }

  /** Everything from the server's answer: the run, its alerts, the charts, the live stream. Asked for while one runs
   * (the first points, a reload, a grown run), one more runs when it ends; never two at once. */
  build() {
    if (this.building) {
      this.buildAgain = true;
      return this.building;
    }
    this.building = this.buildOnce().finally(() => {
      this.building = null;
      if (this.buildAgain && !this.disposed) {
        this.buildAgain = false;
        this.build().catch((e) => this.showError(e.message));
      }
    });
    return this.building;
  }

  async buildOnce() {
    [this.info] = await Promise.all([api.run(this.runId), loadVocabulary()]);
    this.status = this.info.status;
    if (this.info.ranks.length > MANY_RANKS) {
      if (!this.pickedRank) this.view.rank = "top";
      await this.loadOutliers();
    }
    this.serverOffset = Date.now() / 1000 - this.info.status.now;
    this.notes.show(this.info.notes);
    this.alerts = (await api.alerts(this.runId)).alerts;
    await this.profiles.refresh().catch(() => {}); // before the side bar: an alert that asked for a profile links it
    this.renderControls();
    this.renderSide();
    this.keepView();
    this.showStatus(this.status);
    this.showProgress(this.info.progress);
    await this.buildCharts();
    this.showWaiting();
    this.connect();
  }

  renderControls() {
    this.controls.replaceChildren(
      ...runControls(this.runId, this.info.ranks, this.view, {
        smoothing: (v) => {
          this.view.smoothing = v;
          this.keepView();
          this.drawAll();
        },
        filter: (text) => {
          this.view.filter = text;
          this.keepView();
          this.applyFilter();
        },
        log: (on) => {
          this.view.log = on;
          this.keepView();
          this.drawAll();
        },
        robust: (on) => {
          this.view.robust = on;
          this.keepView();
          this.drawAll();
        },
        x: async (kind) => {
          this.view.x = kind;
          this.view.zoom = null;
          this.keepView();
          await this.buildCharts();
        },
        rank: async (rank) => {
          this.view.rank = rank;
          this.pickedRank = true;
          this.keepView();
          if (this.info.ranks.length > MANY_RANKS) this.renderControls(); // a rank picked by number joins the list
          await this.buildCharts();
          this.connect();
        },
      }),
    );
  }

  async buildCharts() {
    this.views().forEach((v) => v.dispose());
    this.heats.clear();
    this.layers = null;
    this.histograms = null;
    this.grid.replaceChildren();
    this.cards = chartGroups(this.info.metrics, this.info.evaluation).map((g) => {
      const read = g.metrics.concat(g.events); // its curves and the events it marks
      const el = h("div", { class: "chart", id: `chart-${g.id}`, "data-metrics": read.join(",") });
      let card = null;
      this.grid.append(
        chartFrame(el, {
          name: g.id,
          chart: () => card && card.echarts,
          csv: () => csvUrl(this.runId, read, this.ranksShown(), g.id),
        }),
      );
      card = new ChartCard(el, this.runId, g, this.ranksShown(), this.view.x);
      card.echarts.on("datazoom", () => this.zoomed(card));
      return card;
    });
    echarts.connect(this.cards.map((c) => c.echarts));
    // The first chart (loss) first: on a cold server each metric is read from the file in turn.
    if (this.cards.length) await this.loadCard(this.cards[0]);
    await Promise.all(this.cards.slice(1).map((c) => this.loadCard(c)));
    if (this.view.zoom && this.cards.length) this.cards[0].chart.zoomTo(this.view.zoom); // the shared link's window
    const drawn = vocab().families.filter((f) => heatFamilies().includes(f) || expertFamilies().includes(f));
    for (const f of drawn.filter((a) => this.info.metrics.some((m) => m.startsWith(a.prefix)))) await this.addFamilyChart(f);
    if (hasLayers(this.info.metrics)) {
      this.layers = new LayersView(this.grid, this.runId, this.ranksShown()[0], this.info.metrics);
      await this.layers.refresh();
      this.histograms = new HistogramsView(this.grid, this.runId, this.ranksShown()[0]);
      await this.histograms.refresh();
    }
    this.applyFilter();
  }

  /** A family recorded in the metrics file as one chart: a heat map of its members x steps, or, per expert, the experts
   * x MoE layers at the step its slider picks (newest first). */
  async addFamilyChart(f) {
    const members = this.info.metrics.filter((m) => m.startsWith(f.prefix));
    const id = `chart-${f.name.replaceAll("_", "-")}`;
    const el = h("div", { class: "chart heat", id, "data-metrics": members.join(",") });
    const perExpert = expertFamilies().includes(f);
    const slider = perExpert
      ? h("input", { type: "range", class: "step-slider", id: `${id}-step`, min: 0, step: 1, "aria-label": `step of ${f.title}` })
      : null;
    this.grid.append(
      chartFrame(el, {
        name: f.name,
        wide: true,
        chart: () => this.heats.get(f.prefix) && this.heats.get(f.prefix).chart,
        csv: () => csvUrl(this.runId, members, [this.ranksShown()[0]], f.name),
        controls: [slider],
      }),
    );
    const d = await this.fetchHeat(f.prefix);
    const chart = perExpert
      ? expertLoad(el, d, { title: f.title, prefix: f.prefix, slider })
      : heatmap(el, d, { title: `${f.title} per ${perWords(f)}` });
    this.heats.set(f.prefix, chart);
  }

  /** The metric search: only the charts with a metric whose name holds the text (any of its words) stay shown. */
  applyFilter() {
    const words = this.view.filter.toLowerCase().split(/\s+/).filter(Boolean);
    const matches = (metrics) => !words.length || metrics.some((m) => words.some((w) => m.toLowerCase().includes(w)));
    let shown = 0;
    for (const frame of this.grid.querySelectorAll(":scope > .card, :scope > .layers-view")) {
      const el = frame.matches(".card") ? frame.querySelector(".chart") : frame;
      const hit = matches((el.dataset.metrics || "").split(",").filter(Boolean)) && frame.children.length > 0; // an empty view stays hidden
      frame.hidden = !hit;
      shown += hit ? 1 : 0;
    }
    const none = $("#filter-none", this.grid);
    if (none) none.remove();
    if (!shown && words.length)
      this.grid.append(h("p", { class: "empty", id: "filter-none" }, `no chart has a metric matching "${this.view.filter}"`));
    // charts that were hidden drew at zero size
    this.views().forEach((v) => v.resize());
  }

  async loadCard(card, win) {
    await Promise.all(card.allDefs.map((store) => store.load(card.x, win)));
    if (!win && this.bandsShown()) await this.loadBands(card);
    this.draw(card);
  }

  /** Across ranks: the min..max band of each of the card's metrics the run bands, behind its per-rank lines
   * (mindwatch.analysis.bands), into the store of its first rank. */
  async loadBands(card) {
    const banded = card.group.metrics.filter((m) => (this.info.band_metrics || []).includes(m));
    await Promise.all(
      banded.map(async (m) => card.defs.find((d) => d.metric === m).takeBand((await api.band(this.runId, m, POINTS)).points)),
    );
  }

  /** Where elapsed time counts from (epoch seconds): the server's one origin for the run (/api/run's elapsed_origin). */
  xOrigin() {
    return this.info.elapsed_origin || 0;
  }

  /** The view into the URL's hash, without a new history entry or a rebuild: reload and share show the same. */
  keepView() {
    const q = viewParams(this.view, this.pickedRank);
    const hash = `#/run/${encodeURIComponent(this.runId)}${q ? "?" + q : ""}`;
    if (location.hash !== hash) history.replaceState(null, "", hash);
  }

  fetchHeat(prefix) {
    return api.heatmap(this.runId, this.ranksShown()[0], prefix);
  }

  draw(card) {
    card.draw(this.view, this.alerts, this.restarts(), this.xOrigin(), this.info.evaluation);
  }

  /** Where each attempt after the first began (meta.json's attempts), for the charts' restart lines. */
  restarts() {
    return ((this.info && this.info.attempts) || [])
      .slice(1)
      .map((a, i) => ({ step: a.first_step, t: a.started_at, attempt: a.attempt || i + 2 }));
  }
  drawAll() {
    this.cards.forEach((c) => this.draw(c));
    this.showWaiting();
  }

  zoomed(card) {
    // Connected charts all fire "datazoom": the window comes from the one the user zoomed (the first),
    // or from the loss chart when that one has no data yet.
    if (!this.timers.zoom) this.zoomOrigin = card.loaded ? card : this.cards[0];
    clearTimeout(this.timers.zoom);
    this.timers.zoom = setTimeout(() => {
      this.timers.zoom = null;
      const win = this.zoomOrigin.chart.window();
      this.view.zoom = win;
      this.keepView();
      for (const other of this.cards) {
        if (win) this.loadCard(other, win);
        else {
          other.showOverview();
          this.draw(other);
        }
      }
    }, ZOOM_MS);
  }

  renderSide() {
    const onLayer = (layer) => this.layers && this.layers.pick(layer);
    this.side.replaceChildren(...sidePanel(this.info, this.alerts, onLayer, this.profiles));
  }

  showProgress(p) {
    this.progressNow = p;
    this.progress.replaceChildren(...progressBar(p, this.status.state));
  }

  /** A live run before its first step (the graph compiles, the first batch loads): what it waits for, and how long. */
  showWaiting() {
    const st = this.status;
    const drawn = this.cards.some((c) => c.defs.some((d) => d.points.length));
    const waits = Boolean(st) && st.state === "running" && (st.last_step === null || st.last_step === undefined) && !drawn;
    this.waiting.hidden = !waits;
    if (!waits) return;
    const started = this.info.elapsed_origin || null;
    const secs = started ? Math.max(0, Math.round(Date.now() / 1000 - this.serverOffset - started)) : null;
    this.waiting.textContent = `compiling the graph / waiting for the first step${secs === null ? "" : `: ${secs} s`}`;
  }

  showStatus(st) {
    this.showWaiting();
    $("#run-state").replaceChildren(...stateBadge(st));
    this.actions.show(st.state);
    const text = bannerText(st);
    this.banner.hidden = !text;
    this.banner.className = `banner banner-${st.state}`;
    this.banner.textContent = text;
    this.banner.title = st.error || ""; // the sentence names what went wrong; the whole error on hover
  }

  showError(message) {
    this.banner.hidden = false;
    this.banner.className = "banner banner-failed";
    this.banner.textContent = message;
  }

  // live push -------------------------------------------------------
  connect() {
    if (this.live) this.live.close();
    if (this.disposed) return;
    const metrics = [...new Set(this.cards.flatMap((c) => c.allDefs.map((d) => d.metric)))];
    const liveDot = (on) => $("#run-live") && $("#run-live").classList.toggle("on", on);
    this.live = openLive(
      { run: this.runId, metrics: metrics.join(","), cursor: this.info.cursor },
      {
        open: () => liveDot(true),
        error: () => liveDot(false),
        points: (d) => {
          if (this.waitsForCharts()) {
            this.live.close();
            this.build();
            return;
          } // the first step: the charts it has
          const added = mergePoints(
            this.cards.flatMap((c) => c.allDefs),
            d,
            this.view.x,
          );
          if (added) {
            this.scheduleDraw();
            this.refreshDerived();
            if (Object.keys(d.metrics).some(isEvalMetric)) this.refreshEvaluation();
          }
        },
        alert: (d) => {
          this.alerts = this.alerts.concat(d.alerts);
          this.renderSide();
          this.scheduleDraw();
          this.refreshProfiles(); // a profile taken, or a request folded into one: its alert came with it
        },
        state: (st) => {
          if (this.status && st.state !== this.status.state) this.refreshProfiles(); // an end waits for the analyses
          this.status = st;
          this.showStatus(st);
          if (this.progressNow) this.showProgress(this.progressNow); // its look follows the state
        },
        progress: (p) => this.showProgress(p),
        reload: async () => {
          this.live.close();
          await this.build();
        },
      },
    );
  }

  /** Whether points came for metrics the page has no chart for yet (it opened before the first step). */
  waitsForCharts() {
    return !this.cards.length;
  }

  scheduleDraw() {
    if (this.timers.draw) return;
    this.timers.draw = setTimeout(() => {
      this.timers.draw = null;
      this.drawAll();
    }, DRAW_MS);
  }

  refreshDerived() {
    if (this.profiles.busy()) this.refreshProfiles(); // recorded, stopped, analysed: its state and step times move
    if (this.timers.derived || !(this.heats.size || this.layers || this.bandsShown())) return;
    this.timers.derived = setTimeout(async () => {
      try {
        for (const [prefix, m] of this.heats) m.update(await this.fetchHeat(prefix));
        if (this.layers) await this.layers.refresh();
        if (this.histograms) await this.histograms.refresh();
        if (this.bandsShown()) await Promise.all(this.cards.map((c) => this.loadBands(c)));
        this.drawAll();
      } catch (e) {
        /* the next points try again */
      }
      this.timers.derived = null;
    }, DERIVED_MS);
  }

  /** A new evaluation: the bests the cards mark are the server's (/api/run's evaluation), asked for again. */
  refreshEvaluation() {
    if (this.timers.evaluation) return;
    this.timers.evaluation = setTimeout(async () => {
      try {
        const fresh = await api.run(this.runId);
        if (!this.disposed) {
          this.info.evaluation = fresh.evaluation;
          this.drawAll();
        }
      } catch (e) {
        /* the next evaluation asks again */
      }
      this.timers.evaluation = null;
    }, DERIVED_MS);
  }

  /** The profiles, asked for again at most every DERIVED_MS; the alerts that asked for one link it once it is listed. */
  refreshProfiles() {
    if (this.timers.profiles) return;
    this.timers.profiles = setTimeout(async () => {
      try {
        if ((await this.profiles.refresh()) && !this.disposed) this.renderSide();
      } catch (e) {
        /* the next alert, points or state ask again */
      }
      this.timers.profiles = null;
    }, DERIVED_MS);
  }

  async rebuildIfGrown() {
    // metrics that appear later (a new rank, a user metric): rebuild once the run lists more
    if (!this.info || document.hidden) return;
    const fresh = await api.run(this.runId).catch(() => null); // progress comes by the live stream alone
    if (fresh && (fresh.metrics.length !== this.info.metrics.length || fresh.ranks.length !== this.info.ranks.length)) {
      if (this.live) this.live.close();
      await this.build();
    }
  }

  dispose() {
    this.disposed = true;
    if (this.live) this.live.close();
    Object.values(this.timers).forEach(clearTimeout);
    clearInterval(this.rescan);
    clearInterval(this.waitClock);
    window.removeEventListener("resize", this.onResize);
    this.views().forEach((v) => v.dispose());
  }
}
