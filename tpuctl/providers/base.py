"""The contract between the flows (control/) and where the compute lives. A provider owns its topology: how a
ClusterSpec becomes resources, their plan rows and price, what the host runs at boot, the cluster record, and
how its store is opened. The flows own only what every provider shares (validate, plan, confirm, create
across placements with failover, undo what this run created, save state, tear down) and never asks which
provider or architecture it is talking to: it asks for a capability (`grants`, `inventory`) instead.

Rules every implementation follows:

- Nothing mutating before validation. `make_spec` validates every flag offline and raises TpuctlError(INPUT)
  naming the flag; flags that do not apply to the provider are refused, not ignored.
- `ensure_*` creates or adopts and is idempotent: calling it again after success (or after an interruption)
  returns the same resource and creates nothing twice. A resource is adopted only when it carries the label
  `tpuctl-cluster=<name>` (models.require_owned); a same-named resource without it is refused.
- `delete_*` succeeds when the resource is already gone, and refuses (TpuctlError INPUT) to delete a resource
  that does not carry the label.
- Every call blocks until the resource is usable or gone, with a deadline (TpuctlError TIMEOUT past it), and
  reports state changes through `progress(state_text)`.
- A failure raises TpuctlError whose `scope` says how far it reaches: ZONE (the next placement may work),
  REGION (no placement in the same region will), GLOBAL (stop). Capacity and location errors carry ZONE or
  REGION; everything else is GLOBAL.
- `ensure_compute` cleans up after itself when it fails part-way (e.g. the legacy node's TPU when its VM could
  not be made), so a failed placement leaves nothing behind; on success it returns what it created, each with
  the undo `up` runs if a later step of the same `up` fails.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, NamedTuple, Protocol

from ..core.errors import bad_input
from ..core.models import ClusterSpec, ClusterState, Grant, HostFacts, ProviderName
from ..core.store import BlobStore

if TYPE_CHECKING:
    from ..core.jobspec import JobSpec

Progress = Callable[[str], None]


class Reporter(Protocol):
    def info(self, message: str) -> None: ...
    def warn(self, message: str) -> None: ...
    def resource(self, kind: str, name: str, state: str, final: bool | None = None) -> None:
        """A resource changed state ("creating", "READY", "deleted", ...); the reporter times it until a final
        state (`final`, or by default READY, RUNNING, DELETED, GRANTED, REVOKED, ADOPTED)."""
    def transfer(self, total: int, verb: str = "upload") -> Callable[[int], None]:
        """Start a byte progress display for a transfer ("upload", "download") of `total` bytes; returns
        advance(n_bytes)."""


def progress_of(reporter: Reporter, kind: str, name: str) -> Progress:
    return lambda s: reporter.resource(kind, name, s)


@dataclass
class UpFlags:
    """`tpuctl up`'s flags as typed, before any provider validated them. None/empty/False = not given."""
    tpu_type: str | None = None
    zones: list[str] = field(default_factory=list)
    project: str | None = None
    arch: str | None = None
    runtime: str | None = None
    spot: bool = False
    service_account: str | None = None
    bucket: str | None = None
    vm_type: str | None = None
    framework: str | None = None
    queued: bool = False
    valid_until: str | None = None
    flex_start: bool = False
    slices: int | None = None
    network: str | None = None
    subnetwork: str | None = None
    create_firewall: bool = False
    gke_cluster: str | None = None
    image: str | None = None
    reservation: str | None = None
    kube_context: str | None = None
    kueue: bool = False
    namespace: str | None = None     # GKE: the runs' Kubernetes namespace (providers/gke/namespaces.py)
    api: str | None = None           # Google Cloud: "tpu" or "compute" (providers/gcp/planning.py)
    flex_wait: str | None = None     # --api compute's own (providers/gcp/compute/gce_requests.py)
    disk_size: int | None = None
    disk_type: str | None = None
    internal_ips: bool = False

    def remember(self, spec: ClusterSpec) -> None:
        """`up -c NAME` on an existing cluster: each flag not given again takes the value the cluster was made
        with (the provider's own flags only: the local provider's spec leaves them all empty)."""
        if not spec.tpu_type:
            return
        self.tpu_type = self.tpu_type or spec.tpu_type
        if spec.provider is ProviderName.GKE:   # GKE's own flags (providers/gke/planning.py)
            if self.gke_cluster is not None and self.gke_cluster != spec.gke_cluster:
                # its node pools live in the GKE cluster it was made with: another one would leave them behind
                was = f"--gke-cluster {spec.gke_cluster}" if spec.gke_cluster else "its own GKE cluster"
                raise bad_input(f"cluster {spec.name} was made in {was}, not --gke-cluster {self.gke_cluster}",
                                f"leave --gke-cluster out, or `tpuctl down -c {spec.name}` first")
            self.zones = self.zones or list(spec.zones)
            self.project = self.project or spec.project
            self.spot = self.spot or spec.spot
            self.service_account = self.service_account or spec.service_account or None
            self.bucket = self.bucket or spec.store.split("://", 1)[-1]
            self.gke_cluster = self.gke_cluster or spec.gke_cluster or None
            self.image = self.image or spec.image or None
            self.reservation = self.reservation or spec.reservation or None
            self.kube_context = self.kube_context or spec.kube_context or None
            self.network = self.network or spec.network or None
            self.subnetwork = self.subnetwork or spec.subnetwork or None
            self.kueue = self.kueue or spec.kueue
            if self.namespace is not None and self.namespace != (spec.namespace or "default"):
                # its LocalQueue (and the namespace, if up made it) are there: another would leave them behind
                raise bad_input(f"cluster {spec.name} was made with --namespace {spec.namespace or 'default'}, not "
                                f"--namespace {self.namespace}", f"leave --namespace out (`submit --namespace` "
                                f"puts one run elsewhere), or `tpuctl down -c {spec.name}` first")
            self.namespace = self.namespace or spec.namespace or None
            if self.slices is None and spec.slices > 1:
                self.slices = spec.slices
            return
        if spec.provider is not ProviderName.GCP:   # a Kaggle cluster has only --type: the rest are defaults
            return
        self.zones = self.zones or list(spec.zones)
        self.project = self.project or spec.project
        self.arch = self.arch or spec.arch.value
        self.runtime = self.runtime or spec.runtime or None
        self.spot = self.spot or spec.spot
        self.create_firewall = self.create_firewall or spec.create_firewall
        self.service_account = self.service_account or spec.service_account or None
        self.bucket = self.bucket or spec.store.split("://", 1)[-1]
        self.vm_type = self.vm_type or spec.vm_type or None
        self.framework = self.framework or spec.framework.value
        self.queued = self.queued or spec.queued
        self.api = self.api or spec.api or None
        self.flex_start = self.flex_start or spec.flex_start
        self.flex_wait = self.flex_wait or (f"{spec.flex_wait}s" if spec.flex_wait and self.flex_start else None)
        self.disk_size = self.disk_size or spec.disk_size or None
        self.disk_type = self.disk_type or spec.disk_type or None
        self.internal_ips = self.internal_ips or spec.internal_ips
        self.reservation = self.reservation or spec.reservation or None
        self.network = self.network or spec.network or None
        self.subnetwork = self.subnetwork or spec.subnetwork or None
        if self.slices is None and spec.slices > 1:
            self.slices = spec.slices

    def given(self) -> list[str]:
        """The flags the user set, spelled as on the command line."""
        names = {"tpu_type": "--type", "zones": "--zone", "project": "--project", "arch": "--arch",
                 "runtime": "--runtime", "spot": "--spot", "service_account": "--service-account",
                 "bucket": "--bucket", "vm_type": "--vm-type", "framework": "--framework", "queued": "--queued",
                 "valid_until": "--valid-until", "flex_start": "--flex-start", "slices": "--slices",
                 "network": "--network", "subnetwork": "--subnetwork", "gke_cluster": "--gke-cluster",
                 "image": "--image", "reservation": "--reservation", "kube_context": "--kube-context",
                 "kueue": "--kueue", "namespace": "--namespace", "api": "--api", "flex_wait": "--flex-wait", "disk_size": "--disk-size",
                 "disk_type": "--disk-type", "internal_ips": "--internal-ips"}
        return [flag for attr, flag in names.items() if getattr(self, attr) not in (None, False, "", [])]


