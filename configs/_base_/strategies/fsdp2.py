# FlexibleRunner + torch FSDP2 (fully_shard). mmengine 0.10.7 has no FSDP2
# strategy: DDPStrategy builds mmstats.FullyShard, which applies fully_shard
# to the modules matching `blocks` (re.fullmatch), then to the root.
# Inherit it beside your full config; it sets only the runner and the
# strategy. The default `blocks` matches OpenMMLab backbones' repeated
# stages (ResNet's backbone.layerN, ViT's backbone.layers.N, Swin's and
# ConvNeXt's backbone.stages.N); override it for other models, e.g.
# strategy = dict(model_wrapper=dict(blocks=r'encoder\.block\d+')).
# Optional mixed precision: param_dtype='bfloat16' (fp32_modules=r'.*bn.*'
# keeps CPU BatchNorm in fp32).
runner_type = 'FlexibleRunner'
strategy = dict(
    type='DDPStrategy',
    model_wrapper=dict(
        type='mmstats.FullyShard',
        blocks=r'backbone\.(layer\d+|layers\.\d+|stages\.\d+)'))
