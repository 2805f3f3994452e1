# Copyright (c) mmstats contributors. All rights reserved.
"""What PreciseBNHook says and publishes: its message-hub keys (kept out of
checkpoints), its argument checks and the lines it logs."""
import logging
from typing import Any, List, Optional

from mmengine.logging import print_log

from mmstats.utils.args import check_bool, check_positive_int

VAR_CHANGE = 'train/precise_bn/var_change'
EMA_VAR_CHANGE = 'train/precise_bn/ema_var_change'
HUB_KEYS = (VAR_CHANGE, EMA_VAR_CHANGE)

__all__ = [
    'VAR_CHANGE', 'EMA_VAR_CHANGE', 'HUB_KEYS', 'drop_hub_keys',
    'check_hook_args', 'log_summary', 'log_modes'
]


def drop_hub_keys(checkpoint: dict) -> None:
    """Keep the once-per-run values out of the checkpoint's message hub.

    They are published for one log line only, so a resume has nothing to
    restore; mmengine's ``MessageHub.load_state_dict`` warns about every
    key of ``resumed_keys`` it cannot find in ``log_scalars`` (``resumed
    key: ... is not defined in message_hub``), whatever its flag.
    """
    state = checkpoint.get('message_hub')
    if not isinstance(state, dict):
        return
    for part in ('resumed_keys', 'log_scalars'):
        table = state.get(part)
        if isinstance(table, dict):  # a new dict: never the live hub's
            state[part] = type(table)(
                (k, v) for k, v in table.items() if k not in HUB_KEYS)


def check_hook_args(interval: Any, by_epoch: Any, **flags: Any) -> None:
    """Refuse a bad ``interval``, ``by_epoch`` or bool flag, naming the
    argument and the fix. Types are checked, not equality: ``0 == False``
    and ``1.0 == True``."""
    owner = 'PreciseBNHook'
    check_positive_int(owner, 'interval', interval, example=1)
    check_bool(
        owner,
        'by_epoch',
        by_epoch,
        none_ok=True,
        meaning='None follows the train loop, True: every `interval` '
        'epochs, False: every `interval` iterations')
    for name, flag in flags.items():
        check_bool(owner, name, flag)


def log_modes(names: Optional[List[str]]) -> None:
    """Say that no BN layer is to be recomputed (``names`` None: at the
    start of training; empty: from now on) or that some are again."""
    if names is None:
        text = ('every BatchNorm layer stays in eval mode during training '
                '(e.g. norm_eval=True, frozen stages) or tracks no running '
                'statistics: nothing to recompute, nothing is published. '
                'Layers that return to training mode later in the run are '
                'recomputed from then on.')
    elif names:
        text = (f'{len(names)} BatchNorm layers are in training mode now: '
                'recomputing them from now on')
    else:
        text = ('every BatchNorm layer is in eval mode now: nothing to '
                'recompute, nothing is published until some return to '
                'training mode')
    print_log(f'PreciseBNHook: {text}', 'current', level=logging.WARNING)


def log_summary(summary: dict, what: str, first: bool) -> None:
    """One line per recomputation (``what``: 'model' or 'EMA model'); on
    the ``first`` run of training, the layers left alone too."""
    if not summary['num_layers']:
        print_log(
            f'PreciseBN ({what}): no BN layer in training mode was called by '
            'the forwards (mode="tensor"): nothing updated, nothing '
            f'published; not called: {", ".join(summary["skipped"]) or "-"}',
            'current',
            level=logging.WARNING)
        return
    print_log(
        f'PreciseBN ({what}): updated {summary["num_layers"]} BN layers '
        f'with {summary["num_samples"]} samples in '
        f'{summary["seconds"]:.2f}s; running_var moved by '
        f'{100 * summary["var_change"]:.2f}% (mean relative change)',
        'current')
    if first:
        for key, text in (('frozen', 'left alone (eval mode)'),
                          ('skipped', 'not called in a forward: left alone'),
                          ('unaffected_norms', 'not BatchNorm: not affected')):
            if summary.get(key):
                print_log(f'PreciseBN: {text}: {", ".join(summary[key])}',
                          'current')
