"""Plant plausible bugs one at a time and check that a test fails for each.

Each entry replaces one exact snippet of mmstats' source (it must occur
exactly once), runs the tests named for it, and restores the file
(always, also on Ctrl-C). A bug no test catches is a missing test; the
table this prints is kept in ``docs/testing.md``.

Usage (from the repository root, with the test requirements installed)::

    python tools/planted_bugs.py            # every bug
    python tools/planted_bugs.py B3 B11     # some of them
"""
import argparse
import os
import re
import subprocess
import sys
import time
from typing import NamedTuple, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Bug(NamedTuple):
    key: str
    what: str
    path: str
    old: str
    new: str
    tests: Tuple[str, ...]


BUGS = [
    Bug('B1', 'floored per-rank sample target', 'mmstats/precise_bn/update.py',
        'math.ceil(num_samples / world_size)', 'num_samples // world_size',
        ('tests/test_precise_bn/test_sample_targets.py',
         'tests/test_precise_bn/test_distributed.py')),
    Bug('B2', 'a batch too many when num_samples is hit exactly',
        'mmstats/precise_bn/update.py', 'if self.seen >= self.target:',
        'if self.seen > self.target:',
        ('tests/test_precise_bn/test_sample_targets.py',
         'tests/test_precise_bn/test_update.py')),
    Bug('B3', 'mean_change summed over channels instead of averaged',
        'mmstats/precise_bn/update.py', '(var + eps).sqrt()) / sizes',
        '(var + eps).sqrt())', ('tests/test_precise_bn/test_update.py', )),
    Bug('B4', 'sampler.set_epoch dropped (every run reads the same samples)',
        'mmstats/hooks/precise_bn_hook.py',
        'sampler.set_epoch(self._num_runs)', 'pass',
        ('tests/test_hooks/test_precise_bn_hook.py', )),
    Bug(
        'B5', "the user's custom_cfg overridden",
        'mmstats/publish/text_line.py',
        "if re.search(processor.mean_pattern, key) and not any(\n"
        "            cfg.get('data_src') == key for cfg in "
        "processor.custom_cfg):", 'if re.search(processor.mean_pattern, key):',
        ('tests/test_hooks/test_hook_args_reach.py',
         'tests/test_hooks/test_stats_collector_hook.py')),
    Bug(
        'B6', 'keep_previous not passed on to the collectors',
        'mmstats/hooks/stats_collector_hook.py',
        'Collector(\n                pattern,\n'
        '                self.keep_previous,',
        'Collector(\n                pattern,\n                True,',
        ('tests/test_hooks/test_hook_args_reach.py',
         'tests/test_hooks/test_stats_collector_hook.py')),
    Bug('B7', "the slowest rank's data_time never reset",
        'mmstats/hooks/stats_collector_hook.py',
        'total, self._time_sum = self._time_sum, 0.0',
        'total = self._time_sum',
        ('tests/test_hooks/test_stats_collector_hook.py', )),
    Bug('B8', "on_nonfinite='ignore' still warning",
        'mmstats/health/policy.py',
        "return bool(bad) and self.config.on_nonfinite != 'ignore'",
        'return bool(bad)',
        ('tests/test_hooks/test_stats_collector_hook.py', )),
    # B9 (gradients unscaled twice after a user's unscale_) has no place to
    # be planted any more: ModuleStatsHook reads gradients in the optimizer's
    # step pre-hook, after GradScaler's own unscale_, and divides by nothing.
    Bug(
        'B10', "ModuleStatsHook follows LoggerHook's interval, not the "
        "collector's", 'mmstats/hooks/module_stats_hook.py',
        'return self._publisher.publishes_after(runner, batch_idx)',
        'return PublicationSchedule(runner, at_last_iter=False).'
        'publishes_after(runner, batch_idx)',
        ('tests/test_hooks/test_module_stats_rhythm.py', )),
    Bug(
        'B11', "ModuleStatsHook ignores the collector's by_epoch",
        'mmstats/hooks/module_stats_hook.py',
        'return self._publisher.publishes_after(runner, batch_idx)',
        'return PublicationSchedule(runner, self._publisher.interval, '
        'at_last_iter=False).publishes_after(runner, batch_idx)',
        ('tests/test_hooks/test_module_stats_rhythm.py', )),
    # B12 loses rank 0's failure only: the header of every other rank, and
    # so the "failed on rank N" message, stays right (the old plant,
    # ``float(fns.rank)``, also changed the rank named for ranks > 0).
    Bug('B12', 'a failure on rank 0 read as "no error"',
        'mmstats/stats/protocol.py', 'fns.rank + 1. if failed else 0.',
        '(fns.rank + 1. if fns.rank else 0.) if failed else 0.',
        ('tests/test_stats/test_protocol.py',
         'tests/test_stats/test_collector_dist.py')),
    Bug(
        'B13', 'a second flush replacing pending sketch counts',
        'mmstats/stats/collector.py',
        'if mine is None:\n                    self._counts[names[i]] = '
        'counts[i].copy()', 'if True:\n                    '
        'self._counts[names[i]] = counts[i].copy()',
        ('tests/test_stats/test_sketch_flushes.py',
         'tests/test_stats/test_collector_sketch.py')),
    Bug('B14', 'report() without the store lock', 'mmstats/stats/pending.py',
        '        lock = self.lock  # acquire/release',
        '        lock = threading.Lock()  # acquire/release',
        ('tests/test_stats/test_reporting.py', )),
    Bug('B15', "a forked worker re-sending the parent's pending values",
        'mmstats/stats/reporting.py',
        '        self.store.after_fork_in_child()\n', '',
        ('tests/test_stats/test_report_fork.py',
         'tests/test_stats/test_report_workers.py',
         'tests/test_stats/test_reporting.py')),
    Bug('B16', 'the compile ops not marked side-effectful',
        'mmstats/stats/reporting.py',
        'has_side_effect(getattr(torch.ops.mmstats, op).default)', 'pass',
        ('tests/test_stats/test_report_compile.py',
         'tests/test_stats/test_report_compile_dist.py')),
    Bug('B17', 'compiled report0 of a tensor counting on every rank',
        'mmstats/stats/reporting.py', 'if rank0 and get_rank() != 0:',
        'if False:', ('tests/test_stats/test_report_compile_dist.py', )),
    Bug('B18', 'worker sketch counts ignoring the phase',
        'mmstats/stats/pending.py',
        'self.sketches.add_counts(prefix + name, sketch)',
        'self.sketches.add_counts(name, sketch)',
        ('tests/test_stats/test_report_fork.py',
         'tests/test_stats/test_report_workers_sketch.py',
         'tests/test_hooks/test_stats_collector_quantiles.py')),
    Bug('B19', 'a large tensor with +/-inf and no NaN taking the fast path',
        'mmstats/stats/moments.py',
        'if not (math.isfinite(low) and math.isfinite(high)):',
        'if math.isnan(low) or math.isnan(high):',
        ('tests/test_stats/test_moments.py',
         'tests/test_stats/test_collector.py')),
    Bug('B20', 'scaled gradients read at a fused optimizer step under AMP',
        'mmstats/module_stats/steps.py',
        "'_step_supports_amp_scaling', False):",
        "'_no_such_attribute', False):",
        ('tests/test_module_stats/test_module_stats_fused.py', )),
    Bug('B21', 'a skipped one-sample batch leaking its counts',
        'mmstats/precise_bn/update.py',
        'self.recorder.counts[:] = [0] * len(self.recorder.counts)', 'pass',
        ('tests/test_precise_bn/test_recorder.py', )),
    Bug('B22', 'the slowest rank chosen by time instead of data_time',
        'mmstats/publish/text_line.py', "if key == 'data_time':",
        "if key == 'time':",
        ('tests/test_hooks/test_stats_collector_hook.py', )),
    # sharded training (issue 25)
    Bug('S1', 'shard sums of squares published without the reduction',
        'mmstats/module_stats/norms.py', 'if self.sharded:', 'if False:',
        ('tests/test_sharded.py', )),
    Bug('S2', 'precise BN runs the unwrapped FSDP1 module (its 1-D shards)',
        'mmstats/sharding.py',
        'while not isinstance(outer, FullyShardedDataParallel) and (',
        'while (', ('tests/test_sharded.py', )),
    Bug('S3', 'precise BN forwards a sharded model without agreeing',
        'mmstats/precise_bn/update.py',
        'sharded = is_sharded(model) and get_world_size(group) > 1',
        'sharded = False', ('tests/test_precise_bn/test_sharded.py', )),
    Bug('S4', 'an empty shard counted as "no gradient" (names differ)',
        'mmstats/sharding.py', 'return None if whole_grad() is None else '
        'empty', 'return None', ('tests/test_sharded.py', )),
    Bug('S5', 'gradients read after clipping', 'mmstats/module_stats/steps.py',
        "if getattr(optim_wrapper, 'clip_grad_kwargs', None):", 'if False:',
        ('tests/test_module_stats/test_module_stats_clip.py', )),
    Bug('S6', 'ZeRO-3 partitions read with their padding',
        'mmstats/sharding.py', 'return max(0, min(part, p.ds_numel - start))',
        'return part', ('tests/test_sharded.py', )),
    Bug('S7', 'ZeRO-1/2 weights counted whole on every rank',
        'mmstats/sharding.py',
        'return p.detach().reshape(-1).narrow(0, address.start,',
        'return p.detach().reshape(-1).narrow(0, 0 * address.start,',
        ('tests/test_sharded.py', )),
    Bug('S8', 'an HSDP replica counted on every replicate coordinate',
        'mmstats/sharding.py',
        'if placement.is_replicate() and mesh.get_local_rank(dim) != 0:',
        'if False:', ('tests/test_sharded.py', )),
    # compiled report(): the reduction inside the graph (issue 27)
    Bug('C1', "compiled rows kept in inductor's reused buffer",
        'mmstats/stats/reporting.py', 'add_row(name, row.clone(), values)',
        'add_row(name, row, values)',
        ('tests/test_stats/test_report_in_graph.py', )),
    Bug('C2', 'compiled M2 shifted by the first value (cancellation)',
        'mmstats/stats/moments.py',
        'head = flat[:(numel + 255) // 256].to(_F64)',
        'head = flat[:1].to(_F64)',
        ('tests/test_stats/test_report_in_graph.py', )),
    Bug('C3', 'compiled values never counted for quantiles',
        'mmstats/stats/reporting.py',
        'values if REPORTER.sketches.enabled else None', 'None',
        ('tests/test_stats/test_report_in_graph.py', )),
    Bug('C4', 'per-name host work that grows with the table',
        'mmstats/stats/pending.py',
        'groups = np.fromiter((index[name] for name in nums)',
        'groups = np.fromiter((sorted(index).index(name) for name in nums)',
        ('tests/test_stats/test_collector.py', )),
    # spikes and histograms (issue 28)
    Bug(
        'SH1', 'a spike blamed on the mirror rank (rank in place of '
        'world - 1 - rank)', 'mmstats/stats/collector.py',
        'float(world - 1 - rank)', 'float(rank)',
        ('tests/test_hooks/test_stats_collector_health.py', )),
    Bug('SH2', 'the median taken with the value it is compared with',
        'mmstats/health/spikes.py', 'np.asarray(history)',
        'np.asarray(list(history) + [value])',
        ('tests/test_hooks/test_stats_collector_health.py', )),
    Bug('SH3', 'histogram gaps not filled: a bucket stretched over them',
        'mmstats/health/histograms.py', 'gap[1:] = lows[1:] > highs[:-1]',
        'gap[1:] = False',
        ('tests/test_health/test_histograms.py',
         'tests/test_hooks/test_stats_collector_health.py')),
    Bug('SH4', 'a histogram re-written from a stale (kept) sketch',
        'mmstats/health/histogram_writer.py', 'and collector.is_new(origin)):',
        'and True):', ('tests/test_hooks/test_stats_collector_health.py', )),
    Bug('SH5', 'W&B histograms committed apart from their scalars',
        'mmstats/health/histogram_writer.py', 'commit=False)', 'commit=True)',
        ('tests/test_hooks/test_stats_collector_health.py', )),
    Bug('SH6', 'the histogram\'s sum of squares without the mean',
        'mmstats/health/histograms.py', 'std * std + mean * mean', 'std * std',
        ('tests/test_hooks/test_stats_collector_health.py', )),
    Bug('SH7', 'collapsed magnitudes reaching over the lowest kept bucket',
        'mmstats/health/histograms.py',
        'pos_floor = bottom[codes == pos_kept[0]][0]',
        'pos_floor = top[codes == pos_kept[0]][0]',
        ('tests/test_health/test_histograms.py', )),
    # W&B read back from a real offline run (tests/helpers/wandb_records.py)
    Bug('WB1', "W&B's histogram without its first bucket (the minimum's)",
        'mmstats/health/histograms.py', 'return hist.bucket_counts, edges',
        'return hist.bucket_counts[1:], edges[1:]',
        ('tests/test_hooks/test_stats_collector_health.py', )),
    Bug('WB2', 'histogram writers on every rank (rank 1 starts a W&B run)',
        'mmstats/health/histogram_writer.py',
        'if not is_main_process():\n        return []', 'pass',
        ('tests/test_hooks/test_stats_collector_health.py', )),
    # training health: memory, throughput, FLOPs, MFU (issue 28 item 3)
    Bug(
        'TP1', 'an uneven last batch counted as a full one',
        'mmstats/hooks/throughput_hook.py',
        'self._interval.add_batch(rows, type(data_batch))',
        'self._interval.add_batch(self._counted_rows or rows, '
        'type(data_batch))', ('tests/test_hooks/test_throughput_hook.py', )),
    Bug('TP2', "rank 0's peak memory published as the max over ranks",
        'mmstats/throughput/interval.py',
        'rank = max(range(len(column)), key=lambda r: (column[r], -r))',
        'rank = 0', ('tests/test_hooks/test_throughput_hook.py', )),
    Bug('TP3', 'validation loops counted in the training time',
        'mmstats/hooks/throughput_hook.py',
        '        self._pause()\n        self._interval.keep_peaks(',
        '        self._interval.keep_peaks(',
        ('tests/test_hooks/test_throughput_hook.py', )),
    Bug('TP4', 'FLOPs scaled per iteration where the samples are known',
        'mmstats/throughput/figures.py',
        'return counted * (samples / counted_rows)',
        'return float(counted * iters)',
        ('tests/test_hooks/test_throughput_hook.py', )),
    Bug(
        'TP5', 'a collective on every iteration',
        'mmstats/hooks/throughput_hook.py',
        '        if self.schedule.publishes_after(runner, batch_idx):\n',
        '        reduce_interval({}, {"x": 1.0})\n'
        '        if self.schedule.publishes_after(runner, batch_idx):\n',
        ('tests/test_hooks/test_throughput_hook.py', )),
    Bug('TP6', 'FLOPs counted on the first iteration (compilation skipped)',
        'mmstats/hooks/throughput_hook.py', 'COUNTED_ITERATION = 2',
        'COUNTED_ITERATION = 1',
        ('tests/test_hooks/test_throughput_runners.py', )),
    Bug('TP7', "validation's CUDA memory left in the training peaks",
        'mmstats/hooks/throughput_hook.py',
        '        self._memory.reset()\n        if self._paused_in_epoch:',
        '        if self._paused_in_epoch:',
        ('tests/test_hooks/test_throughput_hook.py', )),
    Bug('TP8', 'the peak before a validation loop forgotten',
        'mmstats/throughput/figures.py',
        'self.peaks[name] = max(value, self.peaks.get(name, 0.0))', 'pass',
        ('tests/test_hooks/test_throughput_hook.py', )),
    Bug('OS1', 'exp_avg_sq_sqrt_norm from the L2 norm of v, not its sum',
        'mmstats/module_stats/optimizer_state.py',
        'foreach_norm(values, 1, torch.float64)',
        'foreach_norm(values, 2, torch.float64)',
        ('tests/test_module_stats/test_module_stats_optimizer.py', )),
    Bug('OS2', "FSDP1 flat optimizer state cut at the shard's start",
        'mmstats/sharding.py',
        '(lambda tensor, a=start, b=stop: _flat(tensor)[a:b])',
        '(lambda tensor, a=start, b=stop: _flat(tensor)[:b - a])',
        ('tests/test_sharded_optimizer_state.py', )),
    Bug('OS3', 'absent optimizer states published (as zeros)',
        'mmstats/module_stats/optimizer_state.py',
        "if row(f'{state}:count', segment) == 0:", 'if False:',
        ('tests/test_module_stats/test_module_stats_optimizer.py', )),
    Bug(
        'NF1', 'the watch stamps the last noted iteration of a batch, not '
        'the first', 'mmstats/health/nonfinite.py',
        'stamps = torch.where(torch.isfinite(values), NEVER,\n'
        '                                 iterations).amin(0)',
        'stamps = torch.where(torch.isfinite(values), NEVER,\n'
        '                                 iterations)[-1]',
        ('tests/test_hooks/test_nonfinite_origin.py', )),
    Bug('NF2', 'the backward origin taken in forward order',
        'mmstats/health/nonfinite.py', 'sign = 1 if row == FORWARD else -1',
        'sign = 1', ('tests/test_hooks/test_nonfinite_origin.py', )),
    Bug(
        'NF4', 'the watch tests its notes on the host every iteration',
        'mmstats/health/nonfinite.py',
        '        if len(self._history) >= FOLD_EVERY:\n',
        '        if len(self._history) >= FOLD_EVERY or not all(\n'
        '                torch.isfinite(_stacked([n[2]])).all()\n'
        '                for n in self._history):\n',
        ('tests/test_hooks/test_health_host_reads.py', )),
    Bug(
        'NF5', 'the alarm never asked: a watched NaN reported at the next '
        'publication', 'mmstats/hooks/stats_collector_hook.py',
        'and self.health.flags_nonfinite and nonfinite_alarm(runner))',
        'and self.health.flags_nonfinite and False)',
        ('tests/test_hooks/test_nonfinite_origin.py', )),
    Bug('NF6', "the alarm's flags not agreed across ranks",
        'mmstats/health/alarm.py',
        'dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=host_group())',
        'pass', ('tests/test_health/test_alarm.py', )),
    Bug('K1', 'the largest update ratio under a key naming its module',
        'mmstats/module_stats/summary.py',
        "summary[f'{head}max_update_ratio'] = largest[1]",
        "summary[f'{head}max_update_ratio@{largest[0]}'] = largest[1]",
        ('tests/test_hooks/test_what_a_person_reads.py', )),
    Bug(
        'WD1', 'a resumed launch duplicates the steps it shares with the '
        'interrupted one', 'mmstats/analysis/runs.py',
        'if s < first and (at is None or s <= at)',
        'if s <= first and (at is None or s <= at)',
        ('tests/test_tools/test_resumed_run.py', )),
    Bug('WD2', "a work dir's figures of its newest launch only",
        'mmstats/analysis/runs.py', '    return found\n',
        '    return found[-1:]\n', ('tests/test_tools/test_resumed_run.py', )),
    Bug('RC1', 'the resume check compares the wrong way round',
        'mmstats/tools/resume_check.py',
        'if end is None or was is None or end == was:',
        'if end is None or was is None or end != was:',
        ('tests/test_tools/test_resumed_run.py', )),
    Bug('LF1', "a failed run's reason not written to its .log",
        'mmstats/tools/entry.py', '                handler.handle(record)\n',
        '                pass\n', ('tests/test_tools/test_resumed_run.py', )),
    Bug(
        'EX1', "a launcher's return value handed to sys.exit (mmstats-test "
        'exits 1 after its evaluation)', 'mmstats/tools/entry.py',
        '        record(main)(argv)\n', '        return record(main)(argv)\n',
        ('tests/test_packaging.py', )),
    Bug(
        'WG1', "the watch's gradient layout cached once, whatever "
        'gradients are missing', 'mmstats/module_stats/steps.py',
        'layout = self._watch_index.get(missing)',
        'layout = next(iter(self._watch_index.values()), None)',
        ('tests/test_module_stats/test_step_probe_watch.py', )),
    Bug('WG2', 'the watch norms the gradients of unwatched modules too',
        'mmstats/module_stats/steps.py', 'if any(t < targets for t in s)]',
        'if True]', ('tests/test_module_stats/test_step_probe_watch.py', )),
    Bug('NF3', "every rank named as having seen a name's NaN/inf",
        'mmstats/health/nonfinite.py',
        "seen = [o for o in origins if o['names'].get(name)]",
        'seen = origins',
        ('tests/test_hooks/test_nonfinite_origin_dist.py', )),
    Bug('TP9', "the clock runs on after an epoch's last publication",
        'mmstats/hooks/throughput_hook.py', 'restart=not last)',
        'restart=True)', ('tests/test_hooks/test_throughput_hook.py', )),
    Bug('TP10', "the clock restarted before the publication's collective",
        'mmstats/hooks/throughput_hook.py',
        'self._stamp = perf_counter()  # after the collective',
        'self._stamp = now  # after the collective',
        ('tests/test_hooks/test_throughput_hook.py', )),
    Bug('S9', 'an FSDP1 NO_SHARD flat parameter counted on every rank',
        'mmstats/sharding.py',
        'counted = handle.uses_sharded_strategy or rank == 0',
        'counted = True', ('tests/test_sharded.py', )),
    Bug('S10', 'a replicated parameter outside the shards counted on every '
        'rank', 'mmstats/sharding.py',
        '_plain_part(m, p, rank == 0 or not self.sharded)',
        '_plain_part(m, p, True)', ('tests/test_sharded.py', )),
    Bug(
        'AM1', 'the keyword check installed under the wrong name (a '
        'misspelt keyword reaches __init__ unanswered)',
        'mmstats/utils/args.py', '    cls.__init__ = __init__\n',
        '    cls._checked_init = __init__\n',
        ('tests/test_utils/test_arg_checks.py', )),
    Bug('AM2', 'a second instance of a hook refused only from the third on',
        'mmstats/utils/args.py', 'if len(found) < 2:', 'if len(found) < 3:',
        ('tests/test_utils/test_arg_checks.py', )),
    Bug('AM3', 'every | splits the modules regex (inside parentheses too)',
        'mmstats/utils/args.py', "elif char == '|' and depth == 0:",
        "elif char == '|':", ('tests/test_utils/test_arg_checks.py', )),
    Bug('AM4', 'the unmatched alternative warned about at every train()',
        'mmstats/hooks/module_stats_hook.py',
        '        self._warned_unmatched = True\n        closest = []',
        '        closest = []', ('tests/test_utils/test_arg_checks.py', )),
    Bug('AM5', "DeepSpeed's step wrapper drops the schedulers' _with_counter",
        'mmstats/module_stats/steps.py',
        'optim_wrapper.step = functools.wraps(self._step)(step)',
        'optim_wrapper.step = step',
        ('tests/test_module_stats/test_module_stats_deepspeed_warnings.py', )),
    Bug(
        'AM6', "removing the DeepSpeed step wrapper deletes the schedulers' "
        'step too', 'mmstats/module_stats/steps.py',
        '            if self._own_step:\n'
        '                self.optim_wrapper.step = self._step\n'
        '            else:\n'
        '                del self.optim_wrapper.step',
        '            del self.optim_wrapper.step',
        ('tests/test_module_stats/test_module_stats_deepspeed_warnings.py', )),
    Bug(
        'S11', "sharded precise BN's agreement counting the samples seen "
        'before the current batch (a batch too many)',
        'mmstats/precise_bn/update.py',
        'self._next = _Agreement(self, iterator, self.seen + used)',
        'self._next = _Agreement(self, iterator, self.seen)',
        ('tests/test_precise_bn/test_sharded.py', )),
    Bug(
        'SH8', 'spikes tested on the signed value (a statistic turning very '
        'negative never spikes)', 'mmstats/health/spikes.py',
        'if median > 0 and abs(value) > self.factor * median:',
        'if median > 0 and value > self.factor * median:',
        ('tests/test_health/test_spikes.py', )),
    Bug('SH9', "a spike's median taken of the signed history",
        'mmstats/health/spikes.py', 'np.median(np.abs(np.asarray(history)))',
        'np.median(np.asarray(history))',
        ('tests/test_health/test_spikes.py', )),
    Bug('TP11', "MFU over one device's peak (all ranks' FLOP/s: x world)",
        'mmstats/throughput/figures.py', "flops * per_s / sums['peak']",
        'flops * per_s / self.peak_flops',
        ('tests/test_hooks/test_throughput_hook.py', )),
    Bug('PL1', 'a colour bar of one value (one rank holding every peak)',
        'mmstats/analysis/figures.py',
        'if np.unique(values[np.isfinite(values)]).size < 2:',
        'if np.unique(values[np.isfinite(values)]).size < 1:',
        ('tests/test_tools/test_plot_throughput.py',
         'tests/test_tools/test_plot_stats.py')),
    Bug('PL3', "histograms.png clips its min and max lines at the axes' edges",
        'mmstats/analysis/plot_histograms.py',
        'pad = 0.02 * (edges[-1] - edges[0])', 'pad = 0.0',
        ('tests/test_tools/test_plot_histograms.py', )),
    Bug('PL4', 'curves.png ticks fractions of an epoch',
        'mmstats/analysis/plot_curves.py',
        "ax.xaxis.set_major_locator(MaxNLocator('auto', integer=True))",
        "ax.xaxis.set_major_locator(MaxNLocator('auto'))",
        ('tests/test_tools/test_resumed_run.py', )),
    Bug('PL2', 'plot_histograms writes into the work dir, not the vis_data',
        'mmstats/analysis/plot_histograms.py',
        "out = args.out or osp.join(directory, 'histograms.png')",
        "out = args.out or osp.join(args.work_dir, 'histograms.png')",
        ('tests/test_tools/test_plot_histograms.py', )),
    # histogram bucket edges: keys exact against the edge table
    Bug(
        'HE1', 'host sketch keys from log alone (a value on an edge or one '
        'ulp beside it counted one bucket off, -1 above its limit)',
        'mmstats/stats/sketch.py', 'keys += mag > self._table()[column]',
        'keys = np.clip(np.ceil(np.log(mag) * self.multiplier), '
        'self.min_key, self.max_key)',
        ('tests/test_hooks/test_stats_collector_health.py', )),
    Bug(
        'HE2', 'negative values compared with the positive edges (-1 in '
        'the bucket above its limit)', 'mmstats/stats/sketch.py',
        '.sub_(sign, alpha=half)', '.sub_(sign.abs(), alpha=half)',
        ('tests/test_health/test_histograms.py', )),
    Bug('HE3', 'device sketch keys from log alone', 'mmstats/stats/sketch.py',
        'return keys.sub_(edge.sub_(mag).sign_().clamp_(max=0))',
        'return mag.log().mul_(self.multiplier).ceil_()',
        ('tests/test_health/test_histograms.py', )),
    # optimizer-state cosines: g * m formed in float64
    Bug(
        'OS4', 'optimizer-state dot products g * m taken in the parameters\''
        ' dtype (bfloat16: 1e-4 off)',
        'mmstats/module_stats/optimizer_state.py',
        'float64_dots(grads, values), segments, num_segments)',
        'torch.stack([(g * v).sum(dtype=torch.float64) for g, v in '
        'zip(grads, values)]), segments, num_segments)',
        ('tests/test_module_stats/test_module_stats_optimizer_float64.py', )),
    # importing or building a hook changes nothing process-wide
    Bug(
        'IM1', 'mmengine.runner imported with the hooks (DeepSpeed, then '
        'torch._dynamo and its weights_only allowlist entry, when a hook '
        'is built)', 'mmstats/publish/strategies.py',
        'if TYPE_CHECKING:  # imported at run time only',
        'if True:  # imported at run time only',
        ('tests/test_import_effects.py', )),
    # the suite's inductor cache (tests/helpers/compile_cache.py)
    Bug(
        'IC1', 'incomplete binaries kept in the inductor cache (a zero-byte '
        '.so loaded by the next run)', 'tests/helpers/compile_cache.py',
        'if name.endswith(BINARIES) and not complete_elf(',
        'if False and not complete_elf(', ('tests/test_compile_cache.py', )),
    Bug('IC2', 'the inductor cache kept after an unfinished session',
        'tests/helpers/compile_cache.py', '        if left:\n',
        '        if False:\n', ('tests/test_compile_cache.py', )),
    Bug(
        'IC3', "the suite's inductor cache set after DeepSpeed's import "
        "(which sets torch's default: the suite's cache never used)",
        'tests/conftest.py',
        "os.environ.setdefault('TORCHINDUCTOR_CACHE_DIR', INDUCTOR_CACHE)",
        'import tests.helpers.torch_versions  # noqa: E402, F401\n'
        "os.environ.setdefault('TORCHINDUCTOR_CACHE_DIR', INDUCTOR_CACHE)",
        ('tests/test_compile_cache.py', )),
    # modules whose forward hooks never fire (mmseg's decode heads)
    Bug(
        'MU1', 'no word about a module whose act never comes (called as '
        'module.forward(x), or a ModuleList)',
        'mmstats/hooks/module_stats_hook.py',
        '        self._warn_unseen(runner)\n', '',
        ('tests/test_module_stats/test_module_stats_unseen.py', )),
    Bug('MU2', 'the unseen-module warning repeated at every publication',
        'mmstats/hooks/module_stats_hook.py',
        '        self._warned_unseen.update(unseen)\n', '',
        ('tests/test_module_stats/test_module_stats_unseen.py', )),
    # checkpoints a sharded run can trust (docs/checkpoints.md)
    Bug(
        'CK1', "FSDP2's checkpoint: model.state_dict() (rank 0's DTensor "
        'shards pickled as the model)', 'mmstats/strategies/state_dicts.py',
        'return get_model_state_dict(\n'
        '            self.model,\n'
        "            options=self._options(self.checkpoint_format == 'full'))",
        'return self.model.state_dict()',
        ('tests/test_strategies/test_sharded_checkpointing.py', )),
    Bug('CK2', 'no check of what a one-file checkpoint is about to write',
        'mmstats/strategies/state_dicts.py', '        if _is_partial(value):',
        '        if False:',
        ('tests/test_strategies/test_sharded_checkpointing.py', )),
    Bug('CK3', 'the optimizer state not resumed from a sharded checkpoint',
        'mmstats/strategies/state_dicts.py',
        'filename, with_optimizer=with_optimizer, strict=strict)',
        'filename, with_optimizer=False, strict=strict)',
        ('tests/test_strategies/test_sharded_checkpointing.py', )),
    Bug(
        'CK4', 'random states saved but not restored at resume (mmengine '
        'reseeds: the resumed epoch repeats the first one\'s draws)',
        'mmstats/hooks/random_state_hook.py',
        '            restore_random_state(self._resumed[get_rank()])',
        '            pass', ('tests/test_hooks/test_random_state_hook.py', )),
    Bug(
        'CK5', 'validation draws from training\'s random states (its '
        'loader\'s seed moves them)', 'mmstats/hooks/random_state_hook.py',
        '            restore_random_state(self._before_val)',
        '            pass', ('tests/test_hooks/test_random_state_hook.py', )),
    Bug('CK6', 'the spike histories not saved with the checkpoint',
        'mmstats/hooks/stats_collector_hook.py',
        "            checkpoint.setdefault('meta', {})[SPIKES_KEY] = state",
        "            {}.setdefault('meta', {})[SPIKES_KEY] = state",
        ('tests/test_hooks/test_stats_collector_health.py', )),
    Bug(
        'CK7', "evaluation through DeepSpeed's own loading (a ZeRO-3 "
        "checkpoint's module file holds no weights; it looks for 'latest')",
        'mmstats/strategies/deepspeed.py',
        "        if not hasattr(self, 'optim_wrapper'):  # evaluation, "
        'no ZeRO', '        if False:',
        ('tests/test_integrations/test_checkpoints.py::'
         'test_checkpoint_evaluates_on_2_and_1_processes[zero3]', )),
    Bug('CK8', 'tools/train.py without RandomStateHook',
        'mmstats/tools/train.py',
        "    if not has_hook(cfg, 'RandomStateHook'):", '    if False:',
        ('tests/test_integrations/test_checkpoints.py::'
         'test_resume_continues_the_run_exactly[ddp]', )),
    Bug(
        'CK9', "ZeRO-3 on CPU left to DeepSpeed's coalesced gather (gloo "
        'threads race it: uninitialised weights in ~1 run of 10)',
        'mmstats/strategies/deepspeed.py',
        'return dict(zero, stage3_allgather_sequential=True)', 'return zero',
        ('tests/test_strategies/test_deepspeed_cpu.py', )),
    Bug(
        'TC1', "torch 2.1's unhooked optimizer step taken as hooked "
        '(ModuleStatsHook would see no step, silently)',
        'mmstats/utils/torch_compat.py',
        "    if getattr(class_step, '__code__', None) is probe.__code__:",
        '    if True:', ('tests/test_utils/test_torch_compat.py', )),
    Bug('TC2', 'the float64 norms of an old torch taken in the input dtype',
        'mmstats/utils/torch_compat.py',
        '    return torch._foreach_norm([t.to(dtype) for t in tensors], ord)',
        '    return torch._foreach_norm(list(tensors), ord)',
        ('tests/test_utils/test_torch_compat.py', )),
    Bug('LA1', "the launchers do not register the mmstats:: config scope",
        'mmstats/tools/launcher.py',
        "    utils.MODULE2PACKAGE.setdefault('mmstats', 'mmstats')",
        '    pass', ('tests/test_launch/test_setup_strategies.py::'
                     'test_the_launcher_resolves_mmstats_fragments', )),
    Bug('WR1', "the log line names the smallest update ratio's module",
        'mmstats/module_stats/summary.py',
        '        if largest is None or key > largest[0]:',
        '        if largest is None or key < largest[0]:',
        ('tests/test_hooks/test_what_a_person_reads.py', )),
    Bug('WR2', 'scalars.json gets a record per writer again',
        'mmstats/publish/step_records.py',
        '        index = None if not lines else self._joinable(record)',
        '        index = None',
        ('tests/test_hooks/test_what_a_person_reads.py', )),
    Bug('WR3', 'a norm published with its spread over ranks (always 0)',
        'mmstats/publish/layout.py',
        "        if kind == 'replicated' or (kind == 'per_rank'",
        "        if kind == 'never' or (kind == 'per_rank'",
        ('tests/test_hooks/test_what_a_person_reads.py', )),
    Bug(
        'WR4', 'the non-finite report buries the origin after the names',
        'mmstats/health/nonfinite.py',
        "    lines.append(f'non-finite values at {when}: ' + "
        "'; '.join(parts))",
        "    lines.insert(0, f'non-finite values at {when}: ' + "
        "'; '.join(parts))", ('tests/test_hooks/test_nonfinite_origin.py', )),
    Bug('TP12', 'a peak kept before validation replaces a higher one read '
        'after it', 'mmstats/throughput/figures.py',
        'value = max(value, self.peaks[name])', 'value = self.peaks[name]',
        ('tests/test_throughput/test_figures.py', )),
    Bug(
        'PB1', "the EMA model's validation swap copying instead of "
        "exchanging (the model keeps the EMA model's BN statistics)",
        'mmstats/precise_bn/ema.py', 'buf_b.copy_(kept)', 'buf_b.copy_(buf_a)',
        ('tests/test_precise_bn/test_ema.py', )),
    Bug('HP1', 'a re-published (kept) statistic fed to the spike history',
        'mmstats/health/policy.py',
        'if self._spike_names(name) and is_new(name)',
        'if self._spike_names(name)', ('tests/test_health/test_policy.py', )),
    Bug(
        'HW1', 'the hang watch\'s phase not updated around the optimizer '
        'step (a stall there named as backward)',
        'mmstats/hooks/hang_watch_hook.py',
        'self._handles += register_step_hooks(optimizer, step, _nothing)',
        'self._handles += []', ('tests/test_health/test_hangs.py', )),
    Bug(
        'HW2', 'a phase\'s time measured from the run\'s start',
        'mmstats/health/hangs.py',
        '            self.state = (it, seq + 1, phase, detail, now)\n'
        '        else:\n'
        '            self.state = (iteration, 0, phase, detail, now)',
        '            self.state = (it, seq + 1, phase, detail, since)\n'
        '        else:\n'
        '            self.state = (iteration, 0, phase, detail, since)',
        ('tests/test_health/test_hangs.py', )),
    Bug(
        'HW3', 'a stall of rank 0 itself (the reporter) unreported',
        'mmstats/health/hang_watchdog.py',
        'for rank, text in self.channel.read_all().items()\n        }',
        'for rank, text in self.channel.read_all().items()\n'
        '            if rank != self.rank\n        }',
        ('tests/test_health/test_hangs.py', )),
    Bug(
        'RS1', 'the older checkpoint purged before the newer one is written',
        'mmstats/hooks/checkpoint_hook.py',
        '        self._write(runner, filename, meta)\n'
        '        if not is_main_process():\n            return\n'
        '        if dropped is not None:\n',
        '        if dropped is not None and is_main_process():\n'
        '            remove_checkpoint(\n'
        '                osp.join(self.out_dir, '
        'self.filename_tmpl.format(dropped)))\n'
        '        self._write(runner, filename, meta)\n'
        '        if not is_main_process():\n            return\n'
        '        if dropped is not None:\n',
        ('tests/test_checkpoints/test_checkpoint_hook.py', )),
    Bug('RS2', 'the stop decided on each rank alone (no all_reduce)',
        'mmstats/checkpoints/stop.py',
        '    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=host_group())',
        '    pass', ('tests/test_checkpoints/test_together.py', )),
    Bug(
        'RS3', 'the damage check on rank 0 only',
        'mmstats/checkpoints/together.py',
        '    mine = local_problem(path, resume, get_world_size())',
        '    from mmengine.dist import get_rank\n'
        '    mine = local_problem(path, resume, get_world_size()) if '
        'get_rank() == 0 else None',
        ('tests/test_checkpoints/test_together.py', )),
    Bug(
        'RS4', 'a mid-epoch resume trains the epoch from its first batch',
        'mmstats/hooks/checkpoint_hook.py',
        '                    SkipTrainedBatches(runner.train_loop, skip, '
        'after)', '                    pass',
        ('tests/test_checkpoints/test_checkpoint_hook.py', )),
    Bug(
        'RS5', "a FlexibleRunner's preemption resumed where its meta says "
        '(an epoch end, or the next epoch)',
        'mmstats/hooks/checkpoint_hook.py',
        '            loop._epoch, loop._iter = position', '            pass',
        ('tests/test_checkpoints/test_together.py', )),
    Bug(
        'LG1', 'a library ending the process groups after a failed sharded '
        'forward (the launcher owns them)', 'mmstats/precise_bn/update.py',
        '        self.abandoned = True\n        raise RuntimeError(',
        '        self.abandoned = True\n'
        '        torch.distributed.destroy_process_group()\n'
        '        raise RuntimeError(',
        ('tests/test_precise_bn/test_sharded.py::'
         'test_a_forward_failing_on_one_rank_raises_everywhere', )),
    Bug(
        'RH1', "a best checkpoint carrying validation's generator states "
        "instead of training's", 'mmstats/hooks/random_state_hook.py',
        'gather_states(hook._before_val)', 'gather_states()',
        ('tests/test_hooks/test_random_state_hook.py', )),
]

