"""A real PyTorch Lightning fit for the checkpoint tests: a tiny model on CPU, with a callback
that saves a checkpoint when the signal its pod declares arrives and acknowledges it.

    python fit_lightning.py OUT_DIR

Environment: CHECKPOINT_SIGNAL (default SIGUSR2), FAKE_GPU_DEVICE, GPU_AGENT_ACK_DIR (as in
train_ddp.py). The fit ends when OUT_DIR/stop appears.
"""
import os
import signal
import sys
import time

import pytorch_lightning as pl
import torch

out = sys.argv[1]
checkpoint_signal = getattr(signal, os.environ.get("CHECKPOINT_SIGNAL", "SIGUSR2"))
ack_dir = os.environ.get("GPU_AGENT_ACK_DIR", "/run/gpu-agent/ack")
gpu = open(os.environ["FAKE_GPU_DEVICE"])


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(16, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class CheckpointOnSignal(pl.Callback):
    """Save (and acknowledge) a checkpoint after the step in which the signal arrived."""

    def __init__(self):
        self.requested = False

    def on_train_start(self, trainer, pl_module):
        signal.signal(checkpoint_signal, lambda signum, frame: setattr(self, "requested", True))
        open(os.path.join(out, "fit.ready"), "w").close()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.requested:
            self.requested = False
            path = os.path.join(out, f"lightning-step{trainer.global_step}.ckpt")
            trainer.save_checkpoint(path)
            try:
                os.makedirs(ack_dir, exist_ok=True)
                with open(os.path.join(ack_dir, str(os.getpid())), "w") as ack:
                    ack.write(path + "\n")
            except OSError as e:  # no ack directory: the agent counts the exit instead
                print(f"cannot acknowledge the checkpoint: {e}", file=sys.stderr)
        if os.path.exists(os.path.join(out, "stop")):
            trainer.should_stop = True
        time.sleep(0.02)


data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 16)), batch_size=8)
trainer = pl.Trainer(
    accelerator="cpu",
    devices=1,
    max_epochs=-1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[CheckpointOnSignal()],
)
trainer.fit(Tiny(), data)
