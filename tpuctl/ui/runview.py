"""One run, as the run page shows it: its row (the one `jobs` shows), every metric's history, each host's chip
utilisation, its hosts, events in time order, outputs with sizes, the commands for it, and its log read from the
tail (a 100 MB log is never read whole: only its last chunks, then each new chunk as the agent ships it)."""
from __future__ import annotations

import math
import time
from typing import Any

from ..control import armed, submission
from ..core import backends, hostlogs, jobfiles, knobs, layout, metrics, notify, runs, utilisation
from ..core.errors import ErrorKind, TpuctlError
from ..core.sizes import human_bytes
from ..core.store import BlobStore
from . import links
from .views import cluster, costed


def tail_bytes() -> int:
    """How much of a log the page loads first (TPUCTL_UI_LOG_TAIL_BYTES, 128 KiB: some 2,000 lines); older output is
    a command away."""
    return knobs.count("TPUCTL_UI_LOG_TAIL_BYTES", 128 * 1024)


POLL_BYTES = 4 * 2 ** 20   # what one poll of a following page may bring at most (a burst waits for the next poll)


def hosts(st: Any, job: runs.RunSpec | None) -> list[dict[str, Any]]:
    """The run's hosts as `logs --all-hosts` names them (hostlogs.hosts): store index and [sK/wW] label."""
    record = {"arch": st.spec.arch.value, "runtime": st.runtime, "slices": st.spec.slices}
    framework = backends.program_framework(job.framework, job.env, job.keras_backend, record) if job else "tensorflow"
    return [{"index": i, "label": label.strip("[] ")}
            for i, label in hostlogs.hosts(max(1, st.spec.slices), max(1, st.host.hosts), framework)]


def run(name: str, run_id: str) -> dict[str, Any]:
    st, prov = cluster(name)
    store = prov.store(st)
    if not runs.is_id(run_id) or (job := runs.job(store, run_id)) is None:
        raise TpuctlError(ErrorKind.NOT_FOUND, f"no run {run_id} on cluster {name}", "the runs page lists them")
    rows = submission.table(store, ids=[run_id], repair=False)
    costed(st, prov, rows)
    m, _ = metrics.load(store, layout.run_metrics(run_id))   # what is wrong with it: the row's note says
    who = hosts(st, job)
    chips = {h["label"]: utilisation.load(store, layout.run_chips(run_id, h["index"]))[0] for h in who}
    history = m.history if m else {}
    order = sorted(history, key=lambda k: (k != "loss", k))   # loss first
    return {"cluster": name, "id": run_id, "job": job.name, "command": job.command, "row": rows[0] if rows else {},
            "metrics": [{"name": k, "points": history[k]} for k in order],
            "chips": {label: {"shown": utilisation.shown(d), "source": (d or {}).get("source", ""),
                              "history": (d or {}).get("history", {}), "latest": (d or {}).get("chips", [])}
                      for label, d in chips.items()},
            "hosts": who, "events": events(store, run_id), "outputs": outputs(store, run_id),
            "commands": commands(name, run_id, runs.status(store, run_id).state.final),
            "links": links.for_run(st, run_id), "provider": st.spec.provider.value}


def commands(name: str, run_id: str, final: bool = False) -> list[str]:
    """What to type about the run; a finished run is offered no `cancel` (issue 63.7)."""
    return [f"tpuctl logs {run_id} -c {name} -f", f"tpuctl download {run_id} -c {name}"] \
        + ([] if final else [f"tpuctl cancel {run_id} -c {name}"]) + [f"tpuctl tensorboard {run_id} -c {name}"]


def outputs(store: BlobStore, run_id: str) -> list[dict[str, Any]]:
    """Each output with its size in bytes and as people read it (issue 63.7)."""
    prefix = layout.run_output(run_id) + "/"
    return [{"path": k[len(prefix):], "bytes": size, "size": human_bytes(size)} for k, size in store.list(prefix)]


def _read(store: BlobStore, key: str) -> dict[str, Any]:
    """A record of the run's (a claim, a round, an event) as far as it can be read: {} when it cannot."""
    try:
        return jobfiles.read_object(store, key) or {}
    except jobfiles.Unreadable:
        return {}


def _time(v: Any, default: float = 0.0) -> float:
    """A record's time, where a job's or a host's record may hold anything: `default` unless a finite number."""
    try:
        t = float(v)
    except (TypeError, ValueError, OverflowError):
        return default
    return t if math.isfinite(t) and t else default


