"""OpenMMLab's detection, segmentation and classification packages trained
for real, with mmstats' hooks: mmdet 3.3.0 and mmsegmentation 1.2.2, or the
maintained fork's onedl-mmdetection 3.5.1, onedl-mmsegmentation 1.4.2 and
onedl-mmpretrain 1.3.6 (whichever ``tools/downstream/venv.sh`` installed).

Each cell trains one of the packages' own configs (``tools/downstream/
configs/``: RetinaNet and Faster R-CNN R-50-FPN, PSPNet R-50-D8, ResNet-18
with Mixup and EMAHook where mmpretrain is installed) with the package's
own ``tools/train.py`` under ``torchrun`` on 1 and 2 CPU gloo processes,
on the tiny generated data of ``tools/downstream/make_data.py``, and
recomputes every number mmstats published (``scalars.json``, the log)
in float64 from what ``DownstreamRecorderHook`` wrote on each rank.

Not collected by ``make test`` (not under ``tests/``): run through
``make test-downstream`` (``tools/downstream/run.sh``), which builds the
environment it needs first. ``DOWNSTREAM_WORK_DIR`` keeps the runs (logs,
scalars, recordings) there instead of in pytest's temporary folder;
``DOWNSTREAM_CELLS=retinanet-2,pspnet-1`` selects cells;
``DOWNSTREAM_REUSE=1`` checks the runs kept there without training again.
"""
import glob
import importlib.util
import json
import os
import os.path as osp
import pickle
import re
import socket
import subprocess
import sys
import time
from typing import Dict, List

import numpy as np
import pytest

HERE = osp.dirname(osp.abspath(__file__))
DOWNSTREAM = osp.dirname(HERE)
CONFIGS = osp.join(DOWNSTREAM, 'configs')
MMSTATS_DIR = osp.join(osp.dirname(osp.dirname(DOWNSTREAM)), 'mmstats', '')
PEAK_FLOPS = 1e11  # the configs' ThroughputHook(peak_flops=...)
NUM_SAMPLES = 8  # the configs' PreciseBNHook(num_samples=...)
# what PreciseBNHook says about BN layers it leaves alone, once per run
LEFT_ALONE = 'PreciseBN: left alone (eval mode): '
ALL_EVAL = 'PreciseBNHook: every BatchNorm layer stays in eval mode'
# ModuleStatsHook about decode_head, whose forward mmseg calls directly
UNSEEN = ('ModuleStatsHook: no floating-point output of decode_head was '
          'seen on training iteration 2, a publication')

MODELS = {
    'retinanet':
    dict(
        package='mmdet',
        config='retinanet_r50_fpn_tiny-coco.py',
        iters={
            1: 16,
            2: 8
        },  # 4 epochs of 8 images, 2 per batch
        bn_runs=2,  # after epochs 2 and 4
        skipped=[],
        said=LEFT_ALONE,
        warns=[],
        no_act=[],
        frozen_module='backbone.layer1'),
    'faster-rcnn':
    dict(
        package='mmdet',
        config='faster-rcnn_r50_fpn_tiny-coco.py',
        iters={
            1: 16,
            2: 8
        },
        bn_runs=0,  # norm_eval=True: every BN layer in eval mode
        skipped=[],
        said=ALL_EVAL,
        warns=[ALL_EVAL],
        no_act=[],
        frozen_module='backbone.layer1'),
    'pspnet':
    dict(
        package='mmseg',
        config='pspnet_r50-d8_tiny-cityscapes.py',
        iters={
            1: 12,
            2: 12
        },
        bn_runs=2,  # after iterations 6 and 12
        # training only: EncoderDecoder's mode='tensor' runs no auxiliary
        # head, so precise BN never calls its BN layer
        skipped=['auxiliary_head.convs.0.bn'],
        said=None,
        warns=[UNSEEN],
        no_act=['decode_head'],
        frozen_module=None),
    'resnet18':
    dict(
        package='mmpretrain',
        config='resnet18_tiny-cls.py',
        iters={
            1: 12,
            2: 6
        },  # 2 epochs of 12 images, 2 per batch
        bn_runs=2,  # after epochs 1 and 2
        loss_terms=1,  # a classifier's train_step returns `loss` alone
        skipped=[],
        said=LEFT_ALONE,
        warns=[],
        no_act=[],
        frozen_module='backbone.layer1'),
}
# the packages of the stack's venv: mmpretrain where it is installed (the
# fork's stack), mmdet and mmseg in both
CELLS = [
    f'{model}-{n}' for model, spec in MODELS.items()
    if importlib.util.find_spec(spec['package']) for n in (1, 2)
]
if os.environ.get('DOWNSTREAM_CELLS'):
    CELLS = [
        c for c in os.environ['DOWNSTREAM_CELLS'].split(',') if c in CELLS
    ]
