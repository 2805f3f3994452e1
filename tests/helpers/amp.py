"""mmengine's AmpOptimWrapper on CPU for Runner tests: bf16 autocast and
``torch.amp.GradScaler('cpu')`` (mmengine's wrapper is CUDA-only)."""
import torch
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS


@OPTIM_WRAPPERS.register_module(force=True)
class CpuBf16AmpOptimWrapper(AmpOptimWrapper):
    """``AmpOptimWrapper`` with bf16 autocast on CPU.

    Args:
        init_scale (float): The GradScaler's initial loss scale.
        **kwargs: ``OptimWrapper``'s arguments.
    """

    def __init__(self, init_scale: float, **kwargs) -> None:
        OptimWrapper.__init__(self, **kwargs)
        self._scale_update_param = None
        self.loss_scaler = torch.amp.GradScaler('cpu', init_scale=init_scale)
        self.cast_dtype = torch.bfloat16
