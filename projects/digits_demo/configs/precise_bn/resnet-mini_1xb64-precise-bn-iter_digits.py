# Precise BN every 50 iterations (before each validation), iteration-based.
_base_ = ['../demo/resnet-mini_1xb64-iter_digits.py']
custom_hooks = [
    dict(type='mmstats.PreciseBNHook', num_samples=1024, interval=50),
]
