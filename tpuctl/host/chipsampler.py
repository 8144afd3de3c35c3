"""While a run runs, each host's agent samples its accelerator chips every TPUCTL_TPU_METRICS_SECONDS (30 s) into
the run's tpu-metrics[-wN].json in the store (core/utilisation.py): the TensorCore duty cycle and HBM use of each TPU
chip, through tpu-info's library (PyPI `tpu-info`, Google's `nvidia-smi` for TPUs), or a GPU's utilisation and memory
through `nvidia-smi`. Where neither answers it writes why, once, and keeps trying quietly (libtpu's metrics service
only answers once a program holds the TPU).

tpu-info (tpu_info/metrics.py, 0.14.2) asks libtpu's RuntimeMetricService over gRPC on localhost:8431 with local
credentials: GetRuntimeMetric for "tpu.runtime.tensorcore.dutycycle.percent" (a gauge as_double per chip),
"tpu.runtime.hbm.memory.usage.bytes" and "...total.bytes" (gauges as_int per device), each metric's attribute an
int_attr device id. `get_chip_usage(chip_type)` repeats a chip's duty cycle over its devices (devices_per_chip);
its own CLI calls `get_chip_usage_new` for TPU7x (tpu_info/cli_helper.py get_device_usage), and so does this module
where TPUCTL_TPU_METRICS_ADDR names the service (the tests' fake: no chip on the PCI bus to read the type from)."""
from __future__ import annotations

import contextlib
import glob
import importlib
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from types import ModuleType
from typing import Any, Callable, Iterator

from ..core import bounded, jobfiles, knobs, layout, nvidiasmi, utilisation
from ..core.delivery import agent_home
from ..core.store import BlobStore

DEFAULT_ADDR = "localhost:8431"   # tpu_info/metrics.py get_chip_usage's default


class Unavailable(Exception):
    """Why this host's chips cannot be sampled (said once in the file)."""


def every() -> float:
    return knobs.number("TPUCTL_TPU_METRICS_SECONDS", 30)


TPU_INFO = "tpu-info>=0.14"   # get_chip_usage(chip_type, addr) and get_chip_usage_new, as read above
PCI_DEVICES = "/sys/bus/pci/devices"
GOOGLE_PCI_VENDOR = "0x1ae0"   # tpu_info/device.py GOOGLE_PCI_VENDOR_ID: what get_local_chips looks for
_install: list[str] = []       # this process's one try at installing tpu-info: "" when it worked, else why not


def _has_tpu_chips() -> bool:
    for vendor in glob.glob(os.path.join(PCI_DEVICES, "*", "vendor")):
        with contextlib.suppress(OSError):
            if open(vendor).read().strip() == GOOGLE_PCI_VENDOR:
                return True
    return False


def _import_tpu_info() -> tuple[ModuleType, ModuleType]:
    return importlib.import_module("tpu_info.device"), importlib.import_module("tpu_info.metrics")


def _load_tpu_info() -> tuple[ModuleType, ModuleType]:
    """tpu-info's modules: installed, or in the agent's own directory, or installed there now (pip, once per
    process, on the sampler's thread: a run never waits for it), as delivery.py does for Apprise. A TPU VM's image
    need not ship tpu-info (Google's docs say `pip install tpu-info`), and the agent itself installs with --no-deps."""
    target = os.path.join(agent_home(), "tpu-info")
    if target not in sys.path:
        sys.path.append(target)
    try:
        return _import_tpu_info()
    except ImportError:
        pass
    if not os.environ.get("TPUCTL_TPU_METRICS_ADDR") and not _has_tpu_chips():
        raise Unavailable("no TPU chip on this host")
    if not _install:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target",
                            target, TPU_INFO], capture_output=True, text=True, timeout=600)
        _install.append(r.stderr.strip().splitlines()[-1][:200] if r.returncode and r.stderr.strip() else
                        f"pip exited {r.returncode}" if r.returncode else "")
        importlib.invalidate_caches()
    try:
        return _import_tpu_info()
    except ImportError:
        raise Unavailable(f"tpu-info is not installed on this host and could not be ({_install[0] or 'no module'}): "
                          f"pip install '{TPU_INFO}'") from None


