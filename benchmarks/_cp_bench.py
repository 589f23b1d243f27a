"""Helpers shared by the context-parallel decode host-time benchmarks (bench_sfa_dcp.py, bench_dsa_cp.py): the
timing loop with the collectives counted and their wall time subtracted, the 2-process gloo run and the in-process
fake group.

Timing: one step is a build (a callable returning the step's metadata) and one or more layer forwards (callables
taking that metadata); each is timed with time.perf_counter_ns, the garbage collector off, after `warmup` untimed
steps; figures are medians in microseconds. measure_interleaved runs several cases (the modes and the single rank of
one batch size) in turns of 25 steps, so the ratios between them are taken over the same stretch of machine time:
bench_dsa_cp.py uses it (its sequential runs gave ratios from 1.0x to 2.1x for one tree on this shared machine);
bench_sfa_dcp.py and bench_mla_cp.py time each case in one stretch (their run-to-run spread is a few hundredths), as
their README figures always were (in turns their CP modes read about 0.05-0.1x higher at 32 decodes, and MLA's
lower: the turns' cache and predictor state differs from a mode running alone, as it does in an engine). A forward's collectives (cp.Comm.collective_ns: the wall time spent
inside the Comm's collectives) are subtracted from it and counted per layer-step by kind.
"""

import argparse
import datetime
import json
import gc
import os
import queue
import statistics
import tempfile
import time
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp

KINDS = ("all_gather", "all_to_all_single", "all_reduce")


def median_us(xs):
    return round(statistics.median(xs) / 1e3, 2)


def _counters(comm):
    return tuple(comm.calls_of(k) for k in KINDS) + (comm.calls, comm.collective_ns)


class _Timer:
    """One case's timing state: its steps' build, forward and collective times (see measure)."""

    def __init__(self, build, forwards, comm):
        self.build, self.forwards, self.comm = build, forwards, comm
        self.build_ns, self.fwd_ns, self.coll_ns = [], [], []
        self.per = {name: {"ns": [], "coll_ns": [], "counts": [0] * (len(KINDS) + 1)} for name, _ in forwards}
        self.steps = 0

    def step(self, keep):
        """One step (a build and every forward); recorded when keep (False: a warm-up step)."""
        comm = self.comm
        t0 = time.perf_counter_ns()
        md = self.build()
        t1 = time.perf_counter_ns()
        step_fwd = step_coll = 0
        for name, fn in self.forwards:
            c0 = _counters(comm) if comm is not None else None
            a = time.perf_counter_ns()
            fn(md)
            b = time.perf_counter_ns()
            coll = 0
            if comm is not None:
                c1 = _counters(comm)
                coll = c1[-1] - c0[-1]
                if keep:
                    for i in range(len(KINDS) + 1):
                        self.per[name]["counts"][i] += c1[i] - c0[i]
            if keep:
                self.per[name]["ns"].append(b - a - coll)
                self.per[name]["coll_ns"].append(coll)
            step_fwd += b - a - coll
            step_coll += coll
        if keep:
            self.build_ns.append(t1 - t0)
            self.fwd_ns.append(step_fwd)
            self.coll_ns.append(step_coll)
            self.steps += 1

    def row(self):
        iters, comm, forwards = self.steps, self.comm, self.forwards

        def counts(c):
            out = {f"{k}_per_layer_step": c[i] / iters for i, k in enumerate(KINDS)}
            out["collectives_per_layer_step"] = c[len(KINDS)] / iters
            return out

        row = {"build_us": median_us(self.build_ns), "forward_us": median_us(self.fwd_ns)}
        row["step_us"] = round(row["build_us"] + row["forward_us"], 2)
        if comm is not None:
            row["collectives_us_excluded"] = median_us(self.coll_ns)
            if len(forwards) == 1:
                row.update(counts(self.per[forwards[0][0]]["counts"]))
        if len(forwards) > 1:
            row["layers"] = {}
            for name, _ in forwards:
                p = self.per[name]
                lr = {"forward_us": median_us(p["ns"])}
                if comm is not None:
                    lr["collectives_us_excluded"] = median_us(p["coll_ns"])
                    lr.update(counts(p["counts"]))
                row["layers"][name] = lr
        return row


def measure(build, forwards, iters, warmup, comm=None):
    """Medians over `iters` steps of build() and of each forward fn(md) of `forwards` ([(name, fn)]).

    Returns {"build_us", "forward_us" (all forwards of a step), "step_us"} and, with a comm, the collectives'
    median wall time ("collectives_us_excluded") and per layer-step counts; with more than one forward, the same
    per layer under "layers" (name -> {"forward_us", counts})."""
    return measure_interleaved({"case": (build, forwards, comm)}, iters, warmup)["case"]


