# Copyright (c) mmstats contributors. All rights reserved.
"""The tensors ModuleStatsHook reads: a module's floating-point outputs and
L2 norms per module in a few batched ops."""
from collections import OrderedDict
from typing import List, Sequence

import torch

__all__ = ['floating_tensors', 'SegmentNorms']


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

    The index tensor of a layout (which tensor goes to which segment) is
    cached for the ``max_layouts`` most recent layouts: a model whose set of
    parameters with a gradient changes every iteration (LayerDrop, MoE)
    builds it again instead of growing the cache.

    Args:
        num_segments (int): Number of segments.
        max_layouts (int): Index tensors kept. Defaults to 4.
    """

    def __init__(self, num_segments: int, max_layouts: int = 4) -> None:
        self.num_segments = num_segments
        self.max_layouts = max_layouts
        self._index: 'OrderedDict[tuple, torch.Tensor]' = OrderedDict()

    def __call__(self, tensors: Sequence[torch.Tensor],
                 segments: List[int]) -> torch.Tensor:
        """Per segment, the L2 norm of the elements of its ``tensors``
        (``segments[i]`` is the segment of ``tensors[i]``).

        Squares are accumulated in float64, so a norm is finite for any
        finite float32 elements (gradients still multiplied by a loss
        scale of up to ``2**127`` included).

        Returns:
            Tensor: ``(num_segments, )`` float64 norms on the tensors'
            device (0 for empty segments), without a host sync.
        """
        per_tensor = torch.stack(
            torch._foreach_norm(tensors, 2, dtype=torch.float64))
        device = per_tensor.device
        key = (tuple(segments), device)
        index = self._index.get(key)
        if index is None:
            index = torch.tensor(segments, device=device)
            self._index[key] = index
            if len(self._index) > self.max_layouts:
                self._index.popitem(last=False)
        else:
            self._index.move_to_end(key)
        squares = torch.zeros(
            self.num_segments, dtype=torch.float64, device=device)
        return squares.index_add_(0, index, per_tensor.square()).sqrt_()
