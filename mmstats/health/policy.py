# Copyright (c) mmstats contributors. All rights reserved.
"""HealthPolicy: what StatsCollectorHook does about the health of a
publication (when to warn, when to raise, the message), from its
:class:`~.config.HealthConfig`. The hook reads the runner, runs the
collectives (``gather_origins``, ``Collector.largest_ranks``) where the
policy asks for them, and calls it; the policy knows no Runner.
"""
import logging
import re
from typing import Callable, Dict, List, Mapping, Optional

from mmengine.logging import print_log

from .config import HealthConfig
from .nonfinite import nonfinite_message
from .spikes import Spike, SpikeDetector, SpikeError, spike_message

__all__ = ['HealthPolicy', 'covered_iterations']

PHASE_PREFIX = re.compile(r'^(val|test)/')


def covered_iterations(last: Optional[int], count: int) -> str:
    """Which iterations a publication covers, for a message: the last one
    and the ``count`` since the previous publication (``last`` None:
    not a training publication).

    Example:
        >>> covered_iterations(8, 4)
        'iteration 8 (iterations 5-8 since the previous publication'
    """
    if last is None:
        return 'this interval (since the previous publication'
    return (f'iteration {last} (iterations {last - count + 1}-{last} since '
            'the previous publication')


class _Names:
    """Whether ``regex`` (None: nothing) fullmatches a name without its
    ``val/``/``test/``, decided once per name."""

    def __init__(self, regex: Optional[str]) -> None:
        self.regex = None if regex is None else re.compile(regex)
        self._seen: Dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        wanted = self._seen.get(name)
        if wanted is None:
            wanted = self._seen[name] = self.regex is not None and (
                self.regex.fullmatch(PHASE_PREFIX.sub('', name)) is not None)
        return wanted


