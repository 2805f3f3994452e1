# Copyright (c) mmstats contributors. All rights reserved.
"""The norms of chosen modules (:class:`ModuleNorms`): gradient, weight and
update norms and the optimizer-state norms and cosines, from the sums of
squares that :class:`~.steps.StepProbe` keeps of each rank's local parts
of the parameters.

A segment is one chosen module (its parameters, recursively) or, last,
all the parameters (the total gradient norm). At a publication the step
probes' sums, their optimizer-state sums and the weights' sums of squares
go into ONE float64 payload; a sharded model SUM-reduces it over the ranks
in one ``all_reduce`` (every rank, the same shape), so the norms are those
of the full tensors (``docs/sharding.md``); then it is unpacked into named
norms and cosines.
"""
from typing import Any, Dict, List, Sequence, Tuple

import torch
from mmengine.dist import all_reduce
from torch import Tensor, nn

from mmstats.sharding import ParamLayout, sum_squares
from .optimizer_state import MOMENT_ROWS, moment_norms
from .steps import BEFORE, GRAD, UPDATE, StepProbe

__all__ = ['ModuleNorms']


class ModuleNorms:
    """The segments of the modules ``modules`` over ``layout``, and their
    norms at a publication (:meth:`collect`).

    Args:
        model (nn.Module): The user's module (its first parameter's device
            holds the sums; the default device without parameters).
        layout (ParamLayout): This rank's parts of every parameter.
        modules (dict[str, nn.Module]): The chosen modules by name.
        prefix (str): Names are ``<prefix>/<module>/<stat>``.
        stats (Sequence[str]): Which of ``grad_norm``, ``update_ratio``
            and ``weight_norm`` to give.

    Attributes:
        parts (list): ``(segments, part)``: every local parameter part, with
            the segments it counts in (its modules', then the total), what
            :class:`~.steps.StepProbe` takes.
        num_segments (int): ``len(modules) + 1``.
        device (torch.device): Where the sums live.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from mmstats.sharding import ParamLayout
        >>> net = nn.Sequential(nn.Linear(2, 2, bias=False), nn.ReLU())
        >>> _ = net[0].weight.data.fill_(2.)
        >>> norms = ModuleNorms(net, ParamLayout(net), {'0': net[0]},
        ...                     'modules', ['weight_norm'])
        >>> [(name, float(value)) for name, value in norms.collect([])]
        [('modules/0/weight_norm', 4.0)]
    """

    def __init__(self, model: nn.Module, layout: ParamLayout,
                 modules: Dict[str, nn.Module], prefix: str,
                 stats: Sequence[str]) -> None:
        self.names = list(modules)
        self.prefix = prefix
        self.stats = tuple(stats)
        self.sharded = layout.sharded
        self.device = next(model.parameters(), torch.zeros(0)).device
        owners = layout.owners(list(modules.values()))
        # (segments, part) of the parameters in the modules
        self.weights = [(tuple(segments), layout.parts[i])
                        for i, segments in owners.items()]
        total = len(self.names)
        self.parts = [(tuple(owners.get(i, ())) + (total, ), part)
                      for i, part in enumerate(layout.parts)]
        self.num_segments = total + 1

    def collect(self, probes: Sequence[StepProbe]) -> List[Tuple[str, Any]]:
        """The norms of the full tensors: the local sums of squares of the
        probes' armed steps and of the weights, SUM-reduced over the ranks
        in one collective when the model is sharded (all ranks must call
        this together then). Takes (and forgets) the probes' sums.

        Returns:
            list[tuple[str, Any]]: ``(name, value)`` in publication order
            (a name twice where a module's parameters are split over two
            optimizers); values are float64 0-d tensors, cosines and
            optimizer-state norms floats.
        """
        taken = [probe.take() for probe in probes]
        rows = [squares.flatten() for squares, _ in taken]
        moments = [
            probe.take_moments() for probe in probes if probe.optimizer_state
        ]
        rows += [sums.flatten() for sums in moments]
        if 'weight_norm' in self.stats and self.weights:
            rows.append(
                sum_squares([part.weight() for _, part in self.weights],
                            [segments for segments, _ in self.weights],
                            len(self.names), self.device))
        if not rows:
            return []
        payload = torch.cat(rows)
        if self.sharded:
            all_reduce(payload, op='sum')  # every rank, same shape
        found = []
        size = 3 * self.num_segments
        if moments:
            start = len(taken) * size
            stop = start + len(moments) * len(MOMENT_ROWS) * self.num_segments
            found += moment_norms(payload[start:stop].tolist(), len(moments),
                                  self.names, self.prefix)
            payload = torch.cat([payload[:start], payload[stop:]])
        norms = payload.sqrt_()
        for index, (_, present) in enumerate(taken):
            found += self._step_norms(
                norms[index * size:(index + 1) * size].view(3, -1), present,
                probes[index].key)
        if 'weight_norm' in self.stats and self.weights:
            weights = norms[len(taken) * size:]
            for segment in sorted(
                {s
                 for segments, _ in self.weights
                 for s in segments}):
                found.append(
                    (f'{self.prefix}/{self.names[segment]}/weight_norm',
                     weights[segment]))
        return found

    def _step_norms(self, squares: Tensor, present: List[int],
                    key: str) -> List[Tuple[str, Tensor]]:
        """The gradient norms and update ratios of one probe's step (rows
        ``GRAD``, ``UPDATE``, ``BEFORE`` of ``squares``, square-rooted) for
        the segments that had a gradient; the total gradient norm is
        ``<prefix>/total_grad_norm`` (``.<key>`` in an
        ``OptimWrapperDict``)."""
        found = []
        for segment in present:
            if segment == len(self.names):
                if 'grad_norm' in self.stats:
                    found.append(
                        (f'{self.prefix}/total_grad_norm' +
                         (f'.{key}' if key else ''), squares[GRAD, segment]))
                continue
            name = f'{self.prefix}/{self.names[segment]}'
            if 'grad_norm' in self.stats:
                found.append((f'{name}/grad_norm', squares[GRAD, segment]))
            if 'update_ratio' in self.stats:
                found.append(
                    (f'{name}/update_ratio',
                     squares[UPDATE, segment] / squares[BEFORE, segment]))
        return found
