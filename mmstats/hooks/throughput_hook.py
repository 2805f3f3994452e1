# Copyright (c) mmstats contributors. All rights reserved.
"""ThroughputHook: peak memory, samples per second, FLOP/s and MFU over
all ranks, published where the training statistics are
(``docs/throughput.md``)."""
from __future__ import annotations
import logging
from time import perf_counter
from typing import TYPE_CHECKING, Dict, Optional, Sequence

import torch
from mmengine.hooks import Hook
from mmengine.hooks.hook import DATA_BATCH
from mmengine.logging import print_log

from mmstats.dist import host_group
from mmstats.publish import (PublicationSchedule, refuse_unchecked_strategy,
                             write_text_line)
from mmstats.publish.step_records import join_step_records
from mmstats.registry import HOOKS
from mmstats.run_description import log_run_description
from mmstats.sharding import unwrap_model
from mmstats.throughput import (IterationFlops, MemoryReader,
                                ThroughputInterval, batch_rows,
                                reduce_interval)
from mmstats.utils.args import (check_bool, check_keywords, check_log_interval,
                                check_real, refuse_second_instance)

if TYPE_CHECKING:  # imported at run time only (docs/architecture.md)
    from mmengine.runner import Runner

__all__ = ['ThroughputHook']

OWNER = 'ThroughputHook'
#: The FLOPs are counted on this training iteration of a run (1-based):
#: after the first, so that torch.compile has compiled what the first one
#: ran (dynamo skips a function for good when it first meets it under a
#: dispatch mode such as torch's FLOP counter).
COUNTED_ITERATION = 2
#: the text line's keys: the first memory figure, throughput, MFU
TEXT_KEYS = {
    'memory/max_allocated': 'memory/max',
    'memory/max_rss': 'memory/max',
    'throughput/samples_per_s': 'samples_per_s',
    'throughput/mfu': 'mfu',
}


