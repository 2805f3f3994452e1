# Copyright (c) mmstats contributors. All rights reserved.
"""The figures of one throughput interval from plain numbers: this rank's
counts (:class:`ThroughputInterval`: samples, iterations, seconds, kept
memory peaks), its share for the reduction over ranks
(:meth:`ThroughputInterval.local_figures`, reduced by
:func:`~mmstats.throughput.reduce_interval`: a separate, explicit step) and
the published figures of the reduced ones
(:meth:`ThroughputInterval.figures`: rates, peaks, FLOP/s, MFU);
:func:`interval_flops` scales the FLOPs of the counted iteration to an
interval. Host numbers only: no tensor, no collective."""
from typing import Dict, NamedTuple, Optional, Tuple

__all__ = ['Figures', 'ThroughputInterval', 'interval_flops']

#: reduced figures as :func:`~mmstats.throughput.reduce_interval` gives them
Maxima = Dict[str, Optional[Tuple[float, int]]]
Sums = Dict[str, Optional[float]]


class Figures(NamedTuple):
    """The published figures of an interval (see
    :meth:`ThroughputInterval.figures`).

    Attributes:
        scalars (dict[str, float]): The figures, by their key in
            ``scalars.json``, in the order they are written.
        missing (tuple[str]): The keys not published because some rank
            could not give them: a memory figure it cannot read,
            ``'throughput/samples'`` (a batch without rows),
            ``'throughput/mfu'`` (FLOP/s published, a peak not known).
            Nothing counted (no FLOPs, a zero time) is not missing.

    Example:
        >>> Figures({'throughput/iters': 2}, ('throughput/mfu', ))
        Figures(scalars={'throughput/iters': 2}, missing=('throughput/mfu',))
    """
    scalars: Dict[str, float]
    missing: Tuple[str, ...]


def interval_flops(counted: Optional[int], counted_rows: Optional[int],
                   samples: Optional[int], iters: int) -> Optional[float]:
    """The FLOPs of an interval of ``iters`` iterations and ``samples``
    samples on one rank, from the ``counted`` FLOPs of one iteration of
    ``counted_rows`` samples: per sample (``counted * samples /
    counted_rows``) where both are known, else per iteration
    (``counted * iters``); None where nothing was counted.

    Example:
        >>> interval_flops(800, 8, 13, 2)  # batches of 8 and 5: 100/sample
        1300.0
        >>> interval_flops(800, None, 13, 2)  # per iteration
        1600.0
        >>> interval_flops(None, 8, 13, 2) is None
        True
    """
    if counted is None:
        return None
    if counted_rows and samples is not None:
        return counted * (samples / counted_rows)
    return float(counted * iters)


