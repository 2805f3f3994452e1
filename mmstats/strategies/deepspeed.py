# Copyright (c) mmstats contributors. All rights reserved.
"""DeepSpeedStrategy: mmengine's, with checkpoints that evaluate and hooks
that see them."""
from typing import Any, Callable, Optional

from mmengine._strategy import DeepSpeedStrategy as MMEngineDeepSpeedStrategy

from mmstats.registry import STRATEGIES
from .consolidate import read_deepspeed_checkpoint

__all__ = ['DeepSpeedStrategy']


@STRATEGIES.register_module()
class DeepSpeedStrategy(MMEngineDeepSpeedStrategy):
    """mmengine's ``DeepSpeedStrategy`` whose checkpoints evaluate under
    ZeRO-3 and whose hooks see them (``docs/checkpoints.md``).

    Three things differ from mmengine 0.10.7's:

    - **Loading weights without an optimizer** (``tools/test.py``,
      ``load_from``) under ZeRO-3: DeepSpeed gathers the partitions with
      ``zero_to_fp32`` but without the checkpoint's tag, and looks for a
      ``latest`` file mmengine never writes (``ValueError: Unable to find
      'latest' file``). Here the gathered fp32 state dict of the named
      checkpoint (:func:`read_deepspeed_checkpoint`, any number of
      processes) is loaded into the partitioned model.
    - **Evaluation under ZeRO-1/2** (no optimizer): DeepSpeed refuses to
      build the engine ("zero stage 1 requires an optimizer"); as these
      stages keep whole weights on every rank, the engine is built
      without ZeRO and loads the checkpoint's weights.
    - **Hooks' checkpoint callbacks**: mmengine's strategy ignores them, so
      ``before_save_checkpoint`` / ``after_load_checkpoint`` never ran
      (PreciseBNHook's state, the message hub's once-per-line keys). Here
      they get the checkpoint's client state.

    Every argument is mmengine's ``DeepSpeedStrategy``'s.

    Example:
        >>> strategy = dict(type='mmstats.DeepSpeedStrategy',
        ...                 zero_optimization=dict(stage=3))
        >>> STRATEGIES.get('DeepSpeedStrategy') is DeepSpeedStrategy
        True
    """

    def _wrap_model(self, model: Any) -> Any:
        """mmengine's, with DeepSpeed's micro batch size set as
        ``FlexibleRunner`` sets it for a strategy named exactly
        ``'DeepSpeedStrategy'``: the training loader's batch size, else 1.
        """
        self.config.setdefault(
            'train_micro_batch_size_per_gpu',
            self.dispatch_kwargs.get('train_micro_batch_size_per_gpu', 1))
        zero = self.config.get('zero_optimization') or {}
        if not hasattr(self, 'optim_wrapper') and zero.get('stage') in (1, 2):
            # evaluation: DeepSpeed refuses ZeRO-1/2 without an optimizer,
            # and they partition nothing but optimizer state and gradients
            self.config['zero_optimization'] = dict(zero, stage=0)
        return super()._wrap_model(model)

    def save_checkpoint(self,
                        filename: str,
                        *,
                        save_optimizer: bool = True,
                        save_param_scheduler: bool = True,
                        extra_ckpt: Optional[dict] = None,
                        callback: Optional[Callable] = None) -> None:
        """mmengine's save, after ``callback`` saw the client state."""
        extra_ckpt = dict(extra_ckpt or {})
        extra_ckpt.setdefault('meta', {})
        if callback is not None:
            callback(extra_ckpt)
        super().save_checkpoint(
            filename,
            save_optimizer=save_optimizer,
            save_param_scheduler=save_param_scheduler,
            extra_ckpt=extra_ckpt)

    def load_checkpoint(self,
                        filename: str,
                        *,
                        map_location: Any = 'cpu',
                        strict: bool = False,
                        revise_keys: list = [(r'^module.', '')],
                        callback: Optional[Callable] = None) -> dict:
        """The weights of ``filename`` (also a ZeRO-3 checkpoint without an
        optimizer, on any number of processes)."""
        if self.model.zero_optimization_partition_weights():
            checkpoint = self._load_zero3_weights(filename, strict)
        else:
            checkpoint = super().load_checkpoint(filename)
        if callback is not None:
            callback(checkpoint)
        return checkpoint

    def resume(self,
               filename: str,
               *,
               resume_optimizer: bool = True,
               resume_param_scheduler: bool = True,
               map_location: Any = 'default',
               callback: Optional[Callable] = None) -> dict:
        """mmengine's resume, then ``callback`` with the client state."""
        checkpoint = super().resume(
            filename,
            resume_optimizer=resume_optimizer,
            resume_param_scheduler=resume_param_scheduler)
        if callback is not None:
            callback(checkpoint)
        return checkpoint

    def _load_zero3_weights(self, filename: str, strict: bool) -> dict:
        import deepspeed
        self.logger.info(f'Load checkpoint from {filename}')
        checkpoint = read_deepspeed_checkpoint(filename)
        state_dict = checkpoint.pop('state_dict')
        module = self.model.module
        # every rank loads the same values; rank 0's are partitioned on exit
        with deepspeed.zero.GatheredParameters(
                list(module.parameters()), modifier_rank=0):
            result = module.load_state_dict(state_dict, strict=strict)
        if result.missing_keys or result.unexpected_keys:
            self.logger.warning(
                f'missing keys in source state_dict: {result.missing_keys}; '
                f'unexpected keys: {result.unexpected_keys}')
        return checkpoint
