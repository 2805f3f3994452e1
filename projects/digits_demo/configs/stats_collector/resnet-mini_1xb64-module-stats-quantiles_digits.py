# Per-module statistics (activation scale, gradient norm, update ratio of
# the stem, the stages and the head) and quantiles of everything reported,
# published where LoggerHook logs. `python tools/analysis/plot_stats.py
# WORK_DIR` draws the quantile bands and the module heat maps.
_base_ = ['../demo/resnet-mini_1xb64_digits.py']
model = dict(report_stats=True)
custom_hooks = [
    dict(
        type='mmstats.StatsCollectorHook',
        stats=('mean', 'std', 'min', 'max', 'p1', 'p50', 'p99')),
    dict(
        type='mmstats.ModuleStatsHook',
        modules=r'backbone\.(stem|stages\.\d)|head'),
]
