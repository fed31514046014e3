#!/usr/bin/env python3
"""A plain-Python training loop that checkpoints when gpu-agent says the instance is ending.

gpu-agent sends SIGUSR1 (configurable) to every process that holds a GPU *and* handles the
signal, as soon as a Spot notice, scheduled maintenance, a Capacity Block's end or a host
shutdown is known. The handler only sets a flag: the checkpoint is written at the next step
boundary, where the model and optimizer state are consistent.

Run it (no GPU needed for the demo):  python3 examples/trainer.py --steps 1000
Test the handler without a real notice:  sudo gpu-agent drill checkpoint
"""
import argparse
import json
import os
import signal
import time

checkpoint_requested = False


def request_checkpoint(signum, frame):
    # Signal handlers must be quick and safe: record the request, act on it in the loop.
    global checkpoint_requested
    checkpoint_requested = True


def save_checkpoint(path, step, state):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "state": state}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # atomic: a checkpoint is whole or absent
    print(f"checkpoint written at step {step}: {path}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--checkpoint", default="checkpoint.json")
    parser.add_argument("--exit-after-checkpoint", action="store_true",
                        help="stop after the checkpoint (the instance is going away)")
    args = parser.parse_args()

    signal.signal(signal.SIGUSR1, request_checkpoint)

    step, state = 0, {"loss": 1.0}
    if os.path.exists(args.checkpoint):
        with open(args.checkpoint) as f:
            saved = json.load(f)
        step, state = saved["step"], saved["state"]
        print(f"resumed from step {step}", flush=True)

    global checkpoint_requested
    while step < args.steps:
        time.sleep(0.05)  # one training step
        state["loss"] *= 0.999
        step += 1
        if checkpoint_requested:
            save_checkpoint(args.checkpoint, step, state)
            checkpoint_requested = False
            if args.exit_after_checkpoint:
                return
    save_checkpoint(args.checkpoint, step, state)


if __name__ == "__main__":
    main()
