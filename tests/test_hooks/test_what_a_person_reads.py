"""What a person reads, through a real Runner with the four hooks at their
defaults: each puts its short summary on LoggerHook's line (ModuleStatsHook:
the total gradient norm and the largest update ratio with its module,
recomputed from the raw gradients and weights), ``scalars.json`` holds one
record per step (LoggerHook's joined with mmstats'), with no statistic that
cannot vary, and LoggerHook's own ``<timestamp>.json`` stays as it was."""
import json
import os.path as osp
import re

import pytest
from mmengine.runner import Runner

from tests.helpers.module_stats import MODULES, NAMES, RawRecorder, norm
from tests.helpers.runner import toy_cfg

ITERS = 10  # per epoch (160 samples, batch 16)
LOG_INTERVAL = 5
# the modules whose parameters are all the model's (layer1.0 is in layer1)
TOP_LEVEL = ('backbone.stem', 'backbone.layer1', 'head')
LINE = re.compile(r'Epoch\(train\) +\[(\d+)\]\[ *(\d+)/\d+\] (.*)')
LEAD = re.compile(r'modules/max_update_ratio: (\S+) from now on')


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    work_dir = str(tmp_path_factory.mktemp('reads'))
    cfg = toy_cfg(
        work_dir,
        max_epochs=2,
        log_interval=LOG_INTERVAL,
        custom_hooks=[
            dict(type='mmstats.PreciseBNHook', num_samples=64),
            dict(type='mmstats.StatsCollectorHook'),
            dict(type='mmstats.ModuleStatsHook', modules=MODULES),
            dict(type='mmstats.ThroughputHook'),
        ])
    runner = Runner.from_cfg(cfg)
    recorder = RawRecorder()
    runner.register_hook(recorder)
    runner.train()
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    lines, leader = {}, None
    for line in log.splitlines():  # the leading module said in words
        found = LEAD.search(line)
        leader = found.group(1) if found else leader
        for epoch, it, rest in LINE.findall(line):
            step = (int(epoch) - 1) * ITERS + int(it)
            lines[step] = dict(re.findall(r'(\S+): (\S+)', rest))
            lines[step]['leader'] = leader
    vis = osp.join(runner.log_dir, 'vis_data')
    records = [json.loads(x) for x in open(osp.join(vis, 'scalars.json'))]
    own = [
        json.loads(x) for x in open(osp.join(vis, f'{runner.timestamp}.json'))
    ]
    return dict(lines=lines, records=records, own=own, recorder=recorder)


def _raw_summary(recorder, it):
    """The total gradient norm and ``(module, largest update ratio)`` of
    iteration ``it``'s optimizer step, from the raw float64 tensors."""
    step = recorder.steps[it]
    total = norm([g for n in TOP_LEVEL for g in step['grads'][n]])
    ratios = {
        n:
        norm([a - b for a, b in zip(step['after'][n], step['before'][n])]) /
        norm(step['before'][n])
        for n in NAMES
    }
    return total, ratios


def test_each_hook_puts_its_summary_on_the_line(run):
    lines, recorder = run['lines'], run['recorder']
    assert sorted(lines) == [5, 10, 15, 20]
    for step, line in lines.items():
        assert 'loss/mean' in line  # StatsCollectorHook
        assert 'samples_per_s' in line and 'memory/max' in line  # Throughput
        # ModuleStatsHook: its summary, none of its full statistics
        summary = {k: v for k, v in line.items() if k.startswith('modules/')}
        assert len(summary) == 2, line
        total, ratios = _raw_summary(recorder, step)
        assert float(summary['modules/total_grad_norm']) == pytest.approx(
            total, abs=1e-4)
        value = summary['modules/max_update_ratio']  # one key all run
        module = line['leader']  # named in words when it changes
        ranked = sorted(ratios.values())
        assert ranked[-1] > ranked[-2] * 1.001  # the largest is clear
        assert module == max(ratios, key=ratios.get), (step, ratios)
        assert float(value) == pytest.approx(ratios[module], abs=1e-4)
    # PreciseBNHook: on the first line after its run (end of epoch 1)
    assert 'precise_bn/var_change' in lines[15]
    assert all('precise_bn/var_change' not in lines[s] for s in (5, 10, 20))


def test_scalars_json_has_one_record_per_step(run):
    records = run['records']
    steps = [r['step'] for r in records]
    assert len(steps) == len(set(steps)), steps
    by_step = {r['step']: r for r in records}
    for step in (5, 10, 15, 20):
        record = by_step[step]
        assert 'loss' in record and 'lr' in record  # LoggerHook's
        assert 'stats/loss/mean' in record  # StatsCollectorHook's
        assert 'throughput/samples_per_s' in record  # ThroughputHook's
        assert 'modules/total_grad_norm' in record  # the line's summary
    assert 'precise_bn/var_change' in by_step[15]
    # LoggerHook's own file: its records only, as before (the validation
    # metrics' step is the epoch)
    assert [r['step'] for r in run['own']] == [5, 10, 1, 15, 20, 2]
    assert not any(k.startswith('stats/') for r in run['own'] for k in r)


def test_no_statistic_that_cannot_vary(run):
    """A norm, ratio or cosine is one value per publication, the same on
    every rank: only its value; one process: ``instrument_ms`` too."""
    keys = {k for r in run['records'] for k in r}
    for key in keys:
        name, _, stat = key.rpartition('/')
        if not name.startswith('stats/modules/') or name.endswith('/act'):
            continue
        assert stat == 'mean', key
    assert 'stats/modules/backbone.stem/grad_norm/mean' in keys
    assert 'stats/modules/backbone.stem/act/std' in keys
    assert 'stats/modules/instrument_ms/mean' in keys


def test_the_largest_update_ratio_keeps_one_key_as_its_module_changes(run):
    """The module with the largest update ratio changes during this run;
    the key does not (a key naming it split the curve)."""
    leaders = [run['lines'][step]['leader'] for step in sorted(run['lines'])]
    assert len(set(leaders)) > 1, leaders
    keys = {k for r in run['records'] for k in r if 'update_ratio' in k}
    keys = {k for k in keys if not k.startswith('stats/')}
    assert keys == {'modules/max_update_ratio'}
