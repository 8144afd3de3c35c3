"""Issue 49 item 4: a pod waiting on its image or on a node is said stuck, with how long and the fix, only once it
has waited TPUCTL_GKE_STUCK_SECONDS (180 s by default): a first pull or a node pool being repaired ends by itself.
The times are the pod's own (status.startTime, the PodScheduled condition's lastTransitionTime)."""
from __future__ import annotations

import time

from tpuctl.providers.gke.jobset_status import stuck_words

NOW = time.mktime((2026, 11, 28, 17, 0, 0, 0, 0, 0)) - time.timezone


def _stamp(minutes_ago):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - minutes_ago * 60))


def _pulling(minutes_ago):
    return {"metadata": {"name": "p0"}, "spec": {"containers": [{"image": "reg/none:1"}]},
            "status": {"phase": "Pending", "startTime": _stamp(minutes_ago), "containerStatuses": [
                {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}}


def _unschedulable(minutes_ago):
    return {"metadata": {"name": "p1"}, "spec": {}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime":
         _stamp(minutes_ago)}]}}


def test_said_stuck_only_past_the_threshold_with_how_long_and_the_fix(env):
    assert stuck_words([_pulling(1)], NOW) == ""   # a minute into a pull: not yet (the default is 3 min)
    said = stuck_words([_pulling(12)], NOW)
    assert said.startswith("pod p0 stuck for 12 min: cannot pull image reg/none:1 (ImagePullBackOff")
    assert "fix: `tpuctl up --image`" in said
    assert stuck_words([_unschedulable(2)], NOW) == ""
    said = stuck_words([_unschedulable(4)], NOW)
    assert said.startswith("pod p1 stuck for 4 min: unschedulable") and "tpuctl status" in said


def test_the_knob_sets_the_threshold(env, monkeypatch):
    monkeypatch.setenv("TPUCTL_GKE_STUCK_SECONDS", "30")
    assert stuck_words([_pulling(1)], NOW).startswith("pod p0 stuck for 1 min")
    monkeypatch.setenv("TPUCTL_GKE_STUCK_SECONDS", "3600")
    assert stuck_words([_pulling(12)], NOW) == ""
