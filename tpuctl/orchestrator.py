"""Cloud-agnostic flows: plan, up, status, ls, down. No google or rich imports: a Provider and a Reporter do I/O.

`up` saves the cluster's state before each resource is created, so an interrupted `up` is finished by another
`up` (resources are adopted by name and label) or undone by `down`. A failed `up` removes what it created.
"""
from __future__ import annotations

import threading
import time

from . import state
from .catalog import VM_PRICES, region_of, tpu_type
from .errors import TpuctlError
from .models import ClusterSpec, ClusterState


class _Background:
    """A daemon thread with a result: Ctrl-C in the main thread is never stuck behind a worker's long wait."""

    def __init__(self, fn, *args):
        self._result = self._error = None
        self._t = threading.Thread(target=self._run, args=(fn, *args), daemon=True)
        self._t.start()

    def _run(self, fn, *args):
        try:
            self._result = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            self._error = e

    def result(self):
        while self._t.is_alive():
            self._t.join(0.2)
        if self._error is not None:
            raise self._error
        return self._result


def price(spec: ClusterSpec) -> tuple[float | None, str]:
    if spec.provider == "local":
        return 0.0, "free"
    t = tpu_type(spec.tpu_type)
    p = t.spot_price_hour if spec.spot else t.price_hour
    vm = VM_PRICES.get(spec.vm_type) if spec.arch == "node" else 0.0
    if p is None:
        return None, "spot price not in the catalog"
    total = p + (vm or 0.0)
    return total, f"${total:.2f}/hour" + (" (spot)" if spec.spot else "")


def plan(spec: ClusterSpec) -> list[tuple[str, str, str]]:
    """(kind, name, where) rows for what `up` will create or adopt."""
    if spec.provider == "local":
        return [("store", spec.bucket, "this machine"), ("agent", f"agent for {spec.name}", "this machine")]
    where = " or ".join(spec.zones)
    t = tpu_type(spec.tpu_type)
    rows = [("tpu", spec.tpu_name, f"{spec.tpu_type} ({t.chips} chips, {t.hosts} host{'s' * (t.hosts > 1)}, "
             f"{'TPU VM' if spec.arch == 'vm' else 'TPU Node'}{', spot' if spec.spot else ''}) in {where}")]
    if spec.arch == "node":
        rows.append(("vm", spec.vm_name, f"{spec.vm_type} beside the TPU Node"))
    regions = sorted({region_of(z) for z in spec.zones})
    rows.append(("bucket", f"gs://{spec.bucket}", f"in {regions[0] if len(regions) == 1 else 'the region the TPU lands in'}"))
    who = spec.service_account or ("the Compute Engine default service account" if spec.arch == "vm"
                                   else "the TPU service agent and the VM's account")
    rows.append(("grant", "storage.objectAdmin + storage.legacyBucketReader", f"on the bucket only, to {who}"))
    return rows


