# Copyright (c) mmstats contributors. All rights reserved.
"""HangWatchHook: a rank that stops names itself (``docs/hangs.md``)."""
from __future__ import annotations
import logging
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from mmengine.dist import get_rank, get_world_size
from mmengine.hooks import Hook
from mmengine.logging import print_log

from mmstats.health.hang_watchdog import HangWatchdog, build_channel
from mmstats.health.hangs import HangConfig, Progress
from mmstats.registry import HOOKS
from mmstats.utils.args import check_keywords, refuse_second_instance
from mmstats.utils.torch_compat import register_step_hooks

if TYPE_CHECKING:  # imported at run time only (docs/architecture.md)
    from mmengine.runner import Runner

__all__ = ['HangWatchHook']

#: the phase a rank is in once every hook of a call returned (the others:
#: the phase it was in before the call)
AFTER_CALL = {
    'before_train_epoch': 'data',
    'before_train_iter': 'forward',
    'after_train_iter': 'data',
    'before_val_epoch': 'validation',
    'before_val_iter': 'validation',
    'after_val_iter': 'validation',
    'before_test_epoch': 'test',
    'before_test_iter': 'test',
    'after_test_iter': 'test',
    'before_save_checkpoint': 'checkpoint_save',
}
#: the phases of a training step: the model's forward pre-hook and forward
#: hook move between them only there (not in validation or PreciseBN)
STEP_PHASES = ('forward', 'backward', 'optimizer_step')
#: a loop's end: back to the phase its start found (training's data)
RESUMES = {'after_val': 'before_val', 'after_test': 'before_test'}
#: a hook's own work in these calls is part of the phase
CALL_PHASE = {'before_save_checkpoint': 'checkpoint_save'}
#: hooks (and their subclasses) whose work is a phase of its own
HOOK_PHASE = {'PreciseBNHook': 'precise_bn'}


