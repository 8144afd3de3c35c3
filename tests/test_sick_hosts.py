"""A sick host replaced (issue 60 item 4; tpuctl/control/watch.py `_sick`): a Compute Engine TPU slice (a MIG with a
workload policy) whose host its agent marked sick is deleted and made again by the recovery watcher, as a lost slice
is. The TPU VM case is tests/test_watch.py's test_a_host_marked_sick_is_deleted_and_recreated_by_the_lost_hosts_path."""
import json

from conftest import PROJECT, until
from test_gce_tpu import _recoveries
from test_watch import Running, fast  # noqa: F401 - a fixture
from tpuctl.core import layout

ZONE = "us-central1-c"


def test_a_sick_mig_instance_is_replaced_with_its_slice(cloud, cli, fast):
    code, out, err = cli("up", "--type", "tpu7x-16", "--zone", ZONE, "-c", "w", "--spot", "--recover", "--yes")
    assert code == 0, err
    w = Running()
    until(lambda: any("holding its lease" in m for m in w.said.lines), what="the lease")
    vms = sorted(k[2] for k in cloud.compute.instances if k[2].startswith("tpuctl-w"))
    from google.cloud import storage
    bucket = storage.Client(project=PROJECT).bucket(f"{PROJECT}-tpuctl-w")
    bucket.blob(layout.host_sick(vms[-1])).upload_from_string(json.dumps({"host": vms[-1], "worker": 1,
                                                                          "why": "no-tpu twice"}))
    until(lambda: _recoveries(f"{PROJECT}-tpuctl-w"), what="a recovery")
    [rec] = _recoveries(f"{PROJECT}-tpuctl-w")
    assert "marked sick" in rec["lost"] and vms[-1] in rec["lost"], rec
    calls = [c[0] for c in cloud.compute.mutating_calls()]
    assert calls.count("mig_delete") == 1 and calls.count("mig_insert") == 2, calls   # the slice made again, once
    until(lambda: len([k for k, v in cloud.compute.instances.items() if k[2].startswith("tpuctl-w")
                       and v["status"] == "RUNNING"]) == len(vms), what="the slice back")
    assert not list(bucket.list_blobs(prefix=layout.SICK_PREFIX))
    assert cli("down", "-c", "w", "--yes")[0] == 0
    assert w.wait() == "`tpuctl down`"
