// mindwatch dashboard: runs page, run page (live charts), compare page. Talks to /api/* only.
(function () {
  "use strict";
  const $ = (sel, root) => (root || document).querySelector(sel);
  const main = $("#main");
  let cleanup = [];

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") el.className = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (v !== undefined && v !== null && v !== false) el.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
    return el;
  }

  async function getJSON(url) {
    const r = await fetch(url, { credentials: "same-origin" });
    if (r.status === 401) { location.href = "/login"; throw new Error("sign in"); }
    const body = await r.json();
    if (!r.ok) throw new Error(body.error || r.statusText);
    return body;
  }

  function ago(seconds) {
    if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
    if (seconds < 60) return `${Math.max(0, Math.round(seconds))} s`;
    if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
    if (seconds < 86400) return `${(seconds / 3600).toFixed(1)} h`;
    return `${(seconds / 86400).toFixed(1)} d`;
  }

  function tagList(tags) {
    if (!tags) return [];
    if (Array.isArray(tags)) return tags.map(String);
    return Object.entries(tags).map(([k, v]) => `${k}=${v}`);
  }

  const badge = (state) => h("span", { class: `state state-${state}` }, state);

  // ---------------------------------------------------------------- runs page
  function runsPage() {
    document.title = "mindwatch: runs";
    const filters = { project: "", tag: "" };
    const selected = new Set();
    let runs = [], serverOffset = 0;
    const projectSel = h("select", { id: "filter-project", onchange: (e) => { filters.project = e.target.value; render(); } });
    const tagInput = h("input", { id: "filter-tag", placeholder: "tag, e.g. mode=graph", oninput: (e) => { filters.tag = e.target.value.trim(); render(); } });
    const compareBtn = h("button", { id: "compare-btn", disabled: true, onclick: () => {
      location.hash = `#/compare?runs=${[...selected].map(encodeURIComponent).join(",")}&metric=loss`;
    } }, "Compare selected");
    const tbody = h("tbody");
    const empty = h("p", { class: "empty" }, "Waiting for runs… (start a training with the monitor on)");
    main.replaceChildren(
      h("section", { class: "toolbar" }, h("label", {}, "project ", projectSel), h("label", {}, "tag ", tagInput), compareBtn,
        h("span", { class: "live-dot", id: "runs-live", title: "live updates" }, "live")),
      h("table", { class: "runs", id: "runs-table" },
        h("thead", {}, h("tr", {}, ...["", "run", "project", "tags", "state", "last step", "last point", "alerts", "duration"].map((t) => h("th", {}, t)))),
        tbody),
      empty);

    function render() {
      const projects = [...new Set(runs.map((r) => r.project))].sort();
      if (projectSel.options.length !== projects.length + 1) {
        projectSel.replaceChildren(h("option", { value: "" }, "all"), ...projects.map((p) => h("option", { value: p }, p)));
        projectSel.value = filters.project;
      }
      const now = Date.now() / 1000 - serverOffset;
      const shown = runs.filter((r) => (!filters.project || r.project === filters.project) &&
        (!filters.tag || tagList(r.tags).some((t) => t.includes(filters.tag))));
      shown.sort((a, b) => (b.started_at || 0) - (a.started_at || 0));
      tbody.replaceChildren(...shown.map((r) => h("tr", { "data-run": r.id, class: `row-${r.state}` },
        h("td", {}, h("input", { type: "checkbox", checked: selected.has(r.id), onchange: (e) => {
          e.target.checked ? selected.add(r.id) : selected.delete(r.id);
          compareBtn.disabled = selected.size < 1;
        } })),
        h("td", {}, h("a", { href: `#/run/${encodeURIComponent(r.id)}` }, r.run_id)),
        h("td", {}, r.project),
        h("td", {}, ...tagList(r.tags).map((t) => h("span", { class: "tag" }, t))),
        h("td", {}, badge(r.state), r.error ? h("span", { class: "err", title: r.error }, " ⚠") : null),
        h("td", { class: "num" }, r.last_step ?? "–"),
        h("td", { class: "num age", "data-t": r.last_time ?? "" }, r.last_time ? ago(now - r.last_time) + " ago" : "–"),
        h("td", { class: "num" }, r.alert_count ? h("span", { class: "alerts" }, r.alert_count) : "0"),
        h("td", { class: "num" }, ago(r.duration)))));
      empty.hidden = runs.length > 0;
    }
    const es = new EventSource("/api/live?runs=1");
    es.addEventListener("runs", (e) => {
      const d = JSON.parse(e.data);
      runs = d.runs;
      serverOffset = Date.now() / 1000 - d.now;
      $("#runs-live").classList.add("on");
      render();
    });
    es.onerror = () => $("#runs-live") && $("#runs-live").classList.remove("on");
    const tick = setInterval(render, 1000);
    cleanup.push(() => es.close(), () => clearInterval(tick));
  }

  // ---------------------------------------------------------------- run page
  const GROUPS = [
    { id: "loss", title: "loss", metrics: ["loss"] },
    { id: "lr", title: "learning rate", metrics: ["lr"] },
    { id: "grad_norm", title: "gradient norm", metrics: ["grad_norm"] },
    { id: "throughput", title: "throughput (1/s)", metrics: ["samples_per_second", "tokens_per_second"], axes: [{ name: "samples/s" }, { name: "tokens/s" }] },
    { id: "time", title: "step time vs data wait (s)", metrics: ["step_time", "data_time"] },
    { id: "memory", title: "memory (GB)", metrics: ["host_rss_gb", "device_mem_gb", "device_mem_peak_gb"] },
    { id: "loss_scale", title: "loss scale / overflow", metrics: ["loss_scale", "overflow"], axes: [{ name: "scale" }, { name: "overflow" }] },
  ];
  const HIDDEN = new Set(["epoch"]);

  function runPage(runId) {
    document.title = `mindwatch: ${runId}`;
    const POINTS = 2000;
    const view = { x: "step", smoothing: 0, log: false, rank: "0" };
    let info = null, alerts = [], charts = [], heat = null, es = null, lastPointAt = Date.now(), serverOffset = 0;
    const banner = h("div", { class: "banner", id: "banner", hidden: true });
    const title = h("h2", {}, runId);
    const controls = h("section", { class: "toolbar" });
    const grid = h("section", { class: "charts", id: "charts" });
    const side = h("aside", { class: "side" });
    main.replaceChildren(h("div", { class: "run-head" }, title, h("span", { id: "run-state" })), banner, controls, h("div", { class: "run-body" }, grid, side));

    function chartsFor(metrics) {
      const groups = GROUPS.map((g) => {
        const present = g.metrics.filter((m) => metrics.includes(m));
        const axes = g.axes && present.length > 1 ? g.metrics.map((m, i) => g.axes[Math.min(i, g.axes.length - 1)]).filter((a, i) => present.includes(g.metrics[i])) : undefined;
        return Object.assign({}, g, { metrics: present, axes });
      }).filter((g) => g.metrics.length);
      const used = new Set(GROUPS.flatMap((g) => g.metrics));
      for (const m of metrics) {
        if (!used.has(m) && !HIDDEN.has(m) && !m.startsWith("attention_entropy/")) groups.push({ id: m, title: m, metrics: [m] });
      }
      return groups;
    }

    function ranksShown() {
      if (view.rank === "all") return info.ranks.length ? info.ranks : [0];
      return [Number(view.rank)];
    }

    async function fetchSeries(metric, rank, lo, hi) {
      const q = new URLSearchParams({ run: runId, metric, rank, x: view.x, points: POINTS });
      if (lo !== undefined) { q.set("lo", lo); q.set("hi", hi); }
      return getJSON(`/api/series?${q}`);
    }

    function seriesDefs(group) {
      const defs = [];
      const ranks = ranksShown();
      group.metrics.forEach((m, mi) => ranks.forEach((r, ri) => defs.push({
        key: `${m}@${r}`, metric: m, rank: r, name: ranks.length > 1 ? `${m} r${r}` : m,
        yAxisIndex: group.axes ? Math.min(mi, group.axes.length - 1) : 0,
        color: ranks.length > 1 ? MWCharts.PALETTE[(ri + mi * 3) % MWCharts.PALETTE.length] : undefined,
        points: [], nonfinite: [],
      })));
      return defs;
    }

    async function loadChart(c, win) {
      await Promise.all(c.defs.map(async (d) => {
        const s = await fetchSeries(d.metric, d.rank, win && win[0], win && win[1]);
        if (win) {  // detail for the window, overview outside it
          d.points = d.overview.filter((p) => p[0] < win[0]).concat(s.points, d.overview.filter((p) => p[0] > win[1]));
        } else {
          d.overview = s.points;
          d.points = s.points.slice();
          d.nonfinite = s.nonfinite;
        }
      }));
      if (!win) await loadBands(c);
      draw(c);
    }

    function bandsShown() { return view.x === "step" && ranksShown().length > 1; }

    // Across ranks: the min..max band of each metric behind the per-rank lines (mindwatch.analysis.bands).
    async function loadBands(c) {
      if (!bandsShown()) return;
      await Promise.all(c.group.metrics.filter((m) => (info.band_metrics || []).includes(m)).map(async (m) => {
        const b = await getJSON(`/api/band?${new URLSearchParams({ run: runId, metric: m, points: POINTS })}`);
        const first = c.defs.find((d) => d.metric === m);
        first.band = { lower: b.points.map((p) => [p[0], p[1] ?? "-"]),
          upper: b.points.map((p) => [p[0], p[3] === null || p[1] === null ? "-" : p[3] - p[1]]) };
      }));
    }

    const heatURL = () => `/api/heatmap?run=${encodeURIComponent(runId)}&prefix=attention_entropy/&buckets=80&rank=${ranksShown()[0]}`;

    // The heat map and the bands are binned on the server: while points arrive, fetch them again, at most once a second.
    let derivedTimer = null;
    function refreshDerived() {
      if (derivedTimer || !(heat || bandsShown())) return;
      derivedTimer = setTimeout(async () => {
        try {
          if (heat) heat.update(await getJSON(heatURL()));
          await Promise.all(charts.map(loadBands));
          charts.forEach(draw);
          window.__mwDerivedRefreshes = (window.__mwDerivedRefreshes || 0) + 1;
        } catch (e) { /* the next points try again */ }
        derivedTimer = null;
      }, 1000);
    }

    function draw(c) {
      c.chart.update({ series: c.defs, alerts, x: view.x, smoothing: view.smoothing, log: view.log });
    }

    async function build() {
      info = await getJSON(`/api/run?run=${encodeURIComponent(runId)}`);
      serverOffset = Date.now() / 1000 - info.status.now;
      const a = await getJSON(`/api/alerts?run=${encodeURIComponent(runId)}`);
      alerts = a.alerts;
      renderControls();
      renderSide();
      showStatus(info.status);
      await buildCharts();
      connect(info.cursor);
    }

    async function buildCharts() {
      charts.forEach((c) => c.chart.dispose());
      if (heat) heat.dispose();
      heat = null;
      grid.replaceChildren();
      charts = chartsFor(info.metrics).map((g) => {
        const el = h("div", { class: "chart", id: `chart-${g.id}`, "data-metrics": g.metrics.join(",") });
        grid.append(el);
        const c = { group: g, el, defs: seriesDefs(g) };
        c.chart = MWCharts.line(el, { title: g.title, series: c.defs, axes: g.axes, x: view.x });
        c.chart.chart.on("datazoom", () => zoomed(c));
        return c;
      });
      echarts.connect(charts.map((c) => c.chart.chart));
      // The first chart (loss) first: on a cold server each metric is read from the file in turn.
      if (charts.length) await loadChart(charts[0]);
      await Promise.all(charts.slice(1).map((c) => loadChart(c)));
      const layers = info.metrics.filter((m) => m.startsWith("attention_entropy/"));
      if (layers.length) {
        const el = h("div", { class: "chart heat", id: "chart-attention-entropy" });
        grid.append(el);
        heat = MWCharts.heatmap(el, await getJSON(heatURL()), "attention entropy per layer (nats)");
      }
    }

    let zoomTimer = null, zoomOrigin = null;
    function zoomed(c) {
      // Connected charts all fire "datazoom": the window comes from the one the user zoomed (the first),
      // or from the loss chart when that one has no data yet.
      if (!zoomTimer) zoomOrigin = c.defs.some((d) => d.overview && d.overview.length) ? c : charts[0];
      clearTimeout(zoomTimer);
      zoomTimer = setTimeout(() => {
        zoomTimer = null;
        const win = zoomOrigin.chart.window();
        charts.forEach((other) => { if (win) loadChart(other, win); else { other.defs.forEach((d) => { d.points = d.overview.slice(); }); draw(other); } });
      }, 250);
    }

    function renderControls() {
      const rankSel = h("select", { id: "rank", onchange: async (e) => { view.rank = e.target.value; await buildCharts(); reconnect(); } },
        ...info.ranks.map((r) => h("option", { value: String(r) }, `rank ${r}`)),
        info.ranks.length > 1 ? h("option", { value: "all" }, "all ranks") : null);
      rankSel.value = view.rank;
      controls.replaceChildren(
        h("a", { href: "#/" }, "← runs"),
        h("label", {}, "smoothing ", h("input", { id: "smoothing", type: "range", min: 0, max: 0.99, step: 0.01, value: view.smoothing,
          oninput: (e) => { view.smoothing = Number(e.target.value); $("#smoothing-v").textContent = view.smoothing.toFixed(2); charts.forEach(draw); } }),
          h("span", { id: "smoothing-v" }, view.smoothing.toFixed(2))),
        h("label", {}, h("input", { id: "logscale", type: "checkbox", onchange: (e) => { view.log = e.target.checked; charts.forEach(draw); } }), " log scale"),
        h("label", {}, "x ", h("select", { id: "xaxis", onchange: async (e) => { view.x = e.target.value; await buildCharts(); } },
          h("option", { value: "step" }, "step"), h("option", { value: "time" }, "time"))),
        h("label", {}, rankSel),
        h("a", { href: `#/compare?runs=${encodeURIComponent(runId)}&metric=loss` }, "compare…"),
        h("span", { class: "live-dot", id: "run-live", title: "live updates" }, "live"));
    }

    function renderSide() {
      const tags = tagList(info.tags);
      side.replaceChildren(
        h("h3", {}, `Alerts (${alerts.length})`),
        h("ul", { class: "alert-list", id: "alert-list" }, ...alerts.slice(-200).reverse().map((a) =>
          h("li", { class: `sev-${a.severity || "warning"}` }, h("b", {}, `step ${a.step ?? "?"}`), ` r${a.rank ?? 0} `,
            h("span", { class: "rule" }, a.rule || ""), " ", a.message || `${a.metric} = ${a.value}`))),
        h("h3", {}, "Tags"), h("div", {}, ...tags.map((t) => h("span", { class: "tag" }, t))),
        h("h3", {}, "Run"), h("pre", { class: "config" }, JSON.stringify(info.meta, null, 1)),
        h("h3", {}, "Config"), h("pre", { class: "config", id: "config" }, JSON.stringify(info.config, null, 1)));
    }

    function showStatus(st) {
      $("#run-state").replaceChildren(badge(st.state), st.last_step !== null ? h("span", { class: "muted" }, ` step ${st.last_step}`) : "");
      const now = Date.now() / 1000 - serverOffset;
      const last = st.last_time ? `${ago(now - st.last_time)} ago` : "never";
      const text = {
        finished: `Finished: the run ended normally at step ${st.last_step}. No more data will arrive.`,
        failed: `Failed at step ${st.last_step}: ${st.error || "see the training log"}. Data stopped ${last}.`,
        stopped: `Stopped at step ${st.last_step}${st.reason ? ": " + st.reason : ""}.`,
        stalled: `Stalled: the process is alive but no step finished for a while (last point ${last})${st.reason ? ": " + st.reason : ""}.`,
        stale: `Stale: no heartbeat for ${st.heartbeat_at ? ago(now - st.heartbeat_at) : "a long time"} and no final state: the process probably died (kill -9, out of memory, lost node). Last point ${last}.`,
      }[st.state];
      banner.hidden = !text;
      banner.className = `banner banner-${st.state}`;
      banner.textContent = text || "";
    }

    // live push -------------------------------------------------------
    let pending = false;
    function schedule() {
      if (pending) return;
      pending = true;
      setTimeout(() => { pending = false; charts.forEach(draw); }, 100);
    }

    function connect(cursor) {
      const metrics = charts.flatMap((c) => c.group.metrics);
      const q = new URLSearchParams({ run: runId, metrics: metrics.join(","), cursor });
      es = new EventSource(`/api/live?${q}`);
      es.addEventListener("open", () => $("#run-live") && $("#run-live").classList.add("on"));
      es.onerror = () => $("#run-live") && $("#run-live").classList.remove("on");
      es.addEventListener("points", (e) => {
        const d = JSON.parse(e.data);
        lastPointAt = Date.now();
        let n = 0;
        for (const c of charts) for (const def of c.defs) {
          if (def.rank !== d.rank) continue;
          const pts = d.metrics[def.metric];
          if (!pts) continue;
          const last = def.points.length ? def.points[def.points.length - 1][0] : -Infinity;
          for (const [step, t, v] of pts) {
            const x = view.x === "step" ? step : t;
            if (x <= last) continue;  // already drawn (the page loaded after this point was written)
            const y = typeof v === "number" ? v : null;
            def.points.push([x, y]);
            if (def.overview) def.overview.push([x, y]);
            if (y === null) def.nonfinite.push([x, v]);
            n++;
          }
        }
        window.__mwPointsReceived = (window.__mwPointsReceived || 0) + n;
        if (n) { schedule(); refreshDerived(); }
      });
      es.addEventListener("alert", (e) => {
        alerts = alerts.concat(JSON.parse(e.data).alerts);
        info.alert_count = alerts.length;
        renderSide();
        schedule();
      });
      es.addEventListener("state", (e) => showStatus(JSON.parse(e.data)));
      es.addEventListener("reload", async () => { es.close(); await build(); });
      cleanup.push(() => es && es.close());
    }
    function reconnect() { if (es) es.close(); connect(info.cursor); }

    const onResize = () => { charts.forEach((c) => c.chart.resize()); if (heat) heat.resize(); };
    window.addEventListener("resize", onResize);
    const tick = setInterval(async () => {
      // metrics that appear later (a new rank, a user metric): rebuild once the run lists more
      if (!info || document.hidden) return;
      const fresh = await getJSON(`/api/run?run=${encodeURIComponent(runId)}`).catch(() => null);
      if (fresh && (fresh.metrics.length !== info.metrics.length || fresh.ranks.length !== info.ranks.length)) {
        if (es) es.close();
        await build();
      }
    }, 10000);
    cleanup.push(() => window.removeEventListener("resize", onResize), () => clearInterval(tick),
      () => charts.forEach((c) => c.chart.dispose()), () => heat && heat.dispose());
    build().catch((e) => { banner.hidden = false; banner.className = "banner banner-failed"; banner.textContent = e.message; });
  }

  // ---------------------------------------------------------------- compare page
  function comparePage(params) {
    document.title = "mindwatch: compare";
    const ids = (params.get("runs") || "").split(",").filter(Boolean);
    let metric = params.get("metric") || "loss";
    let x = params.get("x") || "step";
    const el = h("div", { class: "chart big", id: "compare-chart" });
    const metricInput = h("input", { id: "compare-metric", list: "metric-names", value: metric });
    const names = h("datalist", { id: "metric-names" });
    const xSel = h("select", { id: "compare-x" }, h("option", { value: "step" }, "step"), h("option", { value: "elapsed" }, "time since start"));
    xSel.value = x;
    const go = () => { location.hash = `#/compare?runs=${ids.map(encodeURIComponent).join(",")}&metric=${encodeURIComponent(metricInput.value)}&x=${xSel.value}`; };
    metricInput.addEventListener("change", go);
    xSel.addEventListener("change", go);
    main.replaceChildren(h("section", { class: "toolbar" }, h("a", { href: "#/" }, "← runs"), h("label", {}, "metric ", metricInput, names),
      h("label", {}, "x ", xSel), h("span", { class: "muted" }, `${ids.length} run(s)`)), el);
    if (!ids.length) { el.replaceWith(h("p", { class: "empty" }, "Select runs on the runs page, then “Compare selected”.")); return; }
    const chart = MWCharts.line(el, { title: metric, series: [], x });
    getJSON(`/api/run?run=${encodeURIComponent(ids[0])}`).then((i) => names.replaceChildren(...i.metrics.map((m) => h("option", { value: m }))));
    getJSON(`/api/compare?runs=${ids.map(encodeURIComponent).join(",")}&metric=${encodeURIComponent(metric)}&x=${x}`).then((d) => {
      chart.update({ series: d.series.map((s) => ({ name: `${s.run} (${s.state})`, points: s.points, nonfinite: s.nonfinite })), x: d.x });
    }).catch((e) => el.replaceWith(h("p", { class: "error" }, e.message)));
    const onResize = () => chart.resize();
    window.addEventListener("resize", onResize);
    cleanup.push(() => window.removeEventListener("resize", onResize), () => chart.dispose());
  }

  // ---------------------------------------------------------------- router
  function route() {
    cleanup.forEach((f) => { try { f(); } catch (e) { /* already gone */ } });
    cleanup = [];
    const hash = location.hash.replace(/^#/, "") || "/";
    const [path, query] = hash.split("?");
    if (path.startsWith("/run/")) runPage(decodeURIComponent(path.slice(5)));
    else if (path === "/compare") comparePage(new URLSearchParams(query || ""));
    else runsPage();
  }
  window.addEventListener("hashchange", route);
  route();
})();