# mmstats' own lines: these words open every message its hooks log
MMSTATS_WORDS = re.compile(r'(PreciseBN|StatsCollectorHook|ModuleStatsHook|'
                           r'ThroughputHook|update_bn_stats|mmstats)')
WARNING_LINE = re.compile(
    r'( - (WARNING|ERROR) - |^\S+\.py:\d+: \w*Warning: |^\[W\d+ )')


# ------------------------------------------------------------ the runs
class Run:
    """One cell's training: the log, the scalars and every rank's record."""

    def __init__(self, cell: str, work_dir: str, output: str, returncode: int,
                 seconds: float) -> None:
        self.cell, self.work_dir, self.output = cell, work_dir, output
        self.returncode, self.seconds = returncode, seconds
        model, nproc = cell.split('-bare')[0].rsplit('-', 1)
        self.model, self.nproc = MODELS[model], int(nproc)
        self.log = self.scalars = None
        self.ranks: List[dict] = []
        logs = sorted(glob.glob(osp.join(work_dir, '2*', '2*.log')))
        if logs:
            with open(logs[-1]) as f:
                self.log = f.read()
            scalars = osp.join(
                osp.dirname(logs[-1]), 'vis_data', 'scalars.json')
            if osp.exists(scalars):
                self.scalars = _read_scalars(scalars)
        for rank in range(self.nproc):
            path = osp.join(work_dir, 'recorder', f'rank{rank}.pkl')
            if osp.exists(path):
                with open(path, 'rb') as f:
                    self.ranks.append(pickle.load(f))

    def steps(self, key: str) -> List[int]:
        """The steps at which ``key`` was published."""
        return sorted(s for s, r in self.scalars.items() if key in r)

    def windows(self, key: str):
        """``(step, iterations it covers)`` of each publication of
        ``key`` (publications tile the run)."""
        start = 0
        for step in self.steps(key):
            yield step, list(range(start + 1, step + 1))
            start = step

    def records(self, iteration: int) -> List[dict]:
        """Every rank's record of training iteration ``iteration``."""
        return [rank['iters'][iteration - 1] for rank in self.ranks]


def _read_scalars(path: str) -> Dict[int, dict]:
    merged: Dict[int, dict] = {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            merged.setdefault(record['step'], {}).update(record)
    return merged


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.fixture(scope='session')
def data_root(tmp_path_factory) -> str:
    root = os.environ.get('DOWNSTREAM_WORK_DIR') or str(
        tmp_path_factory.mktemp('downstream'))
    os.makedirs(root, exist_ok=True)
    subprocess.run(
        [sys.executable,
         osp.join(DOWNSTREAM, 'make_data.py'), root],
        check=True,
        stdout=subprocess.DEVNULL)
    return root


_RUNS: Dict[str, Run] = {}


@pytest.fixture(params=CELLS)
def run(request, data_root) -> Run:
    """Train the cell once per session (every check of it reads it)."""
    cell = request.param
    if cell not in _RUNS:
        _RUNS[cell] = _train(cell, data_root)
    result = _RUNS[cell]
    assert result.returncode == 0, (f'{cell} failed:\n' +
                                    result.output[-6000:])
    return result


@pytest.fixture
def bare(run, data_root) -> Run:
    """The same model trained on 2 processes without mmstats' hooks
    (``custom_hooks=[]``): the warnings that are not mmstats'."""
    cell = f'{run.cell.rsplit("-", 1)[0]}-2-bare'
    if cell not in _RUNS:
        _RUNS[cell] = _train(cell, data_root)
    result = _RUNS[cell]
    assert result.returncode == 0, (f'{cell} failed:\n' +
                                    result.output[-6000:])
    return result


def _train(cell: str, root: str) -> Run:
    model, nproc = cell.split('-bare')[0].rsplit('-', 1)
    spec = MODELS[model]
    package = __import__(spec['package'])
    train = osp.join(
        osp.dirname(package.__file__), '.mim', 'tools', 'train.py')
    work_dir = osp.join(root, 'work', cell)
    out = osp.join(root, 'work', f'{cell}.out')
    if os.environ.get('DOWNSTREAM_REUSE') and osp.exists(out):
        with open(out) as f:  # the checks again, on the runs kept
            return Run(cell, work_dir, f.read(), 0, float('nan'))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [DOWNSTREAM, os.environ.get('PYTHONPATH', '')]),
        OMP_NUM_THREADS='1',
        MKL_NUM_THREADS='1')
    # the package's own tools/train.py; where its engine cannot resolve
    # the package's config scope (the fork's mmseg: mmengine looks for the
    # distribution `mmsegmentation`), run through mmstats.tools.with_scopes,
    # as docs/integrations.md tells users to
    script = ['-m', 'mmstats.tools.with_scopes', train] if _scope_unresolvable(
        spec['package']) else [train]
    command = [
        sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node',
        nproc, '--master_port',
        str(_free_port())
    ] + script + [
        osp.join(CONFIGS, spec['config']), '--launcher', 'pytorch',
        '--work-dir', work_dir
    ] + (['--cfg-options', 'custom_hooks=[]'] if 'bare' in cell else [])
    start = time.perf_counter()
    done = subprocess.run(
        command,
        cwd=root,  # the configs' data_root: data/coco/, data/cityscapes/
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1800)
    seconds = time.perf_counter() - start
    with open(out, 'w') as f:
        f.write(done.stdout)
    # the run's distinct warning lines, for the docs (no timestamps)
    lines = _warnings(done.stdout)
    with open(osp.join(root, 'work', f'{cell}.warnings'), 'w') as f:
        f.write(f'{cell}: {seconds:.0f} s\n' +
                ''.join(f'    {line}\n' for line in sorted(lines)))
    return Run(cell, work_dir, done.stdout, done.returncode, seconds)


