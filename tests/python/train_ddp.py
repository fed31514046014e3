"""A real torchrun job for the checkpoint tests: gloo workers (CPU) that save with torch.save
when the signal their pod declares arrives, acknowledge it, and keep training.

    torchrun --standalone --nproc-per-node 2 train_ddp.py OUT_DIR

Environment: CHECKPOINT_SIGNAL (default SIGTERM), FAKE_GPU_DEVICE (a file held open, standing
in for the CUDA context by which the agent finds GPU processes), GPU_AGENT_ACK_DIR (default
/run/gpu-agent/ack). The job ends, cleanly, when OUT_DIR/stop appears.
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

out = sys.argv[1]
checkpoint_signal = getattr(signal, os.environ.get("CHECKPOINT_SIGNAL", "SIGTERM"))
ack_dir = os.environ.get("GPU_AGENT_ACK_DIR", "/run/gpu-agent/ack")

dist.init_process_group("gloo")
rank = dist.get_rank()
gpu = open(os.environ["FAKE_GPU_DEVICE"])
torch.manual_seed(rank)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
requested = False


def on_signal(signum, frame):
    # Only note it: the save happens between steps, where the state is consistent.
    global requested
    requested = True


signal.signal(checkpoint_signal, on_signal)
open(os.path.join(out, f"rank{rank}.ready"), "w").close()

step = 0
while True:
    loss = model(torch.randn(8, 16)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    if requested:
        requested = False
        path = os.path.join(out, f"rank{rank}-step{step}.pt")
        torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
        try:
            with open(os.path.join(ack_dir, str(os.getpid())), "w") as ack:
                ack.write(path + "\n")
        except OSError as e:  # no ack directory: the agent counts the exit instead
            print(f"rank {rank}: cannot acknowledge the checkpoint: {e}", file=sys.stderr)
    # Every rank stops at the same step.
    stop = torch.tensor([int(os.path.exists(os.path.join(out, "stop")))])
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    if stop.item():
        break
    time.sleep(0.05)
# Both ranks leave the loop after the same all_reduce; the barrier makes every rank finish
# its last collective before any tears the group down. Even then, about one run in ten here
# (2026-12-07 at 6268d62, torch 2.15, under build load) aborted after destroy_process_group
# returned on both ranks: "terminate called without an active exception" (SIGABRT) from a
# C++ thread still joinable when the interpreter's exit ran the static destructors, with no
# signal and no agent involved. Each rank therefore leaves without the interpreter's teardown, once its
# output is flushed (torch.save has closed its checkpoints).
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
