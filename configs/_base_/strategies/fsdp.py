# FlexibleRunner + torch FSDP1 through mmstats.FSDPStrategy (mmengine's
# FSDPStrategy, with checkpoints that resume: docs/checkpoints.md). Inherit
# it beside your full config; it sets only the runner and the strategy (your
# optim_wrapper, dataloaders and custom_hooks stay as they are). mmstats'
# hooks publish the norms of the full tensors (docs/sharding.md).
# Checkpoints: state_dict_cfg='local' (mmengine's default) writes a sharded
# torch.distributed.checkpoint directory; 'full' one file of full tensors.
# tools/train.py / dist_train.sh build it with RUNNERS.build; on a machine
# without CUDA they add device_id='cpu' to the wrapper and use gloo.
# Mixed precision: model_wrapper.mixed_precision=dict(param_dtype=...).
runner_type = 'FlexibleRunner'
strategy = dict(
    type='mmstats.FSDPStrategy',
    model_wrapper=dict(
        type='MMFullyShardedDataParallel', use_orig_params=True))
