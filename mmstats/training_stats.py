# Copyright (c) mmstats contributors. All rights reserved.
"""Drop-in for StyleGAN3's and EDM2's ``torch_utils/training_stats``.

Their training loops switch with one import line::

    from mmstats import training_stats  # was: from torch_utils import ...

and keep every call: ``init_multiprocessing``, ``report``, ``report0``,
``Collector(regex, keep_previous)`` with ``names``, ``update``, ``num``,
``mean``, ``std``, ``as_dict`` and ``collector[name]``, and EDM2's
``default_collector``. A thin adapter over :func:`mmstats.report` and
:class:`mmstats.Collector`. What a training loop observes is theirs:

- ``names()`` lists every name reported so far (through this module) that
  the regex fully matches, in order of first report, before the first
  ``update()`` too; ``as_dict()`` has one entry per name of ``names()``
  (``num=0``, NaN where a name got no value);
- ``num()``, ``mean()`` and ``std()`` of a name the regex does not match
  raise ``AssertionError``; of a matching name without values they return
  0, NaN and NaN;
- ``Collector()`` has StyleGAN3's defaults: ``keep_previous=True`` and
  non-finite values counted, making that update's ``mean`` and ``std``
  NaN; ``default_collector`` has EDM2's: ``keep_previous=False`` and
  non-finite values ignored (``Collector(keep_previous=False,
  ignore_nonfinite=True)`` is EDM2's ``Collector()``);
- ``default_collector`` counts every value reported through this module,
  as EDM2's (created at import there) does.

What differs, each on purpose (see ``docs/quantiles.md``):

- statistics are exact (float64, no ``E[x^2] - E[x]^2``) over all ranks;
  theirs reduce each report in float32;
- ranks may report different names, in any order: no hang, no mixing
  (StyleGAN3 requires the same names in the same order on every rank;
  EDM2 raises); a name only other ranks reported comes last in
  ``names()``;
- a non-finite value spoils only the update it belongs to: StyleGAN3
  keeps cumulative sums, so after one NaN every later update of that name
  reads NaN (``NaN - NaN``) whatever the values, a stale number. An update
  whose non-finite values are all infinities reads NaN where StyleGAN3
  reads ``+inf`` / ``-inf`` (both non-finite to a loop's check);
  :meth:`Collector.nonfinite` counts them;
- ``report0`` counts the values of the process group's rank 0 (the rank
  given to ``init_multiprocessing`` is ignored);
- nothing is live at import: ``default_collector`` comes into being at the
  first ``report`` / ``report0`` through this module or at its first use,
  and a collector that is never updated holds one merged row per name
  (StyleGAN3's loop never updates EDM2's ``default_collector``); building
  a ``Collector`` is not a collective (theirs runs an ``update()``).
"""
import math
from typing import Any, Dict, List, Pattern, Union

import torch  # noqa: F401  (the examples use it)

from .stats import REPORTER
from .stats import Collector as _StatsCollector
from .stats import report as _report
from .stats import report0 as _report0
from .utils.args import check_bool, compile_regex
from .utils.torch_compat import is_compiling

__all__ = [
    'EasyDict', 'init_multiprocessing', 'report', 'report0', 'Collector'
]  # and ``default_collector``, created at its first use

_is_compiling = is_compiling


