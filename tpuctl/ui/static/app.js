// tpuctl ui: draws the data the page carries (#data), then asks /api/ for it again every data-poll seconds.
// Everything shown is set as text (never as HTML): run names, logs and notes come from jobs and hosts.
"use strict";
(function () {
  const app = document.getElementById("app");
  const view = app.dataset.view;
  const every = 1000 * parseFloat(app.dataset.poll || "2");
  let data = JSON.parse(document.getElementById("data").textContent);

  // The token: the page carries it (server.py: no cookie, which every port of 127.0.0.1 would receive). It leaves
  // the address bar (so no bookmark, copy or history entry holds it) and stays in this tab's sessionStorage, which
  // is this origin's alone (its port included): a reload or Back asks again without it, and the 403 page's script
  // asks once more with it. /api/ is asked with it in a header; a link of this server is followed with it.
  const token = document.querySelector("meta[name=tpuctl-token]").content;
  sessionStorage.setItem("tpuctl-token", token);
  const here = new URL(window.location.href);
  if (here.searchParams.has("token")) {
    here.searchParams.delete("token");
    history.replaceState(history.state, "", here.pathname + here.search + here.hash);
  }
  const withToken = (href) => {
    const u = new URL(href, window.location.href);
    u.searchParams.set("token", token);
    return u.href;
  };
  // What a page shows when this server stops answering it, or answers that its token is no longer good (another
  // `tpuctl ui` now on this port): said at the top, instead of figures that silently stop changing.
  function trouble(text) {
    let p = document.getElementById("lost");
    if (!p && !text) return;
    if (!p) {
      p = h("p", {id: "lost", class: "bad", role: "alert"});
      document.body.prepend(p);
    }
    p.textContent = text;
    p.hidden = !text;
  }
  function ask(url) {
    return fetch(url, {headers: {"X-Tpuctl-Token": token}, credentials: "omit", cache: "no-store"}).then((r) => {
      if (r.status === 403) {
        trouble("tpuctl ui no longer accepts this page (it was restarted, or another now answers on this port): " +
          "open the URL it printed");
        return null;
      }
      trouble("");
      return r.ok ? r.json() : null;
    }, (e) => {
      trouble("tpuctl ui is not answering (stopped?): this page shows what it had");
      throw e;
    });
  }

  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") el.textContent = v; else el.setAttribute(k, v);
    }
    for (const kid of kids.flat(Infinity)) {   // a list of elements among the kids: each one, never its String()
      if (kid === null || kid === undefined) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }
  const dollars = (v) => (v === null || v === undefined || v === "") ? "" : "$" + Number(v).toFixed(2);
  const num = (v, d) => (v === null || v === undefined) ? "" : Number(v).toFixed(d);
  const secs = (v) => (v === null || v === undefined) ? "" : (v < 120 ? v.toFixed(0) + "s" :
    v < 7200 ? (v / 60).toFixed(0) + "m" : (v / 3600).toFixed(1) + "h");
  const when = (t) => t ? new Date(t * 1000).toLocaleString() : "";
  const runLink = (c, id) => h("a", {href: "/run/" + encodeURIComponent(c) + "/" + encodeURIComponent(id)}, id);

  // A table that stacks into labelled cards on a narrow screen (app.css: td::before shows data-label).
  function table(cols, rows, cls) {
    return h("div", {class: "scroll"}, h("table", {class: cls || ""},
      h("thead", {}, h("tr", {}, cols.map((c) => h("th", {}, c)))),
      h("tbody", {}, rows.map((r) => h("tr", {}, r.map((cell, i) => h("td", {"data-label": cols[i]}, cell)))))));
  }

  function poll(url, then) {
    const tick = () => ask(url).then((d) => { if (d) then(d); }).catch(() => {}).finally(() => setTimeout(tick, every));
    setTimeout(tick, every);
  }

  function section(id, title, ...kids) {
    let s = document.getElementById(id);
    const fresh = h("section", {id: id}, h("h2", {}, title), kids);
    if (s) s.replaceWith(fresh); else app.append(fresh);
    return fresh;
  }

  // --- clusters ---------------------------------------------------------------------------------------------------
  function drawClusters(d) {
    const rows = d.clusters.map((c) => {
      const s = c.status || {};
      const budget = s.budget_usd !== undefined ? dollars(s.spent_usd) + " of " + dollars(s.budget_usd) + " (" +
        dollars(s.left_usd) + " left)" : "";
      const problem = s.problem ? h("span", {class: "bad"}, s.problem, s.fix ? h("br") : null,
        s.fix ? h("span", {class: "fix"}, "fix: " + s.fix) : null) : (s.fix ? h("span", {class: "dim"}, s.fix) : "");
      return [h("a", {href: "/runs?cluster=" + encodeURIComponent(c.name)}, c.name), c.provider, c.type, c.zone,
        h("span", {class: "state"}, s.phase || c.phase), dollars(s.cost_so_far_usd), s.price || "", budget,
        [s.autostop, s.deadline].filter(Boolean).join("; "),
        [s.recovery, s.watcher].filter(Boolean).join("; ") + ((s.recoveries || []).length ?
          " (" + s.recoveries.length + " recoveries)" : ""),
        s.notifications || "", problem,
        h("span", {class: c.error ? "bad age" : "age"}, c.error ? c.error + " (" + c.age + ")" : c.age)];
    });
    section("clusters", "Clusters", rows.length ? table(["cluster", "provider", "type", "zone", "state", "cost so far",
      "price", "budget", "autostop / deadline", "recovery", "notifications", "problem", "as of"], rows, "clusters") :
      h("p", {}, "No cluster on this machine yet: tpuctl up --provider local -c try"));
  }

  // --- runs -------------------------------------------------------------------------------------------------------
  function runRow(r, all) {
    const restarts = (r.restarts || 0) + (r.goodput_parts ? r.goodput_parts.resumes : 0);
    // the run doctor's (host/doctor.py): since when a run is stalled, and a failure's cause (host/failures.py)
    const said = r.state + (r.stalled_since ? (r.state === "stalled" ? " since " : ", stalled since ") +
      new Date(r.stalled_since * 1000).toLocaleTimeString() : "") + (r.failure && r.state === "failed" ?
      " (" + r.failure + ")" : "");
    // a run whose own files cannot be read (an unreadable state, a metrics file not read): what is wrong, on its row
    const state = h("span", {class: "state " + r.state, title: r.note || null}, said,
      r.state === "unreadable" && r.note ? ": " + r.note : null);
    return [runLink(r.cluster, r.id), all ? r.cluster : null, r.name, state,
      r.step === null ? "" : String(r.step), num(r.loss, 4), r.goodput === null ? "" : r.goodput.toFixed(0) + "%",
      dollars(r.cost_usd), secs(r.duration), restarts ? String(restarts) : "", r.tpu || ""].filter((x) => x !== null);
  }

  function drawRuns(d) {
    const all = !d.cluster;
    const cols = ["compare", "id"].concat(all ? ["cluster"] : [], ["job", "state", "step", "loss", "goodput", "cost",
      "duration", "restarts", "tpu"]);
    const base = "/runs?" + (d.cluster ? "cluster=" + encodeURIComponent(d.cluster) + "&" : "") + "page=";
    const pager = h("p", {class: "pager"}, d.page > 0 ? h("a", {href: base + (d.page - 1), rel: "prev"}, "newer") : null,
      " page " + (d.page + 1) + " ", d.more ? h("a", {href: base + (d.page + 1), rel: "next"}, "older") : null);
    section("runs", d.cluster ? "Runs of " + d.cluster : "Runs of every cluster",
      d.rows.length ? table(cols, d.rows.map((r) => [pickBox(r, all)].concat(runRow(r, all))), "runs") :
        h("p", {}, "No runs yet."),
      pager, (d.problems || []).map((p) => h("p", {class: "bad"}, p)));
  }

  // --- comparing runs: the runs picked on the runs page, their loss curves on one chart (a sweep, issue 63.7) -------
  const picked = new Map();   // "cluster/id" -> its label, kept across the table's redraws
  const COLORS = ["#1a73e8", "#d93025", "#188038", "#f9ab00", "#9334e6", "#12b5cb", "#e8710a", "#5f6368"];
  let compared = null;
  function pickBox(r, all) {
    const key = r.cluster + "/" + r.id;
    const box = h("input", {type: "checkbox", class: "pick", "data-key": key, "aria-label": "compare " + r.id,
      checked: picked.has(key) ? "checked" : null});
    box.addEventListener("change", () => {
      if (box.checked) picked.set(key, {cluster: r.cluster, id: r.id, label: r.id + (all ? " (" + r.cluster + ")" : "")});
      else picked.delete(key);
      drawCompare();
    });
    return box;
  }
  function drawCompare() {
    const want = [...picked.values()];
    if (compared) { compared.destroy(); compared = null; delete charts.compare; }
    if (!want.length) { const s = document.getElementById("compare"); if (s) s.remove(); return; }
    Promise.all(want.map((r) => ask("/api/run?cluster=" + encodeURIComponent(r.cluster) + "&id=" +
      encodeURIComponent(r.id)).catch(() => null)))
      .then((got) => {
        if (want.length !== picked.size) return;   // picked again meanwhile: that draw wins
        const tables = [], series = [{label: "step"}];
        got.forEach((d, i) => {
          const loss = d && (d.metrics || []).find((m) => m.name === "loss");
          if (!loss || !loss.points.length) return;
          tables.push([loss.points.map((p) => p[0]), loss.points.map((p) => p[1])]);
          series.push({label: want[i].label, stroke: COLORS[(series.length - 1) % COLORS.length], width: 2,
            spanGaps: true});
        });
        const fig = h("figure", {id: "compare-chart", class: "chart", "data-runs": String(tables.length)},
          h("figcaption", {}, "loss"));
        section("compare", "Loss of the runs picked", tables.length ? fig :
          h("p", {}, "None of the runs picked has reported a loss yet."));
        if (!tables.length || compared) return;
        const log10 = tables.every((t) => t[1].every((y) => y > 0));
        if (log10) fig.dataset.scale = "log";
        compared = charts.compare = new uPlot({width: chartWidth(), height: 260,
          scales: Object.assign({x: {time: false}}, log10 ? {y: {distr: 3}} : {}), axes: [{label: "step"}, {}],
          series: series}, uPlot.join(tables), fig);
      });
  }

  // --- leftovers --------------------------------------------------------------------------------------------------
  function drawLeftovers(d) {
    const rows = d.rows.map((r) => [r.kind, r.name, r.provider, r.zone || "", r.phase || "",
      r.orphan_data || (r.orphan ? "no cluster in local state holds it" : ""), h("code", {}, r.remove || "")]);
    section("leftovers", "Leftovers", rows.length ? table(["kind", "name", "provider", "zone", "state", "why",
      "removed by"], rows) : h("p", {}, "Nothing left behind that a cluster here does not account for."),
      h("p", {class: d.error ? "bad age" : "age"}, (d.error ? d.error + " " : "") + "as of: " + d.age));
  }

  // --- run --------------------------------------------------------------------------------------------------------
  const charts = {};
  const chartWidth = () => Math.max(240, Math.min(app.clientWidth - 8, 900));
  window.addEventListener("resize", () => {
    for (const u of Object.values(charts)) u.setSize({width: chartWidth(), height: 220});
  });
  // A loss falls over orders of magnitude: its chart has a log scale (issue 63.7), where every value is above 0.
  function chart(id, title, points, label, logScale) {
    const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
    let box = document.getElementById(id);
    if (!box) {
      box = h("figure", {id: id, class: "chart"}, h("figcaption", {}, title));
      document.getElementById("charts").append(box);
    }
    box.dataset.points = String(xs.length);
    if (charts[id]) { charts[id].setData([xs, ys]); return; }
    const log10 = logScale && ys.length > 0 && ys.every((y) => y > 0);
    if (log10) box.dataset.scale = "log";
    charts[id] = new uPlot({width: chartWidth(), height: 220,
      scales: Object.assign({x: {time: label === "time"}}, log10 ? {y: {distr: 3}} : {}),
      axes: [{label: label}, {}], series: [{label: label}, {label: title + (log10 ? " (log scale)" : ""),
        stroke: "#1a73e8", width: 2}]}, [xs, ys], box);
  }

  // The run's id and cluster head its page (issue 63.7); goodput on this machine is said for what it is.
  function drawRunSummary(d) {
    const r = d.row || {};
    section("summary", "Run " + d.id + " on cluster " + d.cluster,
      h("p", {class: "dim"}, d.job + ": " + d.command),
      table(["state", "step", "loss", "goodput", "cost", "duration", "restarts", "tpu"], [runRow(r, false).slice(2)]),
      d.provider === "local" && r.goodput !== null && r.goodput !== undefined ? h("p", {class: "dim", id: "goodput-note"},
        "goodput: the share of the run's time spent in training steps it kept (at most 100%). On this machine " +
        "(--provider local) it measures the CPU or GPU here, and a run of seconds is mostly start-up: it says " +
        "little about a TPU.") : null);
  }

  function drawRunCharts(d) {
    if (!document.getElementById("charts")) app.append(h("section", {id: "charts"}, h("h2", {}, "Metrics")));
    d.metrics.forEach((m) => chart("metric-" + m.name, m.name, m.points, "step", m.name === "loss"));
    for (const [host, c] of Object.entries(d.chips)) {
      const hist = c.history || {};
      if ((hist.duty_cycle_pct || []).length) chart("chips-" + host, "duty cycle % (" + host + ", " + c.source + ")",
        hist.duty_cycle_pct, "time");
      if ((hist.hbm_used_gib || []).length) chart("hbm-" + host, "HBM used GiB (" + host + ")", hist.hbm_used_gib,
        "time");
    }
    const shown = Object.entries(d.chips).map(([host, c]) => host + ": " + (c.shown || "not sampled"));
    let p = document.getElementById("chips-shown");
    if (!p) { p = h("p", {id: "chips-shown"}); document.getElementById("charts").append(p); }
    p.textContent = "TPU utilisation " + shown.join("; ");
  }

  function drawRunRest(d) {
    section("events", "Events", h("ol", {class: "events"}, d.events.map((e) =>
      h("li", {}, h("time", {}, when(e.time)), " ", e.what))));
    section("outputs", "Outputs", d.outputs.length ? table(["path", "size"], d.outputs.map((o) =>
      [o.path, h("span", {title: o.bytes + " bytes"}, o.size || String(o.bytes))])) : h("p", {}, "No outputs yet."));
    section("commands", "Commands", h("ul", {class: "commands"}, d.commands.map((c) => h("li", {},
      h("code", {}, c), " ", h("button", {type: "button", "data-copy": c}, "copy")))));
    if (d.links.length) section("links", "Google Cloud", h("ul", {}, d.links.map((l) =>
      h("li", {}, h("a", {href: l.url, target: "_blank", rel: "noopener"}, l.title)))));
  }

  // The log: its tail first, then each new chunk; a host selector where the run runs on several hosts.
  const log = {worker: 0, next: null, skip: 0, timer: null, final: false};
  function logUrl() {
    return "/api/log?cluster=" + encodeURIComponent(app.dataset.cluster) + "&id=" + encodeURIComponent(app.dataset.id) +
      "&worker=" + log.worker + (log.next === null ? "" : "&after=" + log.next + "&skip=" + log.skip);
  }
  function drawLogBox(d) {
    const pick = d.hosts.length > 1 ? h("label", {}, "host ", h("select", {id: "host"},
      d.hosts.map((x) => h("option", {value: String(x.index)}, x.label)))) : null;
    section("log", "Log", pick, h("p", {id: "log-skipped", class: "dim"}), h("pre", {id: "log-text"}));
    if (pick) document.getElementById("host").addEventListener("change", (e) => {
      log.worker = parseInt(e.target.value, 10);
      log.next = null;
      log.skip = 0;
      log.final = false;
      document.getElementById("log-text").textContent = "";
      clearTimeout(log.timer);
      followLog();
    });
  }
  function followLog() {
    const worker = log.worker;
    ask(logUrl()).then((d) => {
      if (!d || worker !== log.worker) return;
      const pre = document.getElementById("log-text");
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
      if (log.next === null && d.skipped) document.getElementById("log-skipped").textContent =
        "the first " + d.skipped + " bytes are not shown: tpuctl logs " + app.dataset.id + " -c " +
        app.dataset.cluster + " prints them all";
      pre.append(d.text);
      if (atEnd) pre.scrollTop = pre.scrollHeight;
      log.next = d.next;
      log.skip = d.skip;
      log.final = d.final;
      pre.dataset.state = d.state;
    }).catch(() => {}).finally(() => {
      if (worker === log.worker && !log.final) log.timer = setTimeout(followLog, every);
    });
  }

  function drawRun(d) {
    drawRunSummary(d);
    drawRunCharts(d);
    drawRunRest(d);
  }

  // A link of this server followed with the token (as the printed URL has it; app.js then takes it out of the
  // address bar); another tab or window (Ctrl, Shift, the middle button) too. Links elsewhere are left alone.
  function follow(e) {
    const a = e.target.closest && e.target.closest("a[href]");
    if (!a || e.defaultPrevented || e.button > 1) return;
    const u = new URL(a.getAttribute("href"), window.location.href);
    if (u.origin !== window.location.origin) return;
    e.preventDefault();
    if (e.button === 1 || e.ctrlKey || e.metaKey || e.shiftKey) window.open(withToken(u.href), "_blank");
    else window.location.assign(withToken(u.href));
  }
  document.addEventListener("click", follow);
  document.addEventListener("auxclick", follow);

  document.addEventListener("click", (e) => {
    const text = e.target.dataset && e.target.dataset.copy;
    if (text && navigator.clipboard) navigator.clipboard.writeText(text).then(() => { e.target.textContent = "copied"; });
  });

  app.querySelector("h1").remove();
  const q = new URLSearchParams(window.location.search);
  if (view === "clusters") { drawClusters(data); poll("/api/clusters", drawClusters); }
  if (view === "runs") {
    drawRuns(data);
    poll("/api/runs?cluster=" + encodeURIComponent(app.dataset.cluster) + "&page=" + (q.get("page") || "0"), drawRuns);
  }
  if (view === "leftovers") { drawLeftovers(data); poll("/api/leftovers", drawLeftovers); }
  if (view === "run") {
    // a store that has not answered yet: the page says so, and draws the run once it has
    let drawn = false;
    const update = (d) => {
      let p = document.getElementById("pending");
      if (!p) { p = h("p", {id: "pending", class: "bad"}); app.prepend(p); }
      p.textContent = d.pending || "";
      if (!d.row) return;
      if (drawn) { drawRun(d); return; }
      drawRunSummary(d);
      drawLogBox(d);
      drawRunCharts(d);
      drawRunRest(d);
      followLog();
      drawn = true;
    };
    update(data);
    poll("/api/run?cluster=" + encodeURIComponent(app.dataset.cluster) + "&id=" + encodeURIComponent(app.dataset.id),
      update);
  }
})();
