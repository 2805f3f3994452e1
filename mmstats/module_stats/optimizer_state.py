# Copyright (c) mmstats contributors. All rights reserved.
"""Optimizer-state sums: the norms of the optimizer's moments and their
cosines with the gradient, read right after the step
(``docs/optimizer_state.md``).

Per segment (a module, or all parameters) :func:`moment_sums` adds up, over
the local parts of the parameters that had a gradient and keep the state,
the ``MOMENT_ROWS``: for a first moment ``m`` (Adam's ``exp_avg``, SGD's
``momentum_buffer``) the sums of ``m**2``, ``grad * m`` (formed in float64:
:func:`float64_dots`) and ``grad**2`` and the number of parts keeping it;
for a second moment ``v`` (``exp_avg_sq``, never negative) the sum of ``v``
and that number. Summed over the ranks, they give the norms and cosines of
the full tensors (:func:`moment_norms`).
"""
import math
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import torch
from torch import Tensor

from mmstats.sharding import ParamPart, segment_sum, sum_squares
from mmstats.utils.torch_compat import foreach_norm

__all__ = [
    'FIRST_MOMENTS', 'SECOND_MOMENTS', 'MOMENT_ROWS', 'moment_sums',
    'moment_norms', 'float64_dots'
]

#: optimizer states read with ``optimizer_state=True``
FIRST_MOMENTS = ('exp_avg', 'momentum_buffer')  # norm, cosine with the grad
SECOND_MOMENTS = ('exp_avg_sq', )  # sqrt of the sum: ||sqrt(v)||
# rows of moment_sums(): per first moment m, the sums of m**2, of
# grad * m, of grad**2 and the number of parameter parts keeping m; per
# second moment v, the sum of v and that number
MOMENT_ROWS = tuple(f'{state}:{row}' for state in FIRST_MOMENTS
                    for row in ('squares', 'dot', 'grad_squares', 'count')) + \
    tuple(f'{state}:{row}' for state in SECOND_MOMENTS
          for row in ('sum', 'count'))


def moment_sums(parts: Sequence[Tuple[Tuple[int, ...], ParamPart]],
                states: Mapping[Any, Dict[str, Any]], num_segments: int,
                device: torch.device) -> Tensor:
    """Per segment, the ``MOMENT_ROWS`` sums over the local parts of the
    parameters that have a gradient and keep the state.

    Args:
        parts (Sequence[tuple[tuple[int, ...], ParamPart]]): ``(segments,
            part)``: the local parameter parts with the segments they
            count in.
        states (Mapping): ``optimizer.state``, read after the step.
        num_segments (int): Number of segments.
        device (torch.device): Where the sums live.

    Returns:
        Tensor: ``(len(MOMENT_ROWS), num_segments)`` float64 sums.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from mmstats.sharding import ParamLayout
        >>> net = nn.Linear(2, 1, bias=False)
        >>> optimizer = torch.optim.SGD(net.parameters(), lr=1., momentum=.9)
        >>> net(torch.ones(1, 2)).sum().backward()  # gradient (1, 1)
        >>> optimizer.step()  # the momentum buffer is the gradient
        >>> parts = [((0, ), part) for part in ParamLayout(net).parts]
        >>> sums = moment_sums(parts, optimizer.state, 1, torch.device('cpu'))
        >>> row = MOMENT_ROWS.index('momentum_buffer:dot')
        >>> sums[row, 0].item()  # grad . m = 1 + 1
        2.0
    """
    found: Dict[str, list] = {s: [] for s in FIRST_MOMENTS + SECOND_MOMENTS}
    for segments, part in parts:
        entry = states.get(part.optim_key)
        grad = part.grad() if entry else None
        if grad is None:
            continue
        for name, lists in found.items():
            value = entry.get(name)
            if isinstance(value, Tensor):
                lists.append(
                    (segments, part.state(value), grad.detach().reshape(-1)))
    out = torch.zeros(
        len(MOMENT_ROWS), num_segments, dtype=torch.float64, device=device)
    for name, lists in found.items():
        if not lists:
            continue
        segments = [s for s, _, _ in lists]
        values = [v for _, v, _ in lists]
        row = MOMENT_ROWS.index(f'{name}:count')
        out[row] = segment_sum(
            torch.ones(len(lists), device=device), segments, num_segments)
        if name in SECOND_MOMENTS:  # v >= 0: its L1 norm is its sum
            out[MOMENT_ROWS.index(f'{name}:sum')] = segment_sum(
                torch.stack(foreach_norm(values, 1, torch.float64)), segments,
                num_segments)
            continue
        grads = [g for _, _, g in lists]
        out[MOMENT_ROWS.index(f'{name}:squares')] = sum_squares(
            values, segments, num_segments, device)
        out[MOMENT_ROWS.index(f'{name}:dot')] = segment_sum(
            float64_dots(grads, values), segments, num_segments)
        out[MOMENT_ROWS.index(f'{name}:grad_squares')] = sum_squares(
            grads, segments, num_segments, device)
    return out


