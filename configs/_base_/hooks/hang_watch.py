# A rank that stops names itself: rank 0 logs which rank, host, phase and
# iteration, for how long, and where its Python stacks are, within minutes
# instead of at the collective's timeout (inherit with _base_ = [...];
# docs/hangs.md). on_hang='exit' ends every rank with exit status 114.
custom_hooks = [
    dict(type='mmstats.HangWatchHook', timeout='auto', on_hang='warn'),
]
