"""`up --provider gke` -> `down` through the real CLI against wire fakes: the GKE API (fakes/gke_server.py), Compute
with resource policies, and the GCS emulator; the JobSet installer of the JobSet half is stood in for by fake
and the Kubernetes API fake (fakes/k8s_server.py) behind each cluster's endpoint, where the real jobset_install.py
installs JobSet."""
from __future__ import annotations

import json

import pytest

from fakes.gke_server import FakeGke, FakePolicies
from fakes.k8s_server import write_kubeconfig
from tpuctl.core import state
from tpuctl.core.models import LABEL

PROJ = "test-proj"
SA = "424242-compute@developer.gserviceaccount.com"   # FakeCompute's project default service account


@pytest.fixture(scope="session")
def _gke_servers():
    g = FakeGke()
    pol = FakePolicies(g)
    urls = g.start(), pol.start()
    yield g, pol, urls
    g.stop()
    pol.stop()


class Gke:
    def __init__(self, fake, policies, cloud, installed):
        self.fake, self.policies, self.cloud, self.installed = fake, policies, cloud, installed

    def leaks(self):
        """What tpuctl made and `down` must remove: labelled clusters and node pools, workload policies, grants."""
        found = [f"cluster {c['name']}" for c in self.fake.clusters.values()
                 if LABEL in (c.get("resourceLabels") or {})]
        found += [f"pool {cl}/{p['name']}" for cl, p in self.fake.pools()
                  if LABEL in ((p.get("config") or {}).get("resourceLabels") or {})]
        found += [f"policy {k[2]}" for k in self.policies.policies]
        return found + self.cloud.leaks()

    def pool(self, name):
        return next(p for _, p in self.fake.pools() if p["name"] == name)


@pytest.fixture(params=[False, True], ids=["ops-queued", "one-op-per-cluster"])
def gke(request, cloud, _gke_servers, monkeypatch):
    g, pol, (gurl, purl) = _gke_servers
    g.reset()
    g.one_op_per_cluster = request.param
    pol.policies.clear()
    pol.ops.clear()
    pol.faults.clear()
    pol.calls.clear()
    monkeypatch.setenv("CONTAINER_EMULATOR_HOST", gurl)
    monkeypatch.setenv("COMPUTE_EMULATOR_HOST", purl)
    # The clusters' Kubernetes API: the JobSet half's fake (fakes/k8s_server.py), reached through the real kube.py and
    # jobset_install.py; each connection is recorded as {"endpoint", "ca", "token"}.
    from tpuctl.providers.gke import kube
    from fakes.k8s_server import FakeKube
    monkeypatch.setattr(kube, "_CLIENTS", {})   # kube.py keeps one client per endpoint and process: none of another's
    api_server = FakeKube()
    request.addfinalizer(api_server.stop)
    g.kube_endpoint = api_server.url
    installed = []
    connect = kube.connect
    monkeypatch.setattr(kube, "connect", lambda endpoint, ca_b64, token: installed.append(
        {"endpoint": endpoint, "ca": ca_b64, "token": token}) or connect(endpoint, ca_b64, token))
    g_ = Gke(g, pol, cloud, installed)
    g_.kube = api_server
    return g_


def _up(cli, name, *flags):
    return cli("up", "--provider", "gke", "-c", name, "--project", PROJ, "--yes", *flags)


