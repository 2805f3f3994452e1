# All-rank statistics of the losses and of everything mmstats.report() got,
# published where LoggerHook logs (inherit with _base_ = [...]).
custom_hooks = [
    dict(type='mmstats.StatsCollectorHook'),
]
