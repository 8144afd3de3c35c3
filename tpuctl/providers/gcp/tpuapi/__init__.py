"""TPUs through the Cloud TPU API (`--api tpu`, the default): nodes through tpu_v2 and tpu_v1 (tpu.py), queued
resources (queued.py) and their node specs (slices.py)."""
