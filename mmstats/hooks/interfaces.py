# Copyright (c) mmstats contributors. All rights reserved.
"""What mmstats' hooks tell each other, and all of it: no hook imports
another hook, a hook that offers something inherits one of these classes,
and a hook that needs it looks it up among the Runner's hooks by class.

- :class:`StatisticsPublisher` (StatsCollectorHook): when the training
  statistics are published. ModuleStatsHook arms its probes on those
  iterations (:func:`find_publisher`).
- :class:`NonfiniteOriginSource` (ModuleStatsHook with its watch): where
  a non-finite value started. StatsCollectorHook asks every source when a
  publication finds NaN/inf values (:func:`nonfinite_origins`).
- :class:`PublishedNames` (ModuleStatsHook): what its names say on the log
  line, and which of them hold one value per publication. StatsCollectorHook
  asks every such hook at each publication (:func:`published_names`).
"""
from __future__ import annotations
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional

from mmstats.publish.schedule import find_hook

if TYPE_CHECKING:  # imported at run time only (docs/architecture.md)
    from mmengine.runner import Runner

__all__ = [
    'StatisticsPublisher', 'NonfiniteOriginSource', 'PublishedNames',
    'find_publisher', 'nonfinite_origins', 'nonfinite_alarm',
    'published_names', 'single_value_kind'
]


class StatisticsPublisher:
    """A hook that publishes the training statistics says when.

    Example:
        >>> class EveryFifth(StatisticsPublisher):
        ...     def publishes_after(self, runner, batch_idx):
        ...         return batch_idx % 5 == 4
        >>> EveryFifth().publishes_after(None, 9)
        True
    """

    def publishes_after(self, runner: Runner, batch_idx: int) -> bool:
        """Whether the statistics are published after training iteration
        ``batch_idx`` (also asked for iterations ahead of ``runner.iter``).
        """
        raise NotImplementedError


class NonfiniteOriginSource:
    """A hook that watches where non-finite values start says what it saw.

    Example:
        >>> class Quiet(NonfiniteOriginSource):
        ...     def nonfinite_origin(self):
        ...         return []
        >>> Quiet().nonfinite_origin()
        []
    """

    def nonfinite_origin(self) -> List[dict]:
        """What this rank saw since the previous publication: one dict per
        watch, ``NonfiniteWatch.take()``'s plus ``'every_iteration'``.
        Called on every rank together, only when a publication found
        NaN/inf values; may read device flags (a host sync)."""
        raise NotImplementedError

    def nonfinite_seen(self) -> bool:
        """Whether some rank's watch flagged the previous iteration (the
        same answer on every rank). Asked on every rank together, once
        per training iteration; False where the source does not watch
        every iteration."""
        return False


class PublishedNames:
    """A hook whose reported names need more than their statistics says
    what the log line shows of them and which hold one value per
    publication.

    Example:
        >>> class Total(PublishedNames):
        ...     def line_summary(self, results):
        ...         return {'total': results['total']['mean']}
        ...     def single_value_kind(self, name):
        ...         return 'replicated' if name == 'total' else None
        >>> Total().line_summary({'total': {'mean': 2.0}})
        {'total': 2.0}
    """

    def line_summary(self,
                     results: Mapping[str,
                                      Mapping[str,
                                              float]]) -> Dict[str, float]:
        """The log line's keys and values summarising a publication's
        ``results`` (``{name: {stat: value}}`` over all ranks)."""
        raise NotImplementedError

    def single_value_kind(self, name: str) -> Optional[str]:
        """``'replicated'`` (one value per publication, the same on every
        rank), ``'per_rank'`` (one per rank) or None (any number)."""
        raise NotImplementedError


def find_publisher(runner: Runner) -> Optional[StatisticsPublisher]:
    """The Runner's hook that publishes the training statistics, or None.

    Example:
        >>> from types import SimpleNamespace
        >>> find_publisher(SimpleNamespace(hooks=[])) is None
        True
    """
    return find_hook(runner, StatisticsPublisher)


def nonfinite_origins(runner: Runner) -> List[dict]:
    """What every :class:`NonfiniteOriginSource` among the Runner's hooks
    saw (a host sync where a source reads device flags).

    Example:
        >>> from types import SimpleNamespace
        >>> class Source(NonfiniteOriginSource):
        ...     def nonfinite_origin(self):
        ...         return [dict(forward=None, backward=None)]
        >>> nonfinite_origins(SimpleNamespace(hooks=[Source(), object()]))
        [{'forward': None, 'backward': None}]
    """
    return [
        origin for hook in getattr(runner, 'hooks', ())
        if isinstance(hook, NonfiniteOriginSource)
        for origin in hook.nonfinite_origin()
    ]


def nonfinite_alarm(runner: Runner) -> bool:
    """Whether a :class:`NonfiniteOriginSource` among the Runner's hooks
    saw a NaN/inf in the previous iteration (every source asked: each may
    run a collective).

    Example:
        >>> from types import SimpleNamespace
        >>> class Source(NonfiniteOriginSource):
        ...     def nonfinite_seen(self):
        ...         return True
        >>> nonfinite_alarm(SimpleNamespace(hooks=[Source(), object()]))
        True
    """
    seen = [
        hook.nonfinite_seen() for hook in getattr(runner, 'hooks', ())
        if isinstance(hook, NonfiniteOriginSource)
    ]
    return any(seen)


def published_names(runner: Runner) -> List[PublishedNames]:
    """The Runner's hooks that say how their names are published.

    Example:
        >>> from types import SimpleNamespace
        >>> published_names(SimpleNamespace(hooks=[object()]))
        []
    """
    return [
        hook for hook in getattr(runner, 'hooks', ())
        if isinstance(hook, PublishedNames)
    ]


def single_value_kind(sources: List[PublishedNames],
                      name: str) -> Optional[str]:
    """The first answer of ``sources`` (:class:`PublishedNames`) on whether
    ``name`` holds one value per publication, or None.

    Example:
        >>> single_value_kind([], 'modules/head/grad_norm') is None
        True
    """
    for source in sources:
        kind = source.single_value_kind(name)
        if kind is not None:
            return kind
    return None
