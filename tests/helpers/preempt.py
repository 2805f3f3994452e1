"""Hooks that stop a launched run the ways a cluster does (imported by the
preemption tests' configs through ``custom_imports``): a signal to one
rank's process, in training or in a validation loop, and a SIGKILL while a
checkpoint is being written."""
import os
import signal

from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class SignalRankHook(Hook):
    """``signal`` to this process on rank ``rank`` only: after training
    iteration ``at_iter`` (1-based, global), or at the first iteration of
    this launch's validation number ``in_val``."""

    priority = 'HIGHEST'  # before CheckpointHook looks for a signal

    def __init__(self, rank=1, at_iter=None, in_val=None, sig='SIGTERM'):
        self.rank, self.at_iter, self.in_val = rank, at_iter, in_val
        self.sig = getattr(signal, sig)
        self.vals = 0

    def _send(self):
        if get_rank() == self.rank:
            os.kill(os.getpid(), self.sig)

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        if self.at_iter == runner.iter + 1:
            self._send()

    def before_val(self, runner):
        self.vals += 1

    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if self.in_val == self.vals and batch_idx == 0:
            self._send()


@HOOKS.register_module()
class KillDuringSaveHook(Hook):
    """SIGKILL to every process that starts writing the checkpoint of epoch
    ``epoch`` (1-based): the save never finishes."""

    def __init__(self, epoch):
        self.epoch = epoch

    def before_save_checkpoint(self, runner, checkpoint):
        if runner.epoch + 1 == self.epoch:
            os.kill(os.getpid(), signal.SIGKILL)
