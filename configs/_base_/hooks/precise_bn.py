# Precise BN after every epoch (inherit with _base_ = [...]; any
# default_scope).
custom_hooks = [
    dict(type='mmstats.PreciseBNHook', num_samples=8192, interval=1),
]
