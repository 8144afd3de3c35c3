"""Warm restarts (tpuctl/host/compilecache.py): the job's JAX compilation cache on the host's disk, keyed by the job's
code and the JAX stack's versions, shipped to the store by worker 0 for a host made again, bounded, and off with
`submit --no-compile-cache`."""
import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

from jobs import make_job
from tpuctl.core import layout
from tpuctl.core.runs import RunSpec
from tpuctl.core.store import LocalStore
from tpuctl.host import compilecache


def _job(package="p1", **env):
    return RunSpec(id="r", name="j", command="python main.py", package=package, env=dict(env))


def test_the_job_gets_jaxs_cache_variables_in_a_directory_per_code_and_versions(tmp_path, monkeypatch):
    store = LocalStore(str(tmp_path / "store"))
    env = compilecache.environment(tmp_path / "home", store, _job(), None)
    d = env[compilecache.DIR_ENV]
    assert os.path.isdir(d) and os.path.dirname(d) == str(tmp_path / "home" / "compile-cache")
    # every program cached, a small CPU compile too (JAX's defaults: 1 s minimum, filesystem-chosen size floor)
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    assert env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] == "-1"
    assert env["JAX_COMPILATION_CACHE_MAX_SIZE"] == str(compilecache.DEFAULT_BYTES)
    again = compilecache.environment(tmp_path / "home", store, _job(), None)[compilecache.DIR_ENV]
    other_code = compilecache.environment(tmp_path / "home", store, _job("p2"), None)[compilecache.DIR_ENV]
    monkeypatch.setattr(compilecache, "versions", lambda: "jax==9.9")
    other_jax = compilecache.environment(tmp_path / "home", store, _job(), None)[compilecache.DIR_ENV]
    assert again == d and len({d, other_code, other_jax}) == 3


def test_off_by_the_jobs_env_and_a_jobs_own_directory_wins(tmp_path):
    store = LocalStore(str(tmp_path / "store"))
    assert compilecache.environment(tmp_path, store, _job(TPUCTL_COMPILE_CACHE="0"), None) == {}
    assert compilecache.environment(tmp_path, store, _job(JAX_COMPILATION_CACHE_DIR="/mine"), None) == {}
    assert not compilecache.ship(store, tmp_path, {"JAX_COMPILATION_CACHE_DIR": "/mine"}, 0)


def test_worker_0_ships_new_entries_once_and_a_host_made_again_gets_them_back(tmp_path):
    store = LocalStore(str(tmp_path / "store"))
    env = compilecache.environment(tmp_path / "home", store, _job(), None)
    d = env[compilecache.DIR_ENV]
    open(os.path.join(d, "jit_step-abc"), "wb").write(b"x" * 100)
    assert not compilecache.ship(store, tmp_path / "home", env, 1)   # JAX writes from process 0 only: so do we
    assert compilecache.ship(store, tmp_path / "home", env, 0)
    assert not compilecache.ship(store, tmp_path / "home", env, 0)   # nothing new
    key = layout.compile_cache(os.path.basename(d))
    assert tarfile.open(fileobj=io.BytesIO(store.read(key))).getnames() == ["jit_step-abc"]
    other = tmp_path / "new-host"
    env2 = compilecache.environment(other, store, _job(), None)
    assert open(os.path.join(env2[compilecache.DIR_ENV], "jit_step-abc"), "rb").read() == b"x" * 100
    assert not compilecache.ship(store, other, env2, 0)   # restored: the store has it already


def test_the_copy_in_the_store_keeps_the_most_recent_entries_within_the_bound(tmp_path, monkeypatch):
    monkeypatch.setenv("TPUCTL_COMPILE_CACHE_BYTES", "250")
    store = LocalStore(str(tmp_path / "store"))
    env = compilecache.environment(tmp_path, store, _job(), None)
    assert env["JAX_COMPILATION_CACHE_MAX_SIZE"] == "250"
    d = env[compilecache.DIR_ENV]
    for i, name in enumerate(["old", "mid", "new"]):
        p = os.path.join(d, name)
        open(p, "wb").write(b"x" * 100)
        os.utime(p, (1000 + i, 1000 + i))
    assert compilecache.ship(store, tmp_path, env, 0)
    names = tarfile.open(fileobj=io.BytesIO(store.read(layout.compile_cache(os.path.basename(d))))).getnames()
    assert sorted(names) == ["mid", "new"]


def test_a_crafted_archive_never_writes_outside_the_cache(tmp_path):
    store = LocalStore(str(tmp_path / "store"))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in ("../escape", "ok"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
    key = compilecache.key(_job(), None)
    store.write(layout.compile_cache(key), buf.getvalue())
    env = compilecache.environment(tmp_path / "home", store, _job(), None)
    assert sorted(os.listdir(env[compilecache.DIR_ENV])) == [".shipped", "ok"]
    assert not (tmp_path / "home" / "compile-cache" / "escape").exists()


def test_jax_caches_a_small_cpu_compile_with_these_variables(tmp_path):
    """JAX reads them from the environment (its flags' defaults), and a sub-second CPU compile is written: without
    the minimum compile time at 0 it would not be (JAX's default is 1 s)."""
    pytest.importorskip("jax")
    env = compilecache.environment(tmp_path, LocalStore(str(tmp_path / "s")), _job(), None)
    code = "import jax, jax.numpy as jnp; print(jax.jit(lambda x: x * 2 + 1)(jnp.ones(3)).sum())"
    base = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}   # not the suite's own (conftest.py)
    r = subprocess.run([sys.executable, "-c", code], env={**base, **env, "JAX_PLATFORMS": "cpu"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    entries = [n for n in os.listdir(env[compilecache.DIR_ENV]) if not n.endswith("-atime")]
    assert any(n.startswith("jit_") for n in entries), entries


CACHE_ENV_JOB = """
import json, os
print("CACHE", json.dumps(os.environ.get("JAX_COMPILATION_CACHE_DIR")))
"""


def test_submit_gives_the_cache_and_no_compile_cache_takes_it_away(local_up, cli, tmp_path):
    local_up("cc")
    job = make_job(tmp_path, CACHE_ENV_JOB)
    code, out, err = cli("submit", str(job), "-c", "cc")
    assert code == 0, err
    said = json.loads(out.split("CACHE ", 1)[1].splitlines()[0])
    assert said and os.sep + "compile-cache" + os.sep in said
    code, out, err = cli("submit", str(job), "-c", "cc", "--no-compile-cache")
    assert code == 0, err
    # (the suite's own JAX cache, which the agent inherits, may be there: tests/conftest.py)
    said = json.loads(out.split("CACHE ", 1)[1].splitlines()[0])
    assert not said or os.sep + "compile-cache" + os.sep not in said
