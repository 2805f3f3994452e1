# Copyright (c) mmstats contributors. All rights reserved.
"""update_bn_stats: recompute BN running statistics with frozen weights."""
import logging
import math
import random
import sys
import time
from contextlib import contextmanager, nullcontext
from typing import (Any, Callable, ContextManager, Dict, Iterable, Iterator,
                    List, Optional, Tuple)

import numpy as np
import torch
from mmengine.logging import print_log
from mmengine.utils import ProgressBar
from torch import Tensor, nn

from mmstats.dist import get_rank, get_world_size, host_group, sum_all_reduce
from mmstats.sharding import forward_modules, is_sharded, reshard
from mmstats.stats import suspend_reporting
from mmstats.utils.args import check_bool, check_choice, check_positive_int
from .batches import prepare_batch
from .estimators import ESTIMATORS
from .layers import find_layers
from .recorder import BNRecorder, LayerGroup

__all__ = ['update_bn_stats', 'check_args', 'preserve_rng_state']

# BatchNorm refuses a training batch with one value per channel
_TOO_SMALL = 'Expected more than 1 value per channel'


@contextmanager
def preserve_rng_state() -> Iterator[None]:
    """Restore the python, numpy, torch CPU (and initialised CUDA) random
    states on exit (``torch.random.fork_rng`` for torch's).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> with preserve_rng_state():
        ...     _ = torch.rand(3)  # the recomputation draws numbers
        >>> after = torch.rand(1)
        >>> _ = torch.manual_seed(0)
        >>> bool(torch.equal(after, torch.rand(1)))  # as if none were drawn
        True
    """
    py_state, np_state = random.getstate(), np.random.get_state()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    devices = list(range(torch.cuda.device_count())) if cuda else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def check_args(num_samples: Any,
               estimator: Any,
               owner: str = 'update_bn_stats') -> None:
    """Validate ``num_samples`` (a positive int) and ``estimator`` (a key of
    :data:`ESTIMATORS`); ``owner`` is named in the error message. A wrong
    type raises TypeError, a wrong value ValueError
    (:mod:`mmstats.utils.args`).

    Example:
        >>> check_args(8192, 'population')  # passes
        >>> check_args(0, 'population')  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: update_bn_stats: num_samples must be a positive int ...
    """
    check_positive_int(
        owner,
        'num_samples',
        num_samples,
        example=8192,
        meaning='samples over all ranks')
    check_choice(owner, 'estimator', estimator, tuple(ESTIMATORS))


