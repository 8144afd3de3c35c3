"""KaggleProvider: the Provider contract (../base.py) over Kaggle's free accelerators. There is no compute to make:
`up` checks the credentials and the weekly quota and records the cluster; each run is one or more Kaggle sessions
(sessions.py); the store is a directory on this machine, as for the local provider, which the commands that look
at a run keep up to date (`remote_runs`). `down` deletes the kernels and datasets tpuctl made."""
from __future__ import annotations

import json
from pathlib import Path

from ...core import layout
from ...core.catalog import v5e_name
from ...core.errors import ErrorKind, TpuctlError, bad_input
from ...core.lifecycle import show_duration
from ...core.models import ClusterSpec, ClusterState, HostFacts, ProviderName, cluster_record
from ...core.store import LocalStore
from ..base import (Compute, Enforcement, Placement, PlanRow, Price, Progress, Reporter, UpFlags, do_not_apply,
                    progress_of)
from ..local import data_home, delete_dir_store, ensure_dir_store
from .kernel import session_seconds
from .sessions import KaggleSessions

# --type -> Kaggle's machine_shape (kaggle_api_extended: "TpuV5E8", "NvidiaTeslaT4"; "" is no accelerator) and what
# the job sees as TPUCTL_ACCELERATOR. The TPU itself is found by tpuctl.runtime as on any TPU VM (its /dev/vfio).
TYPES = {"v5e-8": ("TpuV5E8", "kaggle:TpuV5E8"), "t4x2": ("NvidiaTeslaT4", "gpu:2"), "cpu": ("", "cpu")}
# retired shapes: Kaggle runs them on something else (kaggle_api_extended `_RETIRED_ACCELERATORS`)
RETIRED = {"p100": "t4x2", "v3-8": "v5e-8"}


