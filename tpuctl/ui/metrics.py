"""`/metrics`: every run's progress, goodput, cost and TPU utilisation for Prometheus, in OpenMetrics text written
by prometheus_client (docs/metrics.md has the table). One more read-only view (DESIGN.md, ui/): each scrape reads
the same runs index and records the pages and `jobs` read (submission.table, status.costing, the chips' files) and
writes nothing anywhere.

What a scrape reads does not grow with the store's history: per cluster, one short listing of the runs index (the
newest TPUCTL_METRICS_KEEP runs, 50) and one of the queue (runs not finished, whatever their age), then the rows of
the runs not yet finished. A finished run's row does not change, so it is read once and kept in this process; it
drops out of the export (and of memory) once TPUCTL_METRICS_KEEP newer runs exist on its cluster. That also bounds
the series: at most KEEP + unfinished runs per cluster, each with a fixed set of series (and its chips while it
runs).

Every family is declared (HELP, TYPE) on every scrape, with or without series: a machine with no TPU still
declares the chip families, so a dashboard's queries are valid before the first run."""
from __future__ import annotations

import threading
import time
from typing import Any, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from ..control import status as status_flow, submission
from ..core import goodput, knobs, layout, metrics, runindex, runs, state, utilisation
from ..core.models import ClusterState, Phase
from ..core.store import BlobStore
from ..providers import registry

RUN = ["cluster", "provider", "run", "job"]
CLUSTER = ["cluster", "provider"]
HOST = RUN + ["host"]
CHIP = HOST + ["chip"]
# the run states (runs.RunState), `stale`: not final, but no heartbeat for submission.STALE_SECONDS (`jobs` shows it
# as "lost?": the host may be gone), and `unreadable`: its job.json or status.json is no such record (jobfiles.py)
STATES = [s.value for s in runs.RunState] + ["stale", "unreadable"]
FINAL = {s.value for s in runs.RunState if s.final}
WINDOWS = (("1m", 60.0), ("5m", 300.0), ("15m", 900.0))
# goodput.breakdown's badput parts, as `jobs --json` gives them (goodput_parts), by the kind named here
BADPUT = {"startup": "startup_seconds", "checkpoint": "checkpoint_seconds",
          "wasted_progress": "wasted_progress_seconds", "disruption": "disruption_seconds",
          "stalled": "stalled_seconds", "other": "other_seconds"}   # stalled: the run doctor's (host/stall.py)
EXAMPLES = ("examples_per_s", "examples_per_second")   # what a job may report its throughput as (jobs/bert_pretrain)


def keep() -> int:
    """Finished runs exported per cluster (TPUCTL_METRICS_KEEP, 50): the newest; older ones drop out."""
    return knobs.count("TPUCTL_METRICS_KEEP", 50)


# a family by its name: GaugeMetricFamily, CounterMetricFamily or SummaryMetricFamily (Any: their add_metric
# signatures differ, and Metric, their base, has none)
Families = dict[str, Any]


