#!/usr/bin/env python3
"""A plain-Python training loop that checkpoints when gpu-agent says the instance is ending.

gpu-agent sends SIGUSR1 (configurable) to every process that holds a GPU *and* handles the
signal, as soon as a Spot notice, scheduled maintenance, a Capacity Block's end or a host
shutdown is known. The handler only sets a flag: the checkpoint is written at the next step
boundary, where the model and optimizer state are consistent.

It also checks gpu-agent's notice file each step (/run/gpu-agent/notice.json, present only
while an ending is pending): a job that polls (rank 0 only, Ray, Metaflow-style loops) needs
no signal handler at all. Either path checkpoints once: the file names the ending by id.

After the checkpoint it tells gpu-agent: "done" (here, the checkpoint's path) in
/run/gpu-agent/ack/<its pid>, which `gpu-agent status` and the pod's Events count as
confirmed. In Kubernetes, choose the signal on the pod:
`gpu-agent.io/checkpoint-signal: SIGUSR1`.

Run it (no GPU needed for the demo):  python3 examples/trainer.py --steps 1000
Test the handler without a real notice:  sudo gpu-agent drill checkpoint
"""
import argparse
import json
import os
import signal
import time

checkpoint_requested = False
NOTICE_FILE = "/run/gpu-agent/notice.json"
ACK_DIR = "/run/gpu-agent/ack"


def pending_ending(path=NOTICE_FILE):
    """The ending gpu-agent has acted on, or None: {"id", "kind", "deadline_unix", ...}."""
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, PermissionError, json.JSONDecodeError):
        # Absent: nothing pending. Unreadable (a permission error: the agent's directory is
        # not shared with this container, or a stricter umask): the signal still comes.
        return None


def acknowledge(path, ack_dir=ACK_DIR):
    """Tell gpu-agent the checkpoint is taken (it counts a confirmation); best effort."""
    try:
        with open(os.path.join(ack_dir, str(os.getpid())), "w") as f:
            f.write(path + "\n")
    except OSError as e:
        print(f"cannot acknowledge the checkpoint to gpu-agent: {e}", flush=True)


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
    parser.add_argument("--notice-file", default=NOTICE_FILE)
    args = parser.parse_args()

    signal.signal(signal.SIGUSR1, request_checkpoint)

    step, state = 0, {"loss": 1.0}
    if os.path.exists(args.checkpoint):
        with open(args.checkpoint) as f:
            saved = json.load(f)
        step, state = saved["step"], saved["state"]
        print(f"resumed from step {step}", flush=True)

    global checkpoint_requested
    handled_ending = None
    while step < args.steps:
        time.sleep(0.05)  # one training step
        state["loss"] *= 0.999
        step += 1
        # Polling path: the same ending (same id) is acted on once.
        ending = pending_ending(args.notice_file)
        if ending and ending["id"] != handled_ending:
            handled_ending = ending["id"]
            left = ending["deadline_unix"] - time.time()
            print(f"{ending['kind']} ending in {left:.0f} s: checkpointing", flush=True)
            checkpoint_requested = True
        if checkpoint_requested:
            save_checkpoint(args.checkpoint, step, state)
            acknowledge(os.path.abspath(args.checkpoint))
            checkpoint_requested = False
            if args.exit_after_checkpoint:
                return
    save_checkpoint(args.checkpoint, step, state)


if __name__ == "__main__":
    main()
