"""A picture of the shipped Grafana dashboard's panels, as a real Prometheus answers their queries, drawn without
Grafana (none can be installed here: neither Debian nor PyPI carries it).

    python bench/screenshot_metrics.py [--seconds 90] [--out docs/metrics-panels.png]

On the local provider in a throwaway TPUCTL_HOME: `up --budget 5` at $2 an hour, a job training with
tpuctl.runtime.Progress (a step every 0.1 s, a checkpoint every 200 steps), libtpu's metrics service faked for the
agent's chip sampler (tests/fakes/libtpu_metrics.py, two chips whose duty cycle moves), `tpuctl ui --metrics-only`,
and Debian's prometheus scraping it every second. After `--seconds`, each panel's query
(tpuctl/ui/grafana/tpuctl-dashboard.json, `$cluster` as All and `$run` as the run) is asked of /api/v1/query_range
and drawn where the dashboard places it (its 24-column grid) with uPlot (tpuctl/ui/static), the heat map as cells;
headless Chromium takes the picture. Needs `prometheus` and `chromium` (apt install). About two minutes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

JOB = """
import math, random, time
from tpuctl import runtime
random.seed(1)
p = runtime.Progress(every=5)
for s in range(1, 100000):
    t0 = time.perf_counter()
    time.sleep(0.1)
    p.step(s, time.perf_counter() - t0, loss=8 * math.exp(-s / 300) + 1.5 + random.random() * 0.2)
    if s % 200 == 0:
        with p.checkpointing():
            time.sleep(1.0)
"""

PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>%(css)s
body{margin:0;background:#111217;color:#ccccdc;font:13px sans-serif}
#grid{display:grid;grid-template-columns:repeat(24,1fr);grid-auto-rows:30px;gap:8px;padding:8px;width:1600px}
.p{background:#181b1f;border:1px solid #2c3235;border-radius:2px;padding:4px 8px;overflow:hidden}
.p h3{margin:0 0 4px;font-size:13px;font-weight:500}
.row{font-size:15px;font-weight:600;align-self:end}
.stat{font-size:40px;color:#73bf69;text-align:center;margin-top:30px}
.u-legend{font-size:11px}
</style><script>%(uplot)s</script></head><body>
<div style="padding:8px 16px;font-size:18px">tpuctl: TPU runs <span style="font-size:12px;color:#888">
(the shipped dashboard's queries, answered by Prometheus %(version)s; drawn with uPlot, not Grafana)</span></div>
<div id="grid"></div><script>
const panels = %(panels)s;
const colors = ["#73bf69","#f2cc0c","#5794f2","#ff9830","#f2495c","#b877d9","#8ab8ff","#fade2a","#96d98d","#ffb357"];
const grid = document.getElementById("grid");
for (const p of panels) {
  const el = document.createElement("div");
  el.style.gridColumn = (p.x + 1) + " / span " + p.w; el.style.gridRow = (p.y + 1) + " / span " + p.h;
  if (p.type === "row") { el.className = "row"; el.textContent = p.title; grid.appendChild(el); continue; }
  el.className = "p"; el.innerHTML = "<h3>" + p.title + "</h3>"; grid.appendChild(el);
  const width = p.w * 1584 / 24 - 24, height = p.h * 38 - 80;
  if (p.type === "stat") {
    const s = document.createElement("div"); s.className = "stat";
    s.textContent = p.series.map(x => "$" + x.values[x.values.length - 1][1].toFixed(2)).join("  "); el.appendChild(s);
    continue;
  }
  const xs = [...new Set(p.series.flatMap(s => s.values.map(v => v[0])))].sort((a, b) => a - b);
  if (p.type === "heatmap") {
    const c = document.createElement("canvas"); c.width = width; c.height = height; el.appendChild(c);
    const g = c.getContext("2d"), rows = p.series.length, cw = width / Math.max(xs.length, 1);
    p.series.forEach((s, r) => {
      const at = new Map(s.values.map(v => [v[0], v[1]]));
      xs.forEach((x, i) => { const v = at.get(x); if (v === undefined) return;
        g.fillStyle = `rgba(255,${Math.round(200 - 160 * v)},40,${0.15 + 0.85 * v})`;
        g.fillRect(i * cw, r * (height - 14) / rows, cw + 0.5, (height - 14) / rows - 2); });
      g.fillStyle = "#ccccdc"; g.fillText(s.name, 4, r * (height - 14) / rows + 12);
    });
    continue;
  }
  const data = [xs, ...p.series.map(s => { const at = new Map(s.values.map(v => [v[0], v[1]]));
                                           return xs.map(x => at.has(x) ? at.get(x) : null); })];
  if (p.stack) for (let i = 2; i < data.length; i++)
    data[i] = data[i].map((v, j) => v === null ? null : v + (data[i - 1][j] || 0));
  new uPlot({width, height, legend: {show: true}, cursor: {show: false},
             axes: [{stroke: "#aaa", grid: {stroke: "#2c3235"}}, {stroke: "#aaa", grid: {stroke: "#2c3235"}, size: 60}],
             series: [{}, ...p.series.map((s, i) => ({
               label: s.name, stroke: colors[i %% colors.length], width: 1.5,
               fill: p.stack ? colors[i %% colors.length] + "55" : undefined}))]},
            data, el);
}
document.body.dataset.drawn = "1";
</script></body></html>"""