@HOOKS.register_module()
@check_keywords
class ThroughputHook(Hook):
    """Peak memory, throughput, FLOP/s and MFU of training, over all ranks.

    Published by the rule StatsCollectorHook publishes by
    (:class:`~mmstats.publish.schedule.PublicationSchedule`: where LoggerHook
    writes a training line, every ``interval`` inner iterations, at every
    epoch end, after the last iteration of an iteration-based run) with an
    ``interval`` of its own, each publication covering exactly the
    training iterations since the previous one, in ONE small collective
    (an all_gather of a few float64 per rank on a gloo group: no device
    sync); nothing else runs per iteration but host counters. To the
    visualizers (``scalars.json``):

    - ``memory/max_allocated``, ``memory/max_reserved`` (CUDA: the peaks of
      the interval, MiB, max over ranks) or ``memory/max_rss`` (elsewhere:
      the process's peak resident memory *since it started*, MiB, max over
      ranks), each with ``<key>_rank``, the rank holding it;
    - ``throughput/iters``, ``throughput/time`` (the interval's wall time,
      max over ranks, from the end of the hook's previous publication, or
      the epoch's start, to this one's start; validation loops, the time
      after an epoch's last publication up to the next epoch's start and
      the hook's own publications are in no interval),
      ``throughput/iters_per_s``;
    - ``throughput/samples`` (the rows of the data batches all ranks saw:
      an uneven last batch counts as it is) and ``throughput/samples_per_s``;
    - ``throughput/flops`` (the interval's FLOPs, all ranks: the FLOPs of
      one iteration counted once per rank on its second batch with
      ``torch.utils.flop_counter``, times its samples over the counted
      batch's), ``throughput/flops_per_s`` and ``throughput/mfu`` (FLOP/s
      over the ranks' summed peak; absent, not zero, where a peak is not
      known: said once in the log).

    It does not take StatsCollectorHook's schedule: it needs no
    StatsCollectorHook, and under that hook's ``by_epoch=True`` a whole
    epoch would be one throughput interval, hiding its slow stretches.
    With both intervals None (the defaults: LoggerHook's) the two hooks
    publish after the same iterations; give them the same ``interval`` to
    keep it so.

    The text line shows ``memory/max``, ``samples_per_s`` and ``mfu``.
    A figure that cannot be had on some rank (a batch whose size cannot be
    found, see :func:`mmstats.throughput.batch_rows`) is absent everywhere,
    with one warning. Validation and test loops publish nothing.

    A misspelt argument names the closest one (``count_flop=False``: "did
    you mean count_flops?"); a second ThroughputHook in the same run is
    refused at ``before_run``, naming both.

    Args:
        interval (int, optional): Publish every ``interval`` inner
            iterations (besides LoggerHook's lines). None: the LoggerHook's
            interval. Defaults to None.
        count_flops (bool): Count the FLOPs of the second training
            iteration of the run (after torch.compile compiled the first;
            it runs slower, under torch's counter) and publish FLOP/s and
            MFU (none for a run of one iteration). Defaults to True.
        peak_flops (float, optional): The peak FLOP/s of one device,
            for MFU; None: from :data:`mmstats.throughput.PEAK_FLOPS` by device
            name and the number formats the counted ops ran in. Defaults to
            None.

    Example:
        >>> # in a config: custom_hooks = [dict(type='mmstats.ThroughputHook')]
        >>> from mmstats.hooks import ThroughputHook
        >>> hook = ThroughputHook(peak_flops=989e12)
        >>> hook.schedule is None  # nothing happens before the run starts
        True
    """

    priority = 'NORMAL'  # before LoggerHook, which resets CUDA peaks

    def __init__(self,
                 interval: Optional[int] = None,
                 count_flops: bool = True,
                 peak_flops: Optional[float] = None) -> None:
        check_log_interval(OWNER, interval)
        check_bool(OWNER, 'count_flops', count_flops)
        _check_peak(peak_flops)
        self.interval = interval
        self.count_flops = count_flops
        self.peak_flops = None if peak_flops is None else float(peak_flops)
        self.schedule: Optional[PublicationSchedule] = None
        self._start_run()

    def _start_run(self) -> None:
        self._memory: Optional[MemoryReader] = None
        self._device_name = 'cpu'
        self._flops = IterationFlops()
        self._counted_rows: Optional[int] = None
        self._interval = ThroughputInterval(self.peak_flops)
        self._run_iters = 0  # training iterations of this run
        self._training = False
        self._stamp: Optional[float] = None  # the clock runs since
        self._paused_in_epoch = False  # by a validation loop
        self._last: Dict[str, float] = {}  # what the hub got from us
        self._text_keys: set = set()
        self._warned: set = set()

    # -- the run -----------------------------------------------------------
    def before_run(self, runner: Runner) -> None:
        """Refuse an unchecked strategy; build the schedule and the memory
        reader of the model's device (every rank: the gloo group of the
        collective is created here)."""
        refuse_unchecked_strategy(runner, OWNER)
        refuse_second_instance(OWNER, runner.hooks, ThroughputHook)
        self._flops.stop()  # a previous run that failed while counting
        self._start_run()
        self.schedule = PublicationSchedule(runner, self.interval)
        join_step_records(runner.visualizer)  # one scalars.json record/step
        device = _model_device(runner.model)
        self._memory = MemoryReader(device)
        if device.type == 'cuda':
            self._device_name = torch.cuda.get_device_name(device)
        else:
            self._device_name = device.type
        host_group()  # the collective's gloo group: every rank, now

    def before_train(self, runner: Runner) -> None:
        """Training has started (validation loops now pause the clock)."""
        log_run_description(runner)  # once per runner, whichever hook
        self._training = True

    def after_train(self, runner: Runner) -> None:
        """Publish the iterations a run ended without publishing (all ranks
        ran the same iterations)."""
        self._flops.stop()
        self._training = False
        if self._interval.iters:
            self._publish(runner, False, runner.iter)

    def before_train_epoch(self, runner: Runner) -> None:
        """Start the clock."""
        self._stamp = perf_counter()

    def after_train_epoch(self, runner: Runner) -> None:
        """Stop the clock until the next epoch begins (it stopped at the
        epoch's last publication already, unless a custom loop has no last
        iteration the schedule knows)."""
        self._pause()

    def before_train_iter(self,
                          runner: Runner,
                          batch_idx: int,
                          data_batch: DATA_BATCH = None) -> None:
        """Count the FLOPs of the run's second iteration (see
        ``COUNTED_ITERATION``)."""
        if (self.count_flops and self._flops.total is None
                and self._run_iters == COUNTED_ITERATION - 1):
            self._counted_rows = batch_rows(data_batch)
            self._flops.start()

    def after_train_iter(self,
                         runner: Runner,
                         batch_idx: int,
                         data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        """Count the batch's samples (host only); publish where the schedule
        says."""
        if self._flops.counting:
            self._flops.stop()
            self._log_count(runner)
        rows = batch_rows(data_batch)
        self._interval.add_batch(rows, type(data_batch))
        self._run_iters += 1
        if self.schedule.publishes_after(runner, batch_idx):
            # the epoch's (or run's) last iteration stops the clock: what
            # runs until the next epoch (the after_train_epoch work of
            # hooks before this one, precise BN say) is in no interval
            last = (
                self.schedule.ends_epoch(runner, batch_idx)
                or self.schedule.ends_run(runner, batch_idx))
            self._publish(
                runner,
                self.schedule.logs_after(runner, batch_idx),
                runner.iter + 1,
                restart=not last)

    # -- validation inside training: not in the training figures -----------
    def before_val(self, runner: Runner) -> None:
        """Pause the clock; keep the training peaks so far."""
        if not self._training:
            return
        self._pause()
        self._interval.keep_peaks(self._memory.read())

    def after_val(self, runner: Runner) -> None:
        """New peaks without validation's; the clock runs again (inside an
        epoch)."""
        if not self._training:
            return
        self._memory.reset()
        if self._paused_in_epoch:
            self._stamp = perf_counter()

    def _pause(self) -> None:
        self._paused_in_epoch = self._stamp is not None
        if self._stamp is not None:
            self._interval.add_seconds(perf_counter() - self._stamp)
            self._stamp = None

    # -- publishing ----------------------------------------------------------
    def _publish(self,
                 runner: Runner,
                 logged: bool,
                 step: int,
                 restart: bool = False) -> None:
        """Reduce the interval over all ranks (one collective) and write
        its figures (:class:`~mmstats.throughput.ThroughputInterval`): all
        to the visualizers, the short ones to the message hub for
        LoggerHook's line (if ``logged``). The clock stops for the
        publication (a rank's wait for the others at the collective is in
        no interval) and runs again after it if it ran and ``restart``."""
        running = self._stamp is not None
        if running:
            now = perf_counter()
            self._interval.add_seconds(now - self._stamp)
            self._stamp = None
        maxima, sums = reduce_interval(*self._interval.local_figures(
            self._memory.read(),  # before LoggerHook resets the peaks
            self._flops.total,
            self._counted_rows,
            self._flops.peak(self._device_name)))
        self._memory.reset()
        figures = self._interval.figures(maxima, sums)
        self._warn_missing(figures.missing, self._interval.unknown)
        self._interval.clear()
        runner.visualizer.add_scalars(figures.scalars, step=step)
        if logged:
            self._to_message_hub(
                runner, {
                    TEXT_KEYS[key]: value
                    for key, value in figures.scalars.items()
                    if key in TEXT_KEYS
                })
        if running and restart:
            self._stamp = perf_counter()  # after the collective

    def _warn_missing(self, missing: Sequence[str],
                      unknown: Optional[str]) -> None:
        """Say once why a figure is not published (``unknown``: this rank's
        batch type without rows, if any)."""
        memory = [key for key in missing if key.startswith('memory/')]
        if memory:
            self._warn_once(
                'memory', f'{OWNER}: {", ".join(memory)} cannot be read on '
                'some rank (no resource module: Windows?), so it is not '
                'published')
        if 'throughput/samples' in missing:
            self._warn_once(
                'samples', f'{OWNER}: the number of samples of a training '
                f'batch could not be found on some rank (this rank: '
                f'{unknown or "none"}), so samples_per_s is not published; '
                'make the batch a dict with "inputs" (a tensor or a list '
                'per sample), or a tuple whose first field is one (see '
                'mmstats.throughput.batch_rows)')
        if 'throughput/mfu' in missing:
            # a CPU has no known peak: nothing asked for is missing there
            self._warn_once(
                'peak', f'{OWNER}: mfu is not published: the peak '
                f'FLOP/s of {self._device_name!r} for the number '
                f'formats it ran ({sorted(self._flops.by_kind)}) is '
                'not known on some rank; pass peak_flops=<FLOP/s of '
                'one device>', logging.INFO
                if self._device_name == 'cpu' else logging.WARNING)

    def _to_message_hub(self, runner: Runner, text: Dict[str, float]) -> None:
        """The text line's keys, latest value only; a key without a value
        now leaves the hub (no stale number on the line)."""
        hub = runner.message_hub
        for key in text:
            full = f'train/{key}'
            buffer = hub.log_scalars.get(full)
            if buffer is not None and (full not in self._text_keys
                                       or buffer.current()
                                       != self._last.get(full)):
                self._warn_once(
                    full, f'{OWNER}: another hook writes {full!r} too (a '
                    f'reported name {key.split("/")[0]!r}?): the text line '
                    'may show either; rename the reported name')
        self._text_keys = write_text_line(runner, 'train', text,
                                          self._text_keys)
        self._last = {f'train/{key}': value for key, value in text.items()}

    def _log_count(self, runner: Runner) -> None:
        rows = self._counted_rows
        per = f'a batch of {rows} samples' if rows else 'a batch'
        kinds = ', '.join(
            f'{kind} {flops / 1e9:.4g}'
            for kind, flops in sorted(self._flops.by_kind.items()))
        print_log(
            f'{OWNER}: training iteration {runner.iter + 1} ({per}, this '
            f'rank) ran {self._flops.total / 1e9:.4g} GFLOP (matmuls, '
            f'convolutions and attention, forward and backward, counted by '
            f'torch.utils.flop_counter; GFLOP by format: {kinds or "none"})',
            'current')

    def _warn_once(self,
                   key: str,
                   message: str,
                   level: int = logging.WARNING) -> None:
        if key not in self._warned:
            self._warned.add(key)
            print_log(message, 'current', level=level)


def _model_device(model: torch.nn.Module) -> torch.device:
    """The device the model trains on: its first parameter's, the
    wrapper's first (FSDP1 keeps its flat parameters there and none in the
    module inside), else the user's module's; CPU without parameters."""
    for module in (model, unwrap_model(model)):
        param = next(module.parameters(), None)
        if param is not None:
            return param.device
    return torch.device('cpu')


def _check_peak(peak_flops: object) -> None:
    if peak_flops is not None:
        check_real(
            OWNER, 'peak_flops', peak_flops,
            lambda v: v > 0 and v != float('inf'),
            'None or the peak FLOP/s of one device, a positive number '
            '(e.g. peak_flops=989e12)')
