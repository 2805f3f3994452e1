# Copyright (c) mmstats contributors. All rights reserved.
"""Where non-finite values started (``docs/nonfinite.md``).

Two pieces, both used by the hooks only when something went wrong or when
asked:

- :class:`NonfiniteWatch`: device-side flags of which watched modules
  produced a NaN/inf forward output or gradient, and the first iteration
  each did. Updating it never syncs the host; :meth:`NonfiniteWatch.take`
  reads it (one device-to-host copy), at a publication that found
  non-finite values.
- :func:`gather_origins` and :func:`describe_origins`: when the reduced
  statistics say some name got NaN/inf values (every rank knows it from
  the same reduced data), every rank hands a small dict of what it saw to
  one ``all_gather_object``; every rank then formats the same text from
  the same list. A healthy publication calls neither.
"""
import socket
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from mmengine.dist import all_gather_object, get_rank

__all__ = [
    'NonfiniteWatch', 'rank_origin', 'gather_origins', 'describe_origins'
]

#: "never": the first-iteration value of a module that stayed finite
NEVER = 2**62
FORWARD, BACKWARD = 0, 1
#: names listed in the text (sorted); the others are counted
MAX_NAMES = 5
#: ranks listed per finding; the others are counted
MAX_RANKS = 8
#: notes a watch keeps before checking them in one batch
FOLD_EVERY = 64