def test_one_slice_up_then_down_leaves_nothing(gke, cli):
    code, out, err = _up(cli, "one", "--type", "v6e-16", "--zone", "us-east5-b")
    assert code == 0, err
    c = gke.fake.clusters[(PROJ, "us-east5-b", "tpuctl-one")]
    assert c["resourceLabels"] == {LABEL: "one"} and c["status"] == "RUNNING"
    pool = gke.pool("tpuctl-one-np-0")
    assert pool["initialNodeCount"] in (4, "4") and pool["config"]["machineType"] == "ct6e-standard-4t"
    assert pool["placementPolicy"]["tpuTopology"] == "4x4"
    assert pool["config"]["serviceAccount"] == SA and pool["locations"] == ["us-east5-b"]
    assert "https://www.googleapis.com/auth/cloud-platform" in pool["config"]["oauthScopes"]
    assert gke.installed[0] == {"endpoint": gke.fake.kube_endpoint, "ca": c["masterAuth"]["clusterCaCertificate"],
                                "token": ""}
    st = state.load("one")
    rec = st.record["gke"]
    assert rec["cluster"] == "tpuctl-one" and rec["adopted"] is False and rec["node_pools"] == ["tpuctl-one-np-0"]
    assert rec["service_account"] == SA and rec["location"] == "us-east5-b" and rec["workload_policy"] == ""
    record = json.loads(_storage().bucket("test-proj-tpuctl-one").blob("tpuctl/cluster.json").download_as_bytes())
    assert record["gke"]["endpoint"] == gke.fake.kube_endpoint and record["hosts"] == 4
    assert {(g.member, g.role) for g in st.grants} == {(f"serviceAccount:{SA}", "roles/storage.objectAdmin"),
                                                       (f"serviceAccount:{SA}", "roles/storage.legacyBucketReader")}
    code, out, err = cli("ls", "--json")
    assert code == 0 and [r for r in json.loads(out) if r["orphan"]] == []
    code, out, err = cli("down", "-c", "one", "--yes")
    assert code == 0, err
    assert gke.leaks() == []
    code, out, err = cli("ls", "--json", "--project", PROJ)
    assert [r for r in json.loads(out) if r["orphan"]] == []


def test_two_slices_make_two_node_pools_and_up_again_makes_nothing(gke, cli):
    code, out, err = _up(cli, "two", "--type", "v5litepod-16", "--zone", "us-west4-a", "--slices", "2")
    assert code == 0, err
    # made at once (issue 49 item 8): in whichever order GKE received them
    assert sorted(p["name"] for _, p in gke.fake.pools()) == ["system", "tpuctl-two-np-0", "tpuctl-two-np-1"]
    made = len(gke.fake.mutating_calls())
    code, out, err = _up(cli, "two", "--type", "v5litepod-16", "--zone", "us-west4-a", "--slices", "2")
    assert code == 0, err
    assert len(gke.fake.mutating_calls()) == made   # adopted, not made twice
    code, out, err = cli("down", "-c", "two", "--yes")
    assert code == 0, err
    assert gke.leaks() == []


def test_up_again_with_no_flags_finishes_what_a_cut_off_up_left_being_made(gke, cli):
    code, out, err = _up(cli, "cut", "--type", "v6e-16", "--zone", "us-east5-b", "--slices", "2")
    assert code == 0, err
    c = gke.fake.clusters[(PROJ, "us-east5-b", "tpuctl-cut")]
    gke.fake.delay = 0.3   # the cluster and a node pool are still being made when the next `up` finds them
    c["status"] = "PROVISIONING"
    gke.fake._op(PROJ, "us-east5-b", "tpuctl-cut", "UPDATE_CLUSTER", "tpuctl-cut",
                 lambda error: c.update(status="RUNNING"), "update")
    pool = gke.pool("tpuctl-cut-np-1")
    pool["status"] = "PROVISIONING"
    gke.fake._op(PROJ, "us-east5-b", "tpuctl-cut", "CREATE_NODE_POOL", "np-1",
                 lambda error: pool.update(status="RUNNING"), "create_pool")
    gke.fake.calls.clear()
    code, out, err = cli("up", "-c", "cut", "--yes")   # the provider, type, zone and slices as they were
    assert code == 0, err
    assert c["status"] == "RUNNING" and pool["status"] == "RUNNING"
    assert len(gke.fake.mutating_calls()) == 0
    polls = [path for action, path, _ in gke.fake.calls if action == "get_pool" and path.endswith("np-1")]
    assert len(polls) >= 2   # read until RUNNING, not taken as it was
    pool["status"] = "ERROR"
    code, out, err = cli("up", "-c", "cut", "--yes")
    assert code == 1 and "node pool tpuctl-cut-np-1 is ERROR" in " ".join(err.split())
    code, out, err = cli("down", "-c", "cut", "--yes")
    assert code == 0, err
    assert gke.leaks() == []


def test_up_again_in_another_gke_cluster_is_refused(gke, cli):
    code, out, err = _up(cli, "mv", "--type", "v6e-16", "--zone", "us-east5-b")
    assert code == 0, err
    _their_cluster(gke)
    code, out, err = _up(cli, "mv", "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team")
    assert code == 2 and "was made in its own GKE cluster, not --gke-cluster team" in " ".join(err.split())
    assert [p["name"] for p in gke.fake.clusters[(PROJ, "us-east5", "team")]["nodePools"]] == ["default-pool"]
    assert cli("down", "-c", "mv", "--yes")[0] == 0
    assert gke.leaks() == []


