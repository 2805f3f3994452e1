# Copyright (c) mmstats contributors. All rights reserved.
"""Step probes (:class:`StepProbe`): sums of squares of gradients and
updates, taken from torch's optimizer step hooks, one probe per optimizer
(:func:`build_step_probes`).

``Optimizer.register_step_pre_hook`` runs right before the parameters are
updated: after DDP's / FSDP's reduction and, under a ``GradScaler``, after
``unscale_`` (``GradScaler.step`` unscales, then calls ``optimizer.step``
only if every gradient is finite). A step the scaler skips calls neither
hook, so its gradients never reach the statistics; it is counted instead.
Gradients are read *before clipping*: where the wrapper clips
(``clip_grad``), at its ``_clip_grad`` (gradients already unscaled), and
kept only if the step then happens. DeepSpeed's ZeRO optimizers have no
step hooks: for a ``DeepSpeedOptimWrapper`` the probe wraps its ``step``
(the engine's gradients are reduced, partitioned and unclipped until
``engine.step()``), at gradient accumulation boundaries.

The probe keeps per-segment sums of squares of the *local* parts of the
parameters (:mod:`mmstats.sharding`); :class:`~.norms.ModuleNorms` reduces
them over the ranks (sharded models) into the norms. The hooks are
registered once and run eagerly even inside a compiled ``train_step``
(``torch.compiler.disable``: dynamo breaks the graph there and guards on
nothing of them).
"""
import functools
import logging
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper
from torch import Tensor

from mmstats.health import NonfiniteWatch
from mmstats.sharding import ParamPart, sum_squares
from mmstats.utils.torch_compat import foreach_norm, register_step_hooks
from .optimizer_state import MOMENT_ROWS, moment_sums

__all__ = ['StepProbe', 'build_step_probes', 'deepspeed_readable']

#: rows of StepProbe.squares
GRAD, UPDATE, BEFORE = 0, 1, 2


