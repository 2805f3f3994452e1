# All-rank statistics of the losses and of what the model reports from its
# forward (mmstats.report), published every LoggerHook interval.
_base_ = ['../demo/resnet-mini_1xb64-iter_digits.py']
model = dict(report_stats=True)
custom_hooks = [
    dict(
        type='mmstats.StatsCollectorHook',
        stats=('mean', 'std', 'min', 'max')),
]
