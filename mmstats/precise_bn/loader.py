# Copyright (c) mmstats contributors. All rights reserved.
"""The loader a recomputation reads: never the training loader itself
(calling its ``iter()`` would restart a persistent training stream), but
one over the training dataset built like it (:func:`loader_like`), or one
built from a config of its own (:func:`check_loader_cfg`,
:func:`loader_from_cfg`).

This module knows no Runner: the function that builds a loader from a
config (mmengine's ``Runner.build_dataloader``) is passed in.
"""
import copy
from typing import Any, Callable, Optional

from mmengine.dataset import DefaultSampler
from torch.utils.data import DataLoader

__all__ = ['check_loader_cfg', 'loader_from_cfg', 'loader_like']


def check_loader_cfg(dataloader: Any, owner: str) -> None:
    """Check that ``dataloader`` is None or a loader config with what
    ``Runner.build_dataloader`` needs: ``dataset``, ``sampler`` and
    ``batch_size`` (or ``batch_sampler``).

    Args:
        dataloader (Any): The argument to check.
        owner (str): Who is given it, named in the error.

    Raises:
        TypeError: ``dataloader`` is neither None nor a dict.
        ValueError: a key is missing (the message lists them and the fix).

    Example:
        >>> from mmstats.precise_bn import check_loader_cfg
        >>> check_loader_cfg(None, 'PreciseBNHook')  # the training dataset
        >>> check_loader_cfg(dict(batch_size=4), 'PreciseBNHook')
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: PreciseBNHook: dataloader lacks ['dataset', 'sampler']...
    """
    if dataloader is None:
        return
    if not isinstance(dataloader, dict):
        raise TypeError(f'{owner}: dataloader must be None or a dataloader '
                        f'config dict, got {type(dataloader).__name__}')
    missing = [
        k for k in ('batch_size', 'dataset', 'sampler') if k not in dataloader
        and not (k == 'batch_size' and 'batch_sampler' in dataloader)
    ]
    if missing:
        raise ValueError(
            f'{owner}: dataloader lacks {missing} (got keys '
            f'{sorted(dataloader)}): give a full loader config, e.g. '
            'dataloader=dict(batch_size=64, dataset=dict(type=...), '
            "sampler=dict(type='DefaultSampler', shuffle=True)), or leave "
            'dataloader=None to read the training dataset')


def loader_from_cfg(cfg: dict, seed: Optional[int],
                    build: Callable[...,
                                    DataLoader], owner: str) -> DataLoader:
    """Build a loader from a config checked by :func:`check_loader_cfg`.

    ``build(cfg, seed=seed)`` is called on a deep copy of ``cfg`` (the
    caller's config is never changed) whose ``persistent_workers``
    defaults to ``num_workers > 0``: workers are kept between
    recomputations. A config that cannot be built raises a ``ValueError``
    naming the config, the cause and the fix.

    Args:
        cfg (dict): The loader config.
        seed (int, optional): The run's seed, for the sampler and workers.
        build (Callable): Builds a loader from a config and ``seed=``, e.g.
            mmengine's ``Runner.build_dataloader``.
        owner (str): Who builds it, named in the error.

    Returns:
        DataLoader: What ``build`` returned.

    Example:
        >>> from mmstats.precise_bn import loader_from_cfg
        >>> def build(cfg, seed):  # Runner.build_dataloader in a hook
        ...     return cfg  # what it was given
        >>> cfg = dict(batch_size=4, dataset=[1, 2], sampler=None,
        ...            num_workers=2)
        >>> built = loader_from_cfg(cfg, 0, build, 'PreciseBNHook')
        >>> built['persistent_workers']
        True
        >>> 'persistent_workers' in cfg  # the config stays as it was
        False
    """
    built = copy.deepcopy(cfg)
    built.setdefault('persistent_workers', built.get('num_workers', 0) > 0)
    try:
        return build(built, seed=seed)
    except Exception as exc:
        raise ValueError(
            f'{owner}: could not build its dataloader from '
            f'dataloader={cfg!r} ({exc!r}); fix the config or pass '
            'dataloader=None to read the training dataset') from exc


def loader_like(train_loader: DataLoader, seed: Optional[int],
                owner: str) -> DataLoader:
    """A loader of its own over ``train_loader``'s dataset.

    A shuffled ``DefaultSampler`` (seeded with ``seed``; its
    ``set_epoch`` chooses each run's samples) and, from ``train_loader``:
    the batch size (``batch_size``, else ``batch_sampler.batch_size``),
    ``drop_last`` (the loader's or its batch sampler's), ``num_workers``
    (kept between runs: ``persistent_workers``), ``collate_fn``,
    ``pin_memory`` and ``worker_init_fn``. ``train_loader`` is only read:
    its ``iter()`` is never called.

    Args:
        train_loader (DataLoader): The training loader.
        seed (int, optional): The run's seed, for the sampler.
        owner (str): Who builds it, named in the error.

    Returns:
        DataLoader: The new loader.

    Raises:
        ValueError: the batch size of ``train_loader`` cannot be told.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> from mmstats.precise_bn import loader_like
        >>> train = DataLoader(list(range(10)), batch_size=4, drop_last=True)
        >>> loader = loader_like(train, 0, 'PreciseBNHook')
        >>> loader.batch_size, loader.drop_last, len(loader)
        (4, True, 2)
        >>> type(loader.sampler).__name__, loader.sampler.shuffle
        ('DefaultSampler', True)
    """
    batch_size = train_loader.batch_size or getattr(train_loader.batch_sampler,
                                                    'batch_size', None)
    if not batch_size:
        raise ValueError(f'{owner} cannot tell the batch size of the training '
                         'loader (it has neither batch_size nor batch_sampler.'
                         'batch_size): pass dataloader=dict(...) to the hook')
    dataset = train_loader.dataset
    drop_last = bool(
        train_loader.drop_last
        or getattr(train_loader.batch_sampler, 'drop_last', False))
    workers = train_loader.num_workers
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=DefaultSampler(dataset, shuffle=True, seed=seed),
        num_workers=workers,
        collate_fn=train_loader.collate_fn,
        pin_memory=train_loader.pin_memory,
        worker_init_fn=train_loader.worker_init_fn,
        persistent_workers=workers > 0,
        drop_last=drop_last)
