"""update_bn_stats on CUDA models: float32, AMP (float16 / bfloat16 through
mmengine's AmpOptimWrapper), channels_last and SyncBatchNorm in one
process, against float64 population statistics of the BN inputs."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

from mmstats import update_bn_stats
from .common import SmallBNNet, bn_layers, population_stats, requires_cuda

pytestmark = requires_cuda

NUM_BATCHES, BATCH = 6, 16


def _setup(seed: int = 0, memory_format=torch.contiguous_format):
    torch.manual_seed(seed)
    model = SmallBNNet().cuda().to(memory_format=memory_format)
    for bn in bn_layers(model).values():  # stale stats to be replaced
        bn.running_mean.fill_(3.0)
        bn.running_var.fill_(7.0)
    gen = torch.Generator().manual_seed(seed + 1)
    batches = [(torch.randn(BATCH, 3, 12, 12, generator=gen) * 2 +
                0.5).cuda().contiguous(memory_format=memory_format)
               for _ in range(NUM_BATCHES)]
    return model, batches


def _check(model, reference, rtol, atol):
    layers = bn_layers(model)
    assert sorted(layers) == sorted(reference)
    for name, (mean, var) in reference.items():
        bn = layers[name]
        assert bn.running_mean.dtype == torch.float32
        np.testing.assert_allclose(
            bn.running_mean.double().cpu(),
            mean,
            rtol=rtol,
            atol=atol,
            err_msg=name)
        np.testing.assert_allclose(
            bn.running_var.double().cpu(),
            var,
            rtol=rtol,
            atol=atol,
            err_msg=name)


def _run(model, batches, forward_context=None):
    info = update_bn_stats(
        model,
        batches,
        num_samples=NUM_BATCHES * BATCH,
        forward_context=forward_context,
        progress=False)
    assert info['num_samples'] == NUM_BATCHES * BATCH
    assert info['num_batches'] == NUM_BATCHES
    assert len(info['updated']) == 3
    return info


@pytest.mark.parametrize('memory_format',
                         [torch.contiguous_format, torch.channels_last])
def test_float32_against_float64_model(memory_format):
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    model, batches = _setup(memory_format=memory_format)
    reference = population_stats(
        copy.deepcopy(model).double(), [b.double() for b in batches])
    _run(model, batches)
    _check(model, reference, rtol=2e-5, atol=1e-6)
    if memory_format is torch.channels_last:
        assert model.conv1.weight.is_contiguous(
            memory_format=torch.channels_last)


@pytest.mark.parametrize('dtype, loose', [(torch.float16, 2e-2),
                                          (torch.bfloat16, 1e-1)])
def test_amp_optim_wrapper_context(dtype, loose):
    from mmengine.optim import AmpOptimWrapper
    model, batches = _setup(seed=3)
    wrapper = AmpOptimWrapper(
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dtype=dtype)

    def context():
        return wrapper.optim_context(model)

    # Exact: the float64 statistics of the values this AMP forward feeds
    # the BN layers (the BN layers themselves compute in float32).
    exact = population_stats(model, batches, context=context)
    # Loose: the float64 model; the gap is the half-precision convolutions.
    full = population_stats(
        copy.deepcopy(model).double(), [b.double() for b in batches])
    _run(model, batches, forward_context=context)
    _check(model, exact, rtol=1e-4, atol=1e-5)
    _check(model, full, rtol=loose, atol=loose)


def test_sync_batchnorm_one_process():
    model, batches = _setup(seed=5)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert any(isinstance(m, nn.SyncBatchNorm) for m in model.modules())
    reference = population_stats(
        copy.deepcopy(model).double(), [b.double() for b in batches])
    _run(model, batches)
    _check(model, reference, rtol=2e-5, atol=1e-6)


def test_frozen_layer_and_model_mode_untouched():
    model, batches = _setup(seed=7)
    model.bn2.eval()
    frozen_mean = model.bn2.running_mean.clone()
    info = update_bn_stats(model, batches, num_samples=32, progress=False)
    assert info['frozen'] == ['bn2']
    torch.testing.assert_close(
        model.bn2.running_mean, frozen_mean, rtol=0, atol=0)
    assert model.training and not model.bn2.training