class EasyDict(dict):
    """A dict whose items are also attributes (like ``dnnlib.EasyDict``).

    Example:
        >>> from mmstats import training_stats
        >>> d = training_stats.EasyDict(lr=0.1)
        >>> d.batch = 64
        >>> d.lr, d['batch']
        (0.1, 64)
    """

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

    Example:
        >>> import torch
        >>> from mmstats import training_stats
        >>> training_stats.init_multiprocessing(0, torch.device('cpu'))
        >>> collector = training_stats.Collector(regex='Example/init')
        >>> _ = training_stats.report('Example/init', 2.0)  # as without it
        >>> collector.update()
        >>> collector['Example/init']
        2.0
    """


def report(name: str, value: Any) -> Any:
    """:func:`mmstats.report` that also records ``name`` for
    :meth:`Collector.names` and brings ``default_collector`` into being.

    Args:
        name (str): Name of the statistic.
        value (float | Sequence | np.ndarray | Tensor): Values; empty only
            registers the name.

    Returns:
        The same ``value`` object.

    Example:
        >>> from mmstats import training_stats
        >>> collector = training_stats.Collector(regex='Example/loss')
        >>> _ = training_stats.report('Example/loss', 0.5)  # every rank
        >>> collector.update()
        >>> collector.num('Example/loss'), collector['Example/loss']
        (1, 0.5)
    """
    return _record(_report, name, value)


def report0(name: str, value: Any) -> Any:
    """Like :func:`report`; only rank 0's values are counted (other ranks
    only record the name).

    Args:
        name (str): Name of the statistic.
        value (float | Sequence | np.ndarray | Tensor): Values (rank 0's
            are counted).

    Returns:
        The same ``value`` object.

    Example:
        >>> from mmstats import training_stats
        >>> collector = training_stats.Collector(regex='Example/lr')
        >>> _ = training_stats.report0('Example/lr', 0.1)  # rank 0's value
        >>> collector.update()  # the same numbers on every rank
        >>> collector.num('Example/lr'), collector['Example/lr']
        (1, 0.1)
    """
    return _record(_report0, name, value)


def _record(report_fn: Any, name: str, value: Any) -> Any:
    """``report_fn(name, value)``, the name recorded for
    :meth:`Collector.names` and ``default_collector`` brought into being."""
    if _is_compiling():  # no Python state touched in a traced region
        return report_fn(name, value)
    _default_collector()
    value = report_fn(name, value)
    REPORTER.remember_name(name)
    return value


class Collector:
    """StyleGAN3's ``Collector`` API on top of :class:`mmstats.Collector`.

    Each :meth:`update` (a collective: every rank must call it) publishes,
    per name matching ``regex`` (:func:`re.fullmatch`), ``num``, ``mean``
    and ``std`` of the values reported since the previous update on all
    ranks. ``std`` is the population standard deviation (``ddof=0``, 0 for
    one value), as in StyleGAN3 and EDM2.

    Args:
        regex (str | re.Pattern): Collect names that fully match this
            pattern. Defaults to '.*'.
        keep_previous (bool): If True, a name that got no value since the
            previous update keeps its previous statistics (StyleGAN3's
            default); if False it reads ``num=0`` and NaN (EDM2's default).
            Defaults to True.
        ignore_nonfinite (bool): If True, NaN / inf values are left out of
            ``num``, ``mean`` and ``std`` (EDM2); if False they count in
            ``num`` and make that update's ``mean`` and ``std`` NaN
            (StyleGAN3). Keyword only. Defaults to False.

    Example:
        >>> from mmstats import training_stats
        >>> collector = training_stats.Collector(regex='Example/.*')
        >>> _ = training_stats.report('Example/loss', [1.0, 2.0, 3.0])
        >>> collector.names()  # every matching name reported in this process
        ['Example/loss']
        >>> collector.update()
        >>> collector.num('Example/loss'), collector['Example/loss']
        (3, 2.0)
    """

    def __init__(self,
                 regex: Union[str, Pattern] = '.*',
                 keep_previous: bool = True,
                 *,
                 ignore_nonfinite: bool = False) -> None:
        for arg, flag in (('keep_previous', keep_previous),
                          ('ignore_nonfinite', ignore_nonfinite)):
            check_bool('training_stats.Collector', arg, flag)
        self._regex = compile_regex(
            'training_stats.Collector', 'regex', regex, pattern_ok=True)
        self._collector = _StatsCollector(
            regex=self._regex, keep_previous=False)
        self._keep_previous = keep_previous
        self._ignore_nonfinite = ignore_nonfinite
        self._moments: Dict[str, EasyDict] = {}

    def names(self) -> List[str]:
        """Every name reported so far that ``regex`` fully matches, in order
        of first report; then names only other ranks reported."""
        match = self._regex.fullmatch
        names = [name for name in REPORTER.compat_names if match(name)]
        known = set(names)
        return names + [n for n in self._collector.names() if n not in known]

    def update(self) -> None:
        """Publish what was reported since the previous update (a
        collective over the default process group)."""
        self._collector.update()
        published = self._collector.as_dict()
        if not self._keep_previous:
            self._moments = {}
        for name, stats in published.items():
            num = int(stats['num'])
            bad = 0 if self._ignore_nonfinite else int(stats['nonfinite'])
            if num + bad == 0:  # no value: keep or forget, as theirs
                continue
            if bad:
                self._moments[name] = EasyDict(
                    num=num + bad, mean=math.nan, std=math.nan)
            else:
                self._moments[name] = EasyDict(
                    num=num, mean=stats['mean'], std=stats['std'])

    def _get(self, name: str) -> EasyDict:
        if not (isinstance(name, str) and self._regex.fullmatch(name)):
            raise AssertionError(
                f'training_stats.Collector: {name!r} does not match this '
                f'collector\'s regex {self._regex.pattern!r} (StyleGAN3 and '
                'EDM2 assert the same): ask a collector whose regex matches')
        return self._moments.get(name) or EasyDict(
            num=0, mean=math.nan, std=math.nan)

    def num(self, name: str) -> int:
        """Number of values of ``name`` in the last update (0 if none)."""
        return self._get(name).num

    def mean(self, name: str) -> float:
        """Mean of the values of ``name`` (NaN if none)."""
        return self._get(name).mean

    def std(self, name: str) -> float:
        """Population std of the values of ``name`` (NaN if none)."""
        return self._get(name).std

    def nonfinite(self, name: str) -> int:
        """Number of NaN / inf values of ``name`` in the last update (an
        mmstats extension)."""
        return int(self._collector.nonfinite(name))

    def as_dict(self) -> EasyDict:
        """``EasyDict(name=EasyDict(num=int, mean=float, std=float))`` for
        every name of :meth:`names`; JSON-serialisable."""
        return EasyDict(
            (name, EasyDict(self._get(name))) for name in self.names())

    def __getitem__(self, name: str) -> float:
        """``collector[name]`` is ``collector.mean(name)``."""
        return self.mean(name)


def _default_collector() -> Collector:
    """EDM2's module-level collector, created once, at first use."""
    return REPORTER.default_collector(
        lambda: Collector(keep_previous=False, ignore_nonfinite=True))


def __getattr__(name: str) -> Any:
    """``default_collector`` comes into being at its first use."""
    if name == 'default_collector':
        return _default_collector()
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
