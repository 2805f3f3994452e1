"""DeepSpeedStrategy on CPU gloo ranks, set up the same way by every test."""
import os


def use_deepspeed(cfg, stage: int) -> None:
    """Make ``cfg`` train with mmengine's DeepSpeedStrategy, ZeRO ``stage``,
    AdamW, on the CPU ranks of ``tests/helpers/dist.py``' pool."""
    os.environ['DS_ACCELERATOR'] = 'cpu'
    import deepspeed
    from deepspeed.utils import groups
    from mmengine.registry import OPTIMIZERS

    # DeepSpeed keeps a clone of the world group for good; a pooled rank
    # whose default group was rebuilt since (a test that tore the groups
    # down) would broadcast on the stale clone
    groups._WORLD_GROUP = None
    deepspeed.init_distributed(dist_backend='gloo')  # the group exists
    # mmengine 0.10.7's DeepSpeedStrategy registers DeepSpeed's optimizers on
    # every build: a second one in this (pooled) process would raise
    # "already registered"
    for name in ('DeepSpeedCPUAdam', 'FusedAdam', 'FusedLamb', 'OnebitAdam',
                 'OnebitLamb', 'ZeroOneAdam'):
        OPTIMIZERS.module_dict.pop(name, None)
    cfg.strategy = dict(
        type='DeepSpeedStrategy',
        zero_optimization=dict(
            stage=stage, stage3_param_persistence_threshold=0),
        train_micro_batch_size_per_gpu=8,
        gradient_accumulation_steps=1)
    cfg.optim_wrapper = dict(
        type='DeepSpeedOptimWrapper',
        optimizer=dict(type='AdamW', lr=1e-2, weight_decay=0.0))
