"""Cost of one stack capture (stacks.hpp): a process with torch's threads, 6 sleeping Python
threads and one spinning with the GIL; 30 dumps; the `capture_us` of each `stacks` line.
    OMP_NUM_THREADS=4 .venv/bin/python benchmarks/stack_capture.py /tmp/stack-bench"""
import json, os, statistics, sys, threading, time
import torch
import rankscope
rankscope.init(rank=0, world_size=1, run_dir=sys.argv[1])
torch.set_num_threads(4)
torch.mm(torch.ones(256, 256), torch.ones(256, 256))   # torch's intra-op threads exist
stop = False
def sleeper():
    while not stop: time.sleep(0.01)
def spinner():
    x = 0
    while not stop: x += 1                                # a Python thread busy with the GIL
ts = [threading.Thread(target=sleeper) for _ in range(6)] + [threading.Thread(target=spinner)]
for t in ts: t.start()
for i in range(30):
    rankscope.dump_flight_recorder("bench")
    time.sleep(0.05)
stop = True
for t in ts: t.join()
rankscope.shutdown()
caps = [json.loads(l) for l in open(os.path.join(sys.argv[1], "rank-0.jsonl")) if '"kind":"stacks"' in l]
us = sorted(c["capture_us"] for c in caps)
print(f"{len(us)} captures, {caps[0]['threads']} threads asked, answered {min(c['answered'] for c in caps)}..{max(c['answered'] for c in caps)}; "
      f"capture ms: min {us[0]/1e3:.2f} median {statistics.median(us)/1e3:.2f} p90 {us[int(len(us)*0.9)]/1e3:.2f} max {us[-1]/1e3:.2f}; python text {len(caps[0].get('python',''))} B")
