# Copyright (c) mmstats contributors. All rights reserved.
"""Drop-in for StyleGAN3's and EDM2's ``torch_utils/training_stats``.

Their training loops switch with one import line::

    from mmstats import training_stats  # was: from torch_utils import ...

and keep every call: ``init_multiprocessing``, ``report``, ``report0``,
``Collector(regex, keep_previous)`` with ``names``, ``update``, ``num``,
``mean``, ``std``, ``as_dict`` and ``collector[name]``, and EDM2's
``default_collector``. A thin adapter over :func:`mmstats.report` and
:class:`mmstats.Collector`; what changes (see ``docs/quantiles.md``):

- statistics are exact (float64, no ``E[x^2] - E[x]^2``) over all ranks;
- ranks may report different names, in any order: no hang, no mixing
  (StyleGAN3 requires the same names in the same order on every rank;
  EDM2 raises);
- NaN / inf values are ignored, as in EDM2 (StyleGAN3 lets them turn the
  mean into NaN); :meth:`Collector.nonfinite` counts them;
- ``names()`` lists, sorted, the names published by the last ``update()``
  (theirs: every name reported so far, in order of first report).
"""
import math
from typing import Any, Dict, List

from .stats import Collector as _StatsCollector
from .stats import report, report0

__all__ = [
    'EasyDict', 'init_multiprocessing', 'report', 'report0', 'Collector',
    'default_collector'
]


class EasyDict(dict):
    """A dict whose items are also attributes (like ``dnnlib.EasyDict``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        del self[name]


def init_multiprocessing(rank: int, sync_device: Any) -> None:
    """Accepted for compatibility; does nothing.

    mmstats reduces over ``torch.distributed``'s default group on the
    backend's own device (``mmengine.dist.get_comm_device``) and takes the
    rank from the process group, so no rank or sync device is needed.

    Args:
        rank (int): Rank of the current process (unused).
        sync_device (torch.device, optional): Device for communication
            (unused).
    """


class Collector:
    """StyleGAN3's ``Collector`` API on top of :class:`mmstats.Collector`.

    Each :meth:`update` (a collective: every rank must call it) publishes,
    per name matching ``regex`` (:func:`re.fullmatch`), ``num``, ``mean``
    and ``std`` of the finite values reported since the previous update on
    all ranks. ``std`` is the population standard deviation (``ddof=0``,
    0 for one value), as in StyleGAN3 and EDM2.

    Args:
        regex (str): Collect names that fully match this pattern.
            Defaults to '.*'.
        keep_previous (bool): If True, a name without new finite values
            keeps its previous statistics (StyleGAN3's default); if False it
            reports ``num=0`` and NaN (EDM2's default). Defaults to True.
    """

    def __init__(self, regex: str = '.*', keep_previous: bool = True) -> None:
        # keep_previous is applied here, on finite counts, like StyleGAN3
        self._collector = _StatsCollector(regex=regex, keep_previous=False)
        self._keep_previous = keep_previous
        self._stats: Dict[str, EasyDict] = {}

    def names(self) -> List[str]:
        """Names published by the last :meth:`update` (sorted)."""
        return list(self._stats)

    def update(self) -> None:
        """Publish what was reported since the previous update (a
        collective over the default process group)."""
        collector = self._collector
        collector.update()
        previous, stats = self._stats, {}
        for name in collector.names():
            num = int(collector.num(name))
            if num == 0 and self._keep_previous and name in previous:
                stats[name] = previous[name]
            elif num == 0:
                stats[name] = EasyDict(num=0, mean=math.nan, std=math.nan)
            else:
                stats[name] = EasyDict(
                    num=num,
                    mean=collector.mean(name),
                    std=collector.std(name))
        self._stats = stats

    def _get(self, name: str) -> EasyDict:
        return self._stats.get(name) or EasyDict(
            num=0, mean=math.nan, std=math.nan)

    def num(self, name: str) -> int:
        """Number of finite values of ``name`` (0 if none)."""
        return self._get(name).num

    def mean(self, name: str) -> float:
        """Mean of the finite values of ``name`` (NaN if none)."""
        return self._get(name).mean

    def std(self, name: str) -> float:
        """Population std of the finite values of ``name`` (NaN if none)."""
        return self._get(name).std

    def nonfinite(self, name: str) -> int:
        """Number of NaN / inf values of ``name`` in the last update (an
        mmstats extension)."""
        return int(self._collector.nonfinite(name))

    def as_dict(self) -> EasyDict:
        """``EasyDict(name=EasyDict(num=int, mean=float, std=float))``, so
        ``as_dict()[name].mean`` works; JSON-serialisable."""
        return EasyDict(
            (name, EasyDict(stat)) for name, stat in self._stats.items())

    def __getitem__(self, name: str) -> float:
        """``collector[name]`` is ``collector.mean(name)``."""
        return self.mean(name)


# EDM2's module-level collector, with EDM2's keep_previous=False. Created at
# import so that values reported before its first update() count.
default_collector = Collector(keep_previous=False)
