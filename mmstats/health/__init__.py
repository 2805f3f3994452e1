# Copyright (c) mmstats contributors. All rights reserved.
"""Training health, read from published (all-rank) statistics and from
the model: what ``StatsCollectorHook`` and ``ModuleStatsHook`` warn about
or draw, without a Runner.

Modules: :mod:`.config` (``HealthConfig``: StatsCollectorHook's
``health=dict(...)``, checked), :mod:`.policy` (``HealthPolicy``: when to
warn, when to raise, the messages), :mod:`.spikes` (a published statistic
far above its recent history), :mod:`.histograms` (merged quantile
sketches as TensorBoard's and W&B's histograms), :mod:`.histogram_writer`
(writing them with mmengine's TensorBoard and W&B backends),
:mod:`.nonfinite` (where a NaN/inf started: device-side flags per module,
gathered and described only when a publication found one), :mod:`.alarm`
(a NaN/inf flagged in one iteration, agreed by every rank at the next),
:mod:`.hangs` (each rank's progress, the stall rule, the hang line) and
:mod:`.hang_watchdog` (the thread that watches, over the process group's
store).
``docs/spikes_histograms.md``, ``docs/nonfinite.md``, ``docs/hangs.md``.
"""
from .alarm import NonfiniteAlarm
from .config import HealthConfig, fold_flat_health
from .hang_watchdog import HangWatchdog, build_channel
from .hangs import (HANG_EXIT_CODE, HangConfig, Progress, RankRecord, Stall,
                    find_stall, hang_message)
from .histogram_writer import histogram_writers, write_histograms
from .histograms import (MAX_BUCKETS, Histogram, numpy_histogram,
                         sketch_histogram)
from .nonfinite import (NonfiniteWatch, describe_origins, gather_origins,
                        nonfinite_message, rank_origin)
from .policy import HealthPolicy
from .spikes import (Spike, SpikeDetector, SpikeError, describe_spikes,
                     spike_message)

__all__ = [
    'HealthConfig', 'HealthPolicy', 'fold_flat_health', 'histogram_writers',
    'write_histograms', 'MAX_BUCKETS', 'Histogram', 'sketch_histogram',
    'numpy_histogram', 'NonfiniteWatch', 'NonfiniteAlarm', 'rank_origin',
    'gather_origins', 'describe_origins', 'nonfinite_message', 'Spike',
    'SpikeDetector', 'SpikeError', 'describe_spikes', 'spike_message',
    'HangConfig', 'HANG_EXIT_CODE', 'Progress', 'RankRecord', 'Stall',
    'find_stall', 'hang_message', 'HangWatchdog', 'build_channel'
]
