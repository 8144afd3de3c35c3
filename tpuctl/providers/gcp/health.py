"""How the cluster is doing, as Google and the store see it now: the TPU's state, each agent's heartbeat, each
host's last boot-log line; what keeps a ready cluster from running jobs, and the command that mends it."""
from __future__ import annotations

import json
import time
from typing import Callable

from ...core import layout, runs
from ...core.errors import ErrorKind, TpuctlError
from ...core.models import Arch, ClusterState
from ..google import storage, vms
from ..google.gcs_store import GcsStore
from .topology import Topology
from .tpuapi import slices
from .tpuapi.queued import QueuedApi
from .tpuapi.tpu import COMING, HEALTH_TOLD, HEALTH_WAIT, HELD, LOST, READY, facts, health_of


# What a state means, where its name does not say (tpu_v2.types.Node.State's docstrings).
_MEANING = {"UNKNOWN": " (Google's repair of it failed)", "STOPPED": " (stopped: `tpuctl up` starts it)",
            "STOPPING": " (being stopped: `tpuctl up` starts it again)",
            "HIDING": " (a state Google does not explain)", "HIDDEN": " (a state Google does not explain)",
            "STATE_UNSPECIFIED": " (Google reports no state)"}


class Health:
    def __init__(self, store_of: Callable[[ClusterState], GcsStore]) -> None:
        self.store_of = store_of

    def _tpu_state(self, st: ClusterState) -> str:
        """The cluster's TPU state as the API reports it now; MISSING when there is none."""
        return self._tpu(st)[0]

    def _tpu(self, st: ClusterState) -> tuple[str, str]:
        """(state, health) of the cluster's TPU now; ("MISSING", "") when there is none. A Multislice is as good
        as its worst slice: one slice lost is the whole run's loss (slices.worst); all READY, the first health
        that is not good."""
        if not st.zone:
            return "MISSING", ""
        api = Topology.tpu(st.spec)
        nodes = {name: api.find(name, st.zone) for name in st.spec.node_names}
        state = slices.worst({n: api.state(node) if node is not None else "MISSING" for n, node in nodes.items()})[1]
        healths = [health_of(node) for node in nodes.values() if node is not None]
        return state, next((h for h in healths if h in HEALTH_WAIT or h in HEALTH_TOLD), healths[0] if healths else "")

    def check_ready(self, st: ClusterState) -> None:
        state, health = self._tpu(st)
        if state == READY:
            return
        raise TpuctlError(ErrorKind.PREEMPTED if state in LOST else ErrorKind.NOT_FOUND,
                          f"the TPU of cluster {st.name} is {state}" + _MEANING.get(state, ""),
                          f"wait, or watch: tpuctl status -c {st.name}" if state in COMING else
                          f"run `tpuctl up -c {st.name} ...` again to (re)create or start it")

    def compute_lost(self, st: ClusterState) -> str | None:
        """A queued request answers first: SUSPENDED (a spot request preempted, its node gone) or FAILED is lost
        whatever the node says; WAITING_FOR_RESOURCES or PROVISIONING is coming up (cloud.google.com/tpu/docs/
        queued-resources). Then the node: a LOST state (tpu.py: PREEMPTED, TERMINATED, UNKNOWN) or MISSING."""
        spec = st.spec
        if spec.queued and st.zone:
            qr = QueuedApi(spec.project).find(spec.qr_name, st.zone)
            qstate = QueuedApi.state(qr) if qr else "MISSING"
            if qstate in ("SUSPENDED", "SUSPENDING", "FAILED", "MISSING"):
                return f"its queued request {spec.qr_name} is {qstate}"
            if qstate != "ACTIVE":
                return None
        if not st.zone:
            return f"its TPU {spec.tpu_name} is MISSING"
        name, state = slices.worst(slices.states(Topology.tpu(spec), spec, st.zone))
        return f"its TPU {name} is {state}{_MEANING.get(state, '')}" if state in slices.LOST else None

    def host_state(self, st: ClusterState) -> tuple[bool, str]:
        state, health = self._tpu(st)
        if state in COMING:
            return True, f"the TPU is {state}: its host will resume the run once it has booted"
        if state == READY and health in HEALTH_WAIT:
            return True, f"the TPU is under maintenance ({health}): it resumes once rescheduled"
        boot = "; ".join(f"{h}: {line}" for h, line in self._boot_logs(st).items())
        if state == READY:
            return True, "the TPU is READY but its agent is silent" + (f" (boot log: {boot})" if boot else "")
        return False, f"the TPU is {state}{_MEANING.get(state, '')}" + (f" (last boot log lines: {boot})" if boot
                                                                         else "")

    def problem(self, st: ClusterState) -> tuple[str, str] | None:
        state, health = self._tpu(st)
        again = f"tpuctl up -c {st.name}"
        if state in COMING or (state == READY and health in HEALTH_WAIT):
            return (f"the TPU is {state}" + (f" ({health})" if health in HEALTH_WAIT else "")
                    + "; runs start once its hosts are back", f"wait, or watch: tpuctl status -c {st.name}")
        if state in HELD:
            replace = f"tpuctl down -c {st.name} --yes && {again} ..."
            return (f"the TPU is {state}{_MEANING.get(state, '')}: nothing runs, and neither waiting nor the "
                    f"recovery watcher brings it back", again if state in ("STOPPED", "STOPPING") else replace)
        if state != READY:
            return (f"the TPU is {state}{_MEANING.get(state, '')}: submitted runs wait and running ones resume once "
                    f"it is back", again)
        if health in HEALTH_TOLD:
            return (f"the TPU reports health {health} ({HEALTH_TOLD[health]})",
                    f"look at the host: tpuctl ssh -c {st.name} -- sudo journalctl -u tpu-runtime; "
                    f"tpuctl down -c {st.name} --yes && {again} ... replaces it")
        beats = {who: age for who, (age, _) in self._beats(st).items()}
        if not beats:
            boot = "; ".join(f"{h}: {line}" for h, line in self._boot_logs(st).items())
            return ("the TPU is READY but no agent has reported yet" + (f" (boot log: {boot})" if boot else ""),
                    f"look at the host: tpuctl ssh -c {st.name} -- sudo journalctl -u tpuctl-agent")
        silent = sorted(w for w, age in beats.items() if age > runs.stale_seconds())
        if silent:
            return (f"agent {', '.join(silent)} silent for over {runs.stale_seconds():.0f}s",
                    f"tpuctl ssh -c {st.name} -- sudo systemctl restart tpuctl-agent")
        return None

    def describe(self, st: ClusterState) -> dict[str, dict[str, object]]:
        spec = st.spec
        out: dict[str, dict[str, object]] = {}
        if st.zone and spec.queued:
            qr = QueuedApi(spec.project).find(spec.qr_name, st.zone)
            out["queued"] = {"state": QueuedApi.state(qr) if qr else "MISSING"}
        for k, name in enumerate(spec.node_names if st.zone else []):
            node = Topology.tpu(spec).find(name, st.zone)
            key = "tpu" if spec.slices <= 1 else f"tpu slice {k}"
            if node is None:
                out[key] = {"name": name, "state": "MISSING"} if spec.slices > 1 else {"state": "MISSING"}
            else:
                f = facts(node)
                out[key] = {**({"name": name} if spec.slices > 1 else {}), "ip": f.ip,
                            "service_account": f.service_account, "hosts": f.hosts,
                            "state": Topology.tpu(spec).state(node), "health": health_of(node)}
        if st.zone:
            if spec.arch is Arch.NODE:
                vm = vms.find(spec.project, spec.vm_name, st.zone)
                out["vm"] = {"state": vm.status if vm else "MISSING"}
        b = storage.find(spec.project, storage.bucket_of(spec))
        out["bucket"] = {"state": "READY" if b else "MISSING", "location": (b.location or "").lower() if b else ""}
        if b is not None:
            out["boot_logs"] = self._boot_logs(st)
            out["workers"] = self._workers(st)
            served = self._served(st)
            if served:
                out["tpu_runtime"] = served
        return out

    def _served(self, st: ClusterState) -> dict[str, object]:
        """What each worker's TPU runtime serves, where a TensorFlow run re-pointed it (host/podruntime.py)."""
        store = self.store_of(st)
        found: dict[str, object] = {}
        for key, _ in store.list(layout.TPU_RUNTIME_PREFIX):
            try:
                rec = json.loads(store.read(key) or b"{}")
            except ValueError:
                continue
            found[str(rec.get("worker", "?"))] = rec.get("image") or f"cannot serve: {rec.get('error', '')}"
        return found

    def _workers(self, st: ClusterState) -> dict[str, object]:
        """Each agent's last heartbeat: its role (a TensorFlow slice's workers > 0 serve the TPU runtime) and age."""
        found: dict[str, object] = {}
        for who, (age, role) in self._beats(st).items():
            found[who] = f"{role}, heartbeat {age:.0f}s ago" + (" (STALE)" if age > runs.stale_seconds() else "")
        return found

    def _beats(self, st: ClusterState) -> dict[str, tuple[float, str]]:
        """'wN host' -> (seconds since its agent's last heartbeat, its role)."""
        return {f"w{beat.get('worker', '?')} {beat.get('host', '')}":
                (time.time() - float(beat.get("time", 0)), str(beat.get("role", "agent")))
                for beat in runs.heartbeats(self.store_of(st))}

    def _boot_logs(self, st: ClusterState) -> dict[str, object]:
        """The last line each host's start-up script wrote into the store: how a failed boot becomes visible."""
        store = self.store_of(st)
        logs: dict[str, object] = {}
        for key, _ in store.list(layout.BOOT_PREFIX):
            lines = (store.read(key) or b"").decode(errors="replace").strip().splitlines()
            logs[key[len(layout.BOOT_PREFIX):].removesuffix(".log")] = lines[-1] if lines else ""
        return logs
