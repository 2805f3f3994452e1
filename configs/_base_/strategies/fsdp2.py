# FlexibleRunner + torch FSDP2 (fully_shard) through mmstats.FSDP2Strategy
# (mmengine 0.10.7 has no FSDP2 strategy): mmstats.FullyShard applies
# fully_shard to the modules matching `blocks` (re.fullmatch), then to the
# root, and checkpoints hold every rank's shard (one file of full tensors;
# state_dict_cfg='sharded' for a torch.distributed.checkpoint directory).
# Inherit it beside your full config; it sets only the runner and the
# strategy. The default `blocks` matches OpenMMLab backbones' repeated
# stages (ResNet's backbone.layerN, ViT's backbone.layers.N, Swin's and
# ConvNeXt's backbone.stages.N); override it for other models, e.g.
# strategy = dict(model_wrapper=dict(blocks=r'encoder\.block\d+')).
# Optional mixed precision: param_dtype='bfloat16' (fp32_modules=r'.*bn.*'
# keeps CPU BatchNorm in fp32).
runner_type = 'FlexibleRunner'
strategy = dict(
    type='mmstats.FSDP2Strategy',
    model_wrapper=dict(
        type='mmstats.FullyShard',
        blocks=r'backbone\.(layer\d+|layers\.\d+|stages\.\d+)'))