class _Batches:
    """Feeds batches to the model until ``target`` samples were used on
    this rank.

    With a sharded model every forward is a collective, so every rank must
    run the same forwards: before each one the ranks agree (:class:`
    _Agreement`, reduced while the previous forward runs) on whether to go
    on, to stop (some rank ran out of data or failed preparing its batch)
    or to skip the batch on all ranks (some rank holds a single sample:
    BatchNorm refuses it).
    """

    def __init__(self, model: nn.Module, base: nn.Module, recorder: BNRecorder,
                 target: int, context: Callable, sharded: bool, group: Any,
                 logger: Any) -> None:
        self.model, self.base, self.recorder = model, base, recorder
        self.target, self.context = target, context
        self.sharded, self.group, self.logger = sharded, group, logger
        self.device = recorder.groups[0].device
        self.seen = self.batches = 0
        self.flags_group = host_group(group) if sharded else None
        self.abandoned = False  # a sharded forward failed: no agreement
        self._next: Optional[_Agreement] = None  # the next batch's

    def run(self, loader: Iterable, progress: bool) -> Optional[BaseException]:
        """Forward the batches of ``loader``; return the exception that
        stopped it, or None."""
        bar = ProgressBar(self.target, file=sys.stdout) if progress else None
        try:
            iterator = iter(loader)
            while True:
                step = self._step(iterator)
                if step is None:
                    break
                if bar is not None and step:
                    bar.update(step)
        except Exception as exc:  # all ranks must still join the reduction
            return exc
        finally:
            if bar is not None:
                sys.stdout.write('\n')
        return None

    def _ran_out(self) -> None:
        print_log(
            f'update_bn_stats: the loader ran out after {self.seen} samples '
            f'({self.batches} batches) on rank {get_rank()}; {self.target} '
            'were wanted: using what there is',
            self.logger,
            level=logging.WARNING)

    def _skipped(self, reason: str) -> None:
        print_log(
            f'update_bn_stats: skipped a batch too small for BatchNorm '
            f'({reason})',
            self.logger,
            level=logging.WARNING)

    def _step(self, iterator: Iterator) -> Optional[int]:
        """One batch: its samples used (0: skipped), or None to stop."""
        if not self.sharded:
            if self.seen >= self.target:
                return None
            try:
                batch = next(iterator)
            except StopIteration:
                self._ran_out()
                return None
            try:
                with self.context():
                    args, kwargs, size = prepare_batch(self.base, batch,
                                                       self.device)
                    self.model(*args, **kwargs)
            except ValueError as e:  # e.g. a last batch of one sample
                if _TOO_SMALL not in str(e):
                    raise
                self.recorder.counts[:] = [0] * len(self.recorder.counts)
                self._skipped(str(e))
                return 0
            return self._used(size)
        # sharded: decide together (the agreement on the next batch runs
        # during this batch's forward), then forward on every rank or none
        if self._next is None:
            self._next = _Agreement(self, iterator, self.seen)
        current = self._next
        self._next = None
        try:  # fails when another rank abandoned its groups
            all_have, all_ok, anyone_wants, big_enough = current.decision()
        except Exception as exc:
            self._abandon(exc)
        if not all_ok:
            raise current.error if current.error is not None else \
                RuntimeError('update_bn_stats: preparing a batch failed on '
                             'another rank')
        if anyone_wants == 0:
            return None
        if not all_have:
            if not current.have:
                self._ran_out()
            return None
        used = current.size if big_enough else 0
        self._next = _Agreement(self, iterator, self.seen + used)
        if not big_enough:
            self._skipped('a batch of one sample on some rank: skipped on '
                          'every rank of the sharded model')
            return 0
        try:
            with self.context():
                self.model(*current.args, **current.kwargs)
        except Exception as exc:
            self._abandon(exc)
        return self._used(current.size)

    def _abandon(self, exc: Exception) -> None:
        """A sharded forward failed on this rank, or on another one (this
        rank then fails in FSDP's collective). The ranks can no longer
        agree: raise at once, without another collective. The process
        groups are the launcher's: it ends them when the error leaves the
        script (``mmstats.launch.abort_distributed``; a process that exits
        closes its gloo connections too), and the ranks still waiting in a
        collective fail then with "Connection closed by peer"."""
        self.abandoned = True
        raise RuntimeError(
            'update_bn_stats: a forward of the sharded model failed (on this '
            'rank, or on another rank while this one was gathering shards); '
            'the ranks can no longer agree, the process groups are left to '
            'the launcher to end; BN statistics were left unchanged: '
            f'{exc!r}') from exc

    def _used(self, size: int) -> int:
        self.recorder.accumulate()
        self.seen, self.batches = self.seen + size, self.batches + 1
        return size


