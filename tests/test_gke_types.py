"""GKE slice shapes (providers/gke/tputypes.py): rows checked by hand against xpk 1.16.0's
core/system_characteristics.py map and GKE's plan-tpus / tpu-ironwood pages (cited in the module)."""
from __future__ import annotations

import pytest

from tpuctl.core.errors import ErrorKind, TpuctlError
from tpuctl.providers.gke.tputypes import shape


@pytest.mark.parametrize("tpu_type, row", [
    # type: (accelerator, machine type, topology, chips/host, hosts, workload policy)
    ("v4-8", ("tpu-v4-podslice", "ct4p-hightpu-4t", "2x2x1", 4, 1, False)),
    ("v4-32", ("tpu-v4-podslice", "ct4p-hightpu-4t", "2x2x4", 4, 4, False)),
    ("v5p-16", ("tpu-v5p-slice", "ct5p-hightpu-4t", "2x2x2", 4, 2, False)),
    ("v5p-8192", ("tpu-v5p-slice", "ct5p-hightpu-4t", "16x16x16", 4, 1024, False)),
    ("v5litepod-1", ("tpu-v5-lite-podslice", "ct5lp-hightpu-1t", "1x1", 1, 1, False)),
    ("v5litepod-4", ("tpu-v5-lite-podslice", "ct5lp-hightpu-4t", "2x2", 4, 1, False)),
    ("v5litepod-16", ("tpu-v5-lite-podslice", "ct5lp-hightpu-4t", "4x4", 4, 4, False)),
    ("v6e-1", ("tpu-v6e-slice", "ct6e-standard-1t", "1x1", 1, 1, False)),
    ("v6e-8", ("tpu-v6e-slice", "ct6e-standard-4t", "2x4", 4, 2, False)),
    ("v6e-16", ("tpu-v6e-slice", "ct6e-standard-4t", "4x4", 4, 4, False)),
    ("v6e-256", ("tpu-v6e-slice", "ct6e-standard-4t", "16x16", 4, 64, False)),
    ("tpu7x-2", ("tpu7x", "tpu7x-standard-1t", "1x1x1", 1, 1, False)),
    ("tpu7x-8", ("tpu7x", "tpu7x-standard-4t", "2x2x1", 4, 1, False)),
    ("tpu7x-16", ("tpu7x", "tpu7x-standard-4t", "2x2x2", 4, 2, True)),
    ("tpu7x-128", ("tpu7x", "tpu7x-standard-4t", "4x4x4", 4, 16, True)),
])
def test_shape_rows(tpu_type: str, row: tuple[str, str, str, int, int, bool]) -> None:
    s = shape(tpu_type)
    assert (s.accelerator, s.machine_type, s.topology, s.chips_per_host, s.hosts, s.needs_workload_policy) == row
    assert s.chips == s.chips_per_host * s.hosts
    assert s.multi_host is (s.hosts > 1)
    assert s.tpu_type == tpu_type


@pytest.mark.parametrize("bad, says", [
    ("v3-8", "unknown TPU type"), ("v5e-3", "valid: v5litepod-1"), ("", "unknown TPU type"),
    ("v6e-2", "valid: v6e-1, v6e-4"), ("tpu7x-4", "valid: tpu7x-2, tpu7x-8"), ("v4-08", "valid:"),
    ("V6E-4", "unknown TPU type"),
])
def test_unknown_types_are_one_line_input_errors(bad: str, says: str) -> None:
    with pytest.raises(TpuctlError) as e:
        shape(bad)
    assert e.value.kind is ErrorKind.INPUT
    assert says in e.value.message + " " + e.value.hint
    assert "\n" not in e.value.message + e.value.hint


def test_v5e_is_v5litepods_other_name() -> None:
    """Issue 52: Kaggle's spelling of the chips Google Cloud calls v5litepod is taken too, as the same slice."""
    assert shape("v5e-16") == shape("v5litepod-16") and shape("v5e-16").tpu_type == "v5litepod-16"
