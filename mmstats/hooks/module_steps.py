# Copyright (c) mmstats contributors. All rights reserved.
"""ModuleStatsHook's optimizer side: sums of squares of gradients and
updates, taken from torch's optimizer step hooks, one probe per optimizer.

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
parameters (:mod:`mmstats.sharding`); ModuleStatsHook reduces them over the
ranks (sharded models) and reports the norms. The hooks are registered once
in ``before_train`` and run eagerly even inside a compiled ``train_step``
(``torch.compiler.disable``: dynamo breaks the graph there and guards on
nothing of them).
"""
import time
from typing import List, Optional, Sequence, Tuple

import torch
from mmengine.optim import OptimWrapper
from torch import Tensor

from mmstats.sharding import ParamPart, sum_squares

__all__ = ['StepProbe']

# rows of StepProbe.squares
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
    """

    def __init__(self, optim_wrapper: OptimWrapper,
                 parts: List[Tuple[Tuple[int, ...],
                                   ParamPart]], num_segments: int,
                 stats: Sequence[str], device: torch.device) -> None:
        self.optim_wrapper = optim_wrapper
        optimizer = optim_wrapper.optimizer
        #: the DeepSpeed engine (its optimizer owns every parameter)
        self.engine = getattr(optim_wrapper, '_model', None)
        mine = None if self.engine is not None else {
            id(p)
            for group in optimizer.param_groups
            for p in group['params']
        }
        self.parts = [
            (s, p) for s, p in parts
            if p.trainable and (mine is None or id(p.optim_key) in mine)
        ]
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
        self._count_before = 0
        self._before: Optional[tuple] = None
        self._clipped: Optional[tuple] = None
        self._handles = [] if self.engine is not None else [
            optimizer.register_step_pre_hook(
                torch.compiler.disable(self._pre_step)),
            optimizer.register_step_post_hook(
                torch.compiler.disable(self._post_step)),
        ]
        self._step = None
        if self.engine is not None:  # ZeRO optimizers have no step hooks
            self._step = optim_wrapper.step
            optim_wrapper.step = self._engine_step
        self._clip = None
        if getattr(optim_wrapper, 'clip_grad_kwargs', None):
            self._clip = optim_wrapper._clip_grad
            optim_wrapper._clip_grad = torch.compiler.disable(self._clip_grad)

    # -- per iteration (called by the hook, outside compiled code) --------
    def begin_iteration(self, armed: bool) -> None:
        """Arm (or not) the statistics of this iteration's steps."""
        self.armed = armed and bool(self.stats) and bool(self.parts)
        self.calls = 0
        self._count_before = getattr(self.optim_wrapper, '_inner_count', 0)

    def end_iteration(self) -> int:
        """Disarm; return how many due steps the GradScaler skipped in this
        iteration (0 without AMP)."""
        self.armed = False
        self._before = self._clipped = None
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

    def remove(self) -> None:
        """Remove the step hooks (and the clipping probe)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._clip is not None:
            del self.optim_wrapper._clip_grad  # the class's method again
            self._clip = None
        if self._step is not None:
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

    def _clip_grad(self) -> None:
        if self.armed:
            start = time.perf_counter()
            self._clipped = self._take_grads()
            self.cost += time.perf_counter() - start
        self._clip()

    def _pre_step(self, optimizer, args, kwargs) -> None:
        self.calls += 1
        if not self.armed:
            return
        start = time.perf_counter()
        grads, found = (
            self._clipped if self._clipped is not None else self._take_grads())
        self._clipped = None
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
        if self._before is None or self.squares is None:
            return
        start = time.perf_counter()
        (parts, before), self._before = self._before, None
        after = [part.weight() for _, part in parts]
        segments = [segments for segments, _ in parts]
        self.squares[UPDATE] = sum_squares(
            torch._foreach_sub(after, before), segments, self.num_segments,
            self.device)
        self.squares[BEFORE] = sum_squares(before, segments, self.num_segments,
                                           self.device)
        self.cost += time.perf_counter() - start