def do_not_apply(flags: list[str], where: str) -> str:
    """"--type does not apply to WHERE", "--type, --zone do not apply to WHERE": the verb agrees with how many flags
    were refused (issue 52 found "--type do not apply")."""
    return f"{', '.join(flags)} {'does' if len(flags) == 1 else 'do'} not apply to {where}"


class PlanRow(NamedTuple):
    kind: str     # tpu, vm, bucket, grant, store, agent
    name: str
    where: str


class Price(NamedTuple):
    hourly: float | None     # USD per hour while the cluster exists; None when the catalog does not know
    text: str


class Placement(NamedTuple):
    """Where compute may be created. Failover moves along a list of these."""
    zone: str
    region: str


@dataclass
class Created:
    """A resource this `up` created, and how to remove it if a later step of the same `up` fails."""
    kind: str
    name: str
    undo: Callable[[], None]


@dataclass
class Compute:
    created: list[Created]
    facts: HostFacts


class Enforcement(NamedTuple):
    """Whether the host can end the cluster's compute itself, on the host's own word: `able` True (text: who
    enforces it), False (text: what it lacks; hint: the grant that would mend it), None (not reported yet)."""
    able: bool | None
    text: str
    hint: str = ""


class BucketGrants(Protocol):
    """Capability: the workload's identities get object access on the store, on the bucket only."""

    def workload_accounts(self, spec: ClusterSpec) -> list[str]:
        """Identities known before creation that must read and write the store."""
    def host_accounts(self, st: ClusterState) -> list[str]:
        """Identities known only once the compute exists (the legacy node's TPU service agent)."""
    def grant(self, spec: ClusterSpec, accounts: list[str], intend: Callable[[list[Grant]], None]) -> list[Grant]:
        """Add the object roles for each account on the bucket only; returns the grants this call added. Before
        writing, `intend` is called with the grants about to be added (those the bucket lacks now), so the caller
        records them first: a kill after the write applied can then never leak a grant, and a grant that was
        there before tpuctl is never recorded, so never revoked."""
    def revoke(self, spec: ClusterSpec, grants: list[Grant]) -> None:
        """Remove exactly these grants; a bucket already gone is fine."""


