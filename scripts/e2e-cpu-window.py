#!/usr/bin/env python3
"""Which threads had the CPUs between each request's last layer event and D done (the e2e paced
row): reads `perf sched timehist` output and the e2e stages file (-Dkvferry.e2e.stages-file, whose
first column is the event's System.nanoTime, CLOCK_MONOTONIC) of a run traced with
`perf sched record -k CLOCK_MONOTONIC`. Prints, per request inside the trace and on average, the
microseconds each thread ran inside the window, summed over CPUs.

usage: e2e-cpu-window.py TIMEHIST_TXT STAGES_CSV
"""
import collections
import re
import sys


def runs(timehist):
    out = []
    for line in open(timehist).read().splitlines()[3:]:
        p = line.split()
        if len(p) < 6:
            continue
        try:
            end, run = float(p[0]), float(p[-1])
        except ValueError:
            continue
        name = re.sub(r'\[\d+/\d+\]$|\[\d+\]$', '', ' '.join(p[2:-3]))
        tid = re.search(r'\[(\d+)', ' '.join(p[2:-3]))
        out.append((end - run / 1e3, end, '%s[%s]' % (name, tid.group(1) if tid else '?')))
    return out


def stage_blocks(path):
    """The stages file's blocks (a header line starts each): per block, one dict per request,
    column name to value, in the file's column order."""
    blocks, header = [], None
    for r in (l.split(',') for l in open(path).read().splitlines()):
        if r[0].startswith('last'):
            header = r
            blocks.append([])
        else:
            blocks[-1].append(dict(zip(header, r)))
    return blocks


def main():
    trace = runs(sys.argv[1])
    blocks = stage_blocks(sys.argv[2])
    lo, hi = trace[0][1], trace[-1][1]
    total, n, windows = collections.Counter(), 0, 0.0
    for d in blocks[-1]:  # the paced measurement is the file's last block
        t0 = int(d['last layer event ns']) / 1e9
        t1 = t0 + float(d['D done']) / 1e6
        if t0 < lo or t1 > hi:
            continue
        n += 1
        windows += (t1 - t0) * 1e6
        busy = collections.Counter()
        for start, end, name in trace:
            overlap = min(end, t1) - max(start, t0)
            if overlap > 0:
                busy[name] += overlap * 1e6
        total.update(busy)
        if n <= 3:
            print('request: D done %.0f us after the event; cma copy %s-%s us' % (
                float(d['D done']), d['cma copy started'], d['cma copy ended']))
            for k, v in busy.most_common(10):
                print('   %-34s %6.0f us' % (k, v))
    if n == 0:
        sys.exit('no request of the paced measurement inside the trace')
    print('%d requests inside the trace; window (event -> D done) %.0f us on average, %d CPUs '
          'give %.0f us; per request:' % (n, windows / n, 2, 2 * windows / n))
    for k, v in total.most_common(16):
        print('   %-34s %6.0f us' % (k, v / n))


if __name__ == '__main__':
    main()
