"""Sizes as tpuctl shows them, in one unit system everywhere: decimal (kB, MB, GB: powers of 1000), as Cloud
Storage's console, `gsutil du -h`'s neighbour `gcloud storage du --readable-sizes` aside, and rich's transfer bars
show them. Issue 40: `--dry-run` said 476.8 MiB where the upload bar and its summary said 500.0 MB for one file."""
from __future__ import annotations


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