class HealthPolicy:
    """The health rules of a publication: NaN/inf (warn, raise or
    ignore), spikes (a :class:`~.spikes.SpikeDetector` fed with the watched
    names' new statistic; warn or raise), histograms (which names), and
    their messages. The same decisions on every rank, from the same
    all-rank statistics.

    A publication asks, in this order: :meth:`nonfinite_counts` and
    :meth:`reports_nonfinite` (then the caller gathers the origins, a
    collective, and calls :meth:`nonfinite_found`, which warns or raises
    ``FloatingPointError``); :meth:`check_spikes` (then, if some name
    spiked, the caller finds the ranks of the largest values, a
    collective, and calls :meth:`spikes_found`, which warns or returns the
    :class:`~.spikes.SpikeError` to raise once the statistics are
    written); :meth:`wants_histogram` per name. The spike histories go
    with checkpoints through :meth:`state_dict` / :meth:`load_state_dict`.

    Args:
        config (HealthConfig): The options (``health=dict(...)``).
        owner (str): Who warns or raises. Defaults to
            'StatsCollectorHook'.

    Example:
        >>> policy = HealthPolicy(HealthConfig(on_nonfinite='raise'))
        >>> results = {'loss': dict(max=1., nonfinite=2)}
        >>> bad = policy.nonfinite_counts(results)
        >>> bad, policy.reports_nonfinite(bad)
        ({'loss': 2}, True)
        >>> policy.nonfinite_found([], bad, 4, 2)
        Traceback (most recent call last):
        FloatingPointError: StatsCollectorHook: non-finite values at \
iteration 4 (iterations 3-4 since the previous publication, over all \
ranks): loss (2 NaN/inf)
    """

    def __init__(self,
                 config: HealthConfig,
                 owner: str = 'StatsCollectorHook') -> None:
        self.config, self.owner = config, owner
        self.detector = None if config.spike_regex is None else (SpikeDetector(
            config.spike_factor, config.spike_window))
        self._spike_names = _Names(config.spike_regex)
        self._histogram_names = _Names(config.histogram_regex)
        self._resumed: Optional[Mapping] = None  # a checkpoint's histories

    @property
    def flags_nonfinite(self) -> bool:
        """Whether a name's ``nonfinite`` count is shown where it was seen
        (not with ``on_nonfinite='ignore'``)."""
        return self.config.on_nonfinite != 'ignore'

    @property
    def writes_histograms(self) -> bool:
        """Whether some names get histograms (``histogram_regex``)."""
        return self.config.histogram_regex is not None

    def begin_run(self) -> None:
        """A new run: the spike histories of a loaded checkpoint, else
        none."""
        if self.detector is not None:
            self.detector.load_state_dict(self._resumed or {})

    def end_run(self) -> None:
        """Forget a loaded checkpoint's histories (the next run starts
        empty unless it loads one)."""
        self._resumed = None

    # -- non-finite values ---------------------------------------------
    @staticmethod
    def nonfinite_counts(results: Mapping[str, dict]) -> Dict[str, int]:
        """``{name: NaN/inf count over all ranks}`` of the names of
        ``results`` (``{name: {stat: value}}``) that got any."""
        return {
            name: int(values['nonfinite'])
            for name, values in results.items() if values['nonfinite']
        }

    def reports_nonfinite(self, bad: Mapping[str, int]) -> bool:
        """Whether ``bad`` (:meth:`nonfinite_counts`) is warned about or
        raised: the caller then gathers the origins (a collective on
        every rank) for :meth:`nonfinite_found`."""
        return bool(bad) and self.config.on_nonfinite != 'ignore'

    def nonfinite_found(self, origins: List[dict], bad: Dict[str, int],
                        last: Optional[int], count: int) -> None:
        """Warn about ``bad``, or raise ``FloatingPointError`` (every rank
        the same text, from the same gathered ``origins``), at the
        publication after iteration ``last`` (:func:`covered_iterations`).
        """
        message = nonfinite_message(
            self.owner, origins, bad,
            f'{covered_iterations(last, count)}, over all ranks)')
        if self.config.on_nonfinite == 'raise':
            raise FloatingPointError(message)
        print_log(message, 'current', level=logging.WARNING)

    # -- spikes --------------------------------------------------------
    def check_spikes(self, mode: str, results: Mapping[str, dict],
                     is_new: Callable[[str], bool]) -> List[Spike]:
        """Feed the watched training names of ``results`` that got new
        values (``is_new``) to the detector; the names that spiked."""
        if self.detector is None or mode != 'train':
            return []
        watched = {
            name: values[self.config.spike_stat]
            for name, values in results.items()
            if self._spike_names(name) and is_new(name)
        }
        return self.detector.check(watched) if watched else []

    def spikes_found(self, spikes: List[Spike], ranks: Mapping[str, int],
                     last: Optional[int], count: int) -> Optional[SpikeError]:
        """Warn about ``spikes`` (``ranks``: the rank of each name's
        largest value), or return the :class:`~.spikes.SpikeError` to raise
        with ``on_spike='raise'``."""
        message = spike_message(
            self.owner, spikes, self.config.spike_stat, ranks,
            f'{covered_iterations(last, count)}, over all ranks; '
            f'spike_factor={self.detector.factor:g})')
        if self.config.on_spike == 'raise':
            return SpikeError(message)
        print_log(message, 'current', level=logging.WARNING)
        return None

    # -- histograms ----------------------------------------------------
    def wants_histogram(self, name: str) -> bool:
        """Whether published name ``name`` gets a histogram."""
        return self._histogram_names(name)

    # -- checkpoints ---------------------------------------------------
    def state_dict(self) -> Optional[dict]:
        """The spike histories, for a checkpoint (None: not watched)."""
        return None if self.detector is None else self.detector.state_dict()

    def load_state_dict(self, state: Optional[Mapping]) -> None:
        """Continue the histories of :meth:`state_dict` (None: a checkpoint
        without them), also after :meth:`begin_run`."""
        self._resumed = state
        if self.detector is not None and state is not None:
            self.detector.load_state_dict(state)
