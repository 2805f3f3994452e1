# Copyright (c) mmstats contributors. All rights reserved.
"""The collectives of the cross-rank protocol (:mod:`.protocol`), behind one
injectable object."""
from typing import Any, List, Optional

import numpy as np
import torch
import torch.distributed as dist
from mmengine.dist import get_comm_device, get_rank, get_world_size

__all__ = ['ReduceFns']


class ReduceFns:
    """The collectives of the protocol, on host float64 arrays.

    Injectable: tests pass an object with the same methods that simulates
    several ranks in one process. Every method is a collective when the
    group has more than one rank (a no-op otherwise).

    Args:
        group (ProcessGroup, optional): Process group. Defaults to None
            (the default group).
    """

    def __init__(self, group: Optional[Any] = None) -> None:
        self.group = group

    @property
    def world_size(self) -> int:
        return get_world_size(self.group)

    @property
    def rank(self) -> int:
        return get_rank(self.group)

    def _all_reduce(self, x: np.ndarray, op: Any) -> np.ndarray:
        if self.world_size == 1:
            return x
        tensor = torch.from_numpy(x).to(get_comm_device(self.group))
        dist.all_reduce(tensor, op=op, group=self.group)
        return tensor.cpu().numpy()

    def all_reduce_sum(self, x: np.ndarray) -> np.ndarray:
        """Elementwise sum over ranks (identical bits on every rank)."""
        return self._all_reduce(x, dist.ReduceOp.SUM)

    def all_reduce_max(self, x: np.ndarray) -> np.ndarray:
        """Elementwise maximum over ranks."""
        return self._all_reduce(x, dist.ReduceOp.MAX)

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        """Every rank's 1-d ``x`` (the same length on every rank), stacked
        in rank order: ``(world_size, len(x))``."""
        if self.world_size == 1:
            return x[None]
        tensor = torch.from_numpy(x).to(get_comm_device(self.group))
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(out, tensor, group=self.group)
        return torch.stack(out).cpu().numpy()

    def all_gather_object(self, obj: Any) -> List[Any]:
        """Every rank's ``obj``, indexed by rank."""
        if self.world_size == 1:
            return [obj]
        out: List[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out