def events(store: BlobStore, run_id: str) -> list[dict[str, Any]]:
    """What happened to the run, oldest first: submitted, each claim (a host took it: a start, a take-over),
    the notifications recorded for it (started, restarted with the attempt, finished or failed with the exit code),
    the cluster's own events while it ran (preempted, recovered, stopped by autostop, budget or deadline), a
    cancel and who sent it, the rounds of a run across hosts, notifications given up on, its end."""
    job, st = runs.job(store, run_id), runs.status(store, run_id)
    out: list[dict[str, Any]] = []
    if job:
        out.append({"time": job.submitted, "what": f"submitted ({job.name}: {job.command})"})
    for a in range(1, st.attempt + 1):
        c = _read(store, layout.run_claim(run_id, 0, a))
        if c:
            out.append({"time": _time(c.get("time")), "what": f"attempt {a} claimed by {c.get('host')}"})
    start = out[0]["time"] if out else 0.0
    end = st.ended or time.time()
    for prefix in (f"run.started-{run_id}", f"run.restarted-{run_id}", f"run.stalled-{run_id}", f"run.ended-{run_id}",
                   f"drill.signalled-{run_id}", f"drill.result-{run_id}", "cluster.", "budget."):
        for key, _ in store.list(layout.notify_event(prefix)[:-len(".json")]):
            e = _read(store, key)
            t = _time(e.get("time"))
            if e.get("run") == run_id or (not e.get("run") and start <= t <= end):
                out.append({"time": t, "what": sentence(e)})
    for r in armed.recoveries(store):
        t = _time(r.get("detected_at"))
        if start <= t <= end:
            out.append({"time": t, "what": f"recovery: {armed.recovery_line(r)}"})
    for key, _ in store.list(layout.run_rounds(run_id)):
        if key.endswith(".json"):
            r = _read(store, key)
            out.append({"time": _time(r.get("time")), "what": f"round {key[-9:-5].lstrip('0')}: "
                        + ", ".join(f"{k} {v}" for k, v in r.items() if k != "time")})
    if store.read(layout.run_cancel(run_id)) is not None:
        doc = _read(store, layout.run_cancel(run_id))
        out.append({"time": _time(doc.get("time"), end), "what": runs.cancelled_by(store, run_id)})
    for u in notify.undelivered(store):
        if u.get("run") == run_id:
            out.append({"time": _time(u.get("time")), "what": f"notification {u.get('event')} to {u.get('to')}"
                                                                   f" given up: {u.get('error')}"})
    if st.state.final:
        code = "" if st.exit_code is None else f" (exit code {st.exit_code})"
        out.append({"time": st.ended or end, "what": f"{st.state.value}{code}" + (f": {st.note}" if st.note else "")})
    return sorted(out, key=lambda e: e["time"])


def _n(v: Any, unit: str = "") -> str:
    return f"{round(v, 4) if isinstance(v, float) else v}{unit}"


def sentence(e: dict[str, Any]) -> str:
    """A recorded notification (core/notify.py) as the page says it: a sentence, not its fields (issue 63.7)."""
    event = str(e.get("event") or "")
    f = {k: v for k, v in e.items() if k not in ("event", "cluster", "run", "time", "log_tail") and v not in (None, "")}
    said = {
        "run.started": lambda: f"started on {f.get('host', 'its host')}",
        "run.restarted": lambda: (f"started again on {f.get('host', 'its host')}, attempt {f.get('attempt', '?')}"
                                  + (f" (restart {f['restart']} after exit code {f.get('exit_code', '?')})"
                                     if f.get("restart") else "") + (f", round {f['round']}" if "round" in f else "")),
        "run.finished": lambda: ("finished" + (f" with loss {_n(f['loss'])}" if "loss" in f else "")
                                 + (f" after {_n(f['duration_s'], ' s')}" if "duration_s" in f else "")
                                 + (f", goodput {_n(f['goodput_pct'], '%')}" if "goodput_pct" in f else "")
                                 + (f", cost ${f['cost_usd']:.2f}" if "cost_usd" in f else "")),
        "run.failed": lambda: (f"failed with exit code {f.get('exit_code', '?')}"
                               + (f" (cause: {f['failure']})" if "failure" in f else "")),
        # the run doctor's (host/doctor.py): which host saw it, the action taken, and why
        "run.stalled": lambda: (f"stalled on {f.get('host', 'its host')}: {f.get('why', 'no progress')}"
                                + (f"; action: {f['action']}" if "action" in f else "")),
        "cluster.preempted": lambda: (f"the cluster's compute was lost ({f.get('lost', 'preempted')})"
                                      + (f" in {f['zone']}" if "zone" in f else "")),
        "cluster.recovered": lambda: (f"the cluster was brought back (recovery {f.get('recovery', '?')}"
                                      + (f", in {_n(f['took_s'], ' s')}" if "took_s" in f else "")
                                      + (f", in {f['zone']}" if "zone" in f else "") + ")"),
        "cluster.stopped": lambda: f"the cluster's compute was ended: {f.get('why') or f.get('reason', '')}",
        "cluster.recovery_given_up": lambda: "recovery was given up" + (f": {f['why']}" if "why" in f else ""),
        # `tpuctl drill` (control/drill.py): what it delivered, and what came of it
        "drill.signalled": lambda: (f"drill: {f.get('signal', 'a signal')} to the job in its {f.get('phase', '?')} "
                                    f"phase" + (f" at step {f['step']}" if "step" in f else "")
                                    + (f", SIGKILL after {float(f['grace']):g} s" if "grace" in f else "")),
        "drill.result": lambda: _drill_result(f),
        "budget.warning": lambda: (f"the budget is nearly spent: ${float(f.get('spent_usd', 0)):.2f} of "
                                   f"${float(f.get('budget_usd', 0)):.2f}"),
    }.get(event)
    if said is not None:
        try:
            return said()
        except (TypeError, ValueError):
            pass   # a field of another shape (an older agent's): its fields, as they are
    rest = ", ".join(f"{k.replace('_', ' ')} {_n(v)}" for k, v in f.items())
    return event.replace(".", " ").replace("_", " ") + (f": {rest}" if rest else "")


