"""tpuctl: a TensorFlow training job onto a Cloud TPU (or this machine), its logs back, nothing left billing."""
__version__ = "0.1.0"