class _Agreement:
    """The next batch of a sharded model's precise BN, prepared, and the
    ranks' agreement on it in flight: one asynchronous MIN all_reduce of
    four CPU flags (on a gloo group: no device sync) over (this rank has a
    batch, prepared it without error, still wants samples, the batch has
    at least two samples)."""

    def __init__(self, feeder: '_Batches', iterator: Iterator,
                 seen: int) -> None:
        self.have, self.error, self.size = True, None, 2
        self.args: tuple = ()
        self.kwargs: dict = {}
        wants = seen < feeder.target
        try:
            batch = next(iterator)
            with feeder.context():
                self.args, self.kwargs, self.size = prepare_batch(
                    feeder.base, batch, feeder.device)
        except StopIteration:
            self.have = False
        except Exception as exc:  # agreed on, raised after
            self.error = exc
        self.flags = torch.tensor(
            [self.have, self.error is None, -float(wants), self.size >= 2],
            dtype=torch.float64)
        self.work = torch.distributed.all_reduce(
            self.flags,
            op=torch.distributed.ReduceOp.MIN,
            group=feeder.flags_group,
            async_op=True)

    def decision(self) -> List[float]:
        """Wait for the agreement: ``[every rank has a batch, no rank
        failed, -(some rank wants more), every batch has >= 2 samples]``."""
        self.work.wait()
        return self.flags.tolist()


def _reduce(recorder: BNRecorder, meta: Tensor, group: Any) -> None:
    """Sum the float64 accumulators and ``meta`` over the ranks, in place
    (one all_reduce per device)."""
    sum_all_reduce(
        [t for g in recorder.groups for t in (g.sums, g.weights)] + [meta],
        group=group)


def _commit(recorder: BNRecorder, group: LayerGroup, mean: Tensor,
            var: Tensor) -> Tuple[List[bool], Tensor, Tensor]:
    """Write the new statistics in place into the original buffers of
    ``group``'s layers (flat ops); return which layers were called and
    their ``var_change`` and ``mean_change``."""
    layers = recorder.layers[group.first:group.first + group.count]
    chan = group.channel_layer
    called = group.weights[0] > 0
    old_mean = torch.cat([bn.running_mean for bn in layers]).double()
    old_var = torch.cat([bn.running_var for bn in layers]).double()
    zeros = torch.zeros(group.count, dtype=torch.float64, device=mean.device)
    var_change = zeros.index_add(0, chan, (var - old_var).abs()) / \
        zeros.index_add(0, chan, old_var.abs()).clamp_min(1e-30)
    eps = torch.tensor([bn.eps for bn in layers],
                       dtype=torch.float64,
                       device=mean.device)[chan]
    sizes = torch.tensor(group.sizes, dtype=torch.float64, device=mean.device)
    mean_change = zeros.index_add(0, chan, (mean - old_mean).abs() /
                                  (var + eps).sqrt()) / sizes
    keep = ~called[chan]  # layers never called keep their statistics
    new_mean = torch.where(keep, old_mean, mean).to(group.dtype)
    new_var = torch.where(keep, old_var, var).to(group.dtype)
    torch.split_with_sizes_copy(
        new_mean, group.sizes, out=[bn.running_mean for bn in layers])
    torch.split_with_sizes_copy(
        new_var, group.sizes, out=[bn.running_var for bn in layers])
    return called.tolist(), var_change[called], mean_change[called]


