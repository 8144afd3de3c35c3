"""Data sync through the fake GCS (gcp-storage-emulator behind the test proxy), measured in one run:

1. first upload of many files with LATENCY s added to every request: tpuctl's parallel sync against a plain
   sequential google-cloud-storage upload loop (goal: >= 4x faster);
2. re-submitting SIZE_MB of unchanged data: time and bytes sent (goal: 0 bytes, under 2 s), against the first
   upload of the same data.

    python bench/bench_data.py [SIZE_MB] [LATENCY]
"""
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from fakes.gcs import FakeGcs  # noqa: E402

SIZE_MB = int(sys.argv[1]) if len(sys.argv) > 1 else 200
LATENCY = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05


def make_files(root: Path, count: int, size: int) -> Path:
    root.mkdir(parents=True)
    for i in range(count):
        (root / f"shard-{i:05d}.tfrecord").write_bytes(os.urandom(size))
    return root


def main():
    gcs = FakeGcs()
    os.environ.update(STORAGE_EMULATOR_HOST=gcs.start(), GOOGLE_CLOUD_PROJECT="bench-proj",
                      TPUCTL_HOME=tempfile.mkdtemp())
    from google.cloud import storage
    from tpuctl.core import datasync
    from tpuctl.providers.stores import open_store
    client = storage.Client(project="bench-proj")
    client.create_bucket("bench")
    store = open_store("gs://bench")
    tmp = Path(tempfile.mkdtemp())
    quiet = lambda total: (lambda n: None)  # noqa: E731

    # 1. many small files, LATENCY per request
    small = make_files(tmp / "small", 64, 256 * 1024)
    gcs.latency = LATENCY
    t = time.perf_counter()
    for f in sorted(small.iterdir()):
        client.bucket("bench").blob(f"seq/{f.name}").upload_from_filename(str(f))
    seq = time.perf_counter() - t
    t = time.perf_counter()
    r = datasync.sync(store, [small], [small.name], "bench-par", quiet)
    par = time.perf_counter() - t
    assert r["uploaded"] == 64
    gcs.latency = 0.0
    print(f"64 files x 256 KiB, {LATENCY * 1000:.0f} ms per request:")
    print(f"  sequential google-cloud-storage loop : {seq:6.2f} s")
    print(f"  tpuctl data sync                     : {par:6.2f} s   {seq / par:.1f}x faster (goal >= 4x)")

    # 2. SIZE_MB unchanged
    big = make_files(tmp / "big", SIZE_MB // 50, 50 << 20) if SIZE_MB >= 50 else make_files(tmp / "big", 1, SIZE_MB << 20)
    t = time.perf_counter()
    first = datasync.sync(store, [big], [big.name], "bench-big", quiet)
    t_first = time.perf_counter() - t
    t = time.perf_counter()
    again = datasync.sync(store, [big], [big.name], "bench-big", quiet)
    t_again = time.perf_counter() - t
    print(f"{SIZE_MB} MB in {first['files']} files:")
    print(f"  first upload        : {t_first:6.2f} s, {first['bytes_sent'] / 1e6:7.1f} MB sent")
    print(f"  re-submit unchanged : {t_again:6.2f} s, {again['bytes_sent'] / 1e6:7.1f} MB sent "
          f"({t_first / t_again:.0f}x less time; goal 0 bytes, < 2 s)")
    gcs.stop()
    os._exit(0)  # the emulator's threads are not daemons


if __name__ == "__main__":
    main()
