"""The host's state while a run and each of its points ran: was the machine quiet enough for
its numbers to be judged?

Read from Linux's own counters, cheaply, around each point:

* run-queue wait: /proc/self/schedstat's second field, the nanoseconds this rank's thread was
  ready to run but kept off a CPU. Over the point's own interval, as a share of its wall time,
  it says directly how much of the point the rank spent waiting for a core that another
  process (or another rank, when there are more ranks than cores) held. Exact to the
  nanosecond, so a 20 ms point is judged as well as a 2 s one.
* CPU steal and iowait: /proc/stat, the whole host's ticks (USER_HZ, 10 ms) over the point.
  Steal is time a hypervisor gave this VM's CPUs to another guest. Ticks are coarse: a share
  counts only from MIN_TICKS ticks of it.
* load average (1 minute) per core at the point's end, and PSI (/proc/pressure/cpu "some":
  the share of time some task waited for a CPU) where the kernel has it, for the record.

A point is *disturbed* when, on its worst rank or host, the run-queue wait exceeds
WAIT_PCT % of its time or steal exceeds STEAL_PCT %; the row then says so in its warning
and verdicts do not rest on it. More ranks than cores on a host (ranks_per_core > 1) is
*oversubscribed*: said at the start, a field on every row, and never judged for scaling,
overlap or latency.
"""
from __future__ import annotations

import os
import time

import numpy as np

# Thresholds of a disturbed point (docs/verdicts.md).
WAIT_PCT = 10.0  # a rank waited for a CPU more than this share of the point's wall time
STEAL_PCT = 10.0  # the hypervisor took more than this share of the host's CPU time
MIN_TICKS = 2  # fewer /proc/stat ticks of steal than this are below its resolution
# What the rows and meta carry.
ROW_FIELDS = ("host_wait_pct", "host_steal_pct", "host_iowait_pct", "host_load_per_core", "ranks_per_core",
              "oversubscribed", "disturbed")


def cores() -> int:
    """CPUs of this host that the job may use: the machine's, fewer under a cgroup CPU quota.
    Not this process's affinity mask: a launcher that binds each rank to a core (Open MPI
    does) would make every host look like one core."""
    n = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return n


def cpu_ticks() -> tuple[int, ...] | None:
    """/proc/stat's cpu line: user nice system idle iowait irq softirq steal (ticks), or None
    off Linux."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()
    except OSError:
        return None
    if not parts or parts[0] != "cpu":
        return None
    v = [int(x) for x in parts[1:9]]
    return tuple(v + [0] * (8 - len(v)))


def wait_ns() -> int | None:
    """Nanoseconds this thread has waited on a run queue, or None where the kernel does not
    say."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None