class Inventory(Protocol):
    """Capability: list what carries the tpuctl label, with or without local state (orphans)."""

    def list_labelled(self, project: str) -> list[dict[str, str]]:
        """Every labelled resource (compute and stores): cluster, kind (tpu, queued, vm, bucket), name, zone (a
        bucket's: its location), arch, type, state."""
    def state_from(self, name: str, project: str, found: list[dict[str, str]]) -> ClusterState:
        """The state of cluster `name` as its labelled resources (`found`, from list_labelled) describe it."""


class WatcherHost(Protocol):
    """Capability: a small machine in the cloud that runs the recovery watcher (`up --recover --watcher vm`)."""

    def check(self, spec: ClusterSpec) -> list[str]:
        """Before anything is made: raise TpuctlError(PERMISSION) when the identity it would run as certainly
        cannot re-create the compute; return warnings when that cannot be told."""
    hourly: float   # $/hour while it exists, free tiers ignored: what `up --budget` counts (core/budget.py)

    def name(self, spec: ClusterSpec) -> str: ...
    def price(self, zone: str) -> str:
        """What it costs, in words (free tiers included)."""
    def zone(self, spec: ClusterSpec, tpu_zone: str) -> str:
        """Where it goes for compute in `tpu_zone`; raises TpuctlError(INPUT) where it cannot go (before anything
        is made)."""
    def ensure(self, st: ClusterState, zone: str, reporter: Reporter) -> bool:
        """Create or adopt it in `zone`, started with the watcher; True when this call created it."""
    def delete(self, st: ClusterState, zone: str, reporter: Reporter) -> None: ...
    def state(self, st: ClusterState, zone: str) -> str:
        """Its state as the cloud reports it ("RUNNING", "MISSING", ...)."""


class RemoteRuns(Protocol):
    """Capability: runs execute on a service the CLI drives (a notebook service's sessions), not by an agent that
    reads the store. `submit` hands each run over; every command that looks at a run moves it on, keeping the
    store's run records (status, log chunks, outputs) as an agent would, so logs, jobs and download read them as
    for every provider."""

    # `submit --max-restarts` honoured: the service restarts a run on exit 42 or a signal (GKE's JobSet), where
    # False: refused (a Kaggle session continues by CONTINUE_CODE instead)
    restarts: bool

    # `submit` without --max-restarts: the restarts a run gets (GKE: disruptions are recovered by default)
    default_restarts: int

    def check_run(self, st: ClusterState, job: JobSpec, max_restarts: int, queue: str, priority: str,
                  namespace: str = "") -> str:
        """`submit`, before anything is made: TpuctlError for a run the service cannot take (GKE: TensorFlow, a
        queue the cluster lacks); returns the queue the run waits in ("" for none)."""
    def dispatch(self, st: ClusterState, store: BlobStore, run_id: str, sessions: int,
                 progress: Callable[[str], None], keep_inputs: bool = False) -> None:
        """Start the run whose job.json is written; `sessions`: how many sessions it may chain through;
        `keep_inputs`: what the service holds of the run's inputs stays once it ends (deleted by default)."""
    def advance(self, st: ClusterState, store: BlobStore, run_id: str, follow: bool = False) -> str:
        """Bring the run's records up to date (rate-limited); its state in words, "" when not one of these runs.
        `follow`: the caller shows the log as it grows (`submit`, `logs -f`): the service's live log is read too."""
    def cancel(self, st: ClusterState, store: BlobStore, run_id: str) -> None: ...
    def let_go(self, run_id: str) -> None:
        """This process stops following the run: another command may move it on at once."""


