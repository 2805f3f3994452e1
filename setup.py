# Copyright (c) mmstats contributors. All rights reserved.
"""Install mmstats: ``pip install -c requirements/constraints.txt -e .``"""
import os
import subprocess
import sys

from setuptools import find_packages, setup


def read_version() -> str:
    namespace: dict = {}
    with open(os.path.join('mmstats', 'version.py')) as f:
        exec(f.read(), namespace)
    return namespace['__version__']


def read_requirements(name: str) -> list:
    with open(os.path.join('requirements', name)) as f:
        return [
            line.strip() for line in f
            if line.strip() and not line.startswith('#')
        ]


def full_mmcv_installed() -> bool:
    """Whether the target interpreter already has a full (compiled) mmcv.

    Asked in a clean subprocess of the target interpreter because pip's
    isolated build environment hides the installed packages. Set
    ``MMSTATS_MMCV=full`` or ``lite`` to decide by hand.
    """
    choice = os.environ.get('MMSTATS_MMCV')
    if choice in ('full', 'lite'):
        return choice == 'full'
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ('PYTHONPATH', 'PYTHONNOUSERSITE', 'PYTHONHOME')
    }
    probe = ('import importlib.util, sys; '
             "sys.exit(0 if importlib.util.find_spec('mmcv._ext') else 1)")
    python = getattr(sys, '_base_executable', sys.executable)
    try:
        return subprocess.run([python, '-c', probe], env=env,
                              capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


install_requires = read_requirements('runtime.txt')
# mmcv.cnn / mmcv.transforms are pure Python: the 'lite' build is enough,
# and installing it over a full mmcv would overwrite its compiled ops.
install_requires.append(
    'mmcv>=2.0.0' if full_mmcv_installed() else 'mmcv-lite>=2.0.0')

setup(
    name='mmstats',
    version=read_version(),
    description='Exact, cheap training statistics for mmengine: precise '
    'BatchNorm and all-rank logged statistics',
    long_description=open('README.md').read()
    if os.path.exists('README.md') else '',
    long_description_content_type='text/markdown',
    license='Apache-2.0',
    python_requires='>=3.10',
    packages=find_packages(include=['mmstats', 'mmstats.*']),
    install_requires=install_requires,
    extras_require=dict(
        tests=read_requirements('tests.txt'),
        benchmarks=['fvcore', 'torchmetrics'],
    ),
    classifiers=[
        'Programming Language :: Python :: 3',
        'License :: OSI Approved :: Apache Software License',
    ],
    zip_safe=False,
)
