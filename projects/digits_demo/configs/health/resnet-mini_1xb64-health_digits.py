# Training health on the digits demo: every all-rank check of mmstats in one
# config, trained as is (one process, or N with tools/dist_train.sh):
#   python tools/train.py THIS_FILE
# and looked at with (WORK_DIR: work_dirs/resnet-mini_1xb64-health_digits)
#   tensorboard --logdir WORK_DIR/TIMESTAMP/vis_data
#   python tools/analysis/plot_stats.py WORK_DIR
#   python tools/analysis/plot_histograms.py WORK_DIR
#   python tools/analysis/plot_throughput.py WORK_DIR
# The README shows this file from `_base_` on. On a CPU, ThroughputHook says
# once that MFU is not published (no peak FLOP/s is known for it).
_base_ = ['../demo/resnet-mini_1xb64_digits.py']
model = dict(report_stats=True)  # the model's report(): model/feat_norm, ...
custom_hooks = [
    dict(type='mmstats.PreciseBNHook', num_samples=1024),
    dict(
        type='mmstats.StatsCollectorHook',
        stats=('mean', 'std', 'min', 'max', 'p50'),  # a quantile: sketches
        health=dict(
            on_nonfinite='raise',  # NaN/inf: FloatingPointError on all ranks
            spike_regex='loss',  # warns when the loss jumps to 4x its median
            histogram_regex='loss|model/feat_norm')),  # all-rank histograms
    dict(
        type='mmstats.ModuleStatsHook',
        modules=r'backbone\.(stem|stages\.\d)|head',
        optimizer_state=True,  # momentum / Adam moments per module
        watch_nonfinite=True),  # which module first went NaN/inf
    dict(type='mmstats.ThroughputHook'),  # memory, samples/s, FLOP/s, MFU
    dict(type='mmstats.HangWatchHook'),  # a stalled rank named: docs/hangs.md
]
visualizer = dict(vis_backends=[  # TensorBoard: the `demo` extra has it
    dict(type='LocalVisBackend'),
    dict(type='TensorboardVisBackend')
])
