# FlexibleRunner + torch FSDP2 (fully_shard). mmengine 0.10.7 has no FSDP2
# strategy: DDPStrategy builds mmstats.FullyShard, which applies
# fully_shard to the modules matching `blocks`, then to the root. Set
# `blocks` to your model's repeated blocks; optional mixed precision:
# param_dtype='bfloat16' (fp32_modules=r'.*bn.*' keeps CPU BatchNorm in
# fp32).
runner_type = 'FlexibleRunner'
strategy = dict(
    type='DDPStrategy',
    model_wrapper=dict(type='mmstats.FullyShard', blocks=r'backbone\.layer\d'))
