"""report() inside torch.compile: no recompilation, exact values."""
import numpy as np
import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import Runner
from torch import nn

from mmstats.stats import (Collector, phase, report, report0, reporting,
                           suspend_reporting)
from tests.helpers.runner import toy_cfg


@pytest.fixture(autouse=True)
def clean_state():
    reporting.reset()
    torch._dynamo.reset()
    saved = torch._dynamo.config.error_on_recompile
    torch._dynamo.config.error_on_recompile = True
    yield
    torch._dynamo.config.error_on_recompile = saved
    torch._dynamo.reset()
    reporting.reset()


class Net(nn.Module):

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x, lr):
        y = self.fc(x)
        report('feat', y)  # a 2-d tensor
        report('feat_mean', y.mean())  # a 0-d tensor with grad
        report0('lr', lr)  # a Python float (a graph input)
        report('const', 2)  # a Python int constant
        report('list', [1.0, 2.0])  # graph-breaks into eager report()
        return y


def test_compiled_forward_exact_no_recompile():
    torch.manual_seed(0)
    net = Net()
    compiled = torch.compile(net)
    collector = Collector(keep_previous=False)
    feats, lrs = [], []
    torch._dynamo.config.error_on_recompile = False
    for step in range(5):  # the learning rate changes at every call
        # warm-up: dynamo recompiles once to make a changing float argument
        # dynamic ("automatic dynamic"), with or without report()
        torch._dynamo.config.error_on_recompile = step >= 2
        x = torch.randn(2, 4)
        lrs.append(0.1 * (step + 1))
        compiled(x, lrs[-1]).sum().backward()
        feats.append(net.fc(x).detach().double().reshape(-1))
    collector.update()
    ref = torch.cat(feats).numpy()
    assert collector.num('feat') == ref.size
    assert collector.mean('feat') == pytest.approx(ref.mean(), rel=1e-6)
    assert collector.std('feat') == pytest.approx(ref.std(), rel=1e-6)
    assert collector.min('feat') == pytest.approx(ref.min(), rel=1e-6)
    assert collector.num('lr') == 5
    assert collector.mean('lr') == pytest.approx(np.mean(lrs), rel=1e-12)
    assert collector.num('const') == 5 and collector.mean('const') == 2
    assert collector.num('list') == 10 and collector.mean('list') == 1.5
    means = [f.mean().item() for f in feats]
    assert collector.mean('feat_mean') == pytest.approx(
        np.mean(means), rel=1e-6)


def test_compiled_reads_state_at_run_time():
    compiled = torch.compile(lambda x: report('v', x * 2) + 1)
    x = torch.ones(3)
    compiled(x)  # no collector yet: nothing kept, nothing guarded
    collector = Collector(keep_previous=False)
    compiled(x)
    with suspend_reporting():
        compiled(x)
    previous = phase('val')
    compiled(x)
    phase(previous)
    collector.update()  # no recompilation for any of these changes
    assert collector.num('v') == 3 and collector.mean('v') == 2
    assert collector.num('val/v') == 3


@HOOKS.register_module(force=True)
class CountReportsHook(Hook):
    """Updates a collector after every iteration and keeps the counts."""

    def before_train(self, runner) -> None:
        self.collector = Collector(r'model/.*', keep_previous=False)
        self.counts, self.feats = [], []

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        # warm-up: mmengine's train_step recompiles once for its own
        # counter (optim_wrapper._inner_count), reports or not
        torch._dynamo.config.error_on_recompile = runner.iter >= 2

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        self.collector.update()
        self.counts.append(self.collector.num('model/feat_norm'))


def test_runner_compile_true(tmp_path):
    cfg = toy_cfg(
        tmp_path,
        by_epoch=False,
        max_iters=5,
        num_samples=32,
        batch_size=8,
        report_stats=True,
        compile=True)
    cfg.custom_hooks = [dict(type='CountReportsHook')]
    runner = Runner.from_cfg(cfg)
    runner.train()  # error_on_recompile: a recompile would raise
    hook = [h for h in runner.hooks if isinstance(h, CountReportsHook)][0]
    assert len(hook.counts) == 5
    assert all(c == hook.counts[0] and c > 0 for c in hook.counts)
    assert np.isfinite(hook.collector.mean('model/feat_norm'))


# Run in a fresh interpreter: ``import mmstats`` must leave torch's
# process-wide state as mmstats' dependencies (mmengine) left it, and
# compile support must still be set up, lazily, on the first trace.
_FRESH_IMPORT = r'''
import sys
import torch
safe_globals = getattr(torch.serialization, 'get_safe_globals', list)
before = list(safe_globals())  # a bare interpreter
import mmstats
from mmstats.stats import Collector, report
assert 'torch._dynamo' not in sys.modules, 'import mmstats imported dynamo'
after = list(safe_globals())
assert after == before, [g for g in after if g not in before]
try:  # the op is defined by the first trace, not by the import
    torch.ops.mmstats.report
except AttributeError:
    pass
else:
    raise AssertionError('import mmstats defined mmstats::report')

def step(x, lr):
    report('x', x * 2)
    report('lr', lr)  # a Python float: a graph break into eager report()
    return x + 1

compiled = torch.compile(step)
collector = Collector(keep_previous=False)
for i in range(5):
    # one warm-up recompile makes the changing float dynamic
    torch._dynamo.config.error_on_recompile = i >= 2
    compiled(torch.full((3, ), float(i)), 0.5 * i)
collector.update()
assert collector.num('x') == 15 and collector.mean('x') == 4.0
assert collector.num('lr') == 5 and collector.mean('lr') == 1.0
print('ok')
'''


def test_import_changes_no_torch_state_and_compile_still_works():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, '-c', _FRESH_IMPORT],
                         capture_output=True,
                         text=True,
                         timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == 'ok', out.stderr
