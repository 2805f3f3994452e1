# FlexibleRunner + DeepSpeed ZeRO-3 through mmstats.DeepSpeedStrategy
# (mmengine's, whose ZeRO-3 checkpoints also evaluate: docs/checkpoints.md;
# deepspeed <= 0.18.6: `pip install 'mmengine-stats[deepspeed]'`, docs/compat.md).
# Inherit it beside your full
# config; it sets only the runner and the strategy. tools/train.py /
# dist_train.sh turn your optim_wrapper into a DeepSpeedOptimWrapper (its
# clip_grad.max_norm into strategy.gradient_clipping), and FlexibleRunner
# sets train_micro_batch_size_per_gpu from your train_dataloader's
# batch_size. On a machine without CUDA they select DeepSpeed's CPU
# accelerator and gloo. ModuleStatsHook reads gradients in bf16/fp32, not
# under DeepSpeed's fp16 loss scaling (docs/sharding.md).
runner_type = 'FlexibleRunner'
strategy = dict(
    type='mmstats.DeepSpeedStrategy',
    # your config's torch optimizer under ZeRO: without it DeepSpeed refuses
    # every optimizer but Adam, AdamW, Adagrad and its own (SGD: "You are
    # using an untested ZeRO Optimizer"); with it, such an optimizer gets one
    # line on rank 0, "You are using ZeRO with an untested optimizer"
    # (docs/launching.md). Adam / AdamW: no line.
    config=dict(zero_allow_untested_optimizer=True),
    zero_optimization=dict(stage=3),
    gradient_accumulation_steps=1)
