"""What the suite relies on to build a costly thing once: pytest.mark.xdist_group under `--dist loadgroup` (pyproject's
addopts), and conftest's built_once for what several files or workers share.

pytest-xdist 3.8 groups a test by adding `@NAME` to its node id in the worker (xdist/remote.py
pytest_collection_modifyitems: `item._nodeid = ...`), and its loadgroup scheduler sends the tests of one suffix to
one worker. pytest 9.2 derives `Node.nodeid` from `self._id` (_pytest/nodes.py), so that assignment changes nothing,
no suffix appears and each group's tests are spread over the workers (each building the group's fixtures again);
pytest 9.1.1 with xdist 3.8.0 groups them (checked here: `test_in_group[0]@g`.. on one worker). pyproject pins
pytest below 9.2; the first test fails if a pair of versions that does not group comes back."""
from __future__ import annotations

import os

import pytest
from conftest import built_once


def _distributed(config) -> bool:
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and bool(config.getoption("loadgroup", False))


@pytest.mark.xdist_group("groups_apply")
@pytest.mark.parametrize("n", [1, 2])
def test_a_group_reaches_xdists_scheduler_as_one_unit(request, tmp_path_factory, n):
    if not _distributed(request.config):
        pytest.skip("runs under xdist's --dist loadgroup (the suite's addopts)")
    assert request.node.nodeid.endswith("@groups_apply"), \
        f"{request.node.nodeid}: xdist_group not applied (pytest and pytest-xdist disagree on node ids)"
    # both tests on one worker: each notes its worker where the run's workers share a directory
    shared = tmp_path_factory.getbasetemp().parent / "groups_apply"
    shared.mkdir(exist_ok=True)
    (shared / str(n)).write_text(os.environ["PYTEST_XDIST_WORKER"])
    workers = {p.read_text() for p in shared.iterdir()}
    assert len(workers) == 1, workers


def _note_build(directory):
    with open(directory.parent / "guard.builds", "a") as f:
        f.write(f"{os.getpid()}\n")
    (directory / "made").write_text("yes")


@pytest.mark.parametrize("n", range(3))
def test_built_once_builds_once_for_every_test_and_worker_of_a_run(tmp_path_factory, n):
    made = built_once(tmp_path_factory, "guard", _note_build)
    assert (made / "made").read_text() == "yes"
    assert len((made.parent / "guard.builds").read_text().splitlines()) == 1


def test_a_build_that_failed_is_built_again(tmp_path_factory):
    def failing(directory):
        (directory / "half").write_text("x")
        raise RuntimeError("build failed")
    with pytest.raises(RuntimeError):
        built_once(tmp_path_factory, "failing", failing)
    again = built_once(tmp_path_factory, "failing", lambda d: (d / "whole").write_text("y"))
    assert sorted(p.name for p in again.iterdir()) == ["whole"]