class Provider(Protocol):
    @property
    def name(self) -> ProviderName: ...
    @property
    def store_noun(self) -> str:
        """What the store is called to users: "bucket", "store"."""
    @property
    def grants(self) -> BucketGrants | None:
        """None: the provider has no identities to grant store access to."""
    @property
    def inventory(self) -> Inventory | None:
        """None: nothing to list beyond local state."""
    @property
    def remote_runs(self) -> RemoteRuns | None:
        """None: an agent on the compute runs what is in the store."""
    @property
    def watcher_host(self) -> WatcherHost | None:
        """None: the recovery watcher runs only where `tpuctl watch` is started."""
    @property
    def self_recovery(self) -> str:
        """"": tpuctl's recovery watcher re-creates lost compute (`up --recover`, `watch`); else who recovers it
        instead, in words (GKE and JobSet), and `up --recover` and `watch` say so rather than arm anything."""

    # -- planning (offline) ----------------------------------------------------------------------------
    def make_spec(self, name: str, flags: UpFlags) -> ClusterSpec:
        """Validate `up`'s flags offline and turn them into a spec; refuse flags that do not apply."""
    def plan(self, spec: ClusterSpec) -> list[PlanRow]:
        """What `up` will create or adopt, for the plan shown before confirming."""
    def price(self, spec: ClusterSpec) -> Price: ...
    def placements(self, spec: ClusterSpec) -> list[Placement]:
        """Where to try, in order (the zones asked for; the one machine for local)."""

    # -- making and removing ---------------------------------------------------------------------------
    def preflight(self, spec: ClusterSpec) -> list[str]:
        """Raise before anything is created when the provider cannot be used (no credentials, a permission that
        is certainly missing); return warnings about what may be missing."""
    def ensure_store(self, spec: ClusterSpec, region: str, progress: Progress) -> bool:
        """Create or adopt the store in `region`; True when this call created it."""
    def delete_store(self, st: ClusterState, progress: Progress) -> None: ...
    def choose_runtime(self, spec: ClusterSpec, placement: Placement) -> str:
        """The software the host runs (spec.runtime, or the newest that fits the placement); "" if none."""
    def ensure_compute(self, st: ClusterState, reporter: Reporter) -> Compute:
        """Create or adopt the cluster's compute at st.zone with st.runtime, and start its host."""
    def delete_compute(self, st: ClusterState, reporter: Reporter) -> None:
        """Remove everything of the cluster that bills (TPU, VM, agent process); the store stays."""
    def write_cluster_record(self, st: ClusterState, confirmed: bool) -> None:
        """`tpuctl/cluster.json` in the store (and what the hosts install from it). Before the compute is confirmed
        (`confirmed` False: written ahead of creation, for hosts that boot during it) it carries nothing learned
        from a previous compute, such as a recreated node's old address."""

    # -- using ---------------------------------------------------------------------------------------
    def store(self, st: ClusterState) -> BlobStore: ...
    def revive(self, st: ClusterState, reporter: Reporter) -> ClusterState:
        """Start again a host process that died where nothing else would (the local agent; systemd restarts a TPU
        host's), saying so; returns the cluster's state, updated."""
    def check_ready(self, st: ClusterState) -> None:
        """Raise TpuctlError unless runs can be submitted now (TPU READY; local agent alive)."""
    def host_state(self, st: ClusterState) -> tuple[bool, str]:
        """(alive or coming back, what it is doing in words): asked by a follower whose run's host went quiet."""
    def problem(self, st: ClusterState) -> tuple[str, str] | None:
        """What keeps a ready cluster from running jobs now (a dead agent, a lost TPU, silent hosts) and the one
        command that mends it, or None when it is healthy."""
    def compute_lost(self, st: ClusterState) -> str | None:
        """Why the cluster's compute is gone and will not come back by itself (a PREEMPTED, TERMINATED or missing
        TPU; a SUSPENDED or FAILED queued request; a dead local agent), or None while it is up or coming up. What
        the recovery watcher (control/watch.py) asks at each look."""
    def enforcement(self, st: ClusterState) -> Enforcement:
        """What the host reported about ending the compute itself, for the cluster record `up` wrote last."""
    def ssh_argv(self, st: ClusterState, worker: int, command: str) -> list[str]:
        """The command line that opens a shell on a host of the cluster (running `command` there when given), or
        TpuctlError(INPUT) when the cluster has no remote host."""
    def location(self, st: ClusterState) -> str:
        """Where the cluster runs, in words ("v3-8 in us-central1-b", "this machine")."""
    def summary(self, st: ClusterState) -> dict[str, object]:
        """The provider's own fields for `status` (project, type, zone, ...), in display order."""
    def describe(self, st: ClusterState) -> dict[str, dict[str, object]]:
        """Live state of each resource of the cluster, as the provider sees it now."""
    def teardown_list(self, st: ClusterState) -> list[str]:
        """What `down` will delete, in words, for its confirmation."""