def measure_interleaved(cases, iters, warmup, block=25):
    """measure() of several cases ({key: (build, forwards, comm)}) whose steps run in turns of `block` steps per
    case (each case's `warmup` steps first), so that a change of machine speed during the run (a shared machine's
    load, its clock) falls on every case alike and the ratios between them stay comparable; a turn is long
    enough for a case's working set to be warm again after its first step. Returns {key: row}."""
    timers = {k: _Timer(*c) for k, c in cases.items()}
    gc.collect()
    gc.disable()
    try:
        for t in timers.values():
            for _ in range(warmup):
                t.step(False)
        done = 0
        while done < iters:
            n = min(block, iters - done)
            for t in timers.values():
                t.step(False)  # the turn's first step rewarms the case's caches
                for _ in range(n):
                    t.step(True)
            done += n
    finally:
        gc.enable()
    return {k: t.row() for k, t in timers.items()}


def ratio(a, b):
    return round(a / b, 2) if b else None


def init_fake_group(world):
    """This process as rank 0 of torch's in-process fake group of `world` ranks (every collective returns at once,
    no data moves)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


def _worker(bench, rank, world, init_file, iters, results):
    try:
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        results.put((rank, True, bench(rank, iters)))
    except BaseException:  # noqa: BLE001  (the parent reports it)
        results.put((rank, False, traceback.format_exc()))
    # Flush the queue's feeder thread, then leave without gloo's teardown (which waits for the peer).
    results.close()
    results.join_thread()
    os._exit(0)


def run_gloo(bench, world, iters, deadline_s=300.0, prefix="aar_bench_cp_"):
    """bench(rank, iters) on `world` spawned processes over gloo on a file store; {rank: its result}. `bench` must be
    a module-level function (pickled by reference). Every process ends (terminated, then killed, if still alive);
    a rank's exception or silence past deadline_s ends the run with every rank's error."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    got = {}
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        init = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_worker, args=(bench, r, world, init, iters, results), daemon=True)
                 for r in range(world)]
        for pr in procs:
            pr.start()
        end = time.monotonic() + deadline_s
        try:
            while len(got) < world and time.monotonic() < end:
                try:
                    rank, ok, value = results.get(timeout=0.5)
                    got[rank] = (ok, value)
                except queue.Empty:
                    if all(not pr.is_alive() for pr in procs) and results.empty():
                        break
        finally:
            for pr in procs:
                pr.join(timeout=10)
            for pr in procs:
                if pr.is_alive():
                    pr.terminate()
                    pr.join(timeout=5)
                if pr.is_alive():
                    pr.kill()
                    pr.join(timeout=5)
            results.close()
            results.join_thread()
    errors = [f"rank {r}:\n{v}" for r, (ok, v) in sorted(got.items()) if not ok]
    errors += [f"rank {r} did not report within {deadline_s:.0f} s" for r in range(world) if r not in got]
    if errors:
        raise SystemExit("\n".join(errors))
    return {r: got[r][1] for r in range(world)}


def collectives_text(d):
    return (f"{d['all_gather_per_layer_step']:.0f} all_gather + {d['all_to_all_single_per_layer_step']:.0f}"
            f" all_to_all + {d['all_reduce_per_layer_step']:.0f} all_reduce / layer-step,"
            f" {d['collectives_us_excluded']:.1f} us excluded")


def parse_and_run(description, bench, world, prefix):
    """The command line both CP benchmarks take (--iters, --out, --fake-group) and their run: rank 0 of the fake
    group in this process, or `world` gloo processes. Returns (args, {rank: bench's result}, the group's text)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--iters", type=int, default=50, help="timed steps per case (medians), after 5 warm-up steps")
    p.add_argument("--out", default=None, help="write the JSON report here")
    p.add_argument("--fake-group", action="store_true",
                   help=f"rank 0 of an in-process fake {world}-rank group (collectives free): the host work alone")
    args = p.parse_args()
    if args.iters < 1:
        p.error("--iters must be >= 1")
    if args.fake_group:
        init_fake_group(world)
        got = {0: bench(0, args.iters)}
    else:
        got = run_gloo(bench, world, args.iters, prefix=prefix)
    group = "fake (in-process, collectives free)" if args.fake_group else f"gloo, {world} local processes"
    return args, got, group


def write_report(path, report):
    """The report as indented JSON at `path` (its directory made), when a path is given."""
    if not path:
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(json.dumps(report, indent=2) + "\n")
