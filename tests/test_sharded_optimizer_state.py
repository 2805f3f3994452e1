"""ModuleStatsHook(optimizer_state=True) under sharded training: real
``FlexibleRunner``s on 2 gloo processes, FSDP1 (``use_orig_params`` True
and False) and FSDP2 (also as HSDP: two replicas), AdamW (and SGD with
momentum under FSDP2).

The model of ``tests/test_sharded.py`` puts a module wholly on one rank,
cuts a parameter in two and leaves a rank's shard of some module empty.
Every published number is checked against a float64 recomputation from
the *full* optimizer state and gradients, gathered by FSDP itself after
each step (``FSDP.optim_state_dict``, the flat gradient's shards gathered
and cut by FSDP's flat layout; ``DTensor.full_tensor``), for exactly the
publication iterations."""
import numpy as np
import pytest
import torch
from mmengine.hooks import Hook

from mmstats.utils.torch_compat import register_step_hooks
from tests.helpers.dist import run_distributed
from tests.helpers.flexible import use_strategy
from tests.helpers.runner import read_scalars
from tests.test_module_stats.test_module_stats_optimizer import reference
from tests.test_sharded import MODULES, PUBLISHED, TARGETS, shard_toy_cfg

STATS = {
    'AdamW': ('exp_avg_norm', 'exp_avg_cos', 'exp_avg_sq_sqrt_norm'),
    'SGD': ('momentum_buffer_norm', 'momentum_buffer_cos'),
}


def _full(tensor):
    if hasattr(tensor, 'full_tensor'):
        tensor = tensor.full_tensor()
    return tensor.detach().double().flatten().clone().numpy()


def _flat_split(flat, shard):
    """A flat parameter's sharded tensor (its gradient, its state under
    ``use_orig_params=False``) gathered and cut by FSDP's flat layout
    (parameters in order with alignment padding between them, then the
    padding of the last shard)."""
    pieces = [torch.empty_like(shard) for _ in range(2)]
    torch.distributed.all_gather(pieces, shard.detach().contiguous())
    sizes = flat._numels_with_padding
    full = torch.cat(pieces)[:sum(sizes)].split(sizes)
    return [t for t, pad in zip(full, flat._is_padding_mask) if not pad]


class FullStateRecorder(Hook):
    """After every optimizer step: ``{fqn: (full grad, {state: full
    tensor})}``, gathered by FSDP (a collective: every rank records)."""
    priority = 'HIGHEST'

    def __init__(self):
        self.steps = {}

    def before_train(self, runner):
        optimizer = runner.optim_wrapper.optimizer
        register_step_hooks(optimizer, lambda *_: None,
                            lambda *_: self._record(runner, optimizer))

    def _record(self, runner, optimizer):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = runner.model
        if isinstance(model, FSDP):
            flat = model._handle.flat_param
            grads = dict(
                zip(flat._fqns, _flat_split(flat, model._handle.sharded_grad)))
            if flat._params is None:  # use_orig_params=False: the flat state
                states = {fqn: {} for fqn in flat._fqns}
                for key, value in optimizer.state[flat].items():
                    if key != 'step':
                        for fqn, full in zip(flat._fqns,
                                             _flat_split(flat, value)):
                            states[fqn][key] = full
            else:  # each original's local piece, in rank order
                local = [{
                    k: v.detach().clone()
                    for k, v in optimizer.state[p].items() if k != 'step'
                } for p in flat._params]
                gathered = [None, None]
                torch.distributed.all_gather_object(gathered, local)
                states = {
                    fqn: {
                        k:
                        torch.cat(
                            [rank[i][k] for rank in gathered if k in rank[i]])
                        for k in set().union(*(rank[i] for rank in gathered))
                    }
                    for i, fqn in enumerate(flat._fqns)
                }
        else:  # FSDP2: DTensor parameters, gradients and state
            params = dict(model.named_parameters())
            grads = {n: p.grad for n, p in params.items()}
            states = {n: optimizer.state[p] for n, p in params.items()}
        self.steps[runner.iter + 1] = {
            fqn: (_full(grads[fqn]), {
                k: _full(v)
                for k, v in states[fqn].items()
                if k != 'step' and isinstance(v, torch.Tensor)
            })
            for fqn in grads
        }


def _train(rank, world, work_dir, strategy, optimizer):
    from mmengine.registry import HOOKS
    from mmengine.runner import FlexibleRunner
    HOOKS.register_module(module=FullStateRecorder, force=True)
    torch.manual_seed(rank)
    cfg = shard_toy_cfg(work_dir, rank)
    cfg.optim_wrapper = dict(
        optimizer=dict(type='AdamW', lr=1e-2, weight_decay=0.1) if optimizer ==
        'AdamW' else dict(type='SGD', lr=0.1, momentum=0.9))
    use_strategy(cfg, strategy)
    cfg.custom_hooks = [
        dict(
            type='mmstats.StatsCollectorHook',
            stats=('num', 'mean', 'min', 'max'),
            collect=('outputs', ),
            health=dict(on_nonfinite='raise')),
        dict(
            type='mmstats.ModuleStatsHook',
            modules=MODULES,
            stats=('grad_norm', ),
            optimizer_state=True),
        dict(type='FullStateRecorder'),
    ]
    runner = FlexibleRunner.from_cfg(cfg)
    runner.train()
    recorder = [h for h in runner.hooks if isinstance(h, FullStateRecorder)][0]
    return dict(
        published=read_scalars(runner, missing_ok=True),
        steps={it: recorder.steps[it]
               for it in PUBLISHED})


def _module_rows(step, name):
    """(grad, state) of the parameters of module ``name``."""
    return [value for fqn, value in step.items() if fqn.startswith(name + '.')]


CELLS = [('fsdp', 'AdamW'), ('fsdp_flat', 'AdamW'), ('fsdp2', 'AdamW'),
         ('fsdp2', 'SGD'), ('fsdp2_hsdp', 'AdamW')]


@pytest.mark.parametrize(
    'strategy,optimizer', CELLS, ids=[f'{s}-{o}' for s, o in CELLS])
def test_flexible_runner(tmp_path, strategy, optimizer):
    ranks = run_distributed(
        _train, 2, str(tmp_path), strategy, optimizer, timeout=600)
    published = ranks[0]['published']
    assert sorted(it for it, record in published.items()
                  if any('/exp_avg' in k or '/momentum_buffer' in k
                         for k in record)) == list(PUBLISHED)
    for it in PUBLISHED:
        record = published[it]
        for name in TARGETS:
            rows = _module_rows(ranks[0]['steps'][it], name)
            assert rows, name
            ref = reference(rows)
            assert set(ref) == set(STATS[optimizer])
            other = reference(_module_rows(ranks[1]['steps'][it], name))
            key = f'stats/modules/{name}'
            for stat in STATS[optimizer]:
                np.testing.assert_allclose(other[stat], ref[stat], rtol=1e-9)
                # every rank holds the full tensors' number: its value
                # alone is published (a spread of it could not vary)
                for spread in ('num', 'std', 'min', 'max'):
                    assert f'{key}/{stat}/{spread}' not in record
                np.testing.assert_allclose(
                    record[f'{key}/{stat}/mean'],
                    ref[stat],
                    rtol=1e-6,
                    err_msg=f'{strategy} {it} {name} {stat}')