def families() -> Families:
    """Every family the exporter has, empty: (name, type, help, labels). Names follow Prometheus's naming practice
    (prometheus.io/docs/practices/naming: one app prefix, base units, `_total` for counts, ratios 0-1)."""
    g, c = GaugeMetricFamily, CounterMetricFamily
    out: list[Metric] = [
        g("tpuctl_run_state", "1 for the state the run is in, 0 for the others (stale: no heartbeat for 2 min)",
          labels=RUN + ["state"]),
        g("tpuctl_run_step", "The last training step the job reported (metrics.json)", labels=RUN),
        g("tpuctl_run_loss", "The loss at the last step the job recorded", labels=RUN),
        g("tpuctl_run_step_seconds", "Mean time of a training step in the run's latest attempt, its first step's "
          "compilation left out", labels=RUN, unit="seconds"),
        g("tpuctl_run_examples_per_second", "Examples a second, as the job reports them (examples_per_s)",
          labels=RUN),
        g("tpuctl_run_goodput_ratio", "Share of the run's lifetime spent in training steps that were kept "
          "(ml-goodput-measurement's goodput, as `tpuctl jobs` shows it)", labels=RUN, unit="ratio"),
        g("tpuctl_run_interval_goodput_ratio", "Goodput over the last 1, 5 and 15 minutes (window), for runs not "
          "finished", labels=RUN + ["window"], unit="ratio"),
        g("tpuctl_run_badput_seconds", "Time of the run's lifetime not spent in kept training steps, by kind",
          labels=RUN + ["kind"], unit="seconds"),
        c("tpuctl_run_resumes", "Times the job's training started again after an interruption", labels=RUN),
        c("tpuctl_run_recoveries", "Re-creations of the compute by the recovery watcher while the run ran",
          labels=RUN),
        g("tpuctl_run_duration_seconds", "From the run's first claim to its end, or now", labels=RUN,
          unit="seconds"),
        g("tpuctl_run_cost_dollars", "What the compute cost while the run ran (the price `jobs` counts)",
          labels=RUN, unit="dollars"),
        g("tpuctl_chip_duty_cycle_ratio", "Share of time the chip was busy, at its last sample", labels=CHIP,
          unit="ratio"),
        g("tpuctl_chip_hbm_used_bytes", "HBM in use on the chip, at its last sample", labels=CHIP, unit="bytes"),
        g("tpuctl_chip_hbm_total_bytes", "HBM the chip has", labels=CHIP, unit="bytes"),
        g("tpuctl_chip_sample_age_seconds", "Age of the host's last sample of its chips", labels=HOST,
          unit="seconds"),
        g("tpuctl_cluster_info", "1 for each cluster in this machine's state, with its type, zone and phase",
          labels=CLUSTER + ["type", "zone", "phase"]),
        g("tpuctl_cluster_cost_dollars_per_hour", "What the cluster's compute costs an hour while it exists "
          "(0 without compute)", labels=CLUSTER),
        g("tpuctl_cluster_budget_dollars", "The cluster's --budget", labels=CLUSTER, unit="dollars"),
        g("tpuctl_cluster_budget_spent_dollars", "What the cluster's compute has cost against its budget",
          labels=CLUSTER, unit="dollars"),
        g("tpuctl_cluster_budget_left_dollars", "What is left of the cluster's budget", labels=CLUSTER,
          unit="dollars"),
        g("tpuctl_cluster_scrape_error", "1 when the cluster's store could not be read in this scrape",
          labels=CLUSTER),
        SummaryMetricFamily("tpuctl_up_provisioning_seconds", "Time `tpuctl up` spent placing the compute, by "
                            "zone and result (ok, or the error's kind)", labels=CLUSTER + ["zone", "result"],
                            unit="seconds"),
    ]
    return {m.name: m for m in out}


