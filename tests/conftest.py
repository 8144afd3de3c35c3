"""Fixtures every test file shares: the Google fakes (one set per test process), an isolated tpuctl home, the CLI.

The suite runs side by side (pytest-xdist workers, `-n` in pyproject's addopts), and two checkouts may run it at once
on one machine. So a test must:
- bind every server it starts to port 0 (an ephemeral port) and hand its address on through the environment or an
  argument: never a fixed port (the Kaggle fake too: fakes/kaggle.py `env()`);
- write only under tmp_path / tmp_path_factory (or TPUCTL_HOME, which the `env` fixture points there): never a fixed
  path, the home directory, or a name in /tmp two runs would share;
- set environment variables with monkeypatch, and make every wait short through its environment variable;
- build what many tests share once per process (a session fixture: the fakes, the wheel index), and what costs
  tens of CPU-seconds once per run (built_once: a prepared corpus, a set of BERT runs, under a file lock); never
  rely on another test having run first or in the same process (a module fixture is made once per worker that runs
  one of its tests; mark tests with pytest.mark.xdist_group only where they must share one process);
- carry `@pytest.mark.slow(SECONDS)` when it takes a minute or so: the slowest start first (below).
"""
import atexit
import fcntl
import logging
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from fakes.compute_server import FakeCompute  # noqa: E402
from fakes.gcs import FakeGcs  # noqa: E402
from fakes.resource_manager import FakeResourceManager  # noqa: E402
from fakes.tpu_host import SimulatedHosts  # noqa: E402
from fakes.tpu_server import QR_PLAN, FakeTpu  # noqa: E402

PROJECT = "test-proj"
logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)  # it logs every 404 as an ERROR


def _never_reap_orphans() -> None:
    """Every test runs as under an init that never reaps: the processes orphaned here (a simulated host's agent, a
    local agent whose `up` has returned, a killed submit's children) become this process's children and stay
    zombies once they exit. A container's init may do just that, and `kill -0` still finds a zombie: CI's run of
    the repair test hung on one (the fake's systemctl took a killed agent for running), where this machine's init
    had reaped it. So whatever asks whether a process runs is tested against zombies everywhere. Linux only."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


_never_reap_orphans()

# tpuctl's state home where a test forgot TPUCTL_HOME (core/state.py home(): XDG_STATE_HOME, else ~/.local/state):
# one of this process's own, so no test writes the user's, nor another suite's.
_STATE_HOME = tempfile.mkdtemp(prefix="tpuctl-test-state-")
os.environ["XDG_STATE_HOME"] = _STATE_HOME
atexit.register(shutil.rmtree, _STATE_HOME, ignore_errors=True)   # every test process, xdist's controller too


def _one_jax_compilation_cache() -> None:
    """Every JAX program the suite's processes compile (the BERT job on JAX, in test_bert's processes, the local
    agent's, a Kaggle session's, a simulated host's: all inherit the environment) goes into one cache for the run,
    and a process that compiles the same program again loads it: a BERT process on JAX compiles about 140 programs,
    16 CPU-seconds of its 17 here, 4 with the cache warm. JAX's persistent cache (jax/_src/config.py:
    jax_compilation_cache_dir; min_compile_time 0 so the many small programs are kept too; a max size turns on
    jax/_src/lru_cache.py's file lock, so a process never reads an entry another is still writing). The xdist
    controller makes it and its workers inherit it (PYTEST_XDIST_WORKER is set in a worker); a run of its own
    (-n 0) makes its own. Behaviour is unchanged: an entry is the executable a compilation of the same program
    gives."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    path = tempfile.mkdtemp(prefix="tpuctl-test-jax-cache-")
    os.environ.update(JAX_COMPILATION_CACHE_DIR=path, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_COMPILATION_CACHE_MAX_SIZE=str(2 << 30))
    atexit.register(shutil.rmtree, path, ignore_errors=True)


_one_jax_compilation_cache()