@HOOKS.register_module()
@check_keywords
class HangWatchHook(Hook):
    """Name the rank that stops, where and since when, long before the
    collective's timeout, and end the run on purpose if asked.

    Every rank records the iteration and phase it is in (data, forward
    and backward, optimizer step, each hook's method, validation, checkpoint
    save, PreciseBN recomputation) with O(1) host work per phase change and
    no collective; a thread per rank writes it to the process group's store
    at most every ``interval`` seconds. When the ranks behind all others
    stay in one phase longer than its timeout, rank 0 logs one ERROR line:
    the stalled ranks with host, phase, iteration and how long, where their
    Python stacks are (``<work_dir>/hangs/``) and how many ranks wait for
    them. ``on_hang='exit'`` then ends every rank that can act with exit
    status 114 (:data:`~mmstats.health.hangs.HANG_EXIT_CODE`); ``--resume``
    continues from the last checkpoint.

    The hook records phases by calling the runner's hooks itself (the
    runner's ``call_hook`` is replaced on the runner instance from
    ``before_run`` to ``after_run``: the same calls in the same order, each
    hook's name recorded before it runs) and by optimizer step pre/post
    hooks. It needs its own hook points (every call of every hook, the
    save), which is why it is a hook of its own, not a health option of
    StatsCollectorHook; it works without any other mmstats hook.

    Args:
        timeout (None, str, float or dict): Seconds a rank may stay in one
            phase: ``'auto'`` (``max(floor, 10 x`` the longest this phase
            took before``)``, ``3 x floor`` before it completed once), a
            number, None (the watch is off), or a dict of phases, e.g.
            ``dict(default='auto', checkpoint_save=3600)``
            (:class:`~mmstats.health.HangConfig`). Defaults to ``'auto'``.
        on_hang (str): ``'warn'`` (the line, repeated at most every
            ``repeat`` seconds; keep waiting) or ``'exit'``. Defaults to
            ``'warn'``.
        floor (float): The least ``'auto'`` timeout, seconds. Defaults to
            300.
        interval (float): Seconds between two writes of a rank's progress
            and two looks of rank 0. Defaults to 5.
        repeat (float): Seconds between two lines about one stall.
            Defaults to 300.

    Example:
        >>> hook = HangWatchHook(timeout=dict(default=600, validation=None))
        >>> hook.config.timeout_of('validation', None) is None
        True
        >>> hook.priority
        'HIGHEST'
    """

    priority = 'HIGHEST'

    def __init__(self,
                 timeout: Union[None, str, float, Dict[str, Any]] = 'auto',
                 on_hang: str = 'warn',
                 floor: float = 300.,
                 interval: float = 5.,
                 repeat: float = 300.) -> None:
        self.config = HangConfig(
            timeout=timeout,
            on_hang=on_hang,
            floor=floor,
            interval=interval,
            repeat=repeat)
        self.progress: Optional[Progress] = None
        self._watchdog: Optional[HangWatchdog] = None
        self._runner: Optional[Runner] = None
        self._plans: Dict[str, List[Tuple[Hook, Optional[tuple]]]] = {}
        self._planned_for = 0  # the number of hooks planned for
        self._resume_at: Dict[str, tuple] = {}
        self._handles: List[Any] = []

    def before_run(self, runner: Runner) -> None:
        """Start recording and watching (rank 0 reports)."""
        refuse_second_instance('HangWatchHook', runner.hooks, HangWatchHook)
        self._finish(runner)  # a previous run of this hook object
        if not self.config.enabled:
            return
        world_size = get_world_size()
        channel = build_channel(world_size)
        if channel is None:
            print_log(
                'HangWatchHook: the process group has no store this torch '
                'exposes, so hangs are not watched (docs/hangs.md)',
                'current',
                level=logging.WARNING)
            return
        self.progress = Progress(self.config.timeout_of)
        self._watchdog = HangWatchdog(self.config, self.progress, channel,
                                      get_rank(), world_size, runner.work_dir)
        self._runner = runner
        runner.call_hook = self._call_hook  # until after_run
        self._watchdog.start()

    def before_train(self, runner: Runner) -> None:
        """The step's phases: the model's forward pre-hook (forward), its
        forward hook (backward: the loss, backward, DDP's all-reduce) and
        the optimizer's step pre-hook (optimizer step)."""
        if self.progress is None:
            return
        progress = self.progress

        def forward(*args) -> None:  # a new micro-batch's forward
            if progress.state[2] in STEP_PHASES[1:]:
                progress.enter('forward')

        def backward(*args) -> None:
            if progress.state[2] == 'forward':
                progress.enter('backward')

        def step(*args, **kwargs) -> None:
            progress.enter('optimizer_step')

        if runner.cfg.get('compile'):  # run eagerly, never traced
            import torch
            forward, backward, step = (
                torch.compiler.disable(f) for f in (forward, backward, step))
        self._handles = [
            runner.model.register_forward_pre_hook(forward),
            runner.model.register_forward_hook(backward)
        ]
        for optimizer in _optimizers(runner.optim_wrapper):
            self._handles += register_step_hooks(optimizer, step, _nothing)

    def after_run(self, runner: Runner) -> None:
        """Stop watching; the runner's own ``call_hook`` again."""
        self._finish(runner)

    def _finish(self, runner: Runner) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        if self._runner is not None:
            vars(self._runner).pop('call_hook', None)
            self._runner = None
        for handle in self._handles:
            handle.remove()
        self._handles, self._plans, self._resume_at = [], {}, {}

    def _plan(self, fn_name: str) -> List[Tuple[Hook, Optional[tuple]]]:
        """The runner's hooks for ``fn_name``, each with the phase it
        records (None: the hook does not implement the method)."""
        hooks = self._runner._hooks
        if len(hooks) != self._planned_for:  # a hook registered meanwhile
            self._plans, self._planned_for = {}, len(hooks)
        plan = self._plans.get(fn_name)
        if plan is None:
            plan = []
            for hook in hooks:
                own = getattr(type(hook), fn_name, None)
                if own is None or own is getattr(Hook, fn_name, None):
                    plan.append((hook, None))
                    continue
                name = type(hook).__name__
                phase = next(
                    (HOOK_PHASE[c.__name__]
                     for c in type(hook).__mro__ if c.__name__ in HOOK_PHASE),
                    CALL_PHASE.get(fn_name, 'hook'))
                plan.append((hook, (phase, f'{name}.{fn_name}')))
            self._plans[fn_name] = plan
        return plan

    def _call_hook(self, fn_name: str, **kwargs) -> None:
        """mmengine's ``Runner.call_hook``, each implementing hook's phase
        recorded before it runs."""
        runner, progress = self._runner, self.progress
        before = progress.state
        iteration = runner.iter if fn_name == 'before_train_iter' else None
        if fn_name in RESUMES.values():
            self._resume_at[fn_name] = before
        for hook, phase in self._plan(fn_name):
            if not hasattr(hook, fn_name):
                continue
            if phase is not None:
                progress.enter(*phase, iteration=iteration)
            try:
                getattr(hook, fn_name)(runner, **kwargs)
            except TypeError as e:
                self._finish(runner)  # the run fails: stop watching it
                raise TypeError(f'{e} in {hook}') from None
            except BaseException:
                self._finish(runner)
                raise
        if self._runner is None:  # after_run ended the watch
            return
        if fn_name == 'after_train_iter':
            progress.enter('data', iteration=runner.iter + 1)
        elif fn_name == 'before_train_epoch':
            progress.enter('data', iteration=runner.iter)
        elif fn_name in AFTER_CALL:
            progress.enter(AFTER_CALL[fn_name])
        else:
            start = self._resume_at.pop(RESUMES.get(fn_name), before)
            if progress.state[2:4] != start[2:4]:
                progress.enter(*start[2:4])


def _nothing(*args, **kwargs) -> None:
    """The step's post-hook: the step phase lasts until the hooks."""


def _optimizers(optim_wrapper: Any) -> List[Any]:
    """The torch optimizers inside mmengine's optimizer wrapper(s)
    (DeepSpeed's engine keeps its own: none)."""
    import torch
    wrappers = (
        list(optim_wrapper.values())
        if hasattr(optim_wrapper, 'values') else [optim_wrapper])
    return [
        w.optimizer for w in wrappers
        if isinstance(getattr(w, 'optimizer', None), torch.optim.Optimizer)
    ]