def _scope_unresolvable(package: str) -> bool:
    """Whether mmengine alone refuses ``package::`` bases: its own check
    (``is_installed`` of the distribution it maps the scope to) fails (the
    fork installs ``mmseg`` as ``onedl-mmsegmentation``)."""
    from mmengine.config.utils import MODULE2PACKAGE
    from mmengine.utils import is_installed
    return not is_installed(MODULE2PACKAGE.get(package, package))


# ------------------------------------------------------------ helpers
def _union(parts) -> tuple:
    """float64 (count, mean, population variance) of the union of parts
    given as (count, sum, sum of squared deviations) (Chan et al.)."""
    count = sum(p[0] for p in parts)
    mean = sum(p[1] for p in parts) / count
    m2 = sum(p[2] + p[0] * (p[1] / p[0] - mean)**2 for p in parts)
    return count, mean, m2 / count


def _close(got, want, rtol, what, atol=0.0) -> None:
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


def _trained_bns(run: Run) -> List[str]:
    """The BN layers in training mode during training (any rank/iter)."""
    return sorted({
        name
        for rank in run.ranks
        for record in rank['iters']
        for name in record['bn_training']
    })


# ------------------------------------------------------------ the checks
def test_trains_every_iteration_on_every_rank(run: Run) -> None:
    iters = run.model['iters'][run.nproc]
    assert len(run.ranks) == run.nproc
    for rank in run.ranks:
        assert rank['world_size'] == run.nproc
        assert [r['iter'] for r in rank['iters']] == list(range(1, iters + 1))
    # torchrun's processes in one gloo group (mmstats.launch.cpu_dist)
    assert 'Distributed launcher: pytorch' in run.log
    assert f'GPU number: {run.nproc}' in run.log  # mmengine's world size


def test_loss_terms_over_all_ranks(run: Run) -> None:
    """Every term ``train_step`` returns: num, mean, std, min and max of
    both ranks' values of exactly the iterations each publication covers."""
    iters = run.model['iters'][run.nproc]
    names = sorted(run.ranks[0]['iters'][0]['losses'])
    assert 'loss' in names, names
    assert len(names) >= run.model.get('loss_terms', 3), names
    windows = list(run.windows('stats/loss/num'))
    assert windows[-1][0] == iters  # the publications tile the run
    assert len(windows) >= 6  # the spike detector had a history to judge
    for step, window in windows:
        record = run.scalars[step]
        for name in names:
            values = np.array(
                [r['losses'][name] for i in window for r in run.records(i)])
            assert record[f'stats/{name}/num'] == len(window) * run.nproc
            for stat, want in (('mean', values.mean()), ('std', values.std()),
                               ('min', values.min()), ('max', values.max())):
                _close(
                    record[f'stats/{name}/{stat}'],
                    want,
                    1e-9,
                    f'{run.cell} step {step} {name} {stat}',
                    atol=1e-12)