@torch.no_grad()
def update_bn_stats(model: nn.Module,
                    data_loader: Iterable,
                    num_samples: int = 8192,
                    estimator: str = 'population',
                    forward_context: Optional[Callable[[],
                                                       ContextManager]] = None,
                    progress: bool = True,
                    logger: Optional[Any] = None,
                    group: Optional[Any] = None) -> Dict[str, Any]:
    """Recompute the running statistics of BatchNorm layers (precise BN).

    Runs forwards with frozen weights over ``num_samples`` samples (over all
    ranks of ``group``) and sets every BN layer in training mode that tracks
    running stats to the statistics of all the values it saw; every rank
    ends with the same statistics. Eval-mode BN layers and other norms are
    left exactly alone, ``model.train()`` is never called, values passed to
    :func:`mmstats.report` during the forwards are ignored, and the random
    states are restored. On failure (on any rank) every buffer keeps its old
    values and every rank raises. Design and limitations:
    ``docs/precise_bn.md``.

    Args:
        model (nn.Module): The model (may be wrapped in DDP/MMDDP), or a
            sharded one (FSDP1, FSDP2, DeepSpeed ZeRO-3, mmengine's wrappers
            of them): its forwards then run through the sharding, the ranks
            agreeing before every batch, and it is left as sharded as it
            was (``docs/sharding.md``).
        data_loader (Iterable): Yields batches; ``iter()`` is called once.
            A ``BaseModel`` gets ``data_preprocessor(batch, False)`` and
            ``mode='tensor'``; a plain module a tensor, ``batch[0]`` or
            ``**batch``.
        num_samples (int): Samples to use over all ranks (whole batches).
            Defaults to 8192.
        estimator (str): ``'population'`` (weighted by each batch's value
            count) or ``'batch_average'`` (mmpretrain's). Defaults to
            ``'population'``.
        forward_context (Callable[[], ContextManager], optional): Called to
            get a context entered around each forward (e.g. autocast).
            Defaults to None.
        progress (bool): Show a progress bar on rank 0 when stdout is a
            terminal. Defaults to True.
        logger (str | logging.Logger, optional): Where warnings go (mmengine
            ``print_log``); None means ``'current'``. Defaults to None.
        group (ProcessGroup, optional): Process group to reduce over.
            Defaults to None (the default group).

    Returns:
        dict: ``num_layers``, ``num_samples`` and ``num_batches`` (used,
        over all ranks), ``seconds``, ``var_change`` (mean over updated
        layers of ``sum|var_new - var_old| / sum|var_old|``),
        ``mean_change`` (mean over updated layers of the mean over channels
        of ``|mean_new - mean_old| / sqrt(var_new + eps)``), ``estimator``
        and the layer names ``updated``, ``skipped`` (never called),
        ``frozen`` (eval mode) and ``unaffected_norms``.

    Raises:
        ValueError: Bad ``num_samples``/``estimator``, an uninitialised lazy
            BN layer, or no batch at all on any rank.
        TypeError: ``progress`` is not a bool or ``forward_context`` is not
            callable.
        RuntimeError: A forward failed on another rank; or, with a sharded
            model, a forward failed inside the model on some rank: then
            raised at once on the ranks that see it, without another
            collective. The process groups are never ended here: the
            launcher ends them when the error leaves the script (mmstats'
            own does; a process that exits ends its connections too), and
            the other ranks then fail instead of waiting in a collective.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from mmstats import update_bn_stats
        >>> _ = torch.manual_seed(0)
        >>> model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
        >>> batches = [torch.randn(8, 3, 6, 6) for _ in range(3)]
        >>> summary = update_bn_stats(model, batches, num_samples=24,
        ...                           progress=False)
        >>> summary['updated'], summary['num_samples'], summary['num_batches']
        (['1'], 24, 3)
        >>> x = torch.cat([model[0](b) for b in batches]).detach().double()
        >>> torch.allclose(model[1].running_mean.double(), x.mean((0, 2, 3)),
        ...                atol=1e-6)
        True
        >>> torch.allclose(model[1].running_var.double(),
        ...                x.var((0, 2, 3), unbiased=False), atol=1e-6)
        True
    """
    _check_call(num_samples, estimator, progress, forward_context)
    start_time = time.perf_counter()
    # DDP's forward only adds collectives: run the module inside; a
    # sharded model runs through its sharding (the forward gathers shards)
    given = model
    model, base = forward_modules(model)
    sharded = is_sharded(model) and get_world_size(group) > 1
    named, frozen, unaffected, kept = find_layers(base)
    summary: Dict[str, Any] = dict(
        num_layers=0,
        num_samples=0,
        num_batches=0,
        seconds=0.0,
        var_change=0.0,
        mean_change=0.0,
        estimator=estimator,
        updated=[],
        skipped=[],
        frozen=frozen,
        unaffected_norms=unaffected)
    if not named:
        return summary
    world_size = get_world_size(group)
    recorder = BNRecorder([bn for _, bn in named], ESTIMATORS[estimator])
    progress = progress and get_rank(group) == 0 and sys.stdout.isatty()
    with preserve_rng_state(), suspend_reporting():
        try:
            recorder.install()
            feeder = _Batches(model, base, recorder,
                              math.ceil(num_samples / world_size),
                              forward_context or nullcontext, sharded, group,
                              logger or 'current')
            seen, batches = _record(
                feeder, data_loader, progress, group,
                f'num_samples={num_samples}, world '
                f'size {world_size}')
            results = [recorder.statistics(g) for g in recorder.groups]
        finally:
            recorder.restore()
            for buf, value in kept:
                buf.copy_(value)
            if sharded:
                reshard(given)
        _commit_all(recorder, results, named, summary)
    summary.update(
        num_layers=len(summary['updated']),
        num_samples=int(round(seen)),
        num_batches=int(round(batches)),
        seconds=time.perf_counter() - start_time)
    return summary