def psi_some_total_us() -> int | None:
    try:
        with open("/proc/pressure/cpu") as f:
            for line in f:
                if line.startswith("some"):
                    return int(line.rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return None
    return None


def tick_shares(before, after) -> dict:
    """steal and iowait shares (per cent) of the host's CPU time between two cpu_ticks(),
    with the tick counts they rest on."""
    if before is None or after is None:
        return {"steal_pct": float("nan"), "iowait_pct": float("nan"), "steal_ticks": 0, "ticks": 0}
    d = [b - a for a, b in zip(before, after)]
    total = sum(d)
    if total <= 0:
        return {"steal_pct": 0.0, "iowait_pct": 0.0, "steal_ticks": 0, "ticks": 0}
    return {"steal_pct": 100.0 * d[7] / total, "iowait_pct": 100.0 * d[4] / total, "steal_ticks": d[7],
            "ticks": total}


def is_disturbed(wait_pct: float, steal_pct: float, steal_ticks: int) -> str:
    """'' for a quiet point, else why it was disturbed (the thresholds named)."""
    why = []
    if wait_pct > WAIT_PCT:
        why.append(f"a rank waited for a CPU {wait_pct:.0f} % of the point's time (> {WAIT_PCT:g} %: another "
                   f"process, or more ranks than cores, held its core)")
    if steal_ticks >= MIN_TICKS and steal_pct > STEAL_PCT:
        why.append(f"CPU steal {steal_pct:.0f} % (> {STEAL_PCT:g} %: the hypervisor ran another guest)")
    return "; ".join(why)


def ranks_per_core(hosts: list[str], cores_of_rank: list[int]) -> dict[str, float]:
    """host -> ranks on it / its cores, for the ranks listed (the world's, in rank order)."""
    out: dict[str, float] = {}
    for h in dict.fromkeys(hosts):
        mine = [i for i, x in enumerate(hosts) if x == h]
        out[h] = len(mine) / max(1, min(cores_of_rank[i] for i in mine))
    return out


def oversubscription_line(rpc: dict[str, float], hosts: list[str], cores_of_rank: list[int]) -> str:
    """The warning said at the start of an oversubscribed run ('' when no host is)."""
    over = [h for h, x in rpc.items() if x > 1.0]
    if not over:
        return ""
    parts = ", ".join(f"{hosts.count(h)} ranks on {cores_of_rank[hosts.index(h)]} cores of {h}" for h in over)
    return (f"oversubscribed: {parts}: ranks take turns on a core, so times measure the scheduler as much as the "
            f"collective; scaling, overlap and latency verdicts on these rows cannot be judged "
            f"(fewer ranks: --np {max(2, min(cores_of_rank))})")


def gpu_state(device: str) -> dict:
    """Clocks and throttle reasons of GPU 0 where NVML (pynvml) is there to ask; otherwise why not."""
    if device != "cuda":
        return {"skipped": "CPU ranks: no GPU clocks to record"}
    try:
        import pynvml
    except ImportError:
        return {"skipped": "pynvml (nvidia-ml-py) not installed: clocks and throttle reasons not recorded"}
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        out = {"sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
               "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
               "throttle_reasons": int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
               "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)}
        pynvml.nvmlShutdown()
        return out
    except Exception as e:  # noqa: BLE001 - a record, never a reason to fail a run
        return {"skipped": f"NVML: {e}"}


def snapshot() -> dict:
    """The host now, for meta.json: load averages, cores, the CPU counters."""
    try:
        load = list(os.getloadavg())
    except OSError:
        load = []
    return {"load_avg": load, "cores": cores(), "cpu_ticks": cpu_ticks(), "psi_some_total_us": psi_some_total_us(),
            "at": time.time()}


def over_run(start: dict, end: dict) -> dict:
    """The run's interval between two snapshots: steal, iowait and CPU pressure (per cent)."""
    out = {"load_avg_start": start.get("load_avg"), "load_avg_end": end.get("load_avg"), "cores": start.get("cores")}
    out.update({k: v for k, v in tick_shares(start.get("cpu_ticks"), end.get("cpu_ticks")).items()
                if k.endswith("_pct")})
    a, b = start.get("psi_some_total_us"), end.get("psi_some_total_us")
    wall = end.get("at", 0) - start.get("at", 0)
    if a is not None and b is not None and wall > 0:
        out["cpu_pressure_pct"] = min(100.0, 100.0 * (b - a) / 1e6 / wall)
    return out


class PointWatch:
    """Around one point on every rank of its communicator: start() before the point's work,
    finish() after (a collective: every rank of the communicator calls it)."""

    def start(self) -> None:
        self.ticks, self.wait, self.wall = cpu_ticks(), wait_ns(), time.monotonic()

    def finish(self, comm, rpc: float) -> dict:
        wall = max(time.monotonic() - self.wall, 1e-9)
        w1 = wait_ns()
        wait_pct = 100.0 * (w1 - self.wait) / 1e9 / wall if w1 is not None and self.wait is not None else 0.0
        sh = tick_shares(self.ticks, cpu_ticks())
        try:
            load = os.getloadavg()[0] / cores()
        except OSError:
            load = float("nan")
        # The worst rank (and so the worst host) decides.
        mine = np.nan_to_num(np.array([wait_pct, sh["steal_pct"], sh["iowait_pct"], load, float(sh["steal_ticks"])]),
                             nan=0.0)
        worst = comm.max_over_ranks(mine)
        why = is_disturbed(float(worst[0]), float(worst[1]), int(worst[4]))
        return {"host_wait_pct": float(worst[0]), "host_steal_pct": float(worst[1]),
                "host_iowait_pct": float(worst[2]), "host_load_per_core": float(worst[3]),
                "ranks_per_core": float(rpc), "oversubscribed": bool(rpc > 1.0), "disturbed": bool(why),
                "_disturbed_why": why}


def host_line(meta: dict) -> str:
    """The host's state over a run, in one line for the report's run line."""
    hs = meta.get("host_state")
    if not isinstance(hs, dict):
        return "host state not recorded"
    rpc = hs.get("ranks_per_core") or {}
    cores_ = hs.get("cores") or {}
    parts = [", ".join(f"{h}: {cores_.get(h, '?')} cores, {x:g} ranks/core" for h, x in rpc.items())]
    if hs.get("oversubscribed"):
        parts[0] += " (OVERSUBSCRIBED)"
    run = hs.get("run") or {}
    load = run.get("load_avg_start") or (hs.get("start") or {}).get("load_avg")
    if load:
        parts.append(f"load {load[0]:.1f} at start" + (f", {run['load_avg_end'][0]:.1f} at end"
                                                        if run.get("load_avg_end") else ""))
    for k, name in (("steal_pct", "steal"), ("iowait_pct", "iowait"), ("cpu_pressure_pct", "CPU pressure")):
        v = run.get(k)
        if isinstance(v, (int, float)) and v == v:
            parts.append(f"{name} {v:.1f} %")
    if "disturbed_points" in hs:
        th = hs.get("thresholds") or {}
        parts.append(f"{hs['disturbed_points']} point(s) disturbed (run-queue wait > {th.get('wait_pct', WAIT_PCT):g} % "
                     f"or steal > {th.get('steal_pct', STEAL_PCT):g} %)")
    return "host: " + "; ".join(p for p in parts if p)
