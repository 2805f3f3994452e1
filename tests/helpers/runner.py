"""Small real-Runner configs around the toy BN model (a few iterations)."""
import time
from typing import Optional

from mmengine.config import Config

from . import toy  # noqa: F401  (registers the toy classes)


def _loader(num_samples: int,
            batch_size: int,
            shuffle: bool,
            infinite: bool = False,
            dataset: Optional[dict] = None) -> dict:
    sampler = 'InfiniteSampler' if infinite else 'DefaultSampler'
    return dict(
        batch_size=batch_size,
        num_workers=0,
        sampler=dict(type=sampler, shuffle=shuffle),
        collate_fn=dict(type='default_collate'),
        dataset=dataset or dict(type='ToyDataset', num_samples=num_samples))


def toy_cfg(work_dir: str,
            by_epoch: bool = True,
            num_samples: int = 160,
            batch_size: int = 16,
            max_epochs: int = 2,
            max_iters: int = 20,
            val_interval: Optional[int] = None,
            log_interval: int = 2,
            report_stats: bool = False,
            **overrides) -> Config:
    """A real-Runner config of the toy BN model on synthetic data.

    Args:
        work_dir (str): The work dir.
        by_epoch (bool): EpochBasedTrainLoop (``max_epochs``) or
            IterBasedTrainLoop (``max_iters``, infinite sampler). Defaults
            to True.
        num_samples (int): Training samples; the epoch has
            ``ceil(num_samples / batch_size)`` iterations. Defaults to 160.
        batch_size (int): Training batch size. Defaults to 16.
        max_epochs (int): Epochs (epoch-based). Defaults to 2.
        max_iters (int): Iterations (iteration-based). Defaults to 20.
        val_interval (int, optional): Validation interval; None: every
            epoch, or ``max_iters``. Defaults to None.
        log_interval (int): LoggerHook interval. Defaults to 2.
        report_stats (bool): The model reports ``model/feat_norm``.
            Defaults to False.
        **overrides: Merged into the config last.

    Returns:
        Config: Ready for ``Runner.from_cfg``.
    """
    if by_epoch:
        train_cfg = dict(
            by_epoch=True,
            max_epochs=max_epochs,
            val_interval=val_interval or 1)
    else:
        train_cfg = dict(
            type='IterBasedTrainLoop',
            max_iters=max_iters,
            val_interval=val_interval or max_iters)
    cfg = Config(
        dict(
            work_dir=str(work_dir),
            experiment_name=f'toy_{time.time_ns()}',
            model=dict(type='ToyBNModel', report_stats=report_stats),
            train_dataloader=_loader(
                num_samples, batch_size, True, infinite=not by_epoch),
            val_dataloader=_loader(64, 32, False),
            val_evaluator=dict(type='ToyAccuracy'),
            optim_wrapper=dict(
                optimizer=dict(type='SGD', lr=0.1, momentum=0.9)),
            train_cfg=train_cfg,
            val_cfg=dict(),
            default_hooks=dict(
                logger=dict(type='LoggerHook', interval=log_interval),
                checkpoint=dict(
                    type='CheckpointHook', interval=100, by_epoch=by_epoch)),
            log_processor=dict(by_epoch=by_epoch),
            env_cfg=dict(dist_cfg=dict(backend='gloo')),
            randomness=dict(seed=0),
            default_scope=None,
        ))
    cfg.merge_from_dict(overrides)
    return cfg


def gloo_launch(cfg: Config) -> Config:
    """Make ``cfg`` run inside an already initialised gloo process group
    (``tests.helpers.dist.run_distributed``)."""
    cfg.launcher = 'pytorch'
    cfg.model_wrapper_cfg = dict(
        type='MMDistributedDataParallel', device_ids=None)
    return cfg


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def clear_mmengine_singletons() -> None:
    """Close mmengine's loggers and drop its global singletons (MessageHub,
    Visualizer, DefaultScope...), as ``RunnerTestCase.tearDown`` does."""
    from mmengine.logging import MMLogger
    from mmengine.utils import ManagerMixin
    for logger in MMLogger._instance_dict.values():
        for handler in list(logger.handlers):
            handler.close()
            logger.removeHandler(handler)
    for cls in _subclasses(ManagerMixin):
        cls._instance_dict.clear()


def read_scalars(runner, missing_ok: bool = False) -> dict:
    """``vis_data/scalars.json`` of ``runner`` merged by step (LoggerHook's
    records and the hooks' own).

    Args:
        runner (Runner): The runner that trained.
        missing_ok (bool): Return ``{}`` where there is no file (ranks > 0
            write none). Defaults to False.
    """
    import json
    import os.path as osp
    merged: dict = {}
    path = osp.join(runner.log_dir, 'vis_data', 'scalars.json')
    if missing_ok and not osp.exists(path):
        return merged
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            merged.setdefault(record['step'], {}).update(record)
    return merged
