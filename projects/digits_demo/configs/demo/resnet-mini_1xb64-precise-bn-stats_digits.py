# The main job (`make demo`): the demo with both mmstats hooks switched on.
# - PreciseBNHook: exact BN statistics after every epoch (1024 samples)
# - StatsCollectorHook: all-rank loss and model statistics in the log
_base_ = ['./resnet-mini_1xb64_digits.py']
model = dict(report_stats=True)
custom_hooks = [
    dict(type='mmstats.PreciseBNHook', num_samples=1024, interval=1),
    dict(
        type='mmstats.StatsCollectorHook',
        stats=('mean', 'std', 'min', 'max')),
]
