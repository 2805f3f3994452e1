"""update_bn_stats on one process against float64 references: closed
forms, split invariance, safety, data handling, RNG and reporting."""
import copy
import logging
import math
import random
import sys
from contextlib import nullcontext

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import (BatchSampler, DataLoader, IterableDataset,
                              SequentialSampler, TensorDataset)

from mmstats.precise_bn import ESTIMATORS, preserve_rng_state, update_bn_stats
from .refs import (INPUT_SHAPES, Bomb, assert_restored, assert_stats,
                   bn_inputs, make_batches, make_model, snapshot)


# -- closed form -----
@pytest.mark.parametrize('estimator', ESTIMATORS)
@pytest.mark.parametrize('kind', ['bn1d_2d', 'bn1d_3d', 'bn2d', 'bn3d'])
def test_closed_form(kind, estimator):
    model = make_model(kind)
    batches = make_batches(INPUT_SHAPES[kind], [7, 16, 5, 12])
    captured = bn_inputs(model, batches)
    snap = snapshot(model)
    summary = update_bn_stats(
        model, batches, num_samples=40, estimator=estimator, progress=False)
    assert_stats(model, captured, estimator)
    assert_restored(model, snap, values=False)
    for name in captured:  # num_batches_tracked is left as it was
        nbt = dict(model.named_modules())[name].num_batches_tracked
        assert torch.equal(nbt, snap[name]['vals']['num_batches_tracked'])
    assert summary['num_layers'] == 2 and summary['num_samples'] == 40
    assert summary['num_batches'] == 4 and summary['estimator'] == estimator
    assert summary['updated'] == list(captured)
    assert summary['skipped'] == [] and summary['frozen'] == []
    # the change summaries, recomputed in float64 from the buffers
    layers = dict(model.named_modules())
    var_change, mean_change = [], []
    for name in captured:
        bn, old = layers[name], snap[name]['vals']
        old_var = old['running_var'].double()
        old_mean = old['running_mean'].double()
        var, mean = bn.running_var.double(), bn.running_mean.double()
        var_change.append(
            ((var - old_var).abs().sum() / old_var.abs().sum()).item())
        mean_change.append(
            ((mean - old_mean).abs() / (var + bn.eps).sqrt()).mean().item())
    assert min(var_change) > 0.01 and min(mean_change) > 0.01
    assert summary['var_change'] == pytest.approx(np.mean(var_change), 1e-5)
    assert summary['mean_change'] == pytest.approx(np.mean(mean_change), 1e-5)
    assert summary['seconds'] > 0


def test_estimators_differ_on_uneven_batches():
    model = make_model('bn2d')
    batches = make_batches(INPUT_SHAPES['bn2d'], [2, 30])
    batches[0] = batches[0] * 5 + 3  # small batch, very different stats
    pop, avg = copy.deepcopy(model), copy.deepcopy(model)
    update_bn_stats(pop, batches, 32, 'population', progress=False)
    update_bn_stats(avg, batches, 32, 'batch_average', progress=False)
    assert not torch.allclose(
        pop[1].running_var, avg[1].running_var, rtol=1e-2)


def test_split_invariance():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    data = make_batches((3, 6, 6), [96], seed=3)[0]
    results = []
    for sizes in ([8] * 12, [32] * 3, [5, 40, 1 + 2, 17, 31]):
        assert sum(sizes) == 96
        m = copy.deepcopy(model)
        update_bn_stats(m, list(data.split(sizes)), 96, progress=False)
        results.append((m[1].running_mean.clone(), m[1].running_var.clone()))
    for mean, var in results[1:]:
        torch.testing.assert_close(mean, results[0][0], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(var, results[0][1], rtol=1e-6, atol=0)


def test_numerics_large_mean_small_std():
    bn = nn.BatchNorm1d(3)
    gen = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(n, 3, 50, generator=gen, dtype=torch.float64) * 0.01 +
         100 + 0.003 * i).float() for i, n in enumerate([16, 9, 32, 20])
    ]
    update_bn_stats(bn, batches, 10**6, progress=False, logger='silent')
    values = torch.cat(batches).double().transpose(0, 1).reshape(3, -1)
    truth = values.var(1, unbiased=False)
    rel = (bn.running_var.double() - truth).abs() / truth
    assert rel.max() < 1e-3, rel
    torch.testing.assert_close(
        bn.running_mean.double(), values.mean(1), rtol=1e-7, atol=0)


