"""`ls` finds every tpuctl-labelled TPU, VM and bucket in the project, and `down` works from the labels alone when
there is no local state (another machine, a lost state file)."""
import json

import pytest
from conftest import PROJECT
from tpuctl.core import state

pytestmark = pytest.mark.usefixtures("no_leak")   # every test ends with nothing of tpuctl left


def _orphans(cli):
    code, out, err = cli("ls", "--json", "--project", PROJECT)
    assert code == 0, err
    return sorted((r["kind"], r["name"], r["remove"]) for r in json.loads(out) if r["orphan"])


@pytest.mark.tpu_nodes
def test_ls_lists_a_lost_node_clusters_tpu_vm_and_bucket_and_down_removes_them_from_labels(cloud, cli):
    assert cli("up", "--type", "v2-8", "--zone", "us-central1-b", "-c", "old", "--arch", "node")[0] == 0
    (state.home() / "clusters" / "old.json").unlink()                # the state file is lost
    remove = f"tpuctl down -c old --project {PROJECT}"
    assert _orphans(cli) == [("bucket", f"{PROJECT}-tpuctl-old", remove + " --delete-bucket"),
                             ("tpu", "tpuctl-old", remove), ("vm", "tpuctl-old-vm", remove)]
    code, out, err = cli("ls", "--project", PROJECT)
    assert code == 0 and "old" in out and "--delete-buc" in out     # the table (the terminal may cut it)
    code, out, err = cli("down", "-c", "old", "--project", PROJECT, "--yes", "--delete-bucket")
    assert code == 0 and "found by its labels" in err, err
    assert not cloud.tpu.nodes[1] and not cloud.compute.instances
    assert _orphans(cli) == [] and state.load("old") is None


def test_down_from_labels_keeps_the_bucket_and_remembers_the_cluster(cloud, cli):
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert")[0] == 0
    (state.home() / "clusters" / "bert.json").unlink()
    code, out, err = cli("down", "-c", "bert", "--project", PROJECT, "--yes")
    assert code == 0, err
    assert not cloud.tpu.nodes[2]
    st = state.load("bert")
    assert st.phase.value == "down" and st.spec.store == f"gs://{PROJECT}-tpuctl-bert"
    assert _orphans(cli) == []                                         # the kept bucket is the cluster's again


def test_down_of_a_cluster_nothing_is_labelled_for(cloud, cli):
    code, out, err = cli("down", "-c", "ghost", "--project", PROJECT, "--yes")
    assert code == 3 and f"labelled in project {PROJECT}" in err
    assert cloud.mutating_calls() == []
