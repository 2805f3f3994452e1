# FlexibleRunner + mmengine's FSDPStrategy (torch FSDP1). mmstats' hooks
# publish the norms of the full tensors (docs/sharding.md). On CPU with
# gloo add device_id='cpu' to model_wrapper (docs/integrations.md).
runner_type = 'FlexibleRunner'
strategy = dict(
    type='FSDPStrategy',
    model_wrapper=dict(
        type='MMFullyShardedDataParallel', use_orig_params=True))
