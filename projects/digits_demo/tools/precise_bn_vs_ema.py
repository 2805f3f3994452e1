# Copyright (c) mmstats contributors. All rights reserved.
"""Val accuracy per epoch with EMA BN statistics vs PreciseBNHook.

Trains the demo twice with the same seed, in a setting where BatchNorm's
EMA statistics lag behind fast-moving weights (low BN momentum, high
learning rate): once as is, once with PreciseBNHook. Prints the accuracy
per epoch of both and saves a PNG plot.

    python projects/digits_demo/tools/precise_bn_vs_ema.py \\
        [--momentum 0.01] [--lr 0.2]
"""
import argparse
import os
import os.path as osp
import subprocess
import sys

PROJECT = osp.dirname(osp.dirname(osp.abspath(__file__)))
REPO = osp.dirname(osp.dirname(PROJECT))
sys.path.insert(0, osp.join(REPO, 'tools'))
CONFIG = osp.join(PROJECT, 'configs/demo/resnet-mini_1xb64_digits.py')
PRECISE_CONFIG = osp.join(
    PROJECT, 'configs/precise_bn/resnet-mini_1xb64-precise-bn-epoch_digits.py')


def val_accuracy(work_dir: str) -> list:
    """Accuracy per epoch from the newest run's scalars.json."""
    import glob

    from analysis.plot_curves import load_scalars
    scalars = sorted(glob.glob(osp.join(work_dir, '*/vis_data/scalars.json')))
    return load_scalars(scalars[-1])['accuracy'][1]


def train(config: str, work_dir: str, options: list) -> list:
    cmd = [
        sys.executable,
        osp.join(REPO, 'tools/train.py'), config, '--work-dir', work_dir,
        '--cfg-options', *options
    ]
    # this checkout's mmstats (as tools/dist_train.sh does), not whichever
    # one the interpreter has installed
    paths = [REPO] + [p for p in [os.environ.get('PYTHONPATH')] if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    return val_accuracy(work_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--momentum',
        type=float,
        default=0.01,
        help='BN momentum (lower: EMA stats lag more)')
    parser.add_argument('--lr', type=float, default=0.2)
    parser.add_argument('--epochs', type=int, default=15)
    parser.add_argument('--num-samples', type=int, default=1024)
    parser.add_argument('--work-dir', default='work_dirs/precise_bn_vs_ema')
    parser.add_argument(
        '--out',
        default=None,
        help='PNG path (default: WORK_DIR/precise_bn_vs_ema'
        '.png)')
    args = parser.parse_args()
    common = [
        f'model.backbone.norm_cfg.momentum={args.momentum}',
        f'optim_wrapper.optimizer.lr={args.lr}',
        f'train_cfg.max_epochs={args.epochs}'
    ]
    ema = train(CONFIG, osp.join(args.work_dir, 'ema'), common)
    precise = train(
        PRECISE_CONFIG, osp.join(args.work_dir, 'precise_bn'), common + [
            f'custom_hooks.0.num_samples={args.num_samples}',
            'custom_hooks.0.progress=False'
        ])
    print(f'BN momentum {args.momentum}, lr {args.lr}: val accuracy (%)')
    print(f'{"epoch":>5} {"EMA stats":>10} {"PreciseBN":>10}')
    for epoch, (a, b) in enumerate(zip(ema, precise), 1):
        print(f'{epoch:>5} {a:>10.2f} {b:>10.2f}')
    print(f'{"mean":>5} {sum(ema) / len(ema):>10.2f} '
          f'{sum(precise) / len(precise):>10.2f}')

    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    out = args.out or osp.join(args.work_dir, 'precise_bn_vs_ema.png')
    fig, ax = plt.subplots(figsize=(6, 3.5))
    epochs = range(1, len(ema) + 1)
    ax.plot(epochs, ema, marker='o', label='EMA BN statistics')
    ax.plot(epochs, precise, marker='s', label='PreciseBNHook')
    ax.set_xlabel('epoch')
    ax.set_ylabel('val accuracy (%)')
    ax.set_title(f'digits, BN momentum {args.momentum}, lr {args.lr}')
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f'plot: {out}')


if __name__ == '__main__':
    main()
