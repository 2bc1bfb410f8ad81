"""Peak resident memory a kernel request adds, measured in a fresh process (tracemalloc cannot see torch).

    python tests/compute/memory_probe.py KERNEL REQUEST_JSON [WARM_UP_JSON]

Runs a small warm-up request first (loading models and initialising PyTorch's kernels), resets the
process's peak resident set (Linux: /proc/self/clear_refs), runs the request and prints, as JSON, the
peak resident bytes above the level before it and the estimate kernel_specs makes from its parameters.
Run it with MALLOC_MMAP_THRESHOLD_=65536 so freed tensors go back to the system and do not hide a peak.
"""
import json
import sys

from kvx.compute.kernel_specs import KERNELS


def status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def main() -> None:
    k = KERNELS[sys.argv[1]]
    warm = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    k.run(k.request(**warm), lambda *a: None)
    base = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                                  # the peak (VmHWM) restarts from the current RSS
    request = k.request(**json.loads(sys.argv[2]))
    k.run(request, lambda *a: None)
    estimate = k.memory(request)
    print(json.dumps({"measured": status("VmHWM") - base, "host": estimate["host"], "device": estimate["device"]}))


if __name__ == "__main__":
    main()
