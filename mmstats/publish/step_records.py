# Copyright (c) mmstats contributors. All rights reserved.
"""One ``scalars.json`` record per step: the records that one step's
writers give mmengine's ``LocalVisBackend`` (StatsCollectorHook's
statistics, ThroughputHook's figures, PreciseBNHook's values, LoggerHook's
line) joined into one line, so that ``pandas.read_json(path, lines=True)``
gives one row per step with no merge (``docs/logging.md``).

LocalVisBackend appends one JSON line per ``add_scalars`` call. Joined, a
call whose step is that of one of the last ``LOOK_BACK`` lines (with no
later line of a larger step between, and no key of that line holding
another value) rewrites that line as the union of both, and the lines
after it as they were; anything else appends, as before. A later line of a
larger step means the step is over: LoggerHook's validation metrics, whose
step is the epoch (``log_metric_by_epoch``), never join an iteration's
record. Nothing is held back: a run that stops at any point leaves every
record it wrote. Where LoggerHook also names its own file
(``<timestamp>.json``), that file gets exactly what LoggerHook gave, as
before. TensorBoard and W&B keep their own per-key records and are not
touched. Another writer of the same file (the size changed since this
joiner wrote) only makes the next record append.
"""
from __future__ import annotations
import copy
import os.path as osp
from collections import deque
from typing import Any, Deque, Optional

__all__ = ['join_step_records', 'StepRecordJoiner', 'LOOK_BACK']

#: how many of its last lines a joiner may still join
LOOK_BACK = 8


class StepRecordJoiner:
    """Join the consecutive same-step records of one ``LocalVisBackend``
    in its ``scalars.json`` (installed on the backend instance by
    :func:`join_step_records`).

    Args:
        backend: mmengine's ``LocalVisBackend``.

    Example:
        >>> import json, tempfile
        >>> from mmengine.visualization import LocalVisBackend
        >>> backend = LocalVisBackend(tempfile.mkdtemp())
        >>> joiner = StepRecordJoiner(backend)
        >>> joiner.add_scalars({'stats/loss/mean': 2.0}, step=10)
        >>> joiner.add_scalars({'loss': 2.1, 'lr': 0.1}, step=10)
        >>> joiner.add_scalars({'loss': 1.9}, step=20)
        >>> with open(backend._scalar_save_file) as f:
        ...     [json.loads(line)['step'] for line in f]
        [10, 20]
    """

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        # the file's last lines as this joiner wrote them: [step, record,
        # offset where the line starts], and the file's size after them
        self._lines: Deque[list] = deque(maxlen=LOOK_BACK)
        self._end = -1

    def add_scalars(self,
                    scalar_dict: dict,
                    step: int = 0,
                    file_path: Optional[str] = None,
                    **kwargs: Any) -> None:
        """``LocalVisBackend.add_scalars``, joining a recent line of the
        same step."""
        backend = self.backend.experiment  # creates the directory once
        record = copy.deepcopy(scalar_dict)
        record.setdefault('step', step)
        if file_path is not None:  # LoggerHook's own file: as it was
            assert file_path.split('.')[-1] == 'json'
            backend._dump(record, osp.join(backend._save_dir, file_path),
                          'json')
        path = backend._scalar_save_file
        size = osp.getsize(path) if osp.exists(path) else 0
        lines = self._lines if size == self._end else None
        if not lines:
            self._lines.clear()
        index = None if not lines else self._joinable(record)
        if index is None:
            self._lines.append([record['step'], record, size])
            backend._dump(record, path, 'json')
        else:
            kept = list(self._lines)[index:]
            kept[0][1] = {**kept[0][1], **record}
            with open(path, 'r+') as f:  # rewrite from the joined line on
                f.truncate(kept[0][2])
            for line in kept:
                line[2] = osp.getsize(path)
                backend._dump(line[1], path, 'json')
        self._end = osp.getsize(path)

    def _joinable(self, record: dict) -> Optional[int]:
        """The index of the recent line ``record`` joins, or None."""
        step = record['step']
        for index in range(len(self._lines) - 1, -1, -1):
            line_step, line, _ = self._lines[index]
            if line_step == step:
                return None if _conflicts(line, record) else index
            if line_step > step:  # that step is over
                return None
        return None


def _conflicts(old: dict, new: dict) -> bool:
    """Whether a key of both holds two values (never joined: nothing is
    merged away)."""
    for key, value in new.items():
        if key in old:
            try:
                if not bool(old[key] == value):
                    return True
            except (TypeError, ValueError):  # arrays: not compared
                return True
    return False


def join_step_records(visualizer: Any) -> int:
    """Make every ``LocalVisBackend`` of ``visualizer`` (rank 0's; other
    ranks write nothing) join the same-step records of ``scalars.json``
    (:class:`StepRecordJoiner`; once per backend). Returns how many
    backends join.

    Example:
        >>> from types import SimpleNamespace
        >>> join_step_records(SimpleNamespace(_vis_backends={}))
        0
    """
    from mmengine.visualization import LocalVisBackend
    joined = 0
    for backend in (getattr(visualizer, '_vis_backends', None) or {}).values():
        if not isinstance(backend, LocalVisBackend):
            continue
        joined += 1
        if isinstance(
                getattr(backend.add_scalars, '__self__', None),
                StepRecordJoiner):
            continue
        backend.add_scalars = StepRecordJoiner(backend).add_scalars
    return joined