class _Up:
    def __init__(self, spec: ClusterSpec, provider, reporter, st: ClusterState):
        self.spec, self.p, self.r, self.st = spec, provider, reporter, st
        self.lock = threading.Lock()
        self.undo: list[tuple[str, callable]] = []

    def save(self, **changes):
        with self.lock:
            for k, v in changes.items():
                setattr(self.st, k, v)
            state.save(self.st)

    def progress(self, kind: str, name: str):
        return lambda s: self.r.resource(kind, name, s)

    # -- bucket and grants -------------------------------------------------------------------------------
    def bucket(self, region: str):
        spec = self.spec
        created = self.p.ensure_bucket(spec, spec.bucket, region, self.progress("bucket", spec.bucket))
        if created:
            self.save(bucket_created=True)
            self.undo.append(("bucket", lambda: self.p.delete_bucket(spec.bucket, spec.name, lambda s: None)))

    def grant(self, accounts: list[str]):
        added = self.p.grant(self.spec.bucket, accounts)
        with self.lock:
            self.st.service_accounts = sorted(set(self.st.service_accounts) | set(accounts))
            self.st.grants = self.st.grants + added
        self.save()
        if added:
            self.undo.append(("grants", lambda: self.p.revoke(self.spec.bucket, added)))
            for a in accounts:
                self.r.resource("grant", a, "granted")

    # -- placement with zone failover -----------------------------------------------------------------------
    def _one_zone(self, zone: str) -> dict:
        spec, p = self.spec, self.p
        runtime = p.runtime_for(spec, zone)
        self.save(zone=zone, runtime=runtime)
        from .startup import render
        store = self.st.store_uri
        if spec.arch == "vm":
            script = render(store, spec.name, "tpu-vm", spec.tpu_type, "local")
            created, facts = p.ensure_tpu(spec, zone, runtime, script, self.progress("tpu", spec.tpu_name))
            if created:
                self.undo.append(("tpu", self._deleter("tpu", zone)))
            return facts
        # Legacy node: TPU and companion VM at once; if either fails here, the other is removed before moving on.
        script = render(store, spec.name, "node-vm", spec.tpu_type, "", runtime)
        vm = _Background(p.ensure_vm, spec, zone, script, self.progress("vm", spec.vm_name))
        tpu_error = vm_error = None
        try:
            created, facts = p.ensure_tpu(spec, zone, runtime, "", self.progress("tpu", spec.tpu_name))
            if created:
                self.undo.append(("tpu", self._deleter("tpu", zone)))
        except TpuctlError as e:
            tpu_error = e
        try:
            if vm.result():
                self.undo.append(("vm", self._deleter("vm", zone)))
        except TpuctlError as e:
            vm_error = e
        if tpu_error or vm_error:
            self._undo_kinds({"tpu", "vm"})
            raise tpu_error or vm_error
        return facts

    def _deleter(self, kind: str, zone: str):
        st = ClusterState(**{**self.st.to_json(), "zone": zone, "grants": []})
        fn = self.p.delete_tpu if kind == "tpu" else self.p.delete_vm
        name = st.tpu_name if kind == "tpu" else st.vm_name
        return lambda: fn(st, self.progress(kind, name))

    def _undo_kinds(self, kinds: set):
        keep = []
        for kind, fn in reversed(self.undo):
            if kind in kinds:
                fn()
            else:
                keep.append((kind, fn))
        self.undo = list(reversed(keep))

    def place(self, zones: list[str]) -> dict:
        skip_regions = set()
        last = None
        for i, zone in enumerate(zones):
            if region_of(zone) in skip_regions:
                continue
            try:
                return self._one_zone(zone)
            except TpuctlError as e:
                if e.scope not in ("zone", "region"):
                    raise
                last = e
                if e.scope == "region":
                    skip_regions.add(region_of(zone))
                rest = [z for z in zones[i + 1:] if region_of(z) not in skip_regions]
                self.r.warn(f"{zone}: {e.message}" + (f"; trying {rest[0]}" if rest else ""))
        tried = ", ".join(zones)
        raise TpuctlError(last.kind, f"could not place {self.spec.tpu_type} in any zone tried ({tried}): "
                          f"{last.message}", last.hint or "add more --zone values or try later", "global")

    def rollback(self):
        failed = []
        for kind, fn in reversed(self.undo):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - keep undoing the rest; report what is left
                failed.append(f"{kind}: {e}")
        self.undo = []
        return failed


def _ordered_zones(spec: ClusterSpec, st: ClusterState) -> list[str]:
    zones = list(spec.zones)
    if st.zone in zones:  # a previous `up` got this far there: adopt it rather than create elsewhere
        zones.remove(st.zone)
        zones.insert(0, st.zone)
    return zones


def _check_compatible(spec: ClusterSpec, st: ClusterState):
    for field, want in (("provider", spec.provider), ("tpu_type", spec.tpu_type), ("arch", spec.arch),
                        ("project", spec.project), ("bucket", spec.bucket)):
        have = getattr(st, field)
        if have and want and have != want:
            raise TpuctlError("input", f"cluster {spec.name} already exists with {field} {have}, not {want}",
                              f"use another -c NAME, or `tpuctl down -c {spec.name}` first")


def _up_local(spec: ClusterSpec, provider, reporter, prior: ClusterState | None) -> ClusterState:
    st = prior or ClusterState(name=spec.name, provider="local", created_at=time.time())
    st.bucket = spec.bucket
    provider.ensure_bucket(spec, st.bucket, "", lambda s: reporter.resource("store", st.bucket, s))
    provider.ensure_host(st, lambda s: reporter.resource("agent", spec.name, s))
    provider.write_cluster_record(st.bucket, cluster_record(st, {}))
    st.phase = "ready"
    state.save(st)
    return st


def up(spec: ClusterSpec, provider, reporter) -> ClusterState:
    prior = state.load(spec.name)
    if prior:
        _check_compatible(spec, prior)
    if spec.provider == "local":
        return _up_local(spec, provider, reporter, prior)
    st = prior or ClusterState(name=spec.name, provider=spec.provider, created_at=time.time())
    for field in ("project", "arch", "tpu_type", "zones", "spot", "bucket", "vm_type", "tpu_name"):
        setattr(st, field, getattr(spec, field))
    st.vm_name = spec.vm_name if spec.arch == "node" else ""
    if prior and prior.phase == "ready" and prior.zone:
        reporter.info(f"cluster {spec.name} exists; checking its resources")
    run = _Up(spec, provider, reporter, st)
    run.save(phase="creating" if not (prior and prior.phase == "ready") else prior.phase)
    zones = _ordered_zones(spec, st)
    single_region = len({region_of(z) for z in zones}) == 1
    try:
        if single_region:
            # The bucket takes about a second; doing it first means a wrong --bucket region fails before any TPU.
            run.bucket(region_of(zones[0]))
            accounts = _Background(provider.workload_accounts, spec)
            facts = run.place(zones)
            run.grant(accounts.result())
        else:
            reporter.info("zones span regions: the bucket follows once the TPU has a zone")
            facts = run.place(zones)
            run.bucket(region_of(run.st.zone))
            run.grant(provider.workload_accounts(spec))
        if spec.arch == "node" and facts.get("service_account"):
            run.grant([facts["service_account"]])
        provider.write_cluster_record(spec.bucket, cluster_record(run.st, facts))
        run.save(phase="ready", tpu_ip=facts.get("ip", ""))
        return run.st
    except KeyboardInterrupt:
        raise TpuctlError("interrupted", f"up interrupted; cluster {spec.name} may be half made",
                          f"run the same `tpuctl up` again to finish it, or `tpuctl down -c {spec.name}` to remove it")
    except TpuctlError as e:
        if run.undo:
            reporter.warn(f"up failed: {e.message}; removing what this run created")
        left = run.rollback()
        if left:
            reporter.warn("could not remove: " + "; ".join(left) + f" (run `tpuctl down -c {spec.name}`)")
        elif not prior:
            state.remove(spec.name)
        raise