def _tpu_info() -> tuple[str, list[dict[str, float]]]:
    device, metrics = _load_tpu_info()
    addr = os.environ.get("TPUCTL_TPU_METRICS_ADDR", "")
    chip_type = None
    if not addr:
        chip_type, _ = device.get_local_chips()
        if chip_type is None:
            raise Unavailable("no TPU chip on this host")
    try:
        if chip_type is None or chip_type is device.TpuChip.V7X:
            usage = metrics.get_chip_usage_new(chip_type, addr or DEFAULT_ADDR)
        else:
            usage = metrics.get_chip_usage(chip_type, addr or DEFAULT_ADDR)
    except Exception as e:  # noqa: BLE001 - grpc.RpcError above all: the service is absent or not up yet
        code = getattr(e, "code", lambda: None)()
        said = getattr(code, "name", "") or type(e).__name__
        raise Unavailable(f"libtpu's runtime metrics service on {addr or DEFAULT_ADDR} did not answer ({said}): no "
                          "program holds the TPU yet, or this libtpu has no metrics service") from None
    return "tpu-info", [{"id": float(u.device_id), "duty_cycle_pct": float(u.duty_cycle_pct),
                         "hbm_used": float(u.memory_usage), "hbm_total": float(u.total_memory)} for u in usage]


# nvidia-smi --help-query-gpu: utilization.gpu "Percent of time over the past sample period during which one or more
# kernels was executing on the GPU"; memory.used / memory.total in MiB with `nounits`.
_SMI = ["--query-gpu=index,utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits"]


MAX_GPUS = 64   # a host's GPUs shown at most: a longer answer is cut here, not written whole at every sample


def _nvidia_smi() -> tuple[str, list[dict[str, float]]]:
    try:   # bounded for real: the group killed at its deadline, what is read capped (core/nvidiasmi.py)
        ran = nvidiasmi.run(_SMI)
    except bounded.Overran as e:
        raise Unavailable(str(e)) from None
    if ran.code not in (0, None):   # None: stopped once its answer passed the cap, which the lines below cut anyway
        raise Unavailable(f"nvidia-smi exited {ran.code}: {ran.err.strip()[:200]}")
    chips = []
    for line in ran.out.strip().splitlines()[:MAX_GPUS]:
        try:
            idx, util, used, total = (float(x.strip()) for x in line.split(","))
            if not all(map(math.isfinite, (idx, util, used, total))):
                raise ValueError(line)
        except ValueError:   # "[N/A]", "nan", a driver's warning: what is not its CSV of numbers
            raise Unavailable(f"nvidia-smi printed what is not its CSV of numbers: {line.strip()[:120]!r}") from None
        chips.append({"id": idx, "duty_cycle_pct": util, "hbm_used": used * 2 ** 20, "hbm_total": total * 2 ** 20})
    return "nvidia-smi", chips


def read_chips() -> tuple[str, list[dict[str, float]]]:
    """(source, each chip's figures) now, or Unavailable with why. A GPU host (the local provider on a GPU
    machine) answers through nvidia-smi; everything else is asked through tpu-info."""
    if shutil.which("nvidia-smi") and not os.environ.get("TPUCTL_TPU_METRICS_ADDR"):
        return _nvidia_smi()
    return _tpu_info()


class ChipSampler:
    """Samples into the run's file from a thread of its own while `running()`; a store that refuses a write
    loses that sample only (the file is a nicety: never a reason for a run to fail)."""

    def __init__(self, store: BlobStore, run_id: str, worker: int,
                 read: Callable[[], tuple[str, list[dict[str, float]]]] = read_chips) -> None:
        self.store, self.key, self.read = store, layout.run_chips(run_id, worker), read
        self.every = every()
        prior = utilisation.parse(store.read(self.key))   # a resumed run's history goes on
        self.doc: dict[str, Any] = prior or utilisation.empty(self.every)
        self.stop = threading.Event()

    def sample(self) -> None:
        try:
            source, chips = self.read()
        except Unavailable as e:
            if self.doc.get("why") == str(e) or self.doc.get("chips") and not self.doc.get("why"):
                return   # said already; or a service that answered before and blinks now: its last figures stand
            self.doc.update(why=str(e), time=time.time())
        except Exception as e:  # noqa: BLE001 - whatever the reader meets is said, never raised into the run
            self.doc.update(why=f"{type(e).__name__}: {e}", time=time.time())
        else:
            utilisation.record(self.doc, time.time(), source, chips)
        with contextlib.suppress(Exception):
            self.store.write(self.key, jobfiles.dumps(self.doc).encode())   # strict JSON: never a NaN

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.every)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        if self.every <= 0:   # TPUCTL_TPU_METRICS_SECONDS=0: sampling off
            yield
            return
        thread = threading.Thread(target=self._loop, daemon=True, name="tpuctl-chips")
        thread.start()
        try:
            yield
        finally:
            self.stop.set()
            thread.join(30)
