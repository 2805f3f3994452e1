# FlexibleRunner + mmengine's DDPStrategy. Inherit it beside your full
# config: `_base_ = ['your_config.py', 'mmstats::...']` or a relative path
# to this file. It sets only the runner and the strategy; your
# optim_wrapper, dataloaders and custom_hooks stay as they are.
# tools/train.py / dist_train.sh build it with RUNNERS.build; on a machine
# without CUDA they set the wrapper's device_ids=None and use gloo.
runner_type = 'FlexibleRunner'
strategy = dict(type='DDPStrategy')