class KaggleProvider:
    name = ProviderName.KAGGLE
    store_noun = "store"
    grants = None
    inventory = None
    watcher_host = None
    self_recovery = ""

    def __init__(self) -> None:
        self.remote_runs = KaggleSessions(lambda st: TYPES[st.spec.tpu_type][0], lambda st: TYPES[st.spec.tpu_type][1])

    @staticmethod
    def root(cluster: str) -> Path:
        return data_home() / "clusters" / cluster / "store"

    # -- planning ------------------------------------------------------------------------------------
    def make_spec(self, name: str, flags: UpFlags) -> ClusterSpec:
        given = [f for f in flags.given() if f != "--type"]
        if given:
            raise bad_input(do_not_apply(given, "--provider kaggle"),
                            "Kaggle picks where a session runs: `tpuctl up --provider kaggle --type v5e-8`")
        t = v5e_name((flags.tpu_type or "v5e-8").lower())   # Google Cloud's v5litepod-8 is Kaggle's v5e-8
        if t in RETIRED:
            raise bad_input(f"--type {t} is retired on Kaggle (its sessions run on other hardware)",
                            f"use --type {RETIRED[t]}")
        if t not in TYPES:
            tpu = t.startswith("v5e-")   # a v5e of another size: Kaggle's TPU is the one v5e-8
            raise bad_input(f"--type {flags.tpu_type!r} is not a Kaggle accelerator" +
                            (": Kaggle's TPU is v5e-8 (v5litepod-8 on Google Cloud)" if tpu else ""),
                            "did you mean --type v5e-8?" if tpu else f"use one of {', '.join(TYPES)}")
        return ClusterSpec(name=name, provider=self.name, store=str(self.root(name)), tpu_type=t)

    def plan(self, spec: ClusterSpec) -> list[PlanRow]:
        shape = TYPES[spec.tpu_type][0] or "no accelerator"
        return [PlanRow("store", spec.store, "this machine"),
                PlanRow("kernel", "one private Kaggle kernel per session of each run",
                        f"Kaggle, {shape}, {show_duration(int(session_seconds(TYPES[spec.tpu_type][0])))} a session")]

    def price(self, spec: ClusterSpec) -> Price:
        return Price(0.0, "free (Kaggle's weekly accelerator quota)")

    def placements(self, spec: ClusterSpec) -> list[Placement]:
        return [Placement("", "")]

    # -- making and removing ---------------------------------------------------------------------------
    def preflight(self, spec: ClusterSpec) -> list[str]:
        """The credentials, and for a TPU the weekly quota (GetAcceleratorQuotaStatistics): refused when used up."""
        from .client import Kaggle
        k = Kaggle()
        q = k.tpu_quota()
        if not TYPES[spec.tpu_type][0].startswith("Tpu"):
            return []
        used, allowed = float(q["used"]) + float(q["reserved"]), float(q["allowed"])
        if allowed and used >= allowed:
            raise TpuctlError(ErrorKind.CAPACITY, f"Kaggle account {k.user} has used its weekly TPU quota "
                              f"({show_duration(int(used))} of {show_duration(int(allowed))}, running sessions "
                              "included)", f"it refreshes at {q['refresh']}; or `up --provider kaggle --type t4x2` "
                              "meanwhile")
        return []

    def ensure_store(self, spec: ClusterSpec, region: str, progress: Progress) -> bool:
        return ensure_dir_store(spec, progress)

    def delete_store(self, st: ClusterState, progress: Progress) -> None:
        delete_dir_store(st, progress)

    def choose_runtime(self, spec: ClusterSpec, placement: Placement) -> str:
        return ""

    def ensure_compute(self, st: ClusterState, reporter: Reporter) -> Compute:
        progress_of(reporter, "kaggle", st.spec.tpu_type)("ready: each run is a Kaggle session")
        return Compute([], HostFacts())

    def delete_compute(self, st: ClusterState, reporter: Reporter) -> None:
        if Path(st.spec.store).is_dir():
            self.remote_runs.delete_all(self.store(st), progress_of(reporter, "kaggle", st.name))

    def write_cluster_record(self, st: ClusterState, confirmed: bool) -> None:
        self.store(st).write(layout.CLUSTER_RECORD, json.dumps(cluster_record(st, "", teardown="exit"),
                                                                indent=2).encode())

    # -- using ---------------------------------------------------------------------------------------
    def store(self, st: ClusterState) -> LocalStore:
        return LocalStore(st.spec.store)

    def revive(self, st: ClusterState, reporter: Reporter) -> ClusterState:
        return st   # no process of tpuctl's runs for a Kaggle cluster

    def check_ready(self, st: ClusterState) -> None:
        from .auth import find
        find()

    def host_state(self, st: ClusterState) -> tuple[bool, str]:
        return True, "Kaggle runs the session"

    def problem(self, st: ClusterState) -> tuple[str, str] | None:
        return None

    def compute_lost(self, st: ClusterState) -> str | None:
        return None

    def enforcement(self, st: ClusterState) -> Enforcement:
        return Enforcement(True, "Kaggle's session limit")

    def ssh_argv(self, st: ClusterState, worker: int, command: str) -> list[str]:
        raise bad_input(f"cluster {st.name} runs on Kaggle: there is no host to open a shell on",
                        f"`tpuctl logs -c {st.name}` prints each session's log")

    def location(self, st: ClusterState) -> str:
        return f"Kaggle, {st.spec.tpu_type}"

    def summary(self, st: ClusterState) -> dict[str, object]:
        from . import inputs
        from .client import Kaggle
        shape = TYPES[st.spec.tpu_type][0]
        out: dict[str, object] = {"type": st.spec.tpu_type, "machine_shape": shape or "none",
                                  "session_limit": f"{show_duration(int(session_seconds(shape)))} a session "
                                                   "(Kaggle: 9h on TPU, 12h otherwise, kaggle.com/docs/tpu)"}
        try:
            k = Kaggle()
            q = k.tpu_quota()
            out["tpu_quota"] = f"{_hours(q['used'])} of {_hours(q['allowed'])} used this week" + \
                (f", {_hours(q['reserved'])} reserved by running sessions" if q["reserved"] else "") + \
                (f" (at least {_hours(q['minimum'])} guaranteed)" if q["minimum"] else "") + \
                f", refreshes {q['refresh']}"
            held = inputs.holdings(self.store(st), k.user)   # one line, as `status` prints each field
            out["on_kaggle"] = "; ".join(f"{kind}: {', '.join(names) or 'none'}" for kind, names in held.items())
        except TpuctlError as e:
            out["tpu_quota"] = f"unknown ({e.message})"
        return out

    def describe(self, st: ClusterState) -> dict[str, dict[str, object]]:
        return {"store": {"path": st.spec.store, "state": "READY" if Path(st.spec.store).is_dir() else "MISSING"}}

    def teardown_list(self, st: ClusterState) -> list[str]:
        return [f"the Kaggle kernels and datasets tpuctl made for {st.name}"]


def _hours(seconds: object) -> str:
    return show_duration(int(float(str(seconds)))) if float(str(seconds)) else "0s"
