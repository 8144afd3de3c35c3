"""A run's log without TensorFlow's start-up preamble; real errors and every other byte kept."""
import pytest

from jobs import make_job
from tpuctl.host.preamble import PreambleFilter

PREAMBLE = (
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    b"I0000 00:00:1795378873.356152   10309 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will "
    b"not be used.\n"
    b"I0000 00:00:1795378873.414397   10309 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    b"available CPU instructions in performance-critical operations.\n"
    b"To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the appropriate "
    b"compiler flags.\n"
    b"E0000 00:00:1795379092.879761   12036 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed "
    b"call to cuInit: UNKNOWN ERROR (303)\n"
    b"I0000 00:00:1795379092.1   12036 util.cc:169] oneDNN custom operations are on. You may see slightly different "
    b"numerical results due to floating-point round-off errors from different computation orders.\n")
REAL = b"E0000 00:00:1795379092.879761   12036 op_kernel.cc:1857] OP_REQUIRES failed: out of memory\n"
KEPT = b"step 10 loss 7.1\n" + REAL + b"Warning: my own\nIteration 50%\r"


@pytest.mark.parametrize("piece", [1, 7, 4096])
def test_only_the_preamble_goes_however_the_output_is_cut(piece):
    lookalike = b"W0000 00:00:1.5   12036 cpu_feature_guard.cc:9] another warning from the same file\n"
    data = PREAMBLE + KEPT[:17] + REAL + PREAMBLE + lookalike + KEPT[17 + len(REAL):]
    f = PreambleFilter(gpu=False)
    out = b"".join(f.feed(data[i:i + piece]) for i in range(0, len(data), piece)) + f.end()
    assert out == KEPT[:17] + REAL + lookalike + KEPT[17 + len(REAL):]


def test_a_partial_progress_line_is_not_held():
    f = PreambleFilter(gpu=False)
    assert f.feed(b"Iteration 5") == b"Iteration 5"
    assert f.feed(b"I0000 00:00:1.2   1 x.cc:1] ") == b""       # may be preamble: held to its newline
    assert f.feed(b"something real\n") == b"I0000 00:00:1.2   1 x.cc:1] something real\n"


def test_on_a_gpu_machine_cuda_errors_stay():
    f = PreambleFilter(gpu=True)
    line = PREAMBLE.splitlines(keepends=True)[4]
    assert f.feed(line) == line


JOB = "import os\nos.write(2, {preamble!r})\nos.write(1, {kept!r})\n"


def test_a_cpu_runs_log_has_no_preamble_unless_the_job_asks(local_up, cli, tmp_path):
    local_up("q")
    job = make_job(tmp_path, JOB.format(preamble=PREAMBLE, kept=KEPT))
    code, out, err = cli("submit", str(job), "-c", "q")
    assert code == 0 and out == KEPT.decode(), out
    loud = make_job(tmp_path, JOB.format(preamble=PREAMBLE, kept=KEPT), '[env]\nTPUCTL_TF_PREAMBLE = "1"\n',
                    name="loud")
    code, out, err = cli("submit", str(loud), "-c", "q")
    assert code == 0 and out == (PREAMBLE + KEPT).decode()