# -- safety -----
def test_failure_restores_everything():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(4, 3), nn.BatchNorm1d(3, momentum=None), Bomb(3),
        nn.BatchNorm1d(3), nn.GroupNorm(1, 3))
    model[1].running_mean.fill_(0.25)
    calls = []

    def custom_forward(x):  # a pre-existing instance-level forward
        calls.append(1)
        return nn.BatchNorm1d.forward(model[3], x)

    model[3].forward = custom_forward
    snap = snapshot(model)
    batches = [torch.randn(8, 4) for _ in range(5)]
    with pytest.raises(RuntimeError, match='bomb went off at call 3'):
        update_bn_stats(model, batches, 40, progress=False)
    assert_restored(model, snap)
    assert model[3].forward is custom_forward and len(calls) == 2
    assert model[1].momentum is None
    # still usable afterwards and the custom forward is used
    model[2].at = -1
    update_bn_stats(model, batches, 40, progress=False)
    assert len(calls) == 2 + 5 and model[3].forward is custom_forward
    assert not torch.equal(model[1].running_mean,
                           snap['1']['vals']['running_mean'])
    assert model[1]._buffers['running_mean'] is snap['1']['objs'][
        'running_mean']


class _Spy(nn.Module):
    """Records what the BN layers look like in the middle of a forward."""

    def __init__(self, bn):
        super().__init__()
        self.bn, self.seen = [bn], []

    def forward(self, x):
        bn = self.bn[0]
        self.seen.append(
            (len(bn._forward_pre_hooks), len(bn._forward_hooks), 'forward'
             in bn.__dict__, bn.momentum,
             len(nn.modules.module._global_forward_pre_hooks),
             len(nn.modules.module._global_forward_hooks)))
        return x


def test_no_hooks_and_forward_attribute_removed():
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(3)
    spy = _Spy(bn)
    model = nn.Sequential(nn.Linear(4, 3), bn, spy)
    update_bn_stats(
        model, [torch.randn(8, 4) for _ in range(3)], 24, progress=False)
    # during the forwards: no hook anywhere, an instance forward, momentum 1
    assert spy.seen == [(0, 0, True, 1.0, 0, 0)] * 3
    assert 'forward' not in bn.__dict__ and bn.momentum == 0.1
    assert not bn._forward_pre_hooks and not bn._forward_hooks
    assert type(bn._buffers['num_batches_tracked']) is torch.Tensor


class _MyBN(nn.BatchNorm2d):
    """A subclass with its own forward (keeps num_batches_tracked)."""

    def forward(self, x):
        return super().forward(x) * 1.0


class _Partial(nn.Module):

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)
        self.frozen = nn.BatchNorm2d(4)
        self.mine = _MyBN(4)
        self.unused = nn.BatchNorm2d(4)
        self.gn = nn.GroupNorm(2, 4)
        self.ln = nn.LayerNorm(4)
        self.inorm = nn.InstanceNorm2d(4, track_running_stats=True)
        self.nostats = nn.BatchNorm2d(4, track_running_stats=False)

    def forward(self, x):
        x = self.mine(self.frozen(self.conv(x)))
        x = self.inorm(self.nostats(self.gn(x)))
        return self.ln(x.mean((2, 3)))


def test_frozen_skipped_and_other_norms():
    model = _Partial()
    model.frozen.eval()
    for bn in (model.frozen, model.unused, model.mine):
        bn.running_mean.uniform_()
        bn.num_batches_tracked.fill_(7)
    snap = snapshot(model)
    batches = make_batches((3, 6, 6), [10, 6])
    captured = bn_inputs(model, batches)
    assert captured['unused'] == [] and len(captured['mine']) == 2
    summary = update_bn_stats(model, batches, 16, progress=False)
    assert summary['frozen'] == ['frozen']
    assert summary['skipped'] == ['unused']
    assert summary['updated'] == ['mine'] and summary['num_layers'] == 1
    assert summary['unaffected_norms'] == ['gn', 'ln', 'inorm', 'nostats']
    assert_stats(model, {'mine': captured['mine']}, 'population')
    for name in ('frozen', 'unused'):
        s = snap[name]
        for key, val in s['vals'].items():
            assert torch.equal(getattr(model, name)._buffers[key], val)
    # unaffected norms tracking running stats are not moved by our forwards
    assert torch.equal(model.inorm.running_mean, torch.zeros(4))
    assert torch.equal(model.inorm.running_var, torch.ones(4))
    assert model.mine.num_batches_tracked.item() == 7
    assert model.frozen.training is False and model.mine.training is True


# -- data -----
def test_batch_sampler_loader_without_batch_size():
    model = make_model('bn1d_2d')
    data = make_batches((6, ), [45], seed=5)[0]
    loader = DataLoader(
        TensorDataset(data),
        batch_sampler=BatchSampler(
            SequentialSampler(data), 10, drop_last=False))
    assert loader.batch_size is None
    captured = bn_inputs(model, [b[0] for b in loader])
    summary = update_bn_stats(model, loader, 45, progress=False)
    assert summary['num_samples'] == 45 and summary['num_batches'] == 5
    assert_stats(model, captured, 'population')


