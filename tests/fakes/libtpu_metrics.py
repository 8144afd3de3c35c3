"""A fake of libtpu's runtime metrics service (tpu.monitoring.runtime.RuntimeMetricService), built from tpu-info's
own proto (tpu_info/proto/tpu_metric_service_pb2*.py, tpu-info 0.14.2): what tpu-info's get_chip_usage asks a TPU VM
while a program holds the TPU.

What it answers, and why:
- GetRuntimeMetric(metric_name) returns a MetricResponse whose TPUMetric holds one Metric per device, each with an
  Attribute whose value.int_attr is the device id (tpu_info/metrics.py sorts on `m.attribute.value.int_attr`);
  duty cycle as gauge.as_double, HBM bytes as gauge.as_int (metrics.py reads exactly those fields).
- An unknown metric name: NOT_FOUND (tpu_info/cli_helper.py treats NOT_FOUND and UNAVAILABLE alike as "metrics
  unavailable", so either is a plausible answer for a name this libtpu does not export).
- It listens with grpc.local_server_credentials, as the client dials with grpc.local_channel_credentials
  (metrics.py: `grpc.secure_channel(addr, grpc.local_channel_credentials())`), on an ephemeral port (or the one
  a test reserved for it, to start it after an agent that was told the address).
"""
from __future__ import annotations

from concurrent import futures

import grpc
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

DUTY = "tpu.runtime.tensorcore.dutycycle.percent"
USED = "tpu.runtime.hbm.memory.usage.bytes"
TOTAL = "tpu.runtime.hbm.memory.total.bytes"


class FakeLibtpuMetrics(pb_grpc.RuntimeMetricServiceServicer):
    def __init__(self, chips: int = 4, port: int = 0) -> None:
        self.duty = [50.0] * chips
        self.used = [8 * 2 ** 30] * chips
        self.total = [16 * 2 ** 30] * chips
        self.calls: list[str] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RuntimeMetricServiceServicer_to_server(self, self.server)
        self.port = self.server.add_secure_port(f"localhost:{port}", grpc.local_server_credentials())
        self.server.start()

    @property
    def addr(self) -> str:
        return f"localhost:{self.port}"

    def GetRuntimeMetric(self, request: pb.MetricRequest, context: grpc.ServicerContext) -> pb.MetricResponse:
        self.calls.append(request.metric_name)
        values = {DUTY: self.duty, USED: self.used, TOTAL: self.total}.get(request.metric_name)
        if values is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"metric {request.metric_name} not found")
        metrics = []
        for i, v in enumerate(values):
            gauge = pb.Gauge(as_double=v) if request.metric_name == DUTY else pb.Gauge(as_int=int(v))
            metrics.append(pb.Metric(attribute=pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=i)),
                                     gauge=gauge))
        return pb.MetricResponse(metric=pb.TPUMetric(name=request.metric_name, metrics=metrics))

    def stop(self) -> None:
        self.server.stop(0)
