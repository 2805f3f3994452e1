# Copyright (c) mmstats contributors. All rights reserved.
"""The digits demo, installed beside mmstats by ``make install``:
``pip install -e projects/digits_demo``."""
from setuptools import find_packages, setup

setup(
    name='mmstats-digits-demo',
    version='0.1.0',
    description='The mmstats demo: a small ResNet on the embedded digits',
    license='Apache-2.0',
    python_requires='>=3.11',
    packages=find_packages(include=['digits_demo', 'digits_demo.*']),
    # mmstats itself comes from the repository root (`pip install -e .`):
    # the PyPI name 'mmstats' belongs to an unrelated package.
    install_requires=['mmcv-lite>=2.0.0', 'scikit-learn', 'matplotlib'],
)