def test_short_loader_warns_and_uses_everything(caplog):
    model = make_model('bn2d')
    batches = make_batches(INPUT_SHAPES['bn2d'], [6, 9])
    captured = bn_inputs(model, batches)
    logger = logging.getLogger('mmstats.test_precise_bn')
    with caplog.at_level(logging.WARNING, logger=logger.name):
        summary = update_bn_stats(
            model, batches, 1000, progress=False, logger=logger)
    assert 'ran out after 15 samples' in caplog.text
    assert summary['num_samples'] == 15
    assert_stats(model, captured, 'population')


def test_empty_loader_raises_and_keeps_stats():
    model = make_model('bn2d')
    snap = snapshot(model)
    with pytest.raises(ValueError, match='no batch'):
        update_bn_stats(model, [], 100, progress=False, logger='silent')
    assert_restored(model, snap)


# a wrong value is a ValueError, a wrong type a TypeError (before issue 29
# all of them were ValueErrors)
@pytest.mark.parametrize('bad, error', [(0, ValueError), (-5, ValueError),
                                        (2.5, TypeError), (True, TypeError),
                                        ('8', TypeError)])
def test_bad_num_samples(bad, error):
    with pytest.raises(error, match='num_samples must be a positive int'):
        update_bn_stats(make_model('bn2d'), [], bad, progress=False)


def test_bad_estimator():
    with pytest.raises(ValueError, match="estimator.*'population'"):
        update_bn_stats(make_model('bn2d'), [], 8, estimator='ema')


class _Endless(IterableDataset):

    def __init__(self):
        self.pulled = 0

    def __iter__(self):
        gen = torch.Generator().manual_seed(0)
        while True:
            self.pulled += 1
            yield torch.randn(6, generator=gen)


def test_infinite_iterables_stop_at_num_samples():
    pulled = []

    def endless():
        gen = torch.Generator().manual_seed(0)
        while True:
            pulled.append(1)
            yield torch.randn(10, 6, generator=gen)

    model = make_model('bn1d_2d')
    summary = update_bn_stats(model, endless(), 35, progress=False)
    assert summary['num_samples'] == 40 and len(pulled) == 4
    dataset = _Endless()
    summary = update_bn_stats(
        model, DataLoader(dataset, batch_size=8), 20, progress=False)
    assert summary['num_samples'] == 24 and summary['num_batches'] == 3
    assert dataset.pulled == 24


def test_shared_bn_called_twice():
    torch.manual_seed(0)

    class Shared(nn.Module):

        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(3)

        def forward(self, x):
            return self.bn(x)[:5] + self.bn(x[:5] * 3 + 2)

    for estimator in ESTIMATORS:
        model = Shared()
        batches = make_batches((3, ), [8, 12, 6], seed=9)
        captured = bn_inputs(model, batches)
        assert len(captured['bn']) == 6  # every call is its own "batch"
        summary = update_bn_stats(
            model, batches, 26, estimator, progress=False)
        assert summary['num_samples'] == 26
        assert_stats(model, captured, estimator)


def test_base_model_with_data_preprocessor():
    from mmengine.model import BaseModel, ImgDataPreprocessor

    flags = []

    class Pre(ImgDataPreprocessor):

        def forward(self, data, training=False):
            flags.append(training)
            return super().forward(data, training)

    class Net(BaseModel):

        def __init__(self):
            super().__init__(
                data_preprocessor=Pre(mean=[1., 2., 3.], std=[2., 3., 4.]))
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn = nn.BatchNorm2d(4)

        def forward(self, inputs, data_samples=None, mode='tensor'):
            assert mode == 'tensor'
            return self.bn(self.conv(inputs))

    torch.manual_seed(0)
    model = Net()
    gen = torch.Generator().manual_seed(2)
    loader = [
        dict(
            inputs=[
                torch.rand(3, 7, 7, generator=gen) * 255 for _ in range(n)
            ],
            data_samples=None) for n in (5, 9, 4)
    ]
    pre = [model.data_preprocessor(b, False)['inputs'] for b in loader]
    captured = bn_inputs(model, pre, call=lambda m, x: m(x))
    flags.clear()
    summary = update_bn_stats(model, loader, 18, progress=False)
    assert flags == [False] * 3
    assert summary['num_samples'] == 18 and summary['num_batches'] == 3
    assert_stats(model, captured, 'population')


