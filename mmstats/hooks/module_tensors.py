# Copyright (c) mmstats contributors. All rights reserved.
"""The tensors ModuleStatsHook reads: a module's floating-point outputs."""
from typing import List

import torch

__all__ = ['floating_tensors']


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
