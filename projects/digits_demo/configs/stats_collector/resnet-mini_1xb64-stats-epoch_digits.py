# One all-rank summary per epoch of the losses and the model's reports.
_base_ = ['../demo/resnet-mini_1xb64_digits.py']
model = dict(report_stats=True)
custom_hooks = [
    dict(
        type='mmstats.StatsCollectorHook',
        by_epoch=True,
        stats=('num', 'mean', 'std', 'min', 'max')),
]
