"""An mmpretrain-style training run with all three mmstats hooks.

The structure users train (mmpretrain's ``ImageClassifier`` + ``ResNet``):
a data preprocessor with a Mixup batch augment, a frozen first stage
(``frozen_stages=1``: its BN layers in eval mode), ``EMAHook``, and
PreciseBNHook + StatsCollectorHook + ModuleStatsHook. Built from mmengine /
mmcv-lite parts (CI does not install mmpretrain); the same checks run on
mmpretrain's own ``ImageClassifier`` + ``ResNet_CIFAR`` when mmpretrain is
importable.

Every checked number is recomputed in float64 from raw values: the loss
statistics of each publication from the per-iteration losses of exactly the
iterations it covers, ModuleStatsHook's values from the module's output and
parameters on the publication iteration, and the precise BN statistics of
the first trainable BN layer (after the frozen stage and a bias-free conv,
its inputs do not depend on how samples are batched) from the whole dataset.
"""
import copy
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.dataset import default_collate, pseudo_collate
from mmengine.evaluator import BaseMetric
from mmengine.hooks import EMAHook, Hook
from mmengine.model import BaseDataPreprocessor, BaseModel
from mmengine.registry import DATASETS
from mmengine.registry import HOOKS as ROOT_HOOKS
from mmengine.registry import METRICS, MODELS
from mmengine.runner import Runner
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import Dataset

from tests.helpers.runner import read_scalars

mmcv_cnn = pytest.importorskip('mmcv.cnn')

NUM_SAMPLES, BATCH, EPOCHS, LOG_INTERVAL = 48, 8, 2, 4
# 6 iterations per epoch: LoggerHook logs at 4 and 10, StatsCollectorHook
# also publishes the rest of each epoch (5-6, 11-12)
PUBLISHED = [4, 6, 10, 12]
MEAN, STD = [120.0, 110.0, 100.0], [60.0, 55.0, 50.0]


# ------------------------------------------------------------------ data
def _images(num_samples: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(num_samples) % 4
    images = torch.randint(0, 80, (num_samples, 3, 16, 16), generator=gen)
    for i, label in enumerate(labels.tolist()):  # a bright band per class
        images[i, label % 3, 4 * label:4 * label + 4] += 150
    return images.to(torch.uint8), labels


@DATASETS.register_module(force=True)
class PretrainStyleDataset(Dataset):
    """uint8 3x16x16 images of 4 classes; ``mmpretrain=True`` packs the
    label as mmpretrain's ``DataSample`` (as its ``PackInputs`` does)."""

    def __init__(self, num_samples: int = NUM_SAMPLES, mmpretrain=False):
        self.images, self.labels = _images(num_samples)
        self.mmpretrain = mmpretrain

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, idx: int) -> dict:
        label = int(self.labels[idx])
        if self.mmpretrain:
            from mmpretrain.structures import DataSample
            sample = DataSample().set_gt_label(label)
        else:
            sample = dict(gt_label=label)
        return dict(inputs=self.images[idx], data_samples=sample)


# ------------------------------------- model from mmengine/mmcv-lite parts
@MODELS.register_module(force=True)
class PretrainStylePreprocessor(BaseDataPreprocessor):
    """Normalise, one-hot labels and, in training, Mixup (mmpretrain's
    ``ClsDataPreprocessor`` + ``batch_augments=Mixup``)."""

    def __init__(self, num_classes: int, mixup_alpha: float = 0.2) -> None:
        super().__init__()
        self.register_buffer('mean', torch.tensor(MEAN).view(1, 3, 1, 1))
        self.register_buffer('std', torch.tensor(STD).view(1, 3, 1, 1))
        self.num_classes = num_classes
        self.mixup_alpha = mixup_alpha
        self.num_mixed = 0

    def forward(self, data: dict, training: bool = False) -> dict:
        data = self.cast_data(data)
        inputs = (data['inputs'].float() - self.mean) / self.std
        labels = data['data_samples']['gt_label']
        score = F.one_hot(labels, self.num_classes).float()
        if training and self.mixup_alpha:
            rng = np.random.default_rng(self.num_mixed)
            self.num_mixed += 1
            lam = float(rng.beta(self.mixup_alpha, self.mixup_alpha))
            perm = torch.from_numpy(rng.permutation(len(labels)))
            inputs = lam * inputs + (1 - lam) * inputs[perm]
            score = lam * score + (1 - lam) * score[perm]
        return dict(
            inputs=inputs, data_samples=dict(gt_label=labels, gt_score=score))


