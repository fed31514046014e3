"""A real torch process that holds the (fake) GPU and handles no signal at all: the agent must
not signal it (SIGUSR1's default action would kill it) and must say why.

    python idle_worker.py OUT_DIR
"""
import os
import sys
import time

import torch

out = sys.argv[1]
gpu = open(os.environ["FAKE_GPU_DEVICE"])
weights = torch.zeros(16)
open(os.path.join(out, "idle.ready"), "w").close()
while not os.path.exists(os.path.join(out, "stop")):
    weights += 1
    time.sleep(0.05)