class NonfiniteWatch:
    """Which of ``names`` produced a non-finite forward output or gradient,
    and the first iteration each did, kept on ``device``.

    Per watched iteration: :meth:`begin_iteration`, then :meth:`forward`
    with each output of a watched module (in the order the forward pass
    produces them: that order is remembered), :meth:`backward` (per-module
    values) or :meth:`backward_parts` (per-tensor values) with the norms or
    sums of squares of the gradients at each step, and
    :meth:`end_iteration`. None of them syncs the host. An output costs one
    sum, in float32 (float64 for float64 outputs): non-finite when some
    element is, and otherwise only if the finite values summed beyond
    3.4e38. The values are kept as they come (a few 0-d tensors per
    iteration, no further device op) and checked in one batch per kind
    (one ``stack``) every ``FOLD_EVERY`` notes and at :meth:`take`.

    Args:
        names (Sequence[str]): The watched modules.
        device (torch.device): Where the stamps live.

    Example:
        >>> import torch
        >>> watch = NonfiniteWatch(['stem', 'head'], torch.device('cpu'))
        >>> watch.begin_iteration(1)
        >>> watch.forward(0, torch.ones(2))
        >>> watch.forward(1, torch.ones(2))
        >>> watch.end_iteration()
        >>> watch.begin_iteration(2)
        >>> watch.forward(0, torch.tensor([1., float('nan')]))
        >>> watch.forward(1, torch.full((2, ), float('nan')))
        >>> watch.backward(torch.tensor([float('inf'), 4.]))
        >>> watch.end_iteration()
        >>> watch.take()
        {'forward': (2, 0, 'stem'), 'backward': (2, 0, 'stem')}
        >>> watch.take()  # nothing since
        {'forward': None, 'backward': None}
    """

    def __init__(self, names: Sequence[str], device: torch.device) -> None:
        self.names = list(names)
        self.device = device
        #: (2, modules) int64: the first iteration a module's output
        #: (row FORWARD) / gradient (row BACKWARD) was non-finite, or NEVER
        #: (up to the last fold)
        self.first = torch.full((2, len(self.names)),
                                NEVER,
                                dtype=torch.int64,
                                device=device)
        #: module indices in the order of their first forward output
        self.order: List[int] = []
        self.iteration = 0
        self._seen: set = set()
        self._sums: List[torch.Tensor] = []  # this iteration's outputs
        self._indices: List[int] = []
        # (iteration, key, values, (row, rows, modules)) not yet folded in
        self._history: List[tuple] = []
        self._index_cache: Dict[tuple, torch.Tensor] = {}

    def begin_iteration(self, iteration: int) -> None:
        """Start watching ``iteration``."""
        self.iteration = iteration
        self._sums, self._indices = [], []

    def forward(self, index: int, output: torch.Tensor) -> None:
        """Take note of an output (detached) of module ``index``."""
        if index not in self._seen:
            self._seen.add(index)
            self.order.append(index)
        dtype = output.dtype
        self._sums.append(output.sum() if dtype is torch.float32 or dtype is
                          torch.float64 else output.sum(dtype=torch.float32))
        self._indices.append(index)

    def backward(self, squares: torch.Tensor) -> None:
        """Take note of the gradients' sums of squares (float64, one per
        module; non-finite where some element is)."""
        self._history.append((self.iteration, ('modules', ), squares, None))

    def backward_parts(self, values: Union[torch.Tensor,
                                           Sequence[torch.Tensor]],
                       rows: torch.Tensor, modules: torch.Tensor) -> None:
        """Take note of one value per gradient tensor (its norm; a tensor,
        or a list of 0-d tensors as ``torch._foreach_norm`` returns them):
        module ``modules[k]`` is non-finite if ``values[rows[k]]`` is.
        ``rows`` and ``modules`` are kept by the caller for the same
        layout."""
        self._history.append((self.iteration, ('parts', id(rows), id(modules)),
                              values, (rows, modules)))

    def end_iteration(self, flag: bool = False) -> Optional[torch.Tensor]:
        """Keep the iteration's output sums (no check yet, no device op:
        the checks of up to ``FOLD_EVERY`` notes run batched). With
        ``flag``: return a 0-d float device tensor, 1 where some note of
        this iteration is non-finite (a few small device ops, no sync: for
        :class:`~mmstats.health.alarm.NonfiniteAlarm`), None without
        notes."""
        if self._sums:
            key = ('outputs', tuple(self._indices))
            self._history.append((self.iteration, key, self._sums, None))
        self._sums, self._indices = [], []
        found = None
        if flag:
            notes = [n[2] for n in self._history if n[0] == self.iteration]
            if notes:
                finite = torch.stack([
                    torch.isfinite(_stacked([note]).to(self.device)).all()
                    for note in notes
                ])
                found = (~finite.all()).float()
        if len(self._history) >= FOLD_EVERY:
            self._fold()
        return found

    def _fold(self) -> None:
        """Stamp the notes kept so far into :attr:`first`: per kind of
        note, one batched check (no host sync)."""
        groups: Dict[tuple, list] = {}
        for note in self._history:
            groups.setdefault(note[1], []).append(note)
        self._history = []
        for key, notes in groups.items():
            values = _stacked([n[2] for n in notes]).to(self.device)
            iterations = torch.tensor([n[0] for n in notes],
                                      device=self.device).unsqueeze(1)
            stamps = torch.where(torch.isfinite(values), NEVER,
                                 iterations).amin(0)
            if key[0] == 'modules':
                torch.minimum(
                    self.first[BACKWARD], stamps, out=self.first[BACKWARD])
            elif key[0] == 'parts':
                rows, modules = notes[0][3]
                self.first[BACKWARD].scatter_reduce_(0, modules, stamps[rows],
                                                     'amin')
            else:
                self.first[FORWARD].scatter_reduce_(0, self._index(key[1]),
                                                    stamps, 'amin')

    def _index(self, indices: tuple) -> torch.Tensor:
        index = self._index_cache.get(indices)
        if index is None:
            if len(self._index_cache) >= 4:  # changing call patterns
                self._index_cache.clear()
            index = self._index_cache[indices] = torch.tensor(
                indices, device=self.device)
        return index

    def reset(self) -> None:
        """Forget the stamps and notes (a new publication interval)."""
        self.first.fill_(NEVER)
        self._history = []

    def take(self) -> Dict[str, Optional[Tuple[int, int, str]]]:
        """``{'forward': ..., 'backward': ...}``: the first non-finite module
        output in forward order and the first non-finite gradient in
        backward order (the reverse), each ``(iteration, position in forward
        order, module name)`` or None; forget them. Syncs the host."""
        self._fold()
        first = self.first.tolist()
        self.reset()
        position = {index: i for i, index in enumerate(self.order)}
        out: Dict[str, Optional[Tuple[int, int, str]]] = {}
        for row, key in ((FORWARD, 'forward'), (BACKWARD, 'backward')):
            # forward: the earliest in forward order; backward: the latest
            # (the first the backward pass reached)
            sign = 1 if row == FORWARD else -1
            seen = [(it, position.get(i,
                                      len(self.order) + i), i)
                    for i, it in enumerate(first[row]) if it != NEVER]
            if not seen:
                out[key] = None
                continue
            it, pos, index = min(seen, key=lambda s: (s[0], sign * s[1]))
            out[key] = (it, pos, self.names[index])
        return out


def _stacked(notes: List[Union[torch.Tensor,
                               Sequence[torch.Tensor]]]) -> torch.Tensor:
    """``(len(notes), n)``: notes of ``n`` values each, given as 1-d tensors
    or as lists of 0-d tensors (one ``stack`` for all of them)."""
    if all(isinstance(note, torch.Tensor) for note in notes):
        return torch.stack(notes)
    return torch.stack([value for note in notes
                        for value in note]).view(len(notes), -1)


