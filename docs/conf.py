# Sphinx configuration: the API reference built from the docstrings and the
# notes beside this file (Markdown, parsed by myst-parser). `make docs`
# builds it warning-free (sphinx -W) into docs/_build/html.
import os
import sys

sys.path.insert(0, os.path.abspath('..'))
# autodoc imports mmengine, which imports DeepSpeed when it is installed:
# name its accelerator rather than let it guess (and log) on a CPU machine
os.environ.setdefault('DS_ACCELERATOR', 'cpu')

project = 'mmstats'
copyright = '2026, mmstats contributors'
author = 'mmstats contributors'
extensions = [
    'sphinx.ext.autodoc', 'sphinx.ext.napoleon', 'sphinx.ext.viewcode',
    'myst_parser'
]
source_suffix = {'.rst': 'restructuredtext', '.md': 'markdown'}
# `[text](other.md#a-heading)` links, as GitHub resolves them
myst_heading_anchors = 4
napoleon_google_docstring = True
autodoc_member_order = 'bysource'
autodoc_typehints = 'none'  # the docstrings name the types
exclude_patterns = ['_build']
html_theme = 'alabaster'
nitpicky = False
