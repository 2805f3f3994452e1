# Copyright (c) mmstats contributors. All rights reserved.
"""Install mmstats: ``pip install -c requirements/constraints.txt -e .``

The distribution is named ``mmengine-stats`` (``pip install
mmengine-stats``); the import name is ``mmstats`` (the PyPI name
``mmstats`` belongs to an unrelated project). Core requirements are what
``import mmstats`` needs beside the engine and torch, which it never
installs: they are the user's (upstream ``mmengine`` or the maintained fork
``onedl-mmengine``, the same import package; one torch build), checked at
import. Extras: ``mminstall`` (mmengine) and ``torch`` for a fresh
environment, as OpenMMLab's own packages do; ``demo`` (projects/digits_demo,
the plots and TensorBoard), ``deepspeed`` (DeepSpeedStrategy), ``tests``,
``lint``, ``docs``, ``benchmarks``. The wheel carries the config fragments
(``mmstats::_base_/...``), the launchers (``mmstats-train``,
``mmstats-test``), the figures (``mmstats-plot``, matplotlib from the
``demo`` extra) and the checkpoint converter (``mmstats-consolidate``).
"""
import os

from setuptools import find_packages, setup


def read_version() -> str:
    namespace: dict = {}
    with open(os.path.join('mmstats', 'version.py')) as f:
        exec(f.read(), namespace)
    return namespace['__version__']


def read_requirements(name: str) -> list:
    """Requirement lines of ``requirements/<name>``, following ``-r``."""
    lines = []
    with open(os.path.join('requirements', name)) as f:
        for line in f:
            line = line.split('#')[0].strip()
            if line.startswith('-r '):
                lines += read_requirements(line[3:].strip())
            elif line:
                lines.append(line)
    return lines


setup(
    name='mmengine-stats',
    version=read_version(),
    description='Exact, cheap training statistics for mmengine: precise '
    'BatchNorm and all-rank logged statistics',
    long_description=open('README.md').read()
    if os.path.exists('README.md') else '',
    long_description_content_type='text/markdown',
    license='Apache-2.0',
    python_requires='>=3.11',
    packages=find_packages(include=['mmstats', 'mmstats.*']),
    # the config fragments, where mmengine looks for ``mmstats::PATH``
    # (OpenMMLab's layout: mmstats/.mim/configs, in a clone a link to
    # configs/)
    package_data={
        'mmstats':
        ['.mim/model-index.yml', '.mim/configs/*/*/*.py', '.mim/configs/*.md']
    },
    entry_points=dict(console_scripts=[
        'mmstats-train = mmstats.tools.train:cli',
        'mmstats-test = mmstats.tools.test:cli',
        'mmstats-plot = mmstats.tools.plot:cli',
        'mmstats-consolidate = mmstats.tools.consolidate:cli',
    ]),
    install_requires=read_requirements('runtime.txt'),
    extras_require=dict(
        mminstall=read_requirements('mminstall.txt'),
        torch=read_requirements('torch.txt'),
        demo=read_requirements('demo.txt'),
        deepspeed=read_requirements('deepspeed.txt'),
        tests=read_requirements('tests.txt'),
        lint=read_requirements('lint.txt'),
        docs=read_requirements('docs.txt'),
        benchmarks=read_requirements('benchmarks.txt'),
    ),
    classifiers=[
        'Programming Language :: Python :: 3',
        'Programming Language :: Python :: 3.11',
        'Programming Language :: Python :: 3.12',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
    ],
    zip_safe=False,
)
