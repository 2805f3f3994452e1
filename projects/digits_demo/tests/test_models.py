import pytest
import torch
import torch.nn.functional as F
from torch import nn

from digits_demo.models import ImageClassifier, ResNetMini
from digits_demo.registry import MODELS


def build(norm_cfg=dict(type='BN'), **backbone):
    return MODELS.build(
        dict(
            type='ImageClassifier',
            backbone=dict(
                type='ResNetMini',
                stem_channels=8,
                stage_channels=(8, 16),
                norm_cfg=norm_cfg,
                **backbone)))


def batch(n=6):
    torch.manual_seed(0)
    return dict(
        inputs=torch.randn(n, 1, 8, 8),
        data_samples=dict(
            gt_label=torch.arange(n) % 10, img_id=torch.arange(n)))


def test_modes_tensor_loss_predict():
    model = build()
    data = model.data_preprocessor(batch(), False)
    logits = model(**data, mode='tensor')
    assert logits.shape == (6, 10)
    loss = model(**data, mode='loss')['loss']
    torch.testing.assert_close(
        loss, F.cross_entropy(logits, data['data_samples']['gt_label']))
    preds = model(**data, mode='predict')
    assert len(preds) == 6
    assert int(preds[2]['pred_label']) == int(logits[2].argmax())
    assert int(preds[2]['gt_label']) == 2
    with pytest.raises(ValueError, match="mode must be"):
        model(**data, mode='bogus')


def test_train_step_reduces_loss():
    from mmengine.optim import OptimWrapper
    model = build()
    optim = OptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    data = batch(20)
    first = model.train_step(data, optim)['loss'].item()
    for _ in range(40):
        last = model.train_step(data, optim)['loss'].item()
    assert last < 0.5 * first


def test_preprocessor_accepts_pseudo_collate_lists():
    model = build()
    data = batch(3)
    listed = dict(
        inputs=list(data['inputs']),
        data_samples=[
            dict(gt_label=g, img_id=i)
            for g, i in zip(data['data_samples']['gt_label'],
                            data['data_samples']['img_id'])
        ])
    a = model.data_preprocessor(listed, False)
    b = model.data_preprocessor(data, False)
    torch.testing.assert_close(a['inputs'], b['inputs'])
    torch.testing.assert_close(a['data_samples']['gt_label'],
                               b['data_samples']['gt_label'])


@pytest.mark.parametrize('norm_cfg, layer', [
    (dict(type='BN'), nn.BatchNorm2d),
    (dict(type='GN', num_groups=4), nn.GroupNorm),
    (dict(type='SyncBN'), nn.SyncBatchNorm),
])
def test_norm_layers_come_from_norm_cfg(norm_cfg, layer):
    model = build(norm_cfg)
    norms = [
        m for m in model.modules()
        if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.GroupNorm))
    ]
    assert len(norms) == 6  # stem, 2 per block x 2 blocks, 1 downsample
    assert all(isinstance(m, layer) for m in norms)
    out = model(**model.data_preprocessor(batch(), False))
    assert torch.isfinite(out).all()


def test_bad_model_config_gives_clear_errors():
    with pytest.raises(ValueError, match='norm_cfg must be a dict'):
        ResNetMini(norm_cfg=dict(num_groups=4))
    with pytest.raises(ValueError, match="norm_cfg type 'Foo' is not"):
        ResNetMini(norm_cfg=dict(type='Foo'))
    with pytest.raises(ValueError, match='num_classes'):
        ImageClassifier(backbone=dict(type='ResNetMini'), num_classes=1)