# XLA's CPU compiler at its lowest optimisation (xla/debug_options_flags.cc: xla_backend_optimization_level, LLVM's
# -O level; xla_llvm_disable_expensive_passes): the BERT job's programs on JAX compile in 13.5 CPU-seconds instead of
# 19.4 for a cold start, and the handful of steps a test runs go no slower to matter; the losses printed were the
# same to the last digit here. Every process of the run inherits it, and the runs a test compares share it. Tests
# that set XLA_FLAGS themselves (a count of CPU devices) put it first.
FAST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if not os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["XLA_FLAGS"] = f"{FAST_XLA_FLAGS} {os.environ.get('XLA_FLAGS', '')}".strip()


def tpuctl_at_a_terminal(*args: str) -> list[str]:
    """argv of `python -m tpuctl ARGS` that SIGINT interrupts as a terminal's Ctrl-C does, even where this suite runs
    with SIGINT ignored (a background job of a non-interactive shell: children inherit SIG_IGN, and Python then
    installs no KeyboardInterrupt). Set by the new interpreter, not by Popen's preexec_fn, which runs in a fork of
    this many-threaded worker before exec (Python's docs: not safe with threads): a worker with gRPC loaded had such a
    child die of SIGABRT before exec, "Epoll1Poller ... epoll_wait error: Bad file descriptor" (its poller's descriptor
    closed by subprocess's fd cleanup; the follower itself imports no gRPC), seen with two suites at once."""
    code = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "sys.argv[0] = 'tpuctl'; runpy.run_module('tpuctl', run_name='__main__')")
    return [sys.executable, "-c", code, *args]


def until(cond, timeout=60.0, what="", every=0.05):
    """Polls cond until it answers something true and returns that answer; past timeout seconds the test fails
    naming what it waited for. what may be a callable, called at the failure, to show the state then."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"waited {timeout:g}s for {said}")
        time.sleep(every)


def kill_dead(pid: int) -> None:
    """SIGKILL pid and wait until it has ended: kill() only marks the signal pending, and on a loaded machine the
    process can still read as running (its /proc state and cmdline unchanged) when the next command looks at it."""
    from tpuctl.core.processes import running
    os.kill(pid, signal.SIGKILL)
    until(lambda: not running(pid), 10, f"pid {pid} to end after SIGKILL")


@dataclass
class Cloud:
    tpu: FakeTpu
    compute: FakeCompute
    gcs: FakeGcs
    hosts: SimulatedHosts
    iam: FakeResourceManager

    foreign: set = field(default_factory=set)   # leaks() entries a test made as the user or another machine

    def mutating_calls(self):
        gcs = [c for c in self.gcs.calls if not c.startswith("GET")]
        return self.tpu.mutating_calls() + self.compute.mutating_calls() + gcs

    def leaks(self):
        """What carries tpuctl's label (TPUs, queued resources, VMs) or is a bucket grant of tpuctl's roles, read
        from the fakes' own state; after `down` of every cluster it must be empty (buckets are kept by design)."""
        from tpuctl.core.models import LABEL, OBJECT_ROLES
        found = [f"tpu {n}" for v in (1, 2) for n, node in self.tpu.nodes[v].items() if LABEL in node.labels]
        found += [f"queued resource {n}" for n in self.tpu.queued]
        found += [f"vm {k[2]}" for k, inst in self.compute.instances.items()
                  if LABEL in (inst.get("labels") or {})]
        found += [f"instance template {k[1]}" for k in self.compute.templates]
        found += [f"resource policy {k[2]}" for k in self.compute.policies]
        found += [f"MIG {k[2]}" for k in self.compute.migs]
        found += [f"grant {role} to {member} on {bucket}" for bucket, held in self.gcs.granted.items()
                  for role, member in held if role in OBJECT_ROLES and member.startswith("serviceAccount:")]
        return [f for f in found if f not in self.foreign]


TEST_DEADLINE = float(os.environ.get("TPUCTL_TEST_DEADLINE", "600"))   # all but the slow(SECONDS) tests take < 90 s
# One hang log per test process: pytest-xdist's workers, and two suites run at once on one machine, each write their
# own (one shared name had one process truncate the stacks another was writing). .ci/run names the directory
# (TPUCTL_TEST_HANG_DIR) and prints every log left in it; a log that stayed empty is removed when its process ends.
HANG_LOG = os.path.join(os.environ.get("TPUCTL_TEST_HANG_DIR") or os.environ.get("TMPDIR", "/tmp"),
                        f"tpuctl-test-hang-{os.getpid()}.log")