def bearer(authorization: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header (Prometheus's `authorization.credentials_file`
    sends it so: RUN_HEALTH_FACTS.md §6), or ""."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class RunsCollector(Collector):
    """A prometheus_client collector that reads every cluster at each scrape (`collect`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.finished: dict[tuple[str, str], dict[str, Any]] = {}   # (cluster, run id) -> its row, read once
        self.stores: dict[tuple[str, str], BlobStore] = {}

    def describe(self) -> Iterable[Metric]:
        return list(families().values())   # so registering reads no store

    def collect(self) -> Iterator[Metric]:
        fams = families()
        with self.lock:   # two scrapes at once share the rows kept
            for st in state.all_clusters(lambda e: None):
                prov = st.spec.provider.value
                try:
                    self._cluster(st, fams)
                    fams["tpuctl_cluster_scrape_error"].add_metric([st.name, prov], 0)
                except Exception:  # noqa: BLE001 - one unreadable store (a bucket gone, no credentials) is a series
                    fams["tpuctl_cluster_scrape_error"].add_metric([st.name, prov], 1)
        yield from fams.values()

    def _store(self, st: ClusterState) -> BlobStore:
        key = (st.name, st.spec.store)
        if key not in self.stores:
            self.stores[key] = registry.get(st.spec.provider).store(st)
        return self.stores[key]

    def _cluster(self, st: ClusterState, fams: Families) -> None:
        prov = registry.get(st.spec.provider)
        cl = [st.name, st.spec.provider.value]
        fams["tpuctl_cluster_info"].add_metric(cl + [st.spec.tpu_type, st.zone, st.phase.value], 1)
        for (zone, result), (n, took) in sorted(provisioning(st).items()):   # no zone (local): the provider's name
            fams["tpuctl_up_provisioning_seconds"].add_metric(cl + [zone or cl[1], result], n, took)
        store = self._store(st)
        hourly, spend = status_flow.costing(st, prov)
        fams["tpuctl_cluster_cost_dollars_per_hour"].add_metric(
            cl, (hourly or 0.0) if st.compute_since and st.phase is not Phase.DOWN else 0.0)
        for name, field in (("budget", "budget_usd"), ("budget_spent", "spent_usd"), ("budget_left", "left_usd")):
            if field in spend:
                fams[f"tpuctl_cluster_{name}_dollars"].add_metric(cl, float(str(spend[field])))
        rows = self._rows(st, store)
        submission.costed(rows, hourly)
        for row in rows:
            self._run(st, store, row, fams)

    def _rows(self, st: ClusterState, store: BlobStore) -> list[dict[str, Any]]:
        """The newest keep() runs and every run not finished: finished rows as first read, the others read now."""
        ids = runindex.newest(store, keep(), repair=False)
        newest = set(ids)
        ids += sorted(rid for k, _ in store.list(layout.QUEUE_PREFIX)
                      if runs.is_id(rid := k[len(layout.QUEUE_PREFIX):]) and rid not in newest)
        for key in [k for k in self.finished if k[0] == st.name and k[1] not in set(ids)]:
            del self.finished[key]   # dropped out: KEEP newer runs exist
        fresh = [rid for rid in ids if (st.name, rid) not in self.finished]
        read = {str(r["id"]): r for r in submission.table(store, ids=fresh, repair=False)} if fresh else {}
        out = []
        for rid in ids:
            row = self.finished.get((st.name, rid)) or read.get(rid)
            if row is None:
                continue
            if rid in read:
                row["log"] = metrics.parse(store.read(layout.run_metrics(rid)))
                if row["state"] in FINAL:
                    self.finished[(st.name, rid)] = row
            out.append(dict(row))
        return out

    def _run(self, st: ClusterState, store: BlobStore, row: dict[str, Any], fams: Families) -> None:
        labels = [st.name, st.spec.provider.value, str(row["id"]), str(row["name"])]
        shown = "stale" if row["state"] == "lost?" else str(row["state"])
        for s in STATES:
            fams["tpuctl_run_state"].add_metric(labels + [s], 1.0 if s == shown else 0.0)
        log: metrics.MetricsLog | None = row["log"]
        if row["step"] is not None:
            fams["tpuctl_run_step"].add_metric(labels, float(row["step"]))
        if row["loss"] is not None:
            fams["tpuctl_run_loss"].add_metric(labels, float(row["loss"]))
        if log is not None:
            per_step = step_seconds(log.attempts)
            if per_step is not None:
                fams["tpuctl_run_step_seconds"].add_metric(labels, per_step)
            rate = next((log.metrics[k] for k in EXAMPLES if k in log.metrics), None)
            if rate is not None:
                fams["tpuctl_run_examples_per_second"].add_metric(labels, rate)
        if row["goodput"] is not None:
            fams["tpuctl_run_goodput_ratio"].add_metric(labels, float(row["goodput"]) / 100)
        parts = row.get("goodput_parts") or {}
        for kind, field in BADPUT.items():
            if field in parts:
                fams["tpuctl_run_badput_seconds"].add_metric(labels + [kind], float(parts[field]))
        fams["tpuctl_run_resumes"].add_metric(labels, float(parts.get("resumes", 0)))
        fams["tpuctl_run_recoveries"].add_metric(labels, float(row.get("recoveries") or 0))
        if row["duration"] is not None:
            fams["tpuctl_run_duration_seconds"].add_metric(labels, float(row["duration"]))
        if row["cost_usd"] is not None:
            fams["tpuctl_run_cost_dollars"].add_metric(labels, float(row["cost_usd"]))
        if row["state"] in FINAL:
            return
        now = time.time()
        if log is not None and log.attempts:
            started = min(float(row["started_at"] or log.attempts[0]["start"]), log.attempts[0]["start"])
            lag = knobs.number("TPUCTL_PROGRESS_SECONDS", 10)
            for window, seconds in WINDOWS:
                ratio = goodput.interval(log.attempts, started, now - seconds, now, lag)
                if ratio is not None:
                    fams["tpuctl_run_interval_goodput_ratio"].add_metric(labels + [window], ratio)
        self._chips(st, store, row, labels, now, fams)

    def _chips(self, st: ClusterState, store: BlobStore, row: dict[str, Any], labels: list[str], now: float,
               fams: Families) -> None:
        """Each host's last sample of its chips (host/chipsampler.py), for a run not finished."""
        from .runview import hosts
        job = runs.job(store, str(row["id"]))
        for h in hosts(st, job):
            doc = utilisation.parse(store.read(layout.run_chips(str(row["id"]), h["index"])))
            if not doc or not doc.get("chips"):
                continue
            fams["tpuctl_chip_sample_age_seconds"].add_metric(labels + [h["label"]],
                                                              max(now - float(doc.get("time") or 0), 0.0))
            for chip in doc["chips"]:
                cid = chip.get("id", "")   # a number in the file (an int, or a float like 0.0 once through JSON)
                at = labels + [h["label"], str(int(cid)) if isinstance(cid, (int, float)) else str(cid)]
                if chip.get("duty_cycle_pct") is not None:
                    fams["tpuctl_chip_duty_cycle_ratio"].add_metric(at, float(chip["duty_cycle_pct"]) / 100)
                for key, fam in (("hbm_used", "tpuctl_chip_hbm_used_bytes"),
                                 ("hbm_total", "tpuctl_chip_hbm_total_bytes")):
                    if chip.get(key) is not None:
                        fams[fam].add_metric(at, float(chip[key]))


def step_seconds(attempts: list[dict[str, float]]) -> float | None:
    """Mean time of a step in the latest attempt that made steps, its first step's extra (compilation) left out,
    as goodput.breakdown counts productive time; None before a step."""
    for a in reversed(attempts):
        steps = a["step"] - a["from"]
        if steps > 0:
            return max(a["step_seconds"] - goodput.first_step_extra(a), 0.0) / steps
    return None


def provisioning(st: ClusterState) -> dict[tuple[str, str], tuple[int, float]]:
    """(zone, result) -> (placements tried, seconds they took), as `up` recorded them in the cluster's state."""
    out: dict[tuple[str, str], tuple[int, float]] = {}
    for key, (n, took) in dict(st.record.get("up_placements") or {}).items():
        zone, _, result = str(key).rpartition("|")
        out[(zone, result)] = (int(n), float(took))
    return out


def registry_for(collector: RunsCollector) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return reg


def exposition(reg: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    """The scrape's body and content type: OpenMetrics when the scraper accepts it (Prometheus 2.42 asks for it
    first), else Prometheus's text format 0.0.4 (prometheus_client's choose_encoder)."""
    from prometheus_client.exposition import choose_encoder
    encoder, content_type = choose_encoder(accept)
    return encoder(reg), content_type