def test_tpu7x_16_makes_its_workload_policy_first_and_removes_it_last(gke, cli):
    code, out, err = _up(cli, "iw", "--type", "tpu7x-16", "--zone", "us-central1-c")
    assert code == 0, err
    c = gke.fake.clusters[(PROJ, "us-central1-c", "tpuctl-iw")]
    assert c["currentMasterVersion"] == "1.34.1-gke.1829001"   # RAPID's default (1.33) is too old for TPU7x
    policy = gke.policies.policies[(PROJ, "us-central1", "tpuctl-iw-wp")]
    assert policy["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}
    pool = gke.pool("tpuctl-iw-np-0")
    assert pool["placementPolicy"] == {"policyName": "tpuctl-iw-wp"}
    assert pool["config"]["machineType"] == "tpu7x-standard-4t" and pool["initialNodeCount"] in (2, "2")
    assert state.load("iw").record["gke"]["workload_policy"] == "tpuctl-iw-wp"
    code, out, err = cli("down", "-c", "iw", "--yes")
    assert code == 0, err
    assert gke.leaks() == []


def _their_cluster(gke, name="team", version="1.34.1-gke.1829001", autopilot=False):
    """A Standard cluster someone else made (no tpuctl label), as GKE reports it."""
    gke.fake.clusters[(PROJ, "us-east5", name)] = {
        "name": name, "location": "us-east5", "status": "RUNNING", "currentMasterVersion": version,
        "endpoint": gke.fake.kube_endpoint, "masterAuth": {"clusterCaCertificate": "Q0E="}, "autopilot": {"enabled": autopilot},
        "nodePools": [{"name": "default-pool", "config": {"machineType": "e2-standard-8"}, "status": "RUNNING"}]}


def test_watch_says_gke_and_jobset_recover(gke, cli):
    code, out, err = _up(cli, "w", "--type", "v6e-4", "--zone", "us-east5-b")
    assert code == 0, err
    code, out, err = cli("watch", "-c", "w")
    assert code == 0, err
    assert "GKE recreates a preempted or repaired TPU node pool and JobSet restarts the run" in " ".join(err.split())
    assert cli("down", "-c", "w", "--yes")[0] == 0


def test_the_kubernetes_token_is_the_users_refreshed_google_token(env, monkeypatch):
    from tpuctl.providers.google import clients

    class Creds:
        valid, token, refreshed = False, None, 0

        def refresh(self, request):
            self.refreshed += 1
            self.valid, self.token = True, "ya29.fresh"
    creds = Creds()

    def credentials():
        return creds
    credentials.cache_clear = lambda: None   # as the lru_cache it stands in for (clients.reset)
    monkeypatch.setattr(clients, "credentials", credentials)
    assert clients.access_token() == "ya29.fresh" and clients.access_token() == "ya29.fresh"
    assert creds.refreshed == 1   # refreshed only when no longer valid
    monkeypatch.setenv("CONTAINER_EMULATOR_HOST", "http://127.0.0.1:1")
    assert clients.access_token() == ""   # the emulators take anonymous requests


def test_a_reservation_is_consumed_by_name(gke, cli):
    code, out, err = _up(cli, "rs", "--type", "v5p-16", "--zone", "us-east5-a", "--reservation", "my-v5p")
    assert code == 0, err
    affinity = gke.pool("tpuctl-rs-np-0")["config"]["reservationAffinity"]
    assert affinity["key"] == "compute.googleapis.com/reservation-name" and affinity["values"] == ["my-v5p"]
    assert affinity["consumeReservationType"] in ("SPECIFIC_RESERVATION", 3)
    code, out, err = cli("down", "-c", "rs", "--yes")
    assert code == 0, err
    assert gke.leaks() == []


def test_adopted_cluster_keeps_living_after_down(gke, cli):
    _their_cluster(gke)
    code, out, err = _up(cli, "ad", "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team", "--spot")
    assert code == 0, err
    pool = gke.pool("tpuctl-ad-np-0")
    assert pool["config"]["spot"] is True and pool["locations"] == ["us-east5-b"]
    rec = state.load("ad").record["gke"]
    assert rec["adopted"] is True and rec["endpoint"] == gke.fake.kube_endpoint and rec["cluster"] == "team"
    code, out, err = cli("down", "-c", "ad", "--yes")
    assert code == 0, err
    assert gke.leaks() == []
    assert [p["name"] for p in gke.fake.clusters[(PROJ, "us-east5", "team")]["nodePools"]] == ["default-pool"]


@pytest.mark.parametrize("kind, flags, code_, says", [
    ("autopilot", ("--type", "v6e-16"), 2, "is an Autopilot cluster"),
    ("old", ("--type", "tpu7x-16", "--zone", "us-central1-c"), 2, "TPU7x needs >= 1.34.0-gke.2201000"),
    ("missing", ("--type", "v6e-16"), 3, "no GKE cluster team"),
])
def test_an_unusable_adopted_cluster_is_refused_and_nothing_is_left(gke, cli, kind, flags, code_, says):
    if kind != "missing":
        _their_cluster(gke, autopilot=kind == "autopilot", version="1.33.5-gke.1200000")
    zone = () if "--zone" in flags else ("--zone", "us-east5-b")
    code, out, err = _up(cli, "ad", *flags, *zone, "--gke-cluster", "team")
    assert code == code_, err
    assert says in " ".join(err.split()) and "Traceback" not in err
    assert gke.leaks() == []
    assert state.load("ad") is None


def test_a_failure_mid_up_leaves_nothing(gke, cli):
    """The second slice's node pool runs out of capacity (its operation fails: the message GKE passes on from
    Compute names ZONE_RESOURCE_POOL_EXHAUSTED): the first pool, the cluster, the policy, bucket and grants go."""
    gke.fake.op_faults["create_pool"] = [None, (8, "Google Compute Engine: ZONE_RESOURCE_POOL_EXHAUSTED: the zone "
                                                   "does not have enough resources")]
    code, out, err = _up(cli, "half", "--type", "tpu7x-16", "--zone", "us-central1-c", "--slices", "2")
    assert code == 4, err   # CAPACITY
    assert "out of capacity" in " ".join(err.split())
    assert gke.leaks() == []
    assert _storage().lookup_bucket("test-proj-tpuctl-half") is None
    assert state.load("half") is None


def test_a_failed_node_pool_in_an_adopted_cluster_is_removed(gke, cli):
    # issue 49 item 8: the pool whose create failed (left in ERROR, as GKE leaves one) was left behind in the
    # adopted cluster, billing; now undone as the cluster path undoes a failed cluster
    _their_cluster(gke)
    gke.fake.op_faults["create_pool"] = [(8, "Google Compute Engine: ZONE_RESOURCE_POOL_EXHAUSTED: the zone does "
                                             "not have enough resources")]
    code, out, err = _up(cli, "ad", "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team")
    assert code == 4, err
    assert gke.leaks() == []
    assert [p["name"] for p in gke.fake.clusters[(PROJ, "us-east5", "team")]["nodePools"]] == ["default-pool"]


def test_network_and_subnetwork_are_the_clusters_and_the_system_pool_is_managed(gke, cli):
    # issue 49 items 6 and 8: a project without a `default` VPC needs them; the system pool's auto-upgrade and
    # auto-repair written out, as a release channel requires
    code, out, err = _up(cli, "net", "--type", "v6e-4", "--zone", "us-east5-b", "--network", "vpc1",
                         "--subnetwork", "sub1")
    assert code == 0, err
    c = gke.fake.clusters[(PROJ, "us-east5-b", "tpuctl-net")]
    assert c["network"] == "vpc1" and c["subnetwork"] == "sub1"
    system = next(p for p in c["nodePools"] if p["name"] == "system")
    assert system["management"] == {"autoUpgrade": True, "autoRepair": True}
    code, out, err = cli("up", "-c", "net", "--yes")   # again, with no flags: the same network, nothing new
    assert code == 0, err
    assert state.load("net").spec.network == "vpc1" and state.load("net").spec.subnetwork == "sub1"
    code, out, err = cli("down", "-c", "net", "--yes")
    assert code == 0, err
    assert gke.leaks() == []


def test_up_kueue_installs_kueue_with_a_queue_for_the_node_pools(gke, cli):
    # issue 49 item 10: the pinned Kueue release, then a ResourceFlavor for the pools' shape, a ClusterQueue of
    # their chips, a LocalQueue and xpk's PriorityClasses; down (the cluster tpuctl made) leaves nothing
    from tpuctl.providers.gke import kueue_install
    code, out, err = _up(cli, "kq", "--type", "v6e-16", "--zone", "us-east5-b", "--slices", "2", "--kueue")
    assert code == 0, err
    objs = gke.kube.objects
    for obj in kueue_install.release_objects():
        assert kueue_install._path(obj) in objs, obj["kind"]
    flavor = objs["/apis/kueue.x-k8s.io/v1beta1/resourceflavors/tpuctl-tpu-v6e-slice-4x4"]
    assert flavor["spec"]["nodeLabels"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                                            "cloud.google.com/gke-tpu-topology": "4x4", "tpuctl-cluster": "kq"}
    cq = objs["/apis/kueue.x-k8s.io/v1beta1/clusterqueues/cluster-queue"]
    group = cq["spec"]["resourceGroups"][0]
    assert group["coveredResources"] == ["google.com/tpu", "cpu", "memory"]   # issue 49 item 10: cpu/memory too
    assert group["flavors"][0]["resources"][0] == {"name": "google.com/tpu", "nominalQuota": 32}
    assert flavor["spec"]["tolerations"][0] == {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
    assert "/apis/kueue.x-k8s.io/v1beta1/namespaces/default/localqueues/multislice-queue" in objs
    assert {p.rsplit("/", 1)[1] for p in objs if "/priorityclasses/" in p} == {"very-low", "low", "medium", "high",
                                                                               "very-high"}
    assert state.load("kq").spec.kueue is True
    code, out, err = cli("down", "-c", "kq", "--yes")
    assert code == 0, err
    assert gke.leaks() == []


def test_a_cluster_that_fails_to_come_up_is_removed(gke, cli):
    """Its operation ends in an error and GKE leaves the cluster in ERROR (a failed create is deleted by hand:
    kubernetes-engine/docs/troubleshooting): up removes it, and the policy and bucket it made before it."""
    gke.fake.op_faults["create_cluster"] = [(13, "Internal error while creating the cluster's control plane.")]
    code, out, err = _up(cli, "bad", "--type", "tpu7x-16", "--zone", "us-central1-c")
    assert code == 1, err
    assert "create GKE cluster tpuctl-bad failed" in " ".join(err.split())
    assert gke.leaks() == [] and gke.fake.clusters == {}
    assert _storage().lookup_bucket("test-proj-tpuctl-bad") is None


def _storage():
    from tpuctl.providers.google import clients
    return clients.storage(PROJ)


def test_an_older_jobset_refused_by_the_installer_undoes_the_up(gke, cli, monkeypatch):
    from tpuctl.core.errors import ErrorKind, TpuctlError

    def refuse(api):
        raise TpuctlError(ErrorKind.INPUT, "the cluster runs JobSet v0.5.2; tpuctl's runs need v0.10.1 or later",
                          "upgrade it")
    from tpuctl.providers.gke import jobset_install
    monkeypatch.setattr(jobset_install, "ensure_jobset", refuse)
    code, out, err = _up(cli, "old", "--type", "v6e-16", "--zone", "us-east5-b")
    assert code == 2, err
    assert "JobSet v0.5.2" in " ".join(err.split())
    assert gke.leaks() == []


def test_ls_in_a_project_without_the_kubernetes_engine_api_says_nothing_of_gke(gke, cli):
    # 403 as Google answers a disabled API (core/errors.py disabled_api: googleapis/python-resource-manager#129)
    gke.fake.faults["list_clusters"].append((403, "PERMISSION_DENIED", "Kubernetes Engine API has not been used in "
                                             "project 424242 before or it is disabled. Enable it by visiting https://"
                                             "console.developers.google.com/apis/api/container.googleapis.com/"
                                             "overview?project=424242 then retry."))
    code, out, err = cli("ls", "--json", "--project", PROJ)
    assert code == 0, err
    assert "gke" not in err and json.loads(out) == []


def test_status_shows_the_node_pools_and_down_works_from_the_labels_alone(gke, cli):
    code, out, err = _up(cli, "lb", "--type", "tpu7x-16", "--zone", "us-central1-c", "--slices", "2")
    assert code == 0, err
    code, out, err = cli("status", "-c", "lb", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["resources"]["pool tpuctl-lb-np-1"] == {"state": "RUNNING", "nodes": 2}
    assert info["resources"]["gke"]["state"] == "RUNNING"
    state.remove("lb")   # another machine, or a lost state file: the labels and the bucket's record remain
    code, out, err = cli("ls", "--json", "--project", PROJ)
    orphans = {(r["kind"], r["name"]) for r in json.loads(out) if r["orphan"]}
    assert {("gke", "tpuctl-lb"), ("pool", "tpuctl-lb-np-0"), ("pool", "tpuctl-lb-np-1")} <= orphans
    code, out, err = cli("down", "-c", "lb", "--project", PROJ, "--provider", "gke", "--yes")
    assert code == 0, err
    assert gke.leaks() == []


@pytest.mark.parametrize("lacks, flags, role", [
    ("container.clusters.create", ("--type", "v6e-16", "--zone", "us-east5-b"), "roles/container.admin"),
    ("compute.resourcePolicies.create", ("--type", "tpu7x-16", "--zone", "us-central1-c"), "roles/compute.admin"),
])
def test_a_missing_project_permission_stops_up_before_anything_is_made(gke, cli, lacks, flags, role):
    from fakes.resource_manager import OTHER_PERMISSIONS, TPU_PERMISSIONS
    gke.cloud.iam.held = set(TPU_PERMISSIONS + OTHER_PERMISSIONS) - {lacks}
    code, out, err = _up(cli, "perm", *flags)
    assert code == 5, err   # PERMISSION
    assert f"you lack {lacks}" in " ".join(err.split()) and role in err
    assert gke.fake.mutating_calls() == [] and gke.leaks() == []


def test_an_adopted_cluster_needs_no_right_to_make_or_delete_clusters(gke, cli):
    from fakes.resource_manager import OTHER_PERMISSIONS, TPU_PERMISSIONS
    gke.cloud.iam.held = set(TPU_PERMISSIONS + OTHER_PERMISSIONS) - {"container.clusters.create",
                                                                     "container.clusters.delete"}
    _their_cluster(gke)
    code, out, err = _up(cli, "adp", "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team")
    assert code == 0, err
    assert cli("down", "-c", "adp", "--yes")[0] == 0


def test_a_kubeconfig_context_given_to_up_is_how_tpuctl_reaches_kubernetes(gke, cli, tmp_path, monkeypatch):
    """`up --kube-context NAME` (issue 37 item 6): the JobSet install goes through that context, not through GKE's
    endpoint and a Google token, and the record keeps it for submit, status and down; a context the kubeconfig lacks
    is refused in one line before anything is made."""
    cfg = tmp_path / "kubeconfig"
    write_kubeconfig(cfg, gke.fake.kube_endpoint)
    monkeypatch.setenv("KUBECONFIG", str(cfg))
    code, out, err = _up(cli, "ctx", "--type", "v6e-16", "--zone", "us-east5-b", "--kube-context", "nosuch")
    assert code == 2 and "--kube-context 'nosuch' is not in your kubeconfig" in err, err
    assert gke.leaks() == [] and gke.fake.mutating_calls() == []
    code, out, err = _up(cli, "ctx", "--type", "v6e-16", "--zone", "us-east5-b", "--kube-context", "mine")
    assert code == 0, err
    assert gke.installed == []   # never through kube.connect: the context reached the API server
    assert state.load("ctx").record["gke"]["context"] == "mine"
    code, out, err = cli("down", "-c", "ctx", "--yes")
    assert code == 0, err
    assert gke.leaks() == []


def test_a_failed_node_pool_on_a_re_up_of_a_cluster_tpuctl_made_is_removed(gke, cli):
    # issue 57 item 6: the cluster exists from an earlier `up`; its pool, gone, is made again and fails: undone
    code, out, err = _up(cli, "re", "--type", "v6e-16", "--zone", "us-east5-b")
    assert code == 0, err
    c = gke.fake.clusters[(PROJ, "us-east5-b", "tpuctl-re")]
    c["nodePools"] = [p for p in c["nodePools"] if p["name"] != "tpuctl-re-np-0"]
    gke.fake.op_faults["create_pool"] = [(8, "Google Compute Engine: ZONE_RESOURCE_POOL_EXHAUSTED: the zone does "
                                             "not have enough resources")]
    code, out, err = cli("up", "-c", "re", "--yes")
    assert code == 4, err
    assert [p["name"] for p in c["nodePools"]] == ["system"]   # the ERROR pool is not left billing
    assert cli("down", "-c", "re", "--yes")[0] == 0
    assert gke.leaks() == []
