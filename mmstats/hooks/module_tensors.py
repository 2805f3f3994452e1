# Copyright (c) mmstats contributors. All rights reserved.
"""The tensors ModuleStatsHook reads: a module's floating-point outputs,
norms per module in one batched op, and the AMP loss scale still in the
gradients."""
from typing import Dict, List, Optional, Sequence

import torch
from mmengine.optim import OptimWrapper

__all__ = ['amp_grad_scale', 'floating_tensors', 'SegmentNorms']


def amp_grad_scale(optim_wrapper: OptimWrapper) -> Optional[torch.Tensor]:
    """The loss scale the gradients are still multiplied by, or None.

    ``AmpOptimWrapper.backward`` scales the loss by its ``loss_scaler`` (a
    ``GradScaler``); its ``step`` unscales the gradients in place only if
    ``clip_grad`` is set (``unscale_``), else inside ``scaler.step``. The
    scale is read as a device tensor (no host sync).
    """
    scaler = getattr(optim_wrapper, 'loss_scaler', None)
    if scaler is None or not scaler.is_enabled():
        return None
    state = scaler._per_optimizer_states.get(id(optim_wrapper.optimizer))
    if state is not None and state['stage'].name == 'UNSCALED':
        return None  # the user already called unscale_ in this step
    return scaler._get_scale_async()


def floating_tensors(output) -> List[torch.Tensor]:
    """The floating-point tensors of a module's output (tensor, tuple, list
    or dict, nested)."""
    if isinstance(output, torch.Tensor):
        return [output] if output.is_floating_point() else []
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in floating_tensors(item)]
    return []


class SegmentNorms:
    """L2 norms of groups ("segments") of tensors in a few batched ops.

    Args:
        num_segments (int): Number of segments.
    """

    def __init__(self, num_segments: int) -> None:
        self.num_segments = num_segments
        self._index: Dict[tuple, torch.Tensor] = {}

    def __call__(self, tensors: Sequence[torch.Tensor],
                 segments: List[int]) -> torch.Tensor:
        """Per segment, the L2 norm of the elements of its ``tensors``
        (``segments[i]`` is the segment of ``tensors[i]``).

        Returns:
            Tensor: ``(num_segments, )`` float64 norms on the tensors'
            device (0 for empty segments), without a host sync; the index
            tensor is built once per layout.
        """
        per_tensor = torch.stack(torch._foreach_norm(tensors)).double()
        device = per_tensor.device
        key = (tuple(segments), device)
        index = self._index.get(key)
        if index is None:
            index = torch.tensor(segments, device=device)
            self._index[key] = index
        squares = torch.zeros(
            self.num_segments, dtype=torch.float64, device=device)
        return squares.index_add_(0, index, per_tensor.square()).sqrt_()
