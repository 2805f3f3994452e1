"""Shared references for the precise-BN tests: float64 statistics of what
each BN layer saw, snapshots of BN state, small models and batches."""
import copy

import numpy as np
import torch
from torch import nn


# -- references -----
def bn_inputs(model, batches, call=None):
    """Inputs of every train-mode BN layer of a copy of ``model`` (float64),
    one entry per call, from the same forwards update_bn_stats runs."""
    ref = copy.deepcopy(model)
    captured, handles = {}, []
    for name, mod in ref.named_modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.training:
            captured[name] = []
            handles.append(
                mod.register_forward_pre_hook(
                    lambda m, args, name=name: captured[name].append(args[
                        0].detach().double())))
    with torch.no_grad():
        for batch in batches:
            (call or (lambda m, b: m(b)))(ref, batch)
    for h in handles:
        h.remove()
    return captured


def ref_stats(xs, estimator):
    """(mean, var) per channel, float64 numpy, of a list of BN inputs."""
    flats = [x.transpose(0, 1).reshape(x.shape[1], -1).numpy() for x in xs]
    if estimator == 'population':
        values = np.concatenate(flats, axis=1)
        return values.mean(1), values.var(1)
    return (np.mean([f.mean(1) for f in flats],
                    axis=0), np.mean([f.var(1, ddof=1) for f in flats],
                                     axis=0))


def assert_stats(model, captured, estimator, rtol=1e-5, atol=1e-7):
    modules = dict(model.named_modules())
    for name, xs in captured.items():
        mean, var = ref_stats(xs, estimator)
        bn = modules[name]
        np.testing.assert_allclose(
            bn.running_mean.double().numpy(),
            mean,
            rtol=rtol,
            atol=atol,
            err_msg=name)
        np.testing.assert_allclose(
            bn.running_var.double().numpy(),
            var,
            rtol=rtol,
            atol=atol,
            err_msg=name)


def snapshot(model):
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            out[name] = dict(
                objs={k: mod._buffers[k]
                      for k in mod._buffers},
                vals={
                    k: v.clone()
                    for k, v in mod._buffers.items() if v is not None
                },
                momentum=mod.momentum,
                training=mod.training,
                forward=mod.__dict__.get('forward', 'absent'),
                pre_hooks=len(mod._forward_pre_hooks),
                hooks=len(mod._forward_hooks))
    out['_training'] = [m.training for m in model.modules()]
    return out


def assert_restored(model, snap, values=True):
    assert [m.training for m in model.modules()] == snap['_training']
    for name, mod in model.named_modules():
        if name not in snap:
            continue
        s = snap[name]
        for key, obj in s['objs'].items():
            assert mod._buffers[key] is obj, (name, key)
            if values and obj is not None:
                assert torch.equal(obj, s['vals'][key]), (name, key)
        assert mod.momentum == s['momentum'], name
        assert mod.training == s['training']
        assert mod.__dict__.get('forward', 'absent') is s['forward'], name
        assert len(mod._forward_pre_hooks) == s['pre_hooks'], name
        assert len(mod._forward_hooks) == s['hooks'], name


# -- models and data -----
def make_model(kind):
    torch.manual_seed(0)
    if kind == 'bn1d_2d':
        return nn.Sequential(
            nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 4),
            nn.BatchNorm1d(4))
    if kind == 'bn1d_3d':
        return nn.Sequential(
            nn.Conv1d(3, 4, 3), nn.BatchNorm1d(4), nn.ReLU(),
            nn.Conv1d(4, 4, 1), nn.BatchNorm1d(4))
    if kind == 'bn2d':
        return nn.Sequential(
            nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
            nn.Conv2d(4, 5, 1), nn.BatchNorm2d(5, momentum=None))
    if kind == 'bn3d':
        return nn.Sequential(
            nn.Conv3d(2, 3, 2), nn.BatchNorm3d(3), nn.ReLU(),
            nn.Conv3d(3, 3, 1), nn.BatchNorm3d(3))
    raise KeyError(kind)


INPUT_SHAPES = dict(
    bn1d_2d=(6, ), bn1d_3d=(3, 9), bn2d=(3, 7, 6), bn3d=(2, 4, 5, 3))


def make_batches(shape, sizes, seed=0, shift=0.0):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn((n, ) + tuple(shape), generator=gen) * 1.5 + 0.7 + shift
        for n in sizes
    ]


class Bomb(nn.Module):
    """Raises on its ``at``-th call."""

    def __init__(self, at):
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.at:
            raise RuntimeError(f'bomb went off at call {self.at}')
        return x