def _slow_seconds(item) -> float:
    """About how long a test marked slow(SECONDS) takes; 0 for any other."""
    mark = item.get_closest_marker("slow")
    return float(mark.args[0]) if mark else 0.0


def pytest_collection_modifyitems(items):
    """The slowest tests first, longest first, the rest in their order: pytest-xdist's loadgroup scheduler hands tests
    out in collection order, one to each worker as it frees up, so a five-minute test collected late ran on while
    the other workers sat idle at the end (longest processing time first: the suite's tail is its shortest)."""
    items.sort(key=lambda item: -_slow_seconds(item))


def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=0, metavar="N",
                     help="show the N tests that used the most CPU (tests/conftest.py _cpu_seconds); 0: off")
    parser.addoption("--timeline", default="", metavar="FILE",
                     help="append each test's start, end, worker and id to FILE: what ran while the machine sat idle")


def _cpu_seconds(counted: dict) -> float:
    """CPU seconds (user + system) of this test process and its descendants so far: its own, its reaped children's
    (getrusage), and the zombies it holds: a process orphaned under it (its subreaper, above: a simulated host's
    agent, a local agent) is never reaped, so its time and that of the children it reaped is read from its /proc
    stat (utime, stime, cutime, cstime), each zombie counted once (`counted`: pid and start time). CPU rather than
    wall time: on a shared machine wall time says more about the neighbours than about the test."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    tick, me = os.sysconf("SC_CLK_TCK"), str(os.getpid())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and fields[1] == me:
            key = (pid, fields[19])
            counted.setdefault(key, sum(int(t) for t in fields[11:15]) / tick)
    return total + sum(counted.values())


_ZOMBIES_COUNTED: dict = {}
_CPU_AT_START = pytest.StashKey[float]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if item.config.getoption("cpu_durations"):
        item.stash[_CPU_AT_START] = _cpu_seconds(_ZOMBIES_COUNTED)
    timeline, began = item.config.getoption("timeline"), time.time()
    try:
        return (yield)
    finally:
        if timeline:   # one line a test, appended by whichever worker ran it (a line under PIPE_BUF is one write)
            with open(timeline, "a") as f:
                f.write(f"{began:.1f} {time.time():.1f} {os.environ.get('PYTEST_XDIST_WORKER', '-')} {item.nodeid}\n")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "teardown" and _CPU_AT_START in item.stash:   # set up, run and torn down: the test's whole cost
        report.user_properties.append(("cpu_seconds", _cpu_seconds(_ZOMBIES_COUNTED) - item.stash[_CPU_AT_START]))
    return report


def pytest_terminal_summary(terminalreporter, config):
    n = config.getoption("cpu_durations")
    if not n:
        return
    cpu = [(dict(r.user_properties).get("cpu_seconds"), r.nodeid) for r in terminalreporter.stats.get("", [])
           + terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", [])
           + terminalreporter.stats.get("error", []) if getattr(r, "when", "") == "teardown"]
    cpu = sorted(((s, i) for s, i in cpu if s is not None), reverse=True)
    terminalreporter.write_sep("=", f"{min(n, len(cpu))} tests by CPU seconds (user + system, with their processes)")
    for seconds, nodeid in cpu[:n]:
        terminalreporter.write_line(f"{seconds:8.1f}  {nodeid}")
    terminalreporter.write_line(f"{sum(s for s, _ in cpu):8.1f}  all {len(cpu)} tests")


def _hang_log_removed_if_empty() -> None:
    try:
        if os.path.getsize(HANG_LOG) == 0:
            os.remove(HANG_LOG)
    except OSError:
        pass


atexit.register(_hang_log_removed_if_empty)


@pytest.fixture(autouse=True)
def _no_test_hangs_the_suite(request):
    """A test that hangs ends the run within TEST_DEADLINE seconds, its name and every thread's stack in HANG_LOG,
    instead of holding CI until its 90-minute limit says nothing about where (a follower once hung under heavy load
    here and could not be reproduced). pytest captures stderr, so the stacks go to a file."""
    import faulthandler
    # a test known to take minutes (slow(SECONDS)) gets four times that: two suites at once on 2 cores, each with
    # four workers, stretch it about so far
    deadline = max(TEST_DEADLINE, 4 * _slow_seconds(request.node))
    with open(HANG_LOG, "w") as log:
        log.write(f"{request.node.nodeid} ran past {deadline:g} s; the run was ended. Its threads:\n")
        log.flush()
        faulthandler.dump_traceback_later(deadline, exit=True, file=log)
        yield
        faulthandler.cancel_dump_traceback_later()
        log.seek(0)
        log.truncate()   # it ended in time: nothing to report


@pytest.fixture(scope="session")
def _servers():
    tpu, compute, gcs, iam = FakeTpu(), FakeCompute(), FakeGcs(), FakeResourceManager()
    hosts = tpu.start(), compute.start(), gcs.start(), iam.start(), tpu.start_rest()
    tpu.iam = compute.iam = iam
    yield (tpu, compute, gcs, iam), hosts
    tpu.stop()
    compute.stop()
    gcs.stop()
    iam.stop()


def built_once(tmp_path_factory, name: str, build) -> Path:
    """A directory that `build(directory)` fills once per run of the suite, whichever test process asks first: the
    others wait for it under a file lock and then read what it left. For what costs tens of CPU-seconds and several
    test files or workers need (a prepared corpus, a set of training runs): a session fixture alone is made once per
    xdist worker, and pytest.mark.xdist_group, which would put its tests on one worker, depends on pytest and
    pytest-xdist agreeing on node ids (pyproject's pin, test_xdist_groups.py). `name` says what the contents depend
    on (their arguments): two callers that name the same directory must mean the same build. The directory sits in
    the run's own temporary root (the xdist workers' basetemps share their parent; a run of its own uses its
    basetemp), so a second suite running at once builds its own. A build that raised leaves no marker, and the next
    caller builds again."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "built-once"
    root.mkdir(exist_ok=True)
    target, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # released when the file closes, also if this process dies
        if not done.exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            build(target)
            done.touch()
    return target