@MODELS.register_module(force=True)
class PretrainStyleResNet(nn.Module):
    """stem + 3 stages of ``ConvModule`` (bias-free conv, BN, ReLU), with
    mmpretrain ResNet's ``frozen_stages`` and ``norm_eval``."""

    def __init__(self,
                 channels=(8, 16, 16),
                 frozen_stages: int = 1,
                 norm_eval: bool = False) -> None:
        super().__init__()
        conv = mmcv_cnn.ConvModule
        bn = dict(type='BN')
        c0, c1, c2 = channels
        self.stem = conv(3, c0, 3, padding=1, norm_cfg=bn)
        self.layer1 = nn.Sequential(conv(c0, c0, 3, padding=1, norm_cfg=bn))
        self.layer2 = nn.Sequential(
            conv(c0, c1, 3, stride=2, padding=1, norm_cfg=bn),
            conv(c1, c1, 3, padding=1, norm_cfg=bn))
        self.layer3 = nn.Sequential(
            conv(c1, c2, 3, stride=2, padding=1, norm_cfg=bn))
        self.frozen_stages, self.norm_eval = frozen_stages, norm_eval
        self._freeze_stages()

    def _freeze_stages(self) -> None:
        for stage in [self.stem, self.layer1][:self.frozen_stages + 1]:
            stage.eval()
            for param in stage.parameters():
                param.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for module in self.modules():
                if isinstance(module, _BatchNorm):
                    module.eval()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer3(self.layer2(self.layer1(self.stem(x))))


@MODELS.register_module(force=True)
class PretrainStyleClassifier(BaseModel):
    """backbone, global average pooling, linear head, soft cross-entropy."""

    def __init__(self,
                 backbone: dict,
                 num_classes: int = 4,
                 data_preprocessor: dict = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        self.backbone = MODELS.build(backbone)
        self.neck = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(16, num_classes)

    def forward(self, inputs, data_samples=None, mode: str = 'tensor'):
        logits = self.head(self.neck(self.backbone(inputs)).flatten(1))
        if mode == 'tensor':
            return logits
        if mode == 'loss':
            soft = data_samples['gt_score']
            return dict(loss=-(soft * logits.log_softmax(1)).sum(1).mean())
        return [
            dict(pred=p, gt=g)
            for p, g in zip(logits.argmax(1), data_samples['gt_label'])
        ]


@METRICS.register_module(force=True)
class PretrainStyleAccuracy(BaseMetric):

    def process(self, data_batch, data_samples) -> None:
        self.results += [float(s['pred'] == s['gt']) for s in data_samples]

    def compute_metrics(self, results: list) -> dict:
        return dict(accuracy=100 * sum(results) / max(len(results), 1))


# ------------------------------------------------------------- recorders
@ROOT_HOOKS.register_module(force=True)
class PretrainStyleRecorderHook(Hook):
    """Per training iteration (float64): the loss, the output of
    ``backbone.layer2`` and the norm of its parameters after the step; the
    frozen BN buffers before training; what validation evaluates."""
    priority = 'LOWEST'  # before_val_epoch: after EMAHook's swap

    def __init__(self, bn: str) -> None:
        self.bn = bn
        self.losses, self.acts, self.weight_norms = [], [], []
        self.val_snapshots, self.frozen_before = [], {}
        self._training = False

    @staticmethod
    def _bare(runner):
        return getattr(runner.model, 'module', runner.model)

    def before_train(self, runner) -> None:
        model = self._bare(runner)
        # the frozen stages: their BN layers (weights and buffers), convs
        frozen_bns = [
            name for name, m in model.named_modules()
            if isinstance(m, _BatchNorm) and not m.weight.requires_grad
        ]
        assert len(frozen_bns) >= 2, frozen_bns  # stem and layer1
        frozen = {
            name
            for name, p in model.named_parameters() if not p.requires_grad
        }
        self.frozen_before = {
            k: v.clone()
            for k, v in model.state_dict().items()
            if k in frozen or k.rpartition('.')[0] in frozen_bns
        }
        model.backbone.layer2.register_forward_hook(self._record_act)

    def _record_act(self, module, args, output) -> None:
        if self._training:
            self.acts.append(output.detach().double().flatten().numpy())

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self._training = True

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        self._training = False
        self.losses.append(float(outputs['loss'].detach().double()))
        layer2 = self._bare(runner).backbone.layer2
        self.weight_norms.append(
            float(
                torch.cat([
                    p.detach().double().flatten() for p in layer2.parameters()
                ]).norm()))

    def before_val_epoch(self, runner) -> None:
        self.val_snapshots.append(
            copy.deepcopy(self._bare(runner).state_dict()))


# --------------------------------------------------------------- configs
def _common_cfg(work_dir, model: dict, dataset: dict, collate: str,
                evaluator: dict, bn: str) -> dict:

    def loader(shuffle):
        return dict(
            batch_size=BATCH,
            num_workers=0,
            sampler=dict(type='DefaultSampler', shuffle=shuffle),
            collate_fn=dict(type=collate),
            dataset=dataset)

    return dict(
        work_dir=str(work_dir),
        experiment_name=f'pretrain_style_{time.time_ns()}',
        model=model,
        train_dataloader=loader(True),
        val_dataloader=loader(False),
        val_evaluator=evaluator,
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9)),
        train_cfg=dict(by_epoch=True, max_epochs=EPOCHS, val_interval=1),
        val_cfg=dict(),
        default_hooks=dict(
            logger=dict(type='LoggerHook', interval=LOG_INTERVAL),
            checkpoint=dict(type='CheckpointHook', interval=100)),
        custom_hooks=[
            dict(
                type='mmstats.PreciseBNHook',
                num_samples=NUM_SAMPLES,
                interval=1,
                progress=False),
            dict(
                type='mmstats.StatsCollectorHook',
                stats=('num', 'mean', 'std', 'min', 'max')),
            dict(type='mmstats.ModuleStatsHook', modules=r'backbone\.layer\d'),
            dict(type='EMAHook', momentum=0.3, priority='ABOVE_NORMAL'),
            dict(type='PretrainStyleRecorderHook', bn=bn),
        ],
        randomness=dict(seed=0),
    )