class StepProbe:
    """Gradient and update sums of squares of the segments (modules, and
    one segment for all the parameters) whose parameters one optimizer
    owns.

    Args:
        optim_wrapper (OptimWrapper): The wrapper of the optimizer.
        parts (list[tuple[tuple[int, ...], ParamPart]]): ``(segments,
            part)``: every local parameter part once, with the segments it
            counts in (nested modules, the total).
        num_segments (int): Number of segments.
        stats (Sequence[str]): Which of ``grad_norm`` and ``update_ratio``
            to take.
        device (torch.device): Where the sums live.
        optimizer_state (bool): Whether to take the sums of the optimizer's
            moments (``MOMENT_ROWS``) after an armed step. Defaults to
            False.
        watch (NonfiniteWatch, optional): Told of the gradients' sums of
            squares of the first ``len(watch.names)`` segments at armed or
            watched steps. Defaults to None.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from mmengine.optim import OptimWrapper
        >>> from mmstats.sharding import ParamLayout
        >>> net = nn.Linear(2, 1, bias=False)
        >>> wrapper = OptimWrapper(torch.optim.SGD(net.parameters(), lr=1.))
        >>> parts = [((0, ), part) for part in ParamLayout(net).parts]
        >>> probe = StepProbe(wrapper, parts, 1, ['grad_norm'],
        ...                   torch.device('cpu'))
        >>> probe.begin_iteration(armed=True)
        >>> net(torch.ones(1, 2)).sum().backward()  # gradient (1, 1)
        >>> wrapper.step()
        >>> _ = probe.end_iteration()
        >>> squares, present = probe.take()
        >>> round(squares[GRAD, 0].item(), 9), present  # squares: 1 + 1
        (2.0, [0])
        >>> probe.remove()
    """

    def __init__(self,
                 optim_wrapper: OptimWrapper,
                 parts: List[Tuple[Tuple[int, ...], ParamPart]],
                 num_segments: int,
                 stats: Sequence[str],
                 device: torch.device,
                 optimizer_state: bool = False,
                 watch: Optional[NonfiniteWatch] = None) -> None:
        self.optim_wrapper = optim_wrapper
        self.key = ''  # the wrapper's key in an OptimWrapperDict
        self.optimizer_state = optimizer_state
        self.watch = watch
        self.watching = False
        # per tuple of missing gradients: (half, rows, modules)
        self._watch_index: Dict[tuple, tuple] = {}
        self._watch_clipped: Optional[tuple] = None
        #: the DeepSpeed engine (its optimizer owns every parameter)
        self.engine = getattr(optim_wrapper, '_model', None)
        self._select_parts(parts)
        self.num_segments = num_segments
        self.device = device
        self.stats = [s for s in stats if s in ('grad_norm', 'update_ratio')]
        scaler = getattr(optim_wrapper, 'loss_scaler', None)
        self.amp = scaler is not None and scaler.is_enabled()
        self.armed = False
        self.calls = 0  # optimizer steps in this iteration
        self.cost = 0.0
        #: (3, num_segments) float64: gradient, update and weight-before
        #: sums of squares of the last armed step that happened, or None
        self.squares: Optional[Tensor] = None
        #: the segments that had a gradient at that step
        self.present: List[int] = []
        #: (len(MOMENT_ROWS), num_segments) float64 sums of the optimizer's
        #: moments after the last armed step that happened, or None
        self.moments: Optional[Tensor] = None
        self._count_before = 0
        self._before: Optional[tuple] = None
        self._clipped: Optional[tuple] = None
        self._intercept()

    def _select_parts(self, parts: List[Tuple[Tuple[int, ...],
                                              ParamPart]]) -> None:
        """Keep the trainable parts this optimizer owns (all of them under
        DeepSpeed), and those counting in some watched module."""
        mine = None if self.engine is not None else {
            id(p)
            for group in self.optim_wrapper.optimizer.param_groups
            for p in group['params']
        }
        self.parts = [
            (s, p) for s, p in parts
            if p.trainable and (mine is None or id(p.optim_key) in mine)
        ]
        # the parts counting in some watched module, and their segments
        targets = len(self.watch.names) if self.watch is not None else 0
        watched = [(s, p) for s, p in self.parts
                   if any(t < targets for t in s)]
        self._watch_segments = [s for s, _ in watched]
        self._watch_parts = [p for _, p in watched]

    def _intercept(self) -> None:
        """Register the step pre/post hooks (under DeepSpeed: wrap the
        wrapper's ``step``) and, where the wrapper clips, its
        ``_clip_grad`` (gradients are read before clipping)."""
        optim_wrapper = self.optim_wrapper
        optimizer = optim_wrapper.optimizer
        self._handles = [] if self.engine is not None else (
            register_step_hooks(optimizer,
                                torch.compiler.disable(self._pre_step),
                                torch.compiler.disable(self._post_step)))
        self._step = None
        self._own_step = False  # step was an attribute of the wrapper
        if self.engine is not None:  # ZeRO optimizers have no step hooks
            self._step = optim_wrapper.step
            self._own_step = 'step' in vars(optim_wrapper)

            def step(**kwargs) -> None:
                self._engine_step(**kwargs)

            # keep what marks the step we wrap: mmengine's parameter
            # schedulers wrap it before us and warn at their first step if
            # their ``_with_counter`` is gone
            optim_wrapper.step = functools.wraps(self._step)(step)
        self._clip = None
        if getattr(optim_wrapper, 'clip_grad_kwargs', None):
            self._clip = optim_wrapper._clip_grad
            optim_wrapper._clip_grad = torch.compiler.disable(self._clip_grad)

    # -- per iteration (called by the hook, outside compiled code) --------
    def begin_iteration(self, armed: bool, watching: bool = False) -> None:
        """Arm (or not) the statistics of this iteration's steps; watch
        (or not) their gradients for NaN/inf."""
        self.watching = watching and self.watch is not None
        self.armed = armed and bool(
            self.stats or self.optimizer_state) and bool(self.parts)
        self.calls = 0
        self._count_before = getattr(self.optim_wrapper, '_inner_count', 0)

    def end_iteration(self) -> int:
        """Disarm; return how many due steps the GradScaler skipped in this
        iteration (0 without AMP)."""
        self.armed = False
        self._before = self._clipped = self._watch_clipped = None
        if not self.amp:
            return 0
        wrapper = self.optim_wrapper
        due = int(wrapper._inner_count != self._count_before
                  and wrapper.should_update())
        return max(due - self.calls, 0)

    def take(self) -> Tuple[Tensor, List[int]]:
        """The sums of squares of the last armed step (zeros if none
        happened on this rank) and the segments that had a gradient there;
        forget them."""
        squares, present = self.squares, self.present
        self.squares, self.present = None, []
        if squares is None:
            squares = torch.zeros(
                3, self.num_segments, dtype=torch.float64, device=self.device)
        return squares, present

    def take_moments(self) -> Tensor:
        """The sums of the optimizer's moments after the last armed step
        (zeros if none happened on this rank); forget them."""
        moments, self.moments = self.moments, None
        if moments is None:
            moments = torch.zeros(
                len(MOMENT_ROWS),
                self.num_segments,
                dtype=torch.float64,
                device=self.device)
        return moments

    def remove(self) -> None:
        """Remove the step hooks (and the clipping probe)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._clip is not None:
            del self.optim_wrapper._clip_grad  # the class's method again
            self._clip = None
        if self._step is not None:  # the step we wrapped again
            if self._own_step:
                self.optim_wrapper.step = self._step
            else:
                del self.optim_wrapper.step
            self._step = None

    # -- the hooks ---------------------------------------------------------
    def _with_grad(self) -> List[Tuple[int, ParamPart, Tensor]]:
        """``(segments, part, local gradient)`` of the parts that have a
        gradient (a part whose parameter has none is left out)."""
        found = []
        for segments, part in self.parts:
            grad = part.grad()
            if grad is not None:
                found.append((segments, part, grad))
        return found

    def _take_grads(self) -> Tuple[Tensor, list]:
        found = self._with_grad()
        squares = sum_squares([g for _, _, g in found],
                              [s for s, _, _ in found], self.num_segments,
                              self.device)
        return squares, found

    def _engine_step(self, **kwargs) -> None:
        """DeepSpeedOptimWrapper.step: the engine's gradients are reduced
        and readable until its step, at an accumulation boundary."""
        boundary = self.engine.is_gradient_accumulation_boundary()
        if boundary:
            self._pre_step(None, (), {})
        self._step(**kwargs)
        if boundary:
            self._post_step(None, (), {})

    def _watch_grads(self) -> Optional[Tuple[List[Tensor], Tensor, Tensor]]:
        """The arguments of :meth:`NonfiniteWatch.backward_parts`: one
        norm per gradient tensor of a watched module (float32 for half
        gradients), mapped to the modules by an index cached per set of
        missing gradients (None without gradients). Per step: a walk over
        the watched parts and one ``torch._foreach_norm``."""
        grads = [part.grad() for part in self._watch_parts]
        missing = tuple(i for i, grad in enumerate(grads) if grad is None)
        layout = self._watch_index.get(missing)
        if layout is None:
            if len(self._watch_index) >= 4:  # changing layouts: stay bounded
                self._watch_index.clear()
            layout = self._watch_index[missing] = self._watch_layout(grads)
        if missing:
            grads = [grad for grad in grads if grad is not None]
        if not grads:
            return None
        half, rows, modules = layout
        norms = foreach_norm(grads, 2, torch.float32 if half else None)
        return norms, rows, modules

    def _watch_layout(self, grads: List[Optional[Tensor]]) -> tuple:
        """``(half, rows, modules)`` of the present ``grads``: whether
        some is half precision, and watched module ``modules[k]`` is
        non-finite if the norm ``rows[k]`` is."""
        targets = len(self.watch.names)
        present = [(segments, grad)
                   for segments, grad in zip(self._watch_segments, grads)
                   if grad is not None]
        half = any(
            grad.dtype in (torch.float16, torch.bfloat16)
            for _, grad in present)
        rows = [
            i for i, (s, _) in enumerate(present) for t in s if t < targets
        ]
        modules = [t for s, _ in present for t in s if t < targets]
        return (half, ) + tuple(
            torch.tensor(column, dtype=torch.long, device=self.device)
            for column in (rows, modules))

    def _takes_grads(self) -> bool:
        """Whether this step's gradients are read: for the statistics, or
        for the watch (on an armed or watched iteration)."""
        return (self.armed
                and bool(self.stats)) or (self.watch is not None and
                                          (self.armed or self.watching))

    def _clip_grad(self) -> None:
        if self._takes_grads():  # before clipping, kept if the step happens
            start = time.perf_counter()
            if self.armed and self.stats:
                self._clipped = self._take_grads()
            else:
                self._watch_clipped = self._watch_grads()
            self.cost += time.perf_counter() - start
        self._clip()

    def _pre_step(self, optimizer, args, kwargs) -> None:
        self.calls += 1
        if not self._takes_grads():
            return
        start = time.perf_counter()
        if not (self.armed and self.stats):  # watched only: the cheap check
            checked, self._watch_clipped = self._watch_clipped, None
            if checked is None:
                checked = self._watch_grads()
            if checked is not None:  # the step happens: its gradients count
                self.watch.backward_parts(*checked)
            self.cost += time.perf_counter() - start
            return
        grads, found = (
            self._clipped if self._clipped is not None else self._take_grads())
        self._clipped = None
        if self.watch is not None:
            self.watch.backward(grads[:len(self.watch.names)])
        self.squares = torch.zeros(
            3, self.num_segments, dtype=torch.float64, device=self.device)
        self.squares[GRAD] = grads
        self.present = sorted(
            {s
             for segments, _, _ in found
             for s in segments})
        if 'update_ratio' in self.stats and found:  # copies of the weights
            parts = [(segments, part) for segments, part, _ in found]
            self._before = (parts,
                            torch._foreach_mul(
                                [part.weight() for _, part in parts], 1.0))
        self.cost += time.perf_counter() - start

    def _post_step(self, optimizer, args, kwargs) -> None:
        if not self.armed:
            return
        start = time.perf_counter()
        if self.optimizer_state:
            self.moments = self._moment_sums()
        if self._before is not None and self.squares is not None:
            self._update_sums()
        self.cost += time.perf_counter() - start

    def _moment_sums(self) -> Tensor:
        """Per segment, the ``MOMENT_ROWS`` sums over the local parts of
        the parameters that have a gradient and keep the state, read from
        ``optimizer.state`` after the step (:func:`.moment_sums`)."""
        return moment_sums(self.parts, self.optim_wrapper.optimizer.state,
                           self.num_segments, self.device)

    def _update_sums(self) -> None:
        (parts, before), self._before = self._before, None
        after = [part.weight() for _, part in parts]
        segments = [segments for segments, _ in parts]
        self.squares[UPDATE] = sum_squares(
            torch._foreach_sub(after, before), segments, self.num_segments,
            self.device)
        self.squares[BEFORE] = sum_squares(before, segments, self.num_segments,
                                           self.device)


def deepspeed_readable(wrapper: Any,
                       stats: Sequence[str],
                       owner: str = 'ModuleStatsHook') -> bool:
    """Whether ``wrapper`` is mmengine's DeepSpeedOptimWrapper whose
    gradients can be read (unscaled: not under DeepSpeed's fp16 loss
    scaling); warns (as ``owner``) where it cannot.

    Example:
        >>> import torch
        >>> from mmengine.optim import OptimWrapper
        >>> sgd = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1)
        >>> deepspeed_readable(OptimWrapper(sgd), ['grad_norm'])
        False
    """
    engine = getattr(wrapper, '_model', None)
    if type(wrapper).__name__ != 'DeepSpeedOptimWrapper' or engine is None:
        return False
    wanted = [s for s in stats if s in ('grad_norm', 'update_ratio')]
    if engine.fp16_enabled() and wanted:
        print_log(
            f'{owner}: DeepSpeed fp16 keeps gradients multiplied by '
            'its loss scale until engine.step(): no grad_norm, update_ratio '
            'or total_grad_norm (use bf16, or stats=("act", "weight_norm"))',
            'current',
            level=logging.WARNING)
        return False
    if engine.gradient_accumulation_steps() > 1 and wanted:
        print_log(
            f'{owner}: DeepSpeed gradient_accumulation_steps > 1: '
            'gradient statistics are taken only where a publication falls '
            'on an accumulation boundary',
            'current',
            level=logging.WARNING)
    return True


def build_step_probes(wrappers: Dict[str, Any],
                      parts: List[Tuple[Tuple[int, ...], ParamPart]],
                      num_segments: int,
                      stats: Sequence[str],
                      device: torch.device,
                      optimizer_state: bool = False,
                      watch: Optional[NonfiniteWatch] = None,
                      keep: bool = False,
                      owner: str = 'ModuleStatsHook') -> List[StepProbe]:
    """One :class:`StepProbe` per optimizer wrapper of ``wrappers`` (an
    ``OptimWrapper``, or a DeepSpeedOptimWrapper whose gradients can be
    read: :func:`deepspeed_readable`), in their order.

    What cannot be read is warned about (as ``owner``) and left out: the
    gradients of a fused optimizer under a GradScaler (it steps on scaled
    gradients), DeepSpeed's optimizer state (kept in its own partitions).
    A probe left with nothing to take is removed, unless ``keep`` (the
    non-finite watch reads every step). The arguments are
    :class:`StepProbe`'s.

    Args:
        wrappers (dict[str, OptimWrapper]): The wrappers by key (``''``
            for the runner's only one).

    Returns:
        list[StepProbe]: The probes, each with its ``key``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from mmengine.optim import OptimWrapper
        >>> from mmstats.sharding import ParamLayout
        >>> net = nn.Linear(2, 1)
        >>> wrapper = OptimWrapper(torch.optim.SGD(net.parameters(), lr=1.))
        >>> parts = [((0, ), part) for part in ParamLayout(net).parts]
        >>> probes = build_step_probes({'': wrapper}, parts, 1,
        ...                            ['grad_norm'], torch.device('cpu'))
        >>> [(probe.key, probe.stats) for probe in probes]
        [('', ['grad_norm'])]
        >>> probes[0].remove()
    """
    probes = []
    for key, wrapper in wrappers.items():
        if not isinstance(wrapper, OptimWrapper) and not deepspeed_readable(
                wrapper, stats, owner):
            continue
        probe = StepProbe(wrapper, parts, num_segments, stats, device,
                          optimizer_state, watch)
        probe.key = key
        probes.append(probe)
    _leave_out_unreadable(probes, owner)
    for probe in list(probes):
        if not (probe.stats or probe.amp or probe.optimizer_state or keep):
            probe.remove()  # nothing to take at its steps
            probes.remove(probe)
    return probes


def _leave_out_unreadable(probes: List[StepProbe], owner: str) -> None:
    """Switch off, with a warning, what ``probes`` cannot read: scaled
    gradients at a fused optimizer's step under a GradScaler, DeepSpeed's
    optimizer state."""
    for probe in probes:
        if probe.amp and getattr(probe.optim_wrapper.optimizer,
                                 '_step_supports_amp_scaling', False):
            print_log(
                f'{owner}: a fused optimizer under a GradScaler '
                'steps on scaled gradients: no grad_norm/update_ratio '
                'and no amp_skipped_steps for '
                f'{type(probe.optim_wrapper.optimizer).__name__}',
                'current',
                level=logging.WARNING)
            probe.stats, probe.amp = [], False
    for probe in probes:
        if probe.optimizer_state and (probe.engine is not None
                                      or any(part.state is None
                                             for _, part in probe.parts)):
            print_log(
                f'{owner}: DeepSpeed keeps the optimizer state in '
                'its own partitions: no optimizer_state statistics for '
                f'{type(probe.optim_wrapper.optimizer).__name__}',
                'current',
                level=logging.WARNING)
            probe.optimizer_state = False