def _check_call(num_samples: int, estimator: str, progress: bool,
                forward_context: Optional[Callable[[],
                                                   ContextManager]]) -> None:
    """Check the arguments of :func:`update_bn_stats` (a wrong type is a
    TypeError, a wrong value a ValueError)."""
    check_args(num_samples, estimator)
    check_bool('update_bn_stats', 'progress', progress)  # not truthiness
    if forward_context is not None and not callable(forward_context):
        raise TypeError('update_bn_stats: forward_context must be None or a '
                        'callable returning a context manager (e.g. '
                        '`lambda: torch.autocast("cuda")`), got '
                        f'{forward_context!r}')


def _record(feeder: _Batches, data_loader: Iterable, progress: bool,
            group: Any, asked: str) -> Tuple[float, float]:
    """Forward the batches, then fold the accumulators and sum them over
    the ranks with every rank's failure flag, samples and batches (one
    reduction); return the samples and batches used over all ranks.
    Raises, on every rank, where some rank failed or no rank had a batch
    (``asked`` says what was asked for)."""
    recorder = feeder.recorder
    error = feeder.run(data_loader, progress)
    if feeder.abandoned:  # no group left to agree over
        raise error
    recorder.fold()
    meta = torch.tensor(
        [float(error is not None), feeder.seen, feeder.batches],
        dtype=torch.float64,
        device=recorder.groups[0].device)
    _reduce(recorder, meta, group)
    failed, seen, batches = meta.tolist()
    if error is not None:
        raise error
    if failed > 0:
        raise RuntimeError(
            'update_bn_stats: a forward failed on another rank (see '
            'its log); BN statistics were left unchanged')
    if batches == 0:
        raise ValueError(
            'update_bn_stats: no batch at all on any rank (empty or '
            f'exhausted loader; {asked}); BN statistics were left unchanged')
    return seen, batches


def _commit_all(recorder: BNRecorder, results: List[Tuple[Tensor, Tensor]],
                named: List[Tuple[str, nn.Module]],
                summary: Dict[str, Any]) -> None:
    """Write every group's new statistics (:func:`_commit`); fill the
    summary's ``updated``, ``skipped``, ``var_change`` and
    ``mean_change``."""
    names = {id(bn): name for name, bn in named}
    var_changes, mean_changes = [], []
    for g, (mean, var) in zip(recorder.groups, results):
        called, var_change, mean_change = _commit(recorder, g, mean, var)
        layers = recorder.layers[g.first:g.first + g.count]
        for bn, ok in zip(layers, called):
            summary['updated' if ok else 'skipped'].append(names[id(bn)])
        var_changes.append(var_change)
        mean_changes.append(mean_change)
    if summary['updated']:
        summary['var_change'] = torch.cat(var_changes).mean().item()
        summary['mean_change'] = torch.cat(mean_changes).mean().item()