@pytest.fixture(scope="session")
def wheel_index(tmp_path_factory):
    """The local package index (fakes/pyindex.py): tensorflow-tpu, tf-keras and PyPI's tensorflow stand-ins."""
    from fakes.pyindex import WheelIndex
    index = WheelIndex(tmp_path_factory.mktemp("index"))
    yield index
    index.stop()


@pytest.fixture
def env(tmp_path, monkeypatch):
    """An isolated tpuctl home and config, fast polls and retries, no real credentials anywhere."""
    monkeypatch.setenv("TPUCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TPUCTL_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("TPUCTL_POLL_INTERVAL", "0.02")
    monkeypatch.setenv("TPUCTL_RETRY_BASE", "0.01")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    for var in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "TPUCTL_PROVIDER", "TPUCTL_CLUSTER",
                "TPUCTL_PROJECT", "TPUCTL_ZONE", "TPU_EMULATOR_HOST", "COMPUTE_EMULATOR_HOST",
                "STORAGE_EMULATOR_HOST", "RESOURCE_MANAGER_EMULATOR_HOST"):
        monkeypatch.delenv(var, raising=False)
    from tpuctl.providers.google import clients
    clients.reset()
    yield tmp_path
    clients.reset()


@pytest.fixture
def cloud(env, _servers, monkeypatch, tmp_path, request, wheel_index):
    (tpu, compute, gcs, iam), (th, ch, sh, rh, trh) = _servers
    # A TPU VM on a base runtime installs the TensorFlow each job asks for: from the local index, never the network
    pip_env = {"TPUCTL_TF_FIND_LINKS": wheel_index.url, "PIP_FIND_LINKS": wheel_index.url, "PIP_NO_INDEX": "1"}
    for k, v in pip_env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("TPU_EMULATOR_HOST", th)
    monkeypatch.setenv("RESOURCE_MANAGER_EMULATOR_HOST", rh)
    monkeypatch.setenv("COMPUTE_EMULATOR_HOST", ch)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", sh)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    for fake in (tpu, compute):
        fake.delay = 0.0
        fake.faults.clear()
        fake.op_faults.clear()
        fake.before.clear()
        fake.lost.clear()
        fake.calls.clear()
    tpu.nodes = {1: {}, 2: {}}
    tpu.tpu_nodes_allowed = request.node.get_closest_marker("tpu_nodes") is not None
    tpu.rest_calls.clear()
    tpu.redelete = None
    tpu.queued, tpu.qr_plan, tpu.qr_plans, tpu.qr_step = {}, list(QR_PLAN), {}, 0.0
    iam.reset(f"{compute.project_number}-compute@developer.gserviceaccount.com")
    tpu.zones = None
    tpu.runtimes.clear()
    tpu.accelerator_types.clear()
    compute.instances.clear()
    compute.firewalls.clear()
    compute.reset_tpu()
    gcs.faults.clear()
    gcs.calls.clear()
    gcs.bytes_in.clear()
    gcs.iam_delay = 0.0
    gcs.iam_after_a_refused_read = False
    gcs.after_iam_set = None
    gcs.lost.clear()
    gcs.wipe()
    hosts = SimulatedHosts(gcs, tmp_path / "hosts")   # off unless a test turns it on (hosts.enabled = True)
    hosts.env.update(TPU_REST_EMULATOR_HOST=trh, COMPUTE_EMULATOR_HOST=ch, RESOURCE_MANAGER_EMULATOR_HOST=rh,
                     **pip_env)
    tpu.hosts = compute.hosts = hosts
    yield Cloud(tpu, compute, gcs, hosts, iam)
    hosts.stop_all()
    tpu.hosts = compute.hosts = None
    gcs.stop_identities()