def test_precise_bn_is_the_union_of_every_ranks_samples(run: Run) -> None:
    """Each recomputation: every BN layer its forwards call gets the same
    statistics on every rank, those of every value it saw over all ranks
    (float64); layers in training mode that ``mode='tensor'`` never calls
    (mmseg's auxiliary head) keep each rank's own statistics, and the log
    names them once; ``precise_bn/var_change`` is published once per
    recomputation, equal to its recomputation from the statistics before
    and after."""
    runs = [rank['bn_runs'] for rank in run.ranks]
    trained = _trained_bns(run)
    assert all(len(r) == run.model['bn_runs']
               for r in runs), [len(r) for r in runs]
    var_changes = [
        run.scalars[s]['precise_bn/var_change']
        for s in run.steps('precise_bn/var_change')
    ]
    assert len(var_changes) == run.model['bn_runs']
    if not run.model['bn_runs']:
        assert not trained
        return
    assert trained
    for index, var_change in enumerate(var_changes):
        parts = [r[index] for r in runs]
        called = sorted(parts[0]['batches'])
        for part in parts:
            assert sorted(part['batches']) == called
        assert set(called) <= set(trained)
        skipped = sorted(set(trained) - set(called))
        assert skipped == run.model['skipped'], skipped
        for part in parts:  # left alone: this rank's statistics
            for name in skipped:
                for key, value in part['before'][name].items():
                    assert np.array_equal(part['after'][name][key],
                                          value), (index, name, key)
        after = parts[0]['after']
        for other in parts[1:]:  # identical on every rank
            for name in called:
                for key, value in after[name].items():
                    assert np.array_equal(other['after'][name][key],
                                          value), (index, name, key)
        samples = sum(b[0] for p in parts for b in p['batches'][called[0]])
        assert samples == NUM_SAMPLES
        changes = []
        for name in called:
            batches = [b[1:] for p in parts for b in p['batches'][name]]
            _, mean, var = _union(batches)
            got_mean = after[name]['running_mean'].astype(np.float64)
            got_var = after[name]['running_var'].astype(np.float64)
            what = f'{run.cell} run {index} {name}'
            # within 1e-6 of the float64 statistics: of the variance, and
            # of the mean's size or the standard deviation (float32 BN
            # forwards sum the batches; seen: 6e-7 and 3.5e-7 at most)
            off = np.abs(got_mean - mean) / (np.abs(mean) + np.sqrt(var))
            assert off.max() <= 1e-6, (what, off.max())
            _close(got_var, var, 1e-6, f'{what} var')
            old = parts[0]['before'][name]['running_var'].astype(np.float64)
            changes.append(np.abs(got_var - old).sum() / np.abs(old).sum())
        _close(var_change, np.mean(changes), 1e-6,
               f'{run.cell} run {index} var_change')
    said = 'PreciseBN: not called in a forward: left alone: '
    if run.model['skipped']:
        assert run.log.count(said) == 1
        line = run.log.split(said, 1)[1].split('\n', 1)[0]
        assert line.split(', ') == run.model['skipped']
    else:
        assert said not in run.log


def test_frozen_and_norm_eval_bn_untouched_and_said_once(run: Run) -> None:
    """BN layers in eval mode (frozen stage 1, norm_eval) and the frozen
    parameters end exactly as they began, on every rank; PreciseBNHook
    says so once."""
    trained = set(_trained_bns(run))
    for rank in run.ranks:
        before, after = rank['before'], rank['after']
        left_alone = sorted(set(before['bn']) - trained)
        for name in left_alone:
            for key, value in before['bn'][name]['buffers'].items():
                assert np.array_equal(after['bn'][name]['buffers'][key],
                                      value), (name, key)
        for name, value in before['frozen'].items():
            assert np.array_equal(after['frozen'][name], value), name
    said = run.model['said']
    if said is None:
        assert not set(run.ranks[0]['before']['bn']) - trained
        assert LEFT_ALONE not in run.log and ALL_EVAL not in run.log
        return
    assert run.log.count(said) == 1, run.log.count(said)
    if said == LEFT_ALONE:
        line = run.log.split(said, 1)[1].split('\n', 1)[0]
        assert line.split(', ') == left_alone
        assert all(
            n.startswith(('backbone.bn1', 'backbone.layer1.'))
            for n in left_alone)
    else:
        assert not trained


