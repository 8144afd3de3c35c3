"""`nvidia-smi`, run with a deadline that holds (core/bounded.py says how): the chip sampler's GPU figures
(host/chipsampler.py) and the local provider's GPU count (providers/local.py). A driver that hangs nvidia-smi hangs
it for good, and each sample asks again."""
from __future__ import annotations

from . import knobs
from .bounded import CAP, Ran, run_bounded


def deadline() -> float:
    """How long one nvidia-smi may take (TPUCTL_NVIDIA_SMI_DEADLINE, 10 s)."""
    return knobs.number("TPUCTL_NVIDIA_SMI_DEADLINE", 10)


def run(args: list[str], within: float | None = None, cap: int = CAP) -> Ran:
    """nvidia-smi with `args`, its output decoded whatever bytes it printed (a driver's message in another encoding:
    never a UnicodeDecodeError); Overran past `within` seconds (deadline() unless given); OSError if it cannot start."""
    within = deadline() if within is None else within
    return run_bounded(["nvidia-smi", *args], within, cap, "TPUCTL_NVIDIA_SMI_DEADLINE")