@pytest.fixture
def live_hosts(cloud, monkeypatch):
    """Simulated hosts boot for every TPU and VM made; waits short enough for tests (grants apply at once)."""
    cloud.hosts.enabled = True
    cloud.hosts.env.update(TPUCTL_LOG_POLL_MAX="0.2", TPUCTL_TEARDOWN_RETRY="0.5")
    monkeypatch.setenv("TPUCTL_LOG_POLL_MAX", "0.2")
    monkeypatch.setenv("TPUCTL_TEARDOWN_WAIT", "120")
    return cloud.hosts


@pytest.fixture
def no_leak(cloud, cli):
    """A fault test ends here: faults off, `down` of every cluster left in state, and then nothing tpuctl made may
    be left in the fakes that `down` should have removed."""
    from tpuctl.core import state
    yield
    for fake in (cloud.tpu, cloud.compute):
        fake.faults.clear()
        fake.op_faults.clear()
        fake.lost.clear()
    cloud.gcs.faults.clear()
    cloud.gcs.lost.clear()
    for st in state.all_clusters():
        cli("down", "-c", st.name, "--yes")   # may refuse (a resource lost its label): then it is not tpuctl's
    assert cloud.leaks() == []


@pytest.fixture
def local_up(env, cli):
    """up(name, *flags): a local cluster through the real CLI, its state returned; every local agent still running
    is stopped when the test ends."""
    from tpuctl.core import state
    from tpuctl.providers.local import LocalProvider

    def up(name, *flags):
        code, out, err = cli("up", "--provider", "local", "-c", name, *flags)
        assert code == 0, err
        return state.load(name)
    yield up
    for st in state.all_clusters():
        LocalProvider()._stop(st, lambda s: None)


@pytest.fixture
def cli(capsys):
    """Run the real CLI entry point in-process; returns (exit code, stdout, stderr)."""
    from tpuctl.cli import main

    def run(*args):
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code or 0
        out, err = capsys.readouterr()
        return code, out, err
    return run


@pytest.fixture(scope="session")
def jax_python(tmp_path_factory):
    """An interpreter with Keras 3 and JAX and NO TensorFlow: this environment's packages
    less its TensorFlow stack, Keras and tpuctl (fakes/kaggle.py image_python), then `pip install keras jax
    tokenizers` from pip's cache / the package index. tpuctl comes from the checkout (PYTHONPATH) where a test runs it
    there; its site-packages also stands for the JAX and Keras of Kaggle's TPU image (FakeKaggle.tpu_jax_site).
    Made once for the run (built_once): the install unpacks jaxlib, and three files' tests on as many workers
    need it."""
    import subprocess
    import sys
    from fakes.kaggle import image_python

    def build(root):
        python = image_python(root, "jax-env", tensorflow_cpu=False)
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                        "--disable-pip-version-check", "keras>=3", "jax", "tokenizers>=0.15"], check=True)
    return built_once(tmp_path_factory, "jax-env", build) / "jax-env" / "bin" / "python"