def test_module_norms_and_activations(run: Run) -> None:
    """ModuleStatsHook on each publication iteration: every chosen
    module's weight norm, gradient norm, update ratio (none for the frozen
    stage) and output statistics over all ranks; the total gradient norm."""
    modules = run.ranks[0]['modules']
    assert modules
    windows = list(run.windows('stats/modules/instrument_ms/mean'))
    assert [s for s, _ in windows] == run.steps('stats/loss/num')
    for step, _ in windows:
        record, records = run.scalars[step], run.records(step)
        key = 'stats/modules/total_grad_norm'
        # one value per publication, the same on every rank: its value
        # alone (no num/std/min/max: a spread that cannot vary)
        assert f'{key}/num' not in record and f'{key}/std' not in record
        _close(record[f'{key}/mean'], records[0]['total_grad_norm'], 1e-6,
               f'{run.cell} {step} total_grad_norm')
        for module in modules:
            key = f'stats/modules/{module}'
            what = f'{run.cell} step {step} {module}'
            assert f'{key}/weight_norm/num' not in record, what
            _close(record[f'{key}/weight_norm/mean'],
                   records[0]['weight_norm'][module], 1e-6, what)
            has_grad = module in records[0]['grad_norm']
            assert has_grad == (module != run.model['frozen_module']), what
            for stat in ('grad_norm', 'update_ratio'):
                if not has_grad:
                    assert f'{key}/{stat}/num' not in record, what
                    continue
                assert f'{key}/{stat}/std' not in record, what
                for r in records:  # DDP: the same on every rank
                    _close(r[stat][module], records[0][stat][module], 1e-6,
                           what)
                _close(record[f'{key}/{stat}/mean'], records[0][stat][module],
                       1e-5, f'{what} {stat}')
            parts = [m for r in records for m in r['act'].get(module, [])]
            if module in run.model['no_act']:  # forward hooks never fire
                assert not parts and f'{key}/act/num' not in record, what
                continue
            assert parts, what
            count, mean, var = _union([p[:3] for p in parts])
            assert record[f'{key}/act/num'] == count, what
            _close(record[f'{key}/act/mean'], mean, 1e-6, what, 1e-9)
            _close(record[f'{key}/act/std'], np.sqrt(var), 1e-6, what)
            assert record[f'{key}/act/min'] == min(p[3] for p in parts)
            assert record[f'{key}/act/max'] == max(p[4] for p in parts)


def test_throughput_counts_the_images_of_every_rank(run: Run) -> None:
    windows = list(run.windows('throughput/samples'))
    assert [s for s, _ in windows] == run.steps('stats/loss/num')
    for step, window in windows:
        record = run.scalars[step]
        images = sum(r['batch_size'] for i in window for r in run.records(i))
        assert record['throughput/samples'] == images
        assert record['throughput/iters'] == len(window)
        _close(record['throughput/samples_per_s'],
               images / record['throughput/time'], 1e-9, str(step))
        if 'throughput/flops_per_s' in record:
            _close(record['throughput/mfu'],
                   record['throughput/flops_per_s'] / (run.nproc * PEAK_FLOPS),
                   1e-9, str(step))
    assert sum('throughput/mfu' in run.scalars[s] for s, _ in windows) >= \
        len(windows) - 1  # counted on iteration 2


def _warnings(text: str) -> set:
    """The distinct warning lines of ``text``, without their time."""
    return {
        re.sub(r'^\d\d/\d\d \d\d:\d\d:\d\d - ', '', line)
        for line in text.splitlines() if WARNING_LINE.search(line)
    }


def test_no_spike_and_no_warning_from_mmstats(run: Run, bare: Run) -> None:
    """A healthy run: no spike warning; no warning that the same training
    without mmstats' hooks does not print, and none that names mmstats,
    except the one line the cell expects (PreciseBNHook where every BN
    layer is in eval mode)."""
    assert 'spike' not in run.output
    expected = run.model['warns']
    ours = sorted(
        line for line in _warnings(run.output)
        if MMSTATS_WORDS.search(line) or MMSTATS_DIR in line)
    new = sorted(_warnings(run.output) - _warnings(bare.output))
    for lines in (ours, new):
        assert len(lines) == len(expected), lines
        for line, text in zip(lines, expected):
            assert text in line, lines
    for text in expected:  # said once (on rank 0, in the log)
        assert run.log.count(text) == 1
