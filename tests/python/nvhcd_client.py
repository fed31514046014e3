"""An NVRx-style node health-check client: the call NVIDIA Resiliency Extension's ft_launcher
makes before rendezvous (nvhcd.HealthCheckService/RunHealthCheck with args ["--no-slurm"] on
unix://SOCKET), through grpcio with stubs generated from the restated proto. Prints the
answer as JSON.

    python nvhcd_client.py PROTO_ROOT SOCKET
"""
import importlib
import json
import sys
import tempfile

import grpc
from grpc_tools import protoc

proto_root, socket = sys.argv[1], sys.argv[2]
generated = tempfile.mkdtemp()
if protoc.main(["protoc", f"-I{proto_root}", f"--python_out={generated}",
                f"--grpc_python_out={generated}", "nvhcd/nvhcd.proto"]) != 0:
    sys.exit("protoc could not compile nvhcd/nvhcd.proto")
sys.path.insert(0, generated)
messages = importlib.import_module("nvhcd.nvhcd_pb2")
service = importlib.import_module("nvhcd.nvhcd_pb2_grpc")

with grpc.insecure_channel(f"unix://{socket}") as channel:
    stub = service.HealthCheckServiceStub(channel)
    answer = stub.RunHealthCheck(messages.HealthCheckRequest(args=["--no-slurm"]), timeout=5)
print(json.dumps({
    "success": answer.success,
    "exit_code": answer.exit_code,
    "output": json.loads(answer.output or "{}"),
    "error": answer.error,
}))