def test_global_rng_state_unchanged():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Dropout(0.5), nn.BatchNorm1d(5))
    batches = make_batches((6, ), [8, 8])

    def draws():
        return (torch.rand(3).tolist(), np.random.rand(3).tolist(),
                random.random())

    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    expected = draws()
    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    loader = DataLoader(
        TensorDataset(torch.cat(batches)), batch_size=8, shuffle=True)
    update_bn_stats(model, loader, 16, progress=False)
    assert draws() == expected
    # the context manager on its own, also on an exception: the draws
    # after it are the ones the seeds give, not shifted by the block's
    for exc in (None, KeyError):
        torch.manual_seed(5)
        np.random.seed(5)
        random.seed(5)
        with pytest.raises(KeyError) if exc else nullcontext():
            with preserve_rng_state():
                torch.rand(10)
                np.random.rand(4)
                random.random()
                if exc:
                    raise exc
        assert draws() == expected
    # and without it the block's draws do shift the stream (the check
    # above can fail)
    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    torch.rand(10)
    np.random.rand(4)
    random.random()
    assert draws() != expected


def test_forward_context_and_no_layers():
    entered = []

    class Ctx:

        def __enter__(self):
            entered.append(1)

        def __exit__(self, *exc):
            return False

    model = make_model('bn1d_2d')
    update_bn_stats(
        model,
        make_batches((6, ), [4, 4, 4]),
        12,
        forward_context=Ctx,
        progress=False)
    assert len(entered) == 3
    summary = update_bn_stats(
        nn.Linear(2, 2), [torch.randn(3, 2)], 3, progress=False)
    assert summary['num_layers'] == 0 and summary['num_samples'] == 0


def test_progress_bar_only_on_a_terminal(capsys, monkeypatch):
    model = make_model('bn1d_2d')
    update_bn_stats(model, make_batches((6, ), [4, 4]), 8, progress=True)
    assert capsys.readouterr().out == ''  # a log file gets no frames
    monkeypatch.setattr(sys.stdout, 'isatty', lambda: True)
    update_bn_stats(model, make_batches((6, ), [4, 4]), 8, progress=True)
    assert '8/8' in capsys.readouterr().out
    assert math.isfinite(model[1].running_var.sum().item())


def test_uninitialised_lazy_bn_is_refused_by_name():
    """A LazyBatchNorm2d before its first forward: a message naming the
    layer and the fix, nothing changed; after one forward it works."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LazyBatchNorm2d())
    batches = make_batches((3, 6, 6), [8, 8])
    with pytest.raises(ValueError) as info:
        update_bn_stats(model, batches, 16, progress=False)
    message = str(info.value)
    assert "BN layer '1' (LazyBatchNorm2d) is not initialised" in message
    assert 'run one forward of the model first' in message
    assert model[1].has_uninitialized_params()  # left alone
    model(batches[0])  # materialises it
    captured = bn_inputs(model, batches)
    summary = update_bn_stats(model, batches, 16, progress=False)
    assert summary['updated'] == ['1']
    assert_stats(model, captured, 'population')


@pytest.mark.parametrize('bad', [0, 1, 1.0, 'no', None])
def test_progress_must_be_a_bool(bad):
    model = make_model('bn2d')
    snap = snapshot(model)
    with pytest.raises(
            TypeError,
            match=r'progress must be True or False, got .*'
            r'write progress=True or progress=False'):
        update_bn_stats(
            model, make_batches(INPUT_SHAPES['bn2d'], [4]), 4, progress=bad)
    assert_restored(model, snap)


def test_forward_context_must_be_callable():
    with pytest.raises(TypeError, match='forward_context must be None or a'):
        update_bn_stats(
            make_model('bn2d'), [],
            4,
            forward_context=nullcontext(),
            progress=False)


def test_layers_to_update_judges_train_mode_and_restores_modes():
    """``train=True`` asks what ``model.train()`` gives (a norm_eval-style
    override included) and leaves every module's mode as it was."""
    from mmstats.precise_bn import layers_to_update

    class NormEval(nn.Sequential):

        def train(self, mode=True):
            super().train(mode)
            for m in self.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.eval()
            return self

    model = NormEval(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4),
        nn.BatchNorm2d(4, track_running_stats=False))
    model.eval()
    assert layers_to_update(model) == []
    assert layers_to_update(model, train=True) == []
    assert not any(m.training for m in model.modules())  # restored
    plain = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4),
        nn.BatchNorm2d(4, track_running_stats=False))
    plain.eval()
    assert layers_to_update(plain, train=True) == ['1']
    assert not any(m.training for m in plain.modules())
    plain.train()
    assert layers_to_update(plain) == ['1']