def rank_origin(names: Dict[str, int], modules: Sequence[dict] = ()) -> dict:
    """What this rank saw: its rank, host, its NaN/inf count of each name
    (``names``) and the module origins of its watches (``modules``: dicts
    of :meth:`NonfiniteWatch.take` plus ``'every_iteration'``).

    Example:
        >>> origin = rank_origin({'loss': 2})
        >>> origin['rank'], origin['names'], origin['modules']
        (0, {'loss': 2}, [])
    """
    return dict(
        rank=get_rank(),
        host=socket.gethostname(),
        names=dict(names),
        modules=list(modules))


def gather_origins(origin: dict) -> List[dict]:
    """Every rank's :func:`rank_origin`, in rank order (one
    ``all_gather_object``: a collective, every rank must call it).

    Example:
        >>> [o['rank'] for o in gather_origins(rank_origin({'x': 1}))]
        [0]
    """
    return list(all_gather_object(origin))


def _ranks(origins: List[dict]) -> str:
    """``rank 1 (host)`` / ``ranks 0 (a), 1 (b)``: the first
    ``MAX_RANKS``, then how many more."""
    hosts = ', '.join(f"{o['rank']} ({o['host']})"
                      for o in origins[:MAX_RANKS])
    if len(origins) > MAX_RANKS:
        hosts += f' and {len(origins) - MAX_RANKS} more'
    return f"rank{'s' if len(origins) > 1 else ''} {hosts}"


def describe_origins(origins: List[dict],
                     bad: Dict[str, int],
                     when: str = 'this interval') -> str:
    """The non-finite report, origin first: one line per first non-finite
    module output (forward order) and gradient (backward order), each with
    its iteration, ranks and hosts; then one line with what else went
    non-finite over the interval ``when``: each name of ``bad``
    (``{name: count over all ranks}``; names not from ModuleStatsHook
    first, at most ``MAX_NAMES``) with the ranks and hosts that saw it.
    Without a module origin the names' line comes first. Bounded: at most
    ``MAX_NAMES`` names and ``MAX_RANKS`` ranks each. The same on every
    rank given the same ``origins``.

    Example:
        >>> origins = [
        ...     dict(rank=0, host='a', names={}, modules=[]),
        ...     dict(rank=1, host='b', names={'loss': 3}, modules=[dict(
        ...         forward=(5, 1, 'layer1'), backward=None,
        ...         every_iteration=True)])]
        >>> print(describe_origins(origins, {'loss': 3}, 'iteration 6'))
        first non-finite module output: 'layer1' at iteration 5 on rank 1 \
(b) (watched every iteration)
        non-finite values at iteration 6: loss (3 NaN/inf) on rank 1 (b)
    """
    lines = []
    for key, what, sign in (('forward', 'output', 1),
                            ('backward', 'gradient (backward)', -1)):
        found = [(m[key], m['every_iteration'], o) for o in origins
                 for m in o['modules'] if m.get(key) is not None]
        if not found:
            continue
        it, pos, module = min((f[0] for f in found),
                              key=lambda f: (f[0], sign * f[1]))
        ranks = [o for f, _, o in found if f == (it, pos, module)]
        every = all(e for _, e, _ in found)
        lines.append(f"first non-finite module {what}: '{module}' at "
                     f'iteration {it} on {_ranks(ranks)} (' +
                     ('watched every iteration'
                      if every else 'seen on an instrumented iteration; '
                      'ModuleStatsHook(watch_nonfinite=True) watches '
                      'every iteration') + ')')
    parts = []
    # the names a user reported (loss, ...) before the per-module ones
    ordered = sorted(bad, key=lambda n: (n.startswith('modules/'), n))
    for name in ordered[:MAX_NAMES]:
        seen = [o for o in origins if o['names'].get(name)]
        where = f' on {_ranks(seen)}' if seen else ''
        parts.append(f'{name} ({bad[name]} NaN/inf){where}')
    if len(bad) > MAX_NAMES:
        parts.append(f'and {len(bad) - MAX_NAMES} names more')
    lines.append(f'non-finite values at {when}: ' + '; '.join(parts))
    return '\n'.join(lines)


def nonfinite_message(owner: str, origins: List[dict], bad: Dict[str, int],
                      when: str) -> str:
    """The warning (or ``FloatingPointError``) text of ``owner``:
    :func:`describe_origins`, its first line after ``owner``, the others
    indented below it.

    Example:
        >>> print(nonfinite_message('Hook', [], {'loss': 1}, 'iteration 4'))
        Hook: non-finite values at iteration 4: loss (1 NaN/inf)
    """
    text = describe_origins(origins, bad, when)
    return f'{owner}: ' + text.replace('\n', '\n    ')