def moment_norms(sums: List[float], num_probes: int, names: Sequence[str],
                 prefix: str) -> List[Tuple[str, float]]:
    """The named norms and cosines of the (reduced) sums of
    ``num_probes`` blocks of :func:`moment_sums` (one per optimizer, each
    with ``len(names) + 1`` segments, read to the host): a name where some
    rank's parameters keep that state, a cosine where neither vector is
    zero.

    Args:
        sums (list[float]): The blocks, flattened and concatenated.
        num_probes (int): Number of blocks.
        names (Sequence[str]): The modules of the first segments.
        prefix (str): Names are ``<prefix>/<module>/<state>_norm``,
            ``.../<state>_cos`` and ``.../<state>_sqrt_norm``.

    Returns:
        list[tuple[str, float]]: ``(name, value)`` in publication order.

    Example:
        >>> sums = [0.] * (len(MOMENT_ROWS) * 2)  # one module, the total
        >>> for row, value in (('exp_avg:squares', 4.), ('exp_avg:dot', 2.),
        ...                    ('exp_avg:grad_squares', 1.),
        ...                    ('exp_avg:count', 1.)):
        ...     sums[MOMENT_ROWS.index(row) * 2] = value
        >>> moment_norms(sums, 1, ['fc'], 'modules')
        [('modules/fc/exp_avg_norm', 2.0), ('modules/fc/exp_avg_cos', 1.0)]
    """
    width = len(names) + 1
    found = []
    for probe in range(num_probes):
        block = sums[probe * len(MOMENT_ROWS) * width:]

        def row(name: str, segment: int) -> float:
            return block[MOMENT_ROWS.index(name) * width + segment]

        for segment, module in enumerate(names):
            key = f'{prefix}/{module}'
            for state in FIRST_MOMENTS:
                if row(f'{state}:count', segment) == 0:
                    continue
                squares = row(f'{state}:squares', segment)
                found.append((f'{key}/{state}_norm', math.sqrt(squares)))
                grads = row(f'{state}:grad_squares', segment)
                if squares > 0 and grads > 0:
                    found.append(
                        (f'{key}/{state}_cos', row(f'{state}:dot', segment) /
                         math.sqrt(squares * grads)))
            for state in SECOND_MOMENTS:
                if row(f'{state}:count', segment) > 0:
                    found.append((f'{key}/{state}_sqrt_norm',
                                  math.sqrt(row(f'{state}:sum', segment))))
    return found


#: Elements per float64 chunk of :func:`float64_dots` (32 MiB per operand).
DOT_CHUNK = 1 << 22


def float64_dots(a: Sequence[Tensor], b: Sequence[Tensor]) -> Tensor:
    """``[sum(a[i] * b[i]) for i]`` (float64) with every product formed in
    float64 and summed there: exact products of float32, bfloat16 and
    float16 elements (a product in their own dtype keeps 24, 8 or 11 bits:
    1e-8 to 1e-3 relative). No host sync.

    The flattened pairs are copied into float64 chunks of at most
    ``DOT_CHUNK`` elements (a larger tensor in pieces): per chunk one
    ``cat`` per operand, one ``mul_`` and one ``segment_reduce``, so the
    kernels launched grow with the elements, not with the number of
    tensors, and the copies stay within 2 x 32 MiB.

    Example:
        >>> import torch
        >>> g = torch.full((3, ), 1 + 2.**-12)  # float32
        >>> exact = 3 * (1 + 2.**-12)**2
        >>> float(float64_dots([g], [g])[0]) == exact
        True
        >>> float((g * g).sum(dtype=torch.float64)) == exact  # float32 g * g
        False
    """
    if not len(a):
        return torch.zeros(0, dtype=torch.float64)
    device = a[0].device
    pieces: List[Tuple[int, Tensor, Tensor]] = []
    for i, (x, y) in enumerate(zip(a, b)):
        x, y = x.reshape(-1), y.reshape(-1)
        if x.numel() > DOT_CHUNK:
            pieces += [(i, p, q)
                       for p, q in zip(x.split(DOT_CHUNK), y.split(DOT_CHUNK))]
        else:
            pieces.append((i, x, y))
    sums, chunk, size = [], [], 0
    for piece in pieces + [None]:  # None: the end
        if chunk and (piece is None or size + piece[1].numel() > DOT_CHUNK):
            x, y = (
                torch.cat([p[k] for p in chunk],
                          out=torch.empty(
                              size, dtype=torch.float64, device=device))
                for k in (1, 2))
            lengths = torch.tensor([p[1].numel() for p in chunk],
                                   device=device)
            sums.append(
                torch.segment_reduce(x.mul_(y), 'sum', lengths=lengths))
            chunk, size = [], 0
        if piece is not None:
            chunk.append(piece)
            size += piece[1].numel()
    out = torch.cat(sums)
    if len(pieces) > len(a):  # pieces of one tensor added up
        owners = torch.tensor([p[0] for p in pieces], device=device)
        out = torch.zeros(
            len(a), dtype=torch.float64,
            device=device).index_add_(0, owners, out)
    return out
