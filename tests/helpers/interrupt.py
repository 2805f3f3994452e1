"""A hook that ends training after a given epoch, as a preempted job ends
after its checkpoint: the resume tests' first part runs the same config
(same ``max_epochs``, same schedule) as the uninterrupted run (imported by
their configs through ``custom_imports``)."""
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class InterruptAfterEpochHook(Hook):
    """Stop the ``EpochBasedTrainLoop`` after epoch ``epoch`` (its
    checkpoint and validation still run)."""

    priority = 'LOWEST'  # after CheckpointHook

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def after_train_epoch(self, runner) -> None:
        if runner.epoch + 1 == self.epoch:
            runner.train_loop.stop_training = True