def get(url: str, headers: dict[str, str] | None = None) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as r:
        return r.read()


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def legend(fmt: str, labels: dict[str, str]) -> str:
    import re
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip() or "value"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=90)
    ap.add_argument("--out", default=str(ROOT / "docs" / "metrics-panels.png"))
    a = ap.parse_args()
    prom_exe, chromium = shutil.which("prometheus"), shutil.which("chromium") or shutil.which("chromium-browser")
    if not prom_exe or not chromium:
        sys.exit("needs prometheus and chromium on PATH: apt install prometheus chromium")
    from fakes.libtpu_metrics import FakeLibtpuMetrics
    from playwright.sync_api import sync_playwright

    from tpuctl.ui import dashboard
    tmp = Path(tempfile.mkdtemp(prefix="tpuctl-metrics-shot-"))
    libtpu_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
    env.update(TPUCTL_HOME=str(tmp / "home"), TPUCTL_CONFIG=str(tmp / "config.toml"), TPUCTL_PRICE_PER_HOUR="2",
               TPUCTL_TPU_METRICS_SECONDS="1", TPUCTL_PROGRESS_SECONDS="1",
               TPUCTL_TPU_METRICS_ADDR=f"localhost:{libtpu_port}")

    def tpuctl(*args: str) -> str:
        r = subprocess.run([sys.executable, "-m", "tpuctl", *args], env=env, capture_output=True, text=True)
        if r.returncode:
            sys.exit(r.stderr[-2000:])
        return r.stdout
    procs: list[subprocess.Popen[str]] = []
    libtpu = None
    stop = threading.Event()
    try:
        tpuctl("up", "--provider", "local", "-c", "shot", "--budget", "5")
        libtpu = FakeLibtpuMetrics(chips=2, port=libtpu_port)

        def wander() -> None:   # duty cycles that move, as a real job's do between steps and saves
            t = 0
            while not stop.wait(0.5):
                t += 1
                libtpu.duty[:] = [70 + 25 * math.sin(t / 9), 60 + 30 * math.sin(t / 13 + 1)]
        threading.Thread(target=wander, daemon=True).start()
        job = tmp / "train"
        job.mkdir()
        (job / "tpuctl.toml").write_text('command = "python main.py"\nframework = "jax"\n')
        (job / "main.py").write_text(JOB)
        run = tpuctl("submit", str(job), "-c", "shot", "--detach").strip()
        token = tmp / "token"
        ui = subprocess.Popen([sys.executable, "-m", "tpuctl", "ui", "--metrics-only", "--token-file", str(token)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(ui)
        target = urllib.parse.urlparse(ui.stdout.readline().strip()).netloc
        port = free_port()
        (tmp / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s}\nscrape_configs:\n  - job_name: tpuctl\n"
            f"    authorization: {{type: Bearer, credentials_file: {token}}}\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n")
        procs.append(subprocess.Popen([prom_exe, f"--config.file={tmp / 'prometheus.yml'}",
                                       f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True))
        base = f"http://127.0.0.1:{port}"
        start = time.time()
        print(f"run {run} training; Prometheus on {base}; waiting {a.seconds} s", flush=True)
        time.sleep(a.seconds)
        end = time.time()
        version = json.loads(get(base + "/api/v1/status/buildinfo"))["data"]["version"]
        doc = dashboard.load()
        panels = []
        for p in doc["panels"]:
            g = p["gridPos"]
            out = {"type": p["type"], "title": p["title"], "x": g["x"], "y": g["y"], "w": g["w"], "h": g["h"],
                   "stack": p.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("stacking", {})
                   .get("mode") == "normal", "series": []}
            for t in p.get("targets", []):
                q = t["expr"].replace("$cluster", ".*").replace("$run", run)
                got = json.loads(get(base + "/api/v1/query_range?" + urllib.parse.urlencode(
                    {"query": q, "start": start, "end": end, "step": 1})))["data"]["result"]
                out["series"] += [{"name": legend(t.get("legendFormat", ""), r["metric"]),
                                   "values": [[float(ts), float(v)] for ts, v in r["values"]]} for r in got]
            panels.append(out)
        static = ROOT / "tpuctl" / "ui" / "static"
        html = PAGE % {"css": (static / "uPlot.min.css").read_text(),
                       "uplot": (static / "uPlot.iife.min.js").read_text(), "panels": json.dumps(panels),
                       "version": version}
        (tmp / "panels.html").write_text(html)
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = b.new_page(viewport={"width": 1616, "height": 1100})
            page.goto((tmp / "panels.html").as_uri())
            page.wait_for_function("document.body.dataset.drawn === '1'", timeout=30000)
            page.screenshot(path=a.out, full_page=True)
            b.close()
        print(a.out)
    finally:
        stop.set()
        for proc in procs:
            proc.terminate()
            proc.wait(20)
        if libtpu is not None:
            libtpu.stop()
        subprocess.run([sys.executable, "-m", "tpuctl", "down", "-c", "shot", "--yes"], env=env, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
