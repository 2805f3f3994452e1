# FlexibleRunner + DeepSpeed ZeRO-3 (deepspeed <= 0.19.6 with mmengine
# 0.10.7). train_micro_batch_size_per_gpu must equal the loader's
# batch_size. ModuleStatsHook reads gradients in bf16/fp32, not under
# DeepSpeed's fp16 loss scaling (docs/sharding.md).
runner_type = 'FlexibleRunner'
strategy = dict(
    type='DeepSpeedStrategy',
    zero_optimization=dict(stage=3),
    train_micro_batch_size_per_gpu=32,
    gradient_accumulation_steps=1)
optim_wrapper = dict(
    type='DeepSpeedOptimWrapper', optimizer=dict(type='AdamW', lr=1e-3))