def cluster_record(st: ClusterState, facts: dict) -> dict:
    from . import __version__
    if st.provider == "local":
        addr = ""
    elif st.arch == "vm":
        addr = "local"   # the job runs on the TPU host itself
    else:
        addr = f"grpc://{facts['ip']}:8470" if facts.get("ip") else ""
    return {"cluster": st.name, "tpu_type": st.tpu_type, "arch": st.arch, "zone": st.zone, "runtime": st.runtime,
            "tpu_address": addr, "store": st.store_uri, "tpuctl_version": __version__}


def load(name: str) -> ClusterState:
    st = state.load(name)
    if st is None:
        raise TpuctlError("not_found", f"no cluster named {name!r}",
                          "`tpuctl ls` lists clusters; `tpuctl up -c NAME ...` makes one")
    return st


def status(st: ClusterState, provider) -> dict:
    live = provider.describe(st)
    spec = ClusterSpec(name=st.name, provider=st.provider, tpu_type=st.tpu_type, arch=st.arch, spot=st.spot,
                       vm_type=st.vm_type)
    return {"cluster": st.name, "provider": st.provider, "project": st.project, "phase": st.phase,
            "type": st.tpu_type, "arch": st.arch, "zone": st.zone, "runtime": st.runtime, "spot": st.spot,
            "bucket": st.bucket, "store": st.store_uri, "price": price(spec)[1] if st.tpu_type or st.provider == "local" else "",
            "grants": [f"{g.role} -> {g.member}" for g in st.grants], "resources": live}


def ls(list_labelled, extra_project: str = "") -> list[dict]:
    """Clusters in local state, plus every tpuctl-labelled TPU the cloud knows of; those without state are orphans.

    list_labelled(project) lists one project's labelled TPUs; it is asked for each project a cluster uses.
    """
    rows = []
    local = state.all_clusters()
    known = {(s.name, s.tpu_name, s.zone) for s in local}
    for s in local:
        rows.append({"cluster": s.name, "provider": s.provider, "type": s.tpu_type, "zone": s.zone,
                     "phase": s.phase, "bucket": s.bucket, "orphan": False})
    for project in sorted(({s.project for s in local if s.provider == "gcp"} | {extra_project}) - {""}):
        for n in list_labelled(project):
            if (n["cluster"], n["name"], n["zone"]) not in known:
                rows.append({"cluster": n["cluster"], "provider": "gcp", "type": n["type"], "zone": n["zone"],
                             "phase": n["state"], "bucket": "", "orphan": True})
    return rows


def down(st: ClusterState, provider, reporter, delete_bucket: bool) -> None:
    progress = lambda kind, name: (lambda s: reporter.resource(kind, name, s))  # noqa: E731
    errors = []
    host = ("agent", st.name) if st.provider == "local" else ("tpu", st.tpu_name)
    work = [_Background(provider.delete_tpu, st, progress(*host))]
    if st.vm_name:
        work.append(_Background(provider.delete_vm, st, progress("vm", st.vm_name)))
    for w in work:
        try:
            w.result()
        except TpuctlError as e:
            errors.append(e)
    if st.bucket and st.grants:
        try:
            provider.revoke(st.bucket, st.grants)
            for m in sorted({g.member for g in st.grants}):
                reporter.resource("grant", m, "revoked")
            st.grants = []
            state.save(st)
        except TpuctlError as e:
            errors.append(e)
    if delete_bucket and st.bucket:
        try:
            provider.delete_bucket(st.bucket, st.name, progress("bucket", st.bucket))
            reporter.resource("bucket", st.bucket, "deleted")
        except TpuctlError as e:
            errors.append(e)
    elif st.bucket:
        what = "store" if st.provider == "local" else "bucket"
        reporter.info(f"kept {what} {st.store_uri} (add --delete-bucket to remove it and its contents)")
    if errors:
        state.save(st)
        first = errors[0]
        raise TpuctlError(first.kind, f"down incomplete: {first.message}", first.hint or
                          f"run `tpuctl down -c {st.name}` again")
    state.remove(st.name)
