# Copyright (c) mmstats contributors. All rights reserved.
"""A small ResNet-style backbone built from ``mmcv.cnn`` bricks."""
from typing import Optional, Sequence

import torch
from mmcv.cnn import ConvModule
from mmengine.model import BaseModule
from mmengine.registry import MODELS as MMENGINE_MODELS
from torch import nn

from digits_demo.registry import MODELS


class BasicBlock(BaseModule):
    """Two 3x3 ConvModules with a residual connection.

    Args:
        in_channels (int): Input channels.
        out_channels (int): Output channels.
        stride (int): Stride of the first conv. Defaults to 1.
        norm_cfg (dict): Config of the norm layers. Defaults to BN.
    """

    def __init__(self,
                 in_channels: int,
                 out_channels: int,
                 stride: int = 1,
                 norm_cfg: dict = dict(type='BN')) -> None:
        super().__init__()
        self.conv1 = ConvModule(
            in_channels, out_channels, 3, stride, 1, norm_cfg=norm_cfg)
        self.conv2 = ConvModule(
            out_channels,
            out_channels,
            3,
            1,
            1,
            norm_cfg=norm_cfg,
            act_cfg=None)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = ConvModule(
                in_channels,
                out_channels,
                1,
                stride,
                norm_cfg=norm_cfg,
                act_cfg=None)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(self.conv2(self.conv1(x)) + identity)


@MODELS.register_module()
class ResNetMini(BaseModule):
    """ResNet-style backbone for small images (e.g. 8x8 digits).

    A 3x3 stem, then one stage per entry of ``stage_channels`` (the first at
    stride 1, the others at stride 2), then global average pooling.

    Args:
        in_channels (int): Image channels. Defaults to 1.
        stem_channels (int): Channels of the stem. Defaults to 32.
        stage_channels (Sequence[int]): Channels of each stage.
            Defaults to (32, 64).
        blocks_per_stage (int): Basic blocks per stage. Defaults to 1.
        norm_cfg (dict): Config of every norm layer, e.g. ``dict(type='BN')``,
            ``dict(type='GN', num_groups=8)`` or ``dict(type='SyncBN')``.
            Defaults to ``dict(type='BN')``.
        init_cfg (dict, optional): mmengine init config. Defaults to None.
    """

    def __init__(self,
                 in_channels: int = 1,
                 stem_channels: int = 32,
                 stage_channels: Sequence[int] = (32, 64),
                 blocks_per_stage: int = 1,
                 norm_cfg: dict = dict(type='BN'),
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg)
        if not isinstance(norm_cfg, dict) or 'type' not in norm_cfg:
            raise ValueError('norm_cfg must be a dict with a "type" key, e.g. '
                             f"dict(type='BN'), got {norm_cfg!r}")
        if MMENGINE_MODELS.get(norm_cfg['type']) is None:
            raise ValueError(
                f"norm_cfg type {norm_cfg['type']!r} is not a registered norm "
                "layer: use e.g. 'BN', 'SyncBN', 'GN' (with num_groups), 'LN'"
                " or 'IN'")
        if not stage_channels or blocks_per_stage < 1:
            raise ValueError('stage_channels must be non-empty and '
                             'blocks_per_stage >= 1, got '
                             f'{stage_channels!r}, {blocks_per_stage!r}')
        self.stem = ConvModule(
            in_channels, stem_channels, 3, 1, 1, norm_cfg=norm_cfg)
        blocks, channels = [], stem_channels
        for i, out_channels in enumerate(stage_channels):
            for j in range(blocks_per_stage):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(
                    BasicBlock(channels, out_channels, stride, norm_cfg))
                channels = out_channels
        self.stages = nn.Sequential(*blocks)
        self.out_channels = channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x)).mean(dim=(2, 3))
