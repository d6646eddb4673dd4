"""Shared by the Python benchmarks: the table of median step times against a baseline arm."""
import statistics


def print_medians(times, base, width=48):
    """times: arm -> [seconds per step, one per round]; prints µs per step and the difference to `base`."""
    ref = statistics.median(times[base])
    print(f"{'variant':{width}} {'us/step':>8} {'vs plain':>9}")
    for name, v in times.items():
        med = statistics.median(v)
        print(f"{name:{width}} {med * 1e6:8.1f} {(med - ref) * 1e6:+9.1f}")