class ThroughputInterval:
    """One rank's interval of training iterations, and its figures.

    The counts are host numbers that the caller adds as the interval runs
    (:meth:`add_batch`, :meth:`add_seconds`, :meth:`keep_peaks`). At its
    end, :meth:`local_figures` gives this rank's share for
    :func:`~mmstats.throughput.reduce_interval` (maxima: memory peaks and
    the time; sums: samples, FLOPs and the device's peak FLOP/s), and
    :meth:`figures` turns the reduced ones into what is published:

    - ``memory/<name>`` and ``memory/<name>_rank``: the max over ranks of
      each peak, the rank holding it;
    - ``throughput/iters``, ``throughput/time`` (seconds, max over ranks)
      and ``throughput/iters_per_s = iters / time``;
    - ``throughput/samples`` (sum over ranks) and ``samples_per_s``;
    - ``throughput/flops`` (sum over ranks of :func:`interval_flops`) and
      ``flops_per_s``;
    - ``throughput/mfu = flops_per_s / (sum over ranks of the peaks)``.

    Rates need a time above zero; FLOPs a counted iteration.

    Args:
        peak_flops (float, optional): The peak FLOP/s of one device, which
            wins over the device's peak the caller passes to
            :meth:`local_figures`. Defaults to None.

    Attributes:
        iters (int): Training iterations in the interval.
        rows (int): The samples of the batches whose rows are known.
        unknown (str, optional): The type of a batch whose rows are not
            known (then the interval's samples are not).
        seconds (float): The interval's time on this rank.
        peaks (dict[str, float]): Memory peaks kept from earlier readings
            (before a validation loop).

    Example:
        >>> interval = ThroughputInterval(peak_flops=100.0)
        >>> for rows in (8, 8, 5):  # an uneven last batch
        ...     interval.add_batch(rows)
        >>> interval.add_seconds(3.0)
        >>> interval.keep_peaks(dict(max_rss=700.0))  # before validation
        >>> maxima, sums = interval.local_figures(
        ...     dict(max_rss=600.0), counted=800, counted_rows=8)
        >>> maxima, sums
        ({'memory/max_rss': 700.0, 'throughput/time': 3.0}, \
{'throughput/samples': 21.0, 'throughput/flops': 2100.0, 'peak': 100.0})
        >>> from mmstats.throughput import reduce_interval
        >>> scalars = interval.figures(*reduce_interval(maxima, sums)).scalars
        >>> scalars['throughput/samples_per_s'], scalars['throughput/mfu']
        (7.0, 7.0)
    """

    def __init__(self, peak_flops: Optional[float] = None) -> None:
        self.peak_flops = peak_flops
        self.clear()

    def clear(self) -> None:
        """Start a new interval (nothing counted, no peak kept)."""
        self.iters = 0
        self.rows = 0
        self.unknown: Optional[str] = None
        self.seconds = 0.0
        self.peaks: Dict[str, float] = {}

    @property
    def samples(self) -> Optional[int]:
        """This rank's samples (None if a batch's rows were not known)."""
        return None if self.unknown else self.rows

    def add_batch(self,
                  rows: Optional[int],
                  batch_type: type = object) -> None:
        """Count one iteration on a batch of ``rows`` samples (None: not
        known, for a batch of ``batch_type``)."""
        if rows is None:
            self.unknown = batch_type.__qualname__
        else:
            self.rows += rows
        self.iters += 1

    def add_seconds(self, seconds: float) -> None:
        """Add ``seconds`` to the interval's time."""
        self.seconds += seconds

    def keep_peaks(self, readings: Dict[str, Optional[float]]) -> None:
        """Keep the memory peaks of ``readings`` (MiB, None: not read) in
        the interval's, as peaks that a reset will not clear."""
        for name, value in readings.items():
            if value is not None:
                self.peaks[name] = max(value, self.peaks.get(name, 0.0))

    def local_figures(
        self,
        memory: Dict[str, Optional[float]],
        counted: Optional[int] = None,
        counted_rows: Optional[int] = None,
        device_peak: Optional[float] = None
    ) -> Tuple[Dict[str, Optional[float]], Sums]:
        """This rank's figures for
        :func:`~mmstats.throughput.reduce_interval`.

        Args:
            memory (dict[str, float]): The memory peaks read now (MiB,
                None: not read), with the kept ones (:meth:`keep_peaks`).
            counted (int, optional): The FLOPs of the counted iteration
                (None: nothing counted). Defaults to None.
            counted_rows (int, optional): The samples of the counted
                iteration's batch. Defaults to None.
            device_peak (float, optional): The peak FLOP/s of this device
                for the formats counted (``peak_flops`` wins). Defaults to
                None.

        Returns:
            tuple[dict, dict]: The maxima (``memory/<name>``,
            ``throughput/time``) and the sums (``throughput/samples``,
            ``throughput/flops``, ``peak``; None where not known).
        """
        maxima: Dict[str, Optional[float]] = {}
        for name, value in memory.items():
            if value is not None and name in self.peaks:
                value = max(value, self.peaks[name])
            maxima[f'memory/{name}'] = value
        maxima['throughput/time'] = self.seconds
        samples = self.samples
        flops = interval_flops(counted, counted_rows, samples, self.iters)
        peak = device_peak if self.peak_flops is None else self.peak_flops
        sums = {
            'throughput/samples': None if samples is None else float(samples),
            'throughput/flops': flops,
            'peak': 0.0 if flops is None else peak,
        }
        return maxima, sums

    def figures(self, maxima: Maxima, sums: Sums) -> Figures:
        """The published figures of the interval from the reduced
        ``maxima`` and ``sums`` of :meth:`local_figures` (every rank ran
        this rank's iterations)."""
        scalars: Dict[str, float] = {}
        missing = []
        for key, held in maxima.items():
            if not key.startswith('memory/'):
                continue
            if held is None:
                missing.append(key)
            else:
                scalars[key], scalars[f'{key}_rank'] = held[0], held[1]
        seconds = maxima['throughput/time'][0]
        scalars['throughput/iters'] = self.iters
        scalars['throughput/time'] = seconds
        per_s = 1.0 / seconds if seconds > 0 else None
        if per_s is not None:
            scalars['throughput/iters_per_s'] = self.iters * per_s
        samples, flops = sums['throughput/samples'], sums['throughput/flops']
        if samples is None:
            missing.append('throughput/samples')
        else:
            scalars['throughput/samples'] = samples
            if per_s is not None:
                scalars['throughput/samples_per_s'] = samples * per_s
        if flops is not None:
            scalars['throughput/flops'] = flops
            if per_s is not None:
                scalars['throughput/flops_per_s'] = flops * per_s
                if sums['peak']:
                    scalars['throughput/mfu'] = flops * per_s / sums['peak']
                else:
                    missing.append('throughput/mfu')
        return Figures(scalars, tuple(missing))
