"""TensorFlow's start-up preamble, kept out of a run's log: absl's note that logging is not initialised, the CPU
feature and oneDNN notices, the CUDA/cuDNN/cuFFT/cuBLAS registration noise, and on a machine without a GPU the
`failed call to cuInit` error. Only those exact messages go: any other line (TF's real errors and warnings
included) is shipped byte for byte. A job that wants them sets TPUCTL_TF_PREAMBLE=1 in its [env].

The filter sees the output as it comes, in arbitrary pieces; a piece that ends inside a line is held only while
that line could still turn out to be preamble (it starts like a glog or absl line), so progress bars drawn with \\r
and prompts without a newline are not delayed."""
from __future__ import annotations

import re

_ALWAYS = [
    rb"Unable to register cu(DNN|FFT|BLAS) factory",
    rb"This TensorFlow binary is optimized to use available CPU instructions",
    rb"oneDNN custom operations are on",
    rb"TF-TRT Warning: Could not find TensorRT",
    rb"[Cc]omputation placer already registered",
    rb"Attempting to register factory for plugin",
]
_NO_GPU = [   # errors only on a machine that has no GPU to find
    rb"Could not find cuda drivers on your machine",
    rb"failed call to cuInit",
    rb"cuda_diagnostics\.cc",
    rb"kernel driver does not appear to be running on this host",
    rb"retrieving CUDA diagnostic information for host",
    rb"hostname: ",
]
_GLOG = re.compile(rb"^[IWEF]\d{4} [\d:.]+ +\d+ [\w./-]+:\d+\] (.*)$")
_ABSL = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_CPU_HINT = re.compile(rb"^To enable the following instructions: .* rebuild TensorFlow with the appropriate "
                       rb"compiler flags\.$")
# A line that has begun like one of those: held until its newline.
_MAYBE = re.compile(rb"^(?:[IWEF]\d{0,4}(?: [\d:.]*(?: +\d*(?: [\w./-]*(?::\d*(?:\].*)?)?)?)?)?|"
                    rb"W(?:A(?:R(?:N(?:I(?:N(?:G(?::.*)?)?)?)?)?)?)?|T(?:o(?: .*)?)?)$", re.S)
_HOLD_AT_MOST = 4096


class PreambleFilter:
    def __init__(self, gpu: bool) -> None:
        self.messages = re.compile(b"|".join(_ALWAYS + ([] if gpu else _NO_GPU)))
        self.held = b""

    def _noise(self, line: bytes) -> bool:
        body = line.rstrip(b"\r\n")
        if body == _ABSL or _CPU_HINT.match(body):
            return True
        m = _GLOG.match(body)
        return bool(m and self.messages.search(m.group(1)))

    def feed(self, data: bytes) -> bytes:
        """What of the output so far can be shipped now."""
        data = self.held + data
        out = bytearray()
        start = 0
        while (nl := data.find(b"\n", start)) >= 0:
            line = data[start:nl + 1]
            if not self._noise(line):
                out += line
            start = nl + 1
        tail = data[start:]
        if tail and (len(tail) > _HOLD_AT_MOST or b"\r" in tail or not _MAYBE.match(tail)):
            out += tail
            tail = b""
        self.held = tail
        return bytes(out)

    def end(self) -> bytes:
        """The output ended: whatever is held (a last line without its newline) goes, unless it is preamble."""
        tail, self.held = self.held, b""
        return b"" if tail and self._noise(tail) else tail
