# Copyright (c) mmstats contributors. All rights reserved.
"""What a resume changes silently: the schedule.

mmengine's resume restores every parameter scheduler's whole state from
the checkpoint, its ``end`` included. A run resumed with a longer (or
shorter) ``train_cfg.max_epochs`` / ``max_iters`` than the checkpoint's
therefore keeps the old schedule: built from the config, a scheduler
without an ``end`` ends at the new ``max_epochs``; resumed, it ends where
the checkpoint's did (after a 2-epoch run resumed with ``max_epochs=3``
the third epoch trains at the old schedule's last learning rate, not on
a cosine stretched over 3 epochs). :class:`ResumeScheduleCheck`, which
``mmstats-train`` registers, compares the schedulers built from the
config with the checkpoint's and warns once, naming the setting and the
way to a new schedule; :func:`schedule_changes` is the comparison.
"""
import re
from typing import Any, List, Optional, Sequence

from mmengine.hooks import Hook

__all__ = ['schedule_changes', 'ResumeScheduleCheck']

MAX_SETTING = re.compile(r'\b(max_epochs|max_iters)\s*=\s*(\d+)')


def _schedulers(runner: Any) -> List[Any]:
    """The runner's built parameter schedulers, in the checkpoint's order
    (a dict of them: by optimizer name, sorted as mmengine saves them)."""
    found = getattr(runner, 'param_schedulers', None)
    if not found or not hasattr(
        (list(found.values())[0] if isinstance(found, dict) else found)[0],
            'state_dict'):
        found = getattr(
            getattr(runner, 'strategy', None), 'param_schedulers', None)
    if isinstance(found, dict):
        return [s for name in found for s in found[name]]
    return list(found or [])


def _saved(checkpoint: dict) -> List[dict]:
    saved = checkpoint.get('param_schedulers') or []
    if isinstance(saved, dict):
        return [s for name in saved for s in saved[name]]
    return list(saved)


def schedule_changes(schedulers: Sequence[Any],
                     saved: Sequence[dict],
                     setting: str = '') -> List[str]:
    """One phrase per scheduler whose ``end`` built from this config
    differs from the checkpoint's (which the resume restores).

    Args:
        schedulers (Sequence): The schedulers built from the config.
        saved (Sequence[dict]): Their ``state_dict`` in the checkpoint.
        setting (str): What changed, for the phrase (e.g.
            ``"train_cfg.max_epochs=3, the checkpoint's 2"``). Defaults
            to ``''``.

    Returns:
        list[str]: Empty where the schedules agree.

    Example:
        >>> from types import SimpleNamespace
        >>> built = SimpleNamespace(end=51, by_epoch=False)
        >>> schedule_changes([built], [dict(end=34, by_epoch=False)])
        ['param_scheduler[0] (SimpleNamespace) ends at iteration 34 as saved, at 51 in this config']
    """  # noqa: E501
    changes = []
    for i, (now, old) in enumerate(zip(schedulers, saved)):
        end, was = getattr(now, 'end', None), old.get('end')
        if end is None or was is None or end == was:
            continue
        unit = 'epoch' if old.get('by_epoch', False) else 'iteration'
        changes.append(f'param_scheduler[{i}] ({type(now).__name__}) ends at '
                       f'{unit} {was} as saved, at {end} in this config' +
                       (f' ({setting})' if setting else ''))
    return changes


def changed_setting(runner: Any, checkpoint: dict) -> str:
    """``"train_cfg.max_epochs=3, the checkpoint's 2"`` where the loop's
    length differs from the one in the checkpoint's config, else ``''``.

    Example:
        >>> from types import SimpleNamespace
        >>> loop = SimpleNamespace(max_epochs=3, max_iters=51)
        >>> cfg = 'train_cfg = dict(by_epoch=True, max_epochs=2)'
        >>> changed_setting(SimpleNamespace(train_loop=loop),
        ...                 dict(meta=dict(cfg=cfg)))
        "train_cfg.max_epochs=3, the checkpoint's 2"
    """
    cfg = str((checkpoint.get('meta') or {}).get('cfg') or '')
    loop = getattr(runner, 'train_loop', None)
    for name, old in MAX_SETTING.findall(cfg):
        now = getattr(loop, name, None)
        if now is not None and now != int(old):
            return f"train_cfg.{name}={now}, the checkpoint's {old}"
    return ''


class ResumeScheduleCheck(Hook):
    """Warn once when a resume restores schedulers whose ``end`` differs
    from this config's (see the module's docstring).

    Example:
        .. code-block:: python

            runner.register_hook(ResumeScheduleCheck(), priority='LOW')
    """

    priority = 'LOW'

    def __init__(self) -> None:
        self.warned: Optional[str] = None

    def after_load_checkpoint(self, runner: Any, checkpoint: dict) -> None:
        if self.warned is not None or not getattr(runner, '_resume', True):
            return
        setting = changed_setting(runner, checkpoint)
        changes = schedule_changes(
            _schedulers(runner), _saved(checkpoint), setting)
        if not changes:
            return
        self.warned = (
            'resume keeps the checkpoint\'s schedule: ' + '; '.join(changes) +
            '. mmengine restores each scheduler\'s state, its end '
            'included: the added epochs or iterations train on the old '
            'schedule (its last value, or its curve). For a schedule over '
            'the new length, start a new run from the weights: '
            '--cfg-options load_from=CHECKPOINT resume=False (the '
            'optimizer state and the counters start afresh).')
        runner.logger.warning(self.warned)
