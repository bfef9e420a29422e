#!/usr/bin/env python3
"""Who ran on which CPU between each request's last layer event and D done (the e2e paced row),
slice by slice: reads `perf sched timehist` output and the e2e stages file, as
scripts/e2e-cpu-window.py does, but prints each scheduler slice in the window (start and end in
microseconds after the event, the CPU, the thread) next to the request's stages. Shows where a
thread waited for a CPU while another CPU was idle.

usage: e2e-timeline.py TIMEHIST_TXT STAGES_CSV [REQUESTS]
"""
import importlib.util
import os
import sys


def load_window_module():
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location('cpu_window', os.path.join(here, 'e2e-cpu-window.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WINDOW = load_window_module()


def slices_with_cpu(timehist):
    """(start s, end s, cpu, thread) per slice; the cpu column is the second field."""
    out = []
    cpu_of = {}
    for line in open(timehist).read().splitlines()[3:]:
        p = line.split()
        if len(p) >= 6:
            try:
                cpu_of[float(p[0])] = p[1]
            except ValueError:
                pass
    for start, end, name in WINDOW.runs(timehist):
        out.append((start, end, cpu_of.get(end, '?'), name))
    return out


def main():
    trace = slices_with_cpu(sys.argv[1])
    by_cpu = sorted(trace, key=lambda s: (s[2], s[0]))  # each request's slices, CPU by CPU
    limit = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    blocks = WINDOW.stage_blocks(sys.argv[2])
    lo, hi = trace[0][1], trace[-1][1]
    shown = 0
    for req in blocks[-1]:  # the paced block
        names = list(req)
        t0 = int(req[names[0]]) / 1e9
        done = float(req['D done'])
        if not lo < t0 < hi - 0.01 or done != done:
            continue
        shown += 1
        if shown > limit:
            break
        stages = ', '.join('%s %s' % (k, req[k]) for k in names[1:] if req[k] != 'NaN')
        print('request %d, stages (us after the event): %s' % (shown, stages))
        for start, end, cpu, name in by_cpu:
            if end > t0 and start < t0 + (done + 50) / 1e6:
                print('  %8.0f -> %8.0f us  %s %s' % (max(start - t0, 0) * 1e6, (end - t0) * 1e6, cpu, name))


if __name__ == '__main__':
    main()
