"""Which boot of its machine an agent runs in, so a run's next attempt can tell a host that restarted beneath it
(Google repairing or maintaining the TPU VM, any reboot) from an agent that restarted on a live host (claims.py).

Linux draws a new random UUID at each boot and serves it at /proc/sys/kernel/random/boot_id (proc_sys_kernel(5):
"boot_id ... a random UUID ... generated ... each time the system boots"; systemd's journal keys entries by it).
TPUCTL_BOOT_ID stands in for it where several simulated hosts share one kernel (tests/fakes/tpu_host.py)."""
from __future__ import annotations

import os

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """This machine's boot, "" where the kernel does not say (a host that is not Linux)."""
    if os.environ.get("TPUCTL_BOOT_ID"):
        return os.environ["TPUCTL_BOOT_ID"]
    try:
        with open(BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return ""
