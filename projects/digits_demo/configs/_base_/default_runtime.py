# The demo's modules live in its own 'digits_demo' scope (mmengine imports
# digits_demo.registry by itself); mmstats' hooks are named with their
# 'mmstats.' prefix, which works under any default_scope.
default_scope = 'digits_demo'

default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=10),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(
        type='CheckpointHook', interval=5, max_keep_ckpts=2, save_last=True),
    sampler_seed=dict(type='DistSamplerSeedHook'),
)
env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'),  # tools/train.py switches to gloo on CPU
)
vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='Visualizer', vis_backends=vis_backends)
log_processor = dict(window_size=10, by_epoch=True)
log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=0)