# A failure whose cause is one of these proves only that the plant broke
# the code's import, syntax or names, not that a test checks the behaviour.
NOT_CAUGHT_BY = ('ImportError', 'ModuleNotFoundError', 'SyntaxError',
                 'IndentationError', 'NameError')


def verdict(returncode: int, stdout: str) -> bool:
    r"""Whether pytest's run caught a planted bug.

    Caught means a test *failed*: pytest exited with 1 (tests failed) and its
    summary counts at least one failure and no error. A collection error
    (exit 2), an error in a fixture's set-up ("1 error") or a failure whose
    cause is an import or syntax error (:data:`NOT_CAUGHT_BY`) proves
    nothing about the behaviour the bug changes, and counts as missed.

    Args:
        returncode (int): pytest's exit status.
        stdout (str): what pytest printed with ``-rfE``.

    Returns:
        bool: True when the bug counts as caught.

    Example:
        >>> verdict(1, 'FAILED t.py::a - AssertionError\n1 failed in 1s')
        True
        >>> verdict(2, 'ERROR t.py\n1 error in 1s')
        False
    """
    if returncode != 1:
        return False
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    summary = lines[-1] if lines else ''
    if not re.search(r'\b\d+ failed\b', summary) or re.search(
            r'\b\d+ errors?\b', summary):
        return False
    failed = [ln for ln in lines if ln.startswith('FAILED ')]
    return bool(failed) and not all(
        any(name in ln for name in NOT_CAUGHT_BY) for ln in failed)


