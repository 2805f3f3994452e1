# Copyright (c) mmstats contributors. All rights reserved.
"""The figures of a work dir, installed with the wheel: ``mmstats-plot
WORK_DIR [WORK_DIR ...]`` (``python -m mmstats.tools.plot``) draws them
all; a clone's ``tools/analysis/plot_*.py`` run the same modules.

``runs`` reads a work dir's whole run across its launches (a resumed run's
``scalars.json`` files joined); ``plot_curves`` (loss, accuracy),
``plot_stats`` (StatsCollectorHook's names and ModuleStatsHook's heat
maps), ``plot_histograms`` (TensorBoard histograms), ``plot_throughput``
(ThroughputHook) and ``compare`` (several work dirs, run against run) each
draw one figure from plain numbers; ``figures`` is what they share. Needs
matplotlib (``pip install 'mmengine-stats[demo]'``); nothing here is
imported by ``import mmstats``.
"""
