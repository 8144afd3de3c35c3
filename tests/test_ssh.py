"""`tpuctl ssh` hands over to gcloud with zone, project and worker filled in; checked with a stand-in gcloud on
PATH that records its arguments."""
import json
import os

import pytest

from conftest import PROJECT


@pytest.fixture
def gcloud(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "gcloud-args.json"
    script = bin_dir / "gcloud"
    script.write_text(f"#!/usr/bin/env python3\nimport json, sys\njson.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n"
                      "sys.exit(7)\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return lambda: json.loads(record.read_text())


def test_ssh_to_a_tpu_vm_worker_with_a_command(cloud, cli, gcloud):
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert")[0] == 0
    code, out, err = cli("ssh", "-c", "bert", "--", "sudo", "journalctl", "-u", "tpuctl-agent", "--since", "1 hour ago")
    assert code == 7                                     # gcloud's own exit code comes back
    assert gcloud() == ["compute", "tpus", "tpu-vm", "ssh", "tpuctl-bert", "--zone=us-central1-b",
                        f"--project={PROJECT}", "--worker=0",
                        "--command=sudo journalctl -u tpuctl-agent --since '1 hour ago'"]
    code, out, err = cli("ssh", "-c", "bert", "--worker", "1")
    assert code == 2 and "--worker takes 0 to 0" in err


@pytest.mark.tpu_nodes
def test_ssh_beside_a_legacy_node_goes_to_its_vm(cloud, cli, gcloud):
    assert cli("up", "--type", "v2-8", "--zone", "us-central1-b", "-c", "old", "--arch", "node")[0] == 0
    assert cli("ssh", "-c", "old")[0] == 7
    assert gcloud() == ["compute", "ssh", "tpuctl-old-vm", "--zone=us-central1-b", f"--project={PROJECT}"]


def test_ssh_without_gcloud_says_what_to_install(cloud, cli, monkeypatch, tmp_path):
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert")[0] == 0
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, out, err = cli("ssh", "-c", "bert")
    assert code == 2 and "gcloud is not installed" in err and "Google Cloud CLI" in err


def test_ssh_on_the_local_provider_has_no_host(local_up, cli):
    local_up("loc")
    code, out, err = cli("ssh", "-c", "loc")
    assert code == 2 and "no remote host" in err and "agents/loc.log" in err