def plant(bug: Bug) -> Tuple[bool, float, str]:
    """Plant ``bug``, run its tests, restore. Returns (caught, seconds,
    the last line pytest printed); caught as :func:`verdict` says."""
    path = os.path.join(ROOT, bug.path)
    with open(path) as f:
        original = f.read()
    if original.count(bug.old) != 1:
        raise ValueError(f'{bug.key}: the snippet occurs '
                         f'{original.count(bug.old)} times in {bug.path}')
    start = time.monotonic()
    paths = (ROOT, os.environ.get('PYTHONPATH'))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    try:
        with open(path, 'w') as f:
            f.write(original.replace(bug.old, bug.new))
        proc = subprocess.run([
            sys.executable, '-m', 'pytest', '-x', '-q', '-rfE', '-p',
            'no:cacheprovider', *bug.tests
        ],
                              cwd=ROOT,
                              capture_output=True,
                              text=True,
                              env=env)
    finally:
        with open(path, 'w') as f:
            f.write(original)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return verdict(proc.returncode, proc.stdout), time.monotonic() - start, (
        lines[-1] if lines else proc.stderr[-300:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('keys', nargs='*', help='bug keys (default: all)')
    args = parser.parse_args()
    bugs = [b for b in BUGS if not args.keys or b.key in args.keys]
    missed = []
    for bug in bugs:
        caught, seconds, last = plant(bug)
        print(
            f'{bug.key} {"caught" if caught else "MISSED"} '
            f'({seconds:.0f}s) {bug.what}: {last}',
            flush=True)
        if not caught:
            missed.append(bug.key)
    print(f'{len(bugs) - len(missed)} of {len(bugs)} caught; missed: '
          f'{" ".join(missed) or "none"}')
    sys.exit(1 if missed else 0)


if __name__ == '__main__':
    main()