def _drill_result(f: dict[str, Any]) -> str:
    head = f"drill {f.get('phase', '?')} ({f.get('signal', '?')}): "
    if f.get("passed") is None:
        return head + str(f.get("why") or "not reached")
    said = [f"resumed from step {f['resumed_from']}" if "resumed_from" in f else "",
            f"last checkpoint {f['last_checkpoint']}" if "last_checkpoint" in f else "no checkpoint",
            f"{f['redone']} steps redone" if "redone" in f else "",
            "saved within the grace" if f.get("saved_in_grace") else "",
            "exited at its checkpoint" if f.get("stopped_at_checkpoint") else "",
            f"data {f['data']}" if "data" in f else ""]
    return head + ("passed" if f["passed"] else "FAILED") + ": " + ", ".join(s for s in said if s) + \
        (f"; {f['why']}" if not f["passed"] and f.get("why") else "")


def _chunk_number(key: str) -> int:
    return int(key.rsplit("/", 1)[1].split(".")[0])


def _whole_characters(data: bytes) -> int:
    """How much of `data` ends on a whole UTF-8 character: a chunk may end inside one (the agent ships at 64 KiB
    or each second, not at character boundaries), and its rest comes with the next chunk."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 == 0x80:
            continue   # a continuation byte: look further back for its lead
        needed = 1 if b < 0x80 else 2 if b < 0xE0 else 3 if b < 0xF0 else 4
        return len(data) if needed <= back else len(data) - back
    return len(data)


def read_from(store: BlobStore, run_id: str, worker: int, after: int, skip: int, final: bool) -> dict[str, Any]:
    """The chunks from number `after` on, less the `skip` bytes of it already shown, up to POLL_BYTES, cut at the
    last whole character unless the host's output is `final`; `next` and `skip` say where the next read starts."""
    chunks: list[bytes] = []
    n = after
    while sum(map(len, chunks)) < POLL_BYTES and \
            (chunk := store.read(layout.log_chunk(run_id, worker, n))) is not None:
        chunks.append(chunk)
        n += 1
    data = b"".join(chunks)[skip:]
    done = final and sum(map(len, chunks)) < POLL_BYTES
    cut = len(data) if done else _whole_characters(data)
    pos, nxt = skip + cut, after
    for chunk in chunks:
        if pos < len(chunk):
            break
        pos, nxt = pos - len(chunk), nxt + 1
    return {"text": data[:cut].decode(errors="replace"), "next": nxt, "skip": pos, "final": done}


def log(name: str, run_id: str, worker: int, after: int | None, skip: int = 0) -> dict[str, Any]:
    """Worker `worker`'s log: with `after` None, its tail (the last chunks up to tail_bytes(), listed once, with how
    many bytes came before them); else from chunk `after` (less `skip` bytes of it) on, as `logs -f` reads it.
    `next`/`skip` say where to read next; `final` whether the run has ended on that host (no chunk follows its final
    status)."""
    if not runs.is_id(run_id):   # an id is part of store keys: `..` never reaches one
        raise TpuctlError(ErrorKind.NOT_FOUND, f"no run {run_id!r} on cluster {name}", "the runs page lists them")
    st, prov = cluster(name)
    store = prov.store(st)
    skipped = 0
    if after is None:
        listed = store.list(layout.run_logs(run_id, worker))
        kept: list[str] = []
        size = 0
        for key, n in reversed(listed):
            if kept and size + n > tail_bytes():
                break
            kept.insert(0, key)
            size += n
        skipped = sum(n for _, n in listed) - size
        after = _chunk_number(kept[0]) if kept else 1
        first = (store.read(kept[0]) or b"") if kept and skipped else b""
        # a tail that starts inside a character starts at the next one
        skip = next((i for i, b in enumerate(first[:4]) if b & 0xC0 != 0x80), 0)
    status = runs.status(store, run_id, worker)   # before the chunks: a final status means every chunk is out
    got = read_from(store, run_id, worker, after, skip, status.state.final)
    return {**got, "skipped": skipped + skip, "state": status.state.value}