def mmengine_parts_cfg(work_dir) -> dict:
    model = dict(
        type='PretrainStyleClassifier',
        backbone=dict(type='PretrainStyleResNet', frozen_stages=1),
        data_preprocessor=dict(
            type='PretrainStylePreprocessor', num_classes=4))
    cfg = _common_cfg(work_dir, model, dict(type='PretrainStyleDataset'),
                      'default_collate', dict(type='PretrainStyleAccuracy'),
                      'backbone.layer2.0.bn')
    cfg['default_scope'] = None
    return cfg


def mmpretrain_cfg(work_dir) -> dict:
    """mmpretrain's own config dicts: ImageClassifier + ResNet_CIFAR-18
    (8 base channels), ClsDataPreprocessor + Mixup, Accuracy."""
    model = dict(
        type='ImageClassifier',
        backbone=dict(
            type='ResNet_CIFAR',
            depth=18,
            stem_channels=8,
            base_channels=8,
            frozen_stages=1,
            out_indices=(3, )),
        neck=dict(type='GlobalAveragePooling'),
        head=dict(
            type='LinearClsHead',
            num_classes=4,
            in_channels=64,
            loss=dict(type='CrossEntropyLoss', use_soft=True)),
        train_cfg=dict(augments=dict(type='Mixup', alpha=0.2)),
        data_preprocessor=dict(
            type='ClsDataPreprocessor', num_classes=4, mean=MEAN, std=STD))
    cfg = _common_cfg(work_dir, model,
                      dict(type='PretrainStyleDataset',
                           mmpretrain=True), 'pseudo_collate',
                      dict(type='Accuracy', topk=(1, )),
                      'backbone.layer2.0.bn1')
    cfg['default_scope'] = 'mmpretrain'
    return cfg


# ------------------------------------------------------------ references
def bn_reference(model, inputs, state, bn_name):
    """float64 population mean/var of ``bn_name``'s inputs over ``inputs``
    with the conv weights of ``state``: the frozen prefix (eval mode) and
    the bias-free conv in front of the BN layer."""
    model = copy.deepcopy(model).double().eval()
    model.load_state_dict(state)
    captured = []
    bn = dict(model.named_modules())[bn_name]
    handle = bn.register_forward_pre_hook(
        lambda m, args: captured.append(args[0]))
    with torch.no_grad():
        model.backbone(inputs.double())
    handle.remove()
    x = captured[0].transpose(0, 1).flatten(1)
    return x.mean(1), x.var(1, unbiased=False)


