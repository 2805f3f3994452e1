"""A hook that writes down what the launcher built, for the tests that
launch ``tools/dist_train.sh`` in subprocesses (imported by their configs
through ``custom_imports``)."""
import json
import os.path as osp

import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class LaunchRecorderHook(Hook):
    """At ``before_train``, write ``launch_rank{R}.json`` into the work dir:
    the runner, strategy and model wrapper types (with the wrapper's base
    classes), the process group's backend and size, the parameters held on
    this rank and the epoch training starts from."""

    def before_train(self, runner) -> None:
        model = runner.model
        local = 0
        for param in model.parameters():
            if hasattr(param, 'to_local'):  # FSDP2's DTensors
                param = param.to_local()
            local += param.numel()
        record = dict(
            runner=type(runner).__name__,
            strategy=type(getattr(runner, 'strategy', None)).__name__,
            wrapper=type(model).__name__,
            wrapper_bases=[c.__name__ for c in type(model).__mro__],
            backend=dist.get_backend() if dist.is_initialized() else None,
            world_size=runner.world_size,
            local_numel=local,
            start_epoch=runner.epoch)
        engine = getattr(model, 'model', None)  # DeepSpeed's engine
        if hasattr(engine, 'zero_optimization_stage'):
            record['zero_stage'] = engine.zero_optimization_stage()
        path = osp.join(runner.work_dir, f'launch_rank{runner.rank}.json')
        with open(path, 'w') as f:
            json.dump(record, f)
