#!/usr/bin/python3
"""How much of rankscope's background thread's running time a training thread
spent waiting for the same core: the part of its CPU cost that can delay
training. Reads `perf script -F comm,pid,tid,cpu,time,event,trace` of the
tracepoints sched_switch, sched_waking, sched_wakeup_new and sched_migrate_task
(benchmarks/sched_overhead.sh records them) on standard input.

    sched_cost.py --from T0 --to T1 --steps N --ranks R < script.txt

A thread named "rankscope" is a background thread; every other thread of a
process that has one is a training thread (main, loader, gloo, ...). A
training thread waits from its wake-up (or from being preempted) until it runs;
it waits on the core whose run queue holds it (migrations followed). Only the
window [T0, T1] (CLOCK_MONOTONIC seconds) counts, so start-up and shutdown do
not."""
import argparse
import re
import sys

HEAD = re.compile(r'^\s*(\S.*?)\s+(-?\d+)/(-?\d+)\s+\[(\d+)\]\s+([\d.]+):\s+sched:(\w+):\s+(.*)$')
SWITCH = re.compile(r'prev_comm=(.*?) prev_pid=(\d+) prev_prio=\d+ prev_state=(\S+) ==> '
                    r'next_comm=(.*?) next_pid=(\d+) next_prio=\d+')
WAKE = re.compile(r'comm=(.*?) pid=(\d+) prio=\d+ target_cpu=(\d+)')
MIGRATE = re.compile(r'comm=(.*?) pid=(\d+) prio=\d+ orig_cpu=(\d+) dest_cpu=(\d+)')


def read(lines):
    events, process_of, name = [], {}, {}
    for line in lines:
        m = HEAD.match(line)
        if not m:
            continue
        _, pid, tid, cpu, t, kind, rest = m.groups()
        pid, tid, cpu, t = int(pid), int(tid), int(cpu), float(t)
        if tid > 0:
            process_of[tid] = pid  # a switch event runs in the context of the thread leaving
        if kind == 'sched_switch':
            s = SWITCH.match(rest)
            if s:
                prev, nxt = int(s.group(2)), int(s.group(5))
                name[prev], name[nxt] = s.group(1), s.group(4)
                events.append((t, 'switch', cpu, prev, s.group(3), nxt))
        elif kind in ('sched_waking', 'sched_wakeup_new'):
            s = WAKE.match(rest)
            if s:
                events.append((t, 'wake', int(s.group(3)), int(s.group(2))))
        elif kind == 'sched_migrate_task':
            s = MIGRATE.match(rest)
            if s:
                events.append((t, 'migrate', int(s.group(4)), int(s.group(2))))
    return events, process_of, name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--from', dest='t0', type=float, default=0.0)
    ap.add_argument('--to', dest='t1', type=float, default=float('inf'))
    ap.add_argument('--steps', type=int, default=0, help='steps in the window (per rank)')
    ap.add_argument('--ranks', type=int, default=1)
    a = ap.parse_args()
    events, process_of, name = read(sys.stdin)
    background = {t for t, n in name.items() if n == 'rankscope'}
    processes = {process_of[t] for t in background if t in process_of}
    if not any(e[1] == 'switch' for e in events) or not processes:
        # e.g. perf printed the events through its libtraceevent plugins, in another format
        sys.exit('sched_cost.py: no sched_switch events in the expected format, or no thread named "rankscope"')

    def training(t):
        return t not in background and process_of.get(t) in processes

    running = {}   # core -> thread on it
    waiting = {}   # training thread -> core whose run queue holds it
    last = None
    ran = contended = 0.0
    for e in events:
        t = e[0]
        if last is not None and a.t0 <= last and t <= a.t1:
            dt = t - last
            for core, thread in running.items():
                if thread in background:
                    ran += dt
                    if core in waiting.values():
                        contended += dt
        last = t
        if e[1] == 'switch':
            _, _, core, prev, state, nxt = e
            waiting.pop(prev, None)
            if training(prev) and state.startswith('R'):  # preempted: still runnable
                waiting[prev] = core
            waiting.pop(nxt, None)
            running[core] = nxt
        elif e[1] == 'wake':
            if training(e[3]) and e[3] not in running.values():
                waiting[e[3]] = e[2]
        elif e[3] in waiting:
            waiting[e[3]] = e[2]
    per = 1e6 / max(a.steps * a.ranks, 1)
    print(f'sched: {len(processes)} processes, {len(background)} background threads, '
          f'window {min(a.t1, last or 0) - a.t0:.1f} s, {a.steps} steps per rank')
    print(f'sched: background threads ran {ran * 1e3:.3f} ms = {ran * per:.3f} us per rank per step')
    share = 100 * contended / ran if ran else 0.0
    print(f'sched: ... while a training thread waited for the same core: {contended * 1e3:.3f} ms = '
          f'{contended * per:.3f} us per rank per step ({share:.0f} % of it)')


if __name__ == '__main__':
    main()
