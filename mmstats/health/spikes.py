# Copyright (c) mmstats contributors. All rights reserved.
"""Spikes: a published statistic far above its recent history.

A pure detector over published (all-rank) statistics: every rank holds the
same published values, so every rank that feeds the same values in the
same order takes the same decisions, without a collective. See
``docs/spikes_histograms.md``.
"""
import math
from collections import deque
from typing import Deque, Dict, List, Mapping, NamedTuple, Sequence

import numpy as np

__all__ = [
    'Spike', 'SpikeDetector', 'SpikeError', 'MIN_HISTORY', 'describe_spikes'
]

#: Publications a name needs before it can spike (fewer when the window is
#: shorter): the first intervals of a run have no history to compare with.
MIN_HISTORY = 5


class SpikeError(RuntimeError):
    """Raised (on every rank at the same iteration) by
    ``StatsCollectorHook(health=dict(on_spike='raise'))`` when a watched
    name spiked.

    Example:
        >>> issubclass(SpikeError, RuntimeError)
        True
    """


class Spike(NamedTuple):
    """A name whose statistic spiked at a publication.

    Example:
        >>> spike = Spike('loss', 40., 2., 20., 5)
        >>> spike.name, spike.ratio, spike.count
        ('loss', 20.0, 5)
    """
    name: str
    value: float  # this publication's statistic
    median: float  # median magnitude of its history before this one
    ratio: float  # |value| / median
    count: int  # values in the history compared with


class SpikeDetector:
    """Flag names whose statistic exceeds ``factor`` times the median of
    its recent history.

    :meth:`check` takes one publication's statistic per name (e.g. the
    interval maximum of ``loss`` over all ranks). A name *spikes* when
    ``|value| > factor * median(|history|)``, the history being its last
    ``window`` finite values (before this one) and holding at least
    ``min(MIN_HISTORY, window)`` of them; a zero median never spikes.
    Magnitudes, so a name that turns very negative spikes too. Every
    finite value joins the history afterwards, a spike included: the median
    ignores one outlier, and a lasting jump becomes the new normal after
    ``window // 2`` publications (one warning per publication until then).
    Non-finite values (NaN: no finite value this interval) are skipped and
    kept out of the history; they are ``on_nonfinite``'s.

    The median of the recent past, not a mean and standard deviation: a
    loss that falls by 10x during a run never looks like a spike of the
    early values, and one spike does not mask the next.

    Args:
        factor (float): How many times the median makes a spike (> 1).
            Defaults to 4.
        window (int): Publications of history kept per name. Defaults to
            20.

    Example:
        >>> detector = SpikeDetector(factor=4., window=8)
        >>> for loss in (1.0, 0.9, 1.1, 0.8, 1.0):  # the history
        ...     assert detector.check({'loss': loss}) == []
        >>> detector.check({'loss': 5.0})  # median 1.0
        [Spike(name='loss', value=5.0, median=1.0, ratio=5.0, count=5)]
        >>> detector.check({'loss': 1.2})  # back to normal
        []
    """

    def __init__(self, factor: float = 4., window: int = 20) -> None:
        if not isinstance(factor, (int, float)) or isinstance(factor, bool):
            raise TypeError(f'SpikeDetector: factor must be a number > 1 '
                            f'(e.g. 4.0), got {factor!r}')
        if not factor > 1 or math.isinf(factor):
            raise ValueError(f'SpikeDetector: factor must be a finite '
                             f'number > 1 (e.g. 4.0), got {factor!r}')
        if (not isinstance(window, int) or isinstance(window, bool)
                or window < 1):
            raise ValueError(f'SpikeDetector: window must be a positive int'
                             f' (e.g. 20), got {window!r}')
        self.factor = float(factor)
        self.window = window
        self.min_history = min(MIN_HISTORY, window)
        self._history: Dict[str, Deque[float]] = {}

    def reset(self) -> None:
        """Forget every history (a new run)."""
        self._history.clear()

    def state_dict(self) -> dict:
        """Every name's history (plain floats), for a checkpoint."""
        return {name: list(h) for name, h in self._history.items()}

    def load_state_dict(self, state: Mapping[str, Sequence[float]]) -> None:
        """Continue the histories of :meth:`state_dict` (a resumed run);
        each keeps its last ``window`` values."""
        self._history = {
            name: deque(map(float, values), maxlen=self.window)
            for name, values in state.items()
        }

    def history(self, name: str) -> List[float]:
        """The values of ``name`` a next :meth:`check` compares with."""
        return list(self._history.get(name, ()))

    def check(self, values: Mapping[str, float]) -> List[Spike]:
        """Compare each name's value with its history, then add it.

        Args:
            values (Mapping[str, float]): This publication's statistic per
                name (names in any order; NaN / inf are skipped).

        Returns:
            list[Spike]: The names that spiked, sorted by name.
        """
        spikes = []
        for name in sorted(values):
            value = float(values[name])
            if not math.isfinite(value):
                continue
            history = self._history.get(name)
            if history is None:
                history = self._history[name] = deque(maxlen=self.window)
            if len(history) >= self.min_history:
                median = float(np.median(np.abs(np.asarray(history))))
                if median > 0 and abs(value) > self.factor * median:
                    spikes.append(
                        Spike(name, value, median,
                              abs(value) / median, len(history)))
            history.append(value)
        return spikes


def describe_spikes(spikes: Sequence[Spike], stat: str,
                    ranks: Mapping[str, int]) -> str:
    """The text of ``spikes`` of statistic ``stat``, one line each, what
    first: the name, how much, the rank that reported the largest value
    of the name (``ranks``).

    Example:
        >>> describe_spikes([Spike('loss', 40., 2., 20., 5)], 'max',
        ...                 {'loss': 3})
        'loss: max 40 is 20x the median 2 of its last 5 publications, \
largest value from rank 3'
    """
    return '\n'.join(
        f'{spike.name}: {stat} {spike.value:.6g} is '
        f'{spike.ratio:.3g}x the median {spike.median:.6g} of its last '
        f'{spike.count} publications, '
        f'largest value from rank {ranks[spike.name]}' for spike in spikes)


def spike_message(owner: str, spikes: Sequence[Spike], stat: str,
                  ranks: Mapping[str, int], when: str) -> str:
    """The warning (or :class:`SpikeError`) text of ``owner``: one line per
    spike, what first (:func:`describe_spikes`), the first with ``when``.

    Example:
        >>> print(spike_message('Hook', [Spike('loss', 40., 2., 20., 5)],
        ...                     'max', {'loss': 3}, 'iteration 9'))
        Hook: spike in loss: max 40 is 20x the median 2 of its last 5 \
publications, largest value from rank 3 at iteration 9
    """
    lines = describe_spikes(spikes, stat, ranks).split('\n')
    lines[0] += f' at {when}'
    return f'{owner}: spike in ' + '\n    spike in '.join(lines)
