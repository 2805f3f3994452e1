"""FlexibleRunner on the pooled gloo ranks of ``tests/helpers/dist.py``:
the toy config trimmed for it, and the strategies the tests run, by name."""
from mmengine.config import Config

from tests.helpers.deepspeed import use_deepspeed
from tests.helpers.runner import toy_cfg

#: the FSDP2 units of the toy models (``mmstats.FullyShard(blocks=...)``)
FSDP2_BLOCKS = r'backbone\.(stem|layer1)|head'


def flexible_cfg(work_dir: str, rank: int, **toy_kwargs) -> Config:
    """:func:`toy_cfg` (iteration-based; ``toy_kwargs`` passed on) for a
    FlexibleRunner on rank ``rank``: its own work dir, no validation, no
    checkpoints, the process group already initialised."""
    cfg = toy_cfg(f'{work_dir}/r{rank}', by_epoch=False, **toy_kwargs)
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.train_cfg.pop('val_interval', None)
    cfg.default_hooks.pop('checkpoint')
    cfg.launcher = 'pytorch'
    return cfg


def use_strategy(cfg: Config, strategy: str, **fully_shard) -> None:
    """Set ``cfg``'s strategy by name: ``ddp``; FSDP1 on CPU with original
    (``fsdp``) or flat (``fsdp_flat``) parameters, or not sharded at all
    (``fsdp_noshard``: ``NO_SHARD``, original parameters); FSDP2 (``fsdp2``:
    ``mmstats.FSDP2Strategy``, ``FullyShard`` over ``FSDP2_BLOCKS``,
    ``fully_shard`` more of its arguments; ``fsdp2_hsdp``: with 2
    replicas); DeepSpeed ZeRO
    (``zero1``-``zero3``, with its optimizer wrapper: :func:`use_deepspeed`).
    """
    if strategy.startswith('zero'):
        use_deepspeed(cfg, int(strategy[-1]))
    elif strategy == 'ddp':
        cfg.strategy = dict(
            type='DDPStrategy',
            model_wrapper=dict(
                type='MMDistributedDataParallel', device_ids=None))
    elif strategy.startswith('fsdp2'):
        if strategy == 'fsdp2_hsdp':
            fully_shard['replicas'] = 2
        cfg.strategy = dict(
            type='mmstats.FSDP2Strategy',
            model_wrapper=dict(
                type='mmstats.FullyShard', blocks=FSDP2_BLOCKS, **fully_shard))
    elif strategy in ('fsdp', 'fsdp_flat', 'fsdp_noshard'):
        cfg.strategy = dict(
            type='FSDPStrategy',
            model_wrapper=dict(
                type='MMFullyShardedDataParallel',
                device_id='cpu',
                use_orig_params=strategy != 'fsdp_flat'))
        if strategy == 'fsdp_noshard':
            cfg.strategy.model_wrapper.sharding_strategy = 'NO_SHARD'
    else:
        raise ValueError(f'unknown strategy {strategy!r}')
