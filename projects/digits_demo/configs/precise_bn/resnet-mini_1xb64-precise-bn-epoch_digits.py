# Precise BN after every epoch, on 1024 training samples (over all ranks).
_base_ = ['../demo/resnet-mini_1xb64_digits.py']
custom_hooks = [
    dict(type='mmstats.PreciseBNHook', num_samples=1024, interval=1),
]