def assert_bn_precise(state, ref, bn_name):
    mean, var = ref
    torch.testing.assert_close(
        state[f'{bn_name}.running_mean'].double(), mean, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(
        state[f'{bn_name}.running_var'].double(), var, rtol=1e-4, atol=1e-6)


def train_and_check(cfg: dict, collate) -> None:
    from mmengine.config import Config
    runner = Runner.from_cfg(Config(cfg))
    runner.train()
    rec = [
        h for h in runner.hooks if isinstance(h, PretrainStyleRecorderHook)
    ][0]
    model = rec._bare(runner)
    losses = np.array(rec.losses)
    assert len(losses) == EPOCHS * NUM_SAMPLES // BATCH

    # StatsCollectorHook: each publication covers exactly its iterations
    scalars = read_scalars(runner)
    steps = sorted(s for s, r in scalars.items() if 'stats/loss/num' in r)
    assert steps == PUBLISHED
    start = 0
    for step in steps:
        window, record = losses[start:step], scalars[step]
        assert record['stats/loss/num'] == len(window)
        for stat, ref in (('mean', window.mean()), ('std', window.std()),
                          ('min', window.min()), ('max', window.max())):
            np.testing.assert_allclose(
                record[f'stats/loss/{stat}'],
                ref,
                rtol=1e-6,
                atol=1e-9,
                err_msg=f'step {step} {stat}')
        # ModuleStatsHook: the publication iteration only
        act = rec.acts[step - 1]
        key = 'stats/modules/backbone.layer2'
        assert record[f'{key}/act/num'] == act.size
        np.testing.assert_allclose(
            record[f'{key}/act/mean'], act.mean(), rtol=1e-6)
        np.testing.assert_allclose(
            record[f'{key}/act/max'], act.max(), rtol=1e-6)
        np.testing.assert_allclose(
            record[f'{key}/weight_norm/mean'],
            rec.weight_norms[step - 1],
            rtol=1e-6)
        assert f'{key}/grad_norm/num' not in record  # one value: no spread
        assert record[f'{key}/grad_norm/mean'] > 0
        # the frozen stage: activations and weights, no gradients
        assert 'stats/modules/backbone.layer1/act/mean' in record
        assert 'stats/modules/backbone.layer1/grad_norm/mean' not in record
        assert 'stats/modules/backbone.layer1/update_ratio/mean' not in record
        start = step

    # PreciseBNHook: frozen BN layers left exactly alone ...
    state = model.state_dict()
    for key, before in rec.frozen_before.items():
        assert torch.equal(state[key], before), key
    # ... the trainable ones exact for the final weights ...
    dataset = runner.train_dataloader.dataset
    batch = collate([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        inputs = model.data_preprocessor(batch, False)['inputs']
    assert_bn_precise(state, bn_reference(model, inputs, state, rec.bn),
                      rec.bn)
    # ... and validation ran the EMA weights with their own exact stats
    assert len(rec.val_snapshots) == EPOCHS
    ema = [h for h in runner.hooks if isinstance(h, EMAHook)][0]
    ema_state = ema.ema_model.module.state_dict()
    last = rec.val_snapshots[-1]
    conv = rec.bn.replace('bn1', 'conv1').replace('.bn', '.conv')
    torch.testing.assert_close(last[f'{conv}.weight'],
                               ema_state[f'{conv}.weight'])
    assert not torch.equal(last[f'{conv}.weight'], state[f'{conv}.weight'])
    assert_bn_precise(last, bn_reference(model, inputs, last, rec.bn), rec.bn)


def test_mmpretrain_style_run_with_all_three_hooks(tmp_path, clean_mmengine):
    train_and_check(mmengine_parts_cfg(tmp_path), default_collate)


def test_mmpretrain_style_check_can_fail(tmp_path, clean_mmengine):
    """Without PreciseBNHook the trainable BN stats are EMA estimates:
    the precise-BN check above rejects them."""
    cfg = mmengine_parts_cfg(tmp_path)
    cfg['custom_hooks'] = [
        h for h in cfg['custom_hooks'] if h['type'] != 'mmstats.PreciseBNHook'
    ]
    with pytest.raises(
            AssertionError,
            match='running_mean|running_var|'
            'Tensor-likes are not close'):
        train_and_check(cfg, default_collate)


def test_real_mmpretrain_run_with_all_three_hooks(tmp_path, clean_mmengine):
    pytest.importorskip('mmpretrain', reason='mmpretrain is not installed')
    train_and_check(mmpretrain_cfg(tmp_path), pseudo_collate)
