"""Multi-process harness of the context-parallel tests (docs/design/cp.md §9).

``run_ranks(world, case, *args)`` starts ``world`` processes with torch.multiprocessing's
forkserver context (see ``_context``); each joins a gloo process group over a
``file://`` store in a fresh temporary directory and calls ``case(rank, world, *args)``
(a module-level function, so it pickles by reference). Each returns what its case returned, in rank order, or
raises with every failing rank's traceback. Every process is ended before it returns:
joined within the deadline, terminated (then killed) after it, so a deadlocked
collective fails the test instead of hanging it.
"""

import datetime
import os
import queue
import tempfile
import time
import traceback

import torch
import torch.multiprocessing as mp

# The group's own timeout: bounds rendezvous and any collective that a case does
# not bound itself (the cp.Comm timeouts in the cases are shorter).
GROUP_TIMEOUT_S = 30.0


def _entry(rank, world, init_file, results, case, args, deadline_s):
    import faulthandler

    import torch.distributed as dist

    # A rank still running near the deadline prints where it is stuck.
    faulthandler.dump_traceback_later(max(1.0, deadline_s - 5.0), exit=False)
    try:
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
        # init_process_group returns on a rank once its own connections are made,
        # while a peer may still be completing gloo's full-mesh connect. A case that
        # issues no collective (the profiling-run cases) would let this rank
        # os._exit below and fail the peer's connect ("Connection closed by peer").
        # One barrier here: every rank leaves it with the whole mesh up.
        dist.barrier()
        value = case(rank, world, *args)
        results.put((rank, True, value))
    except BaseException:  # noqa: BLE001  (report everything, including assertion failures)
        results.put((rank, False, traceback.format_exc()))
    # Flush the result to the pipe (put() hands it to a feeder thread) before
    # leaving. No destroy_process_group: a case may leave its peers dead (the
    # failure tests); os._exit skips gloo's teardown, which would wait for them.
    results.close()
    results.join_thread()
    os._exit(0)


def _context(preload=()):
    # forkserver: a clean single-threaded server process (no OpenMP pool, no
    # gloo state: what makes plain fork unsafe after torch has run) that has
    # imported torch and the runtime once; each rank forks from it, so a test
    # does not pay the imports per rank (2-core machine: ~20 s -> ~1 s per
    # 4-rank test). The server keeps the stdout/stderr it started with (under
    # pytest: the first test's capture), so failures travel back through the
    # result queue, never through the ranks' output. spawn where forkserver is
    # missing.
    try:
        ctx = mp.get_context("forkserver")
    except ValueError:
        return mp.get_context("spawn")
    # `preload`: more modules for the server to import once (the vLLM adapter tests: vLLM's own
    # modules, ~8 s of CPU per import). Only the call that starts the server sets the list; a
    # server already running keeps its own, and the ranks then import what they miss themselves.
    ctx.set_forkserver_preload(["torch", "torch.distributed", "ascend_attn_rt", "pytest", *preload])
    return ctx


def run_ranks(world, case, *args, deadline_s=90.0, expect_dead=(), preload=()):
    """Runs case on `world` ranks; returns [value of rank 0, ...]. Ranks listed in
    `expect_dead` may end without reporting (a case that kills a rank on purpose); `preload`
    names modules the forkserver imports when this call starts it (see _context)."""
    ctx = _context(preload)
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="aar_cp_") as tmp:
        init_file = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_entry, args=(r, world, init_file, results, case, args, deadline_s), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        got = {}
        end = time.monotonic() + deadline_s
        try:
            while len(got) < world:
                left = end - time.monotonic()
                if left <= 0:
                    break
                try:
                    rank, ok, value = results.get(timeout=min(left, 0.5))
                    got[rank] = (ok, value)
                except queue.Empty:
                    if all(not p.is_alive() for p in procs) and results.empty():
                        break
        finally:
            for p in procs:
                p.join(timeout=max(0.0, min(5.0, end - time.monotonic())))
            for p in procs:
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
            results.close()
            results.join_thread()
    errors = [f"rank {r}:\n{v}" for r, (ok, v) in sorted(got.items()) if not ok]
    missing = [r for r in range(world) if r not in got and r not in expect_dead]
    if missing:
        errors.append(f"ranks {missing} did not report within {deadline_s} s (deadlock or crash)")
    if errors:
        raise AssertionError("\n".join(errors))
    return [got[r][1] if r in got else None for r in range(world)]


# The DCP placement of docs/design/cp.md §2.1 / §2.2, written once for the tests (independent of the
# runtime's plan code): the owner of global position x, its index in the owner's local sequence, and
# how many of a sequence's first n positions rank k holds.
def owner(x, W, I):
    return (x // I) % W


def local_index(x, W, I):
    return (x // (W * I)) * I + x % I


def local_len(n, W, I, k):
    base = (n // I // W) * I
    rem = n - base * W
    return base + min(max(rem - k * I, 0), I)


def cp_tol(dtype):
    """The multi-process tests' tolerance against the float64 references."""
    return dict(atol=2e-4, rtol=2e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)


def pcp_dcp_groups(rank, wp, wd):
    """The PCP and DCP groups of a PCP x DCP layout (docs/design/cp.md §9): KV rank r = rp * wd + rd;
    every rank creates every group in the same order (new_group is collective). Returns
    (pcp_group, dcp_group) of `rank`."""
    import torch.distributed as dist

    dcp = pcp = None
    for rp in range(wp):
        ranks = [rp * wd + rd for rd in range(wd)]
        g = dist.new_group(ranks)
        if rank in ranks:
            dcp = g
    for rd in range(wd):
        ranks = [rp * wd + rd for rp in range(wp)]
        g = dist.new_group(ranks)
        if rank in ranks:
            pcp = g
    return pcp, dcp


def random_block_table(per_req, g):
    """A block table (len(per_req), max(per_req)) int32 whose request r holds per_req[r] distinct blocks drawn by
    `g` from a pool of sum(per_req) + 2 blocks (the rest of its row 0). Returns (table, pool size)."""
    nb = sum(per_req) + 2
    perm = torch.randperm(nb, generator=g).tolist()
    table = torch.zeros(len(per_req), max(per_req), dtype=torch.int32)
    k = 0
    for r, n in enumerate(per_req):
        table[r, :n] = torch.tensor(perm[k:k + n], dtype=torch.int32)
        k += n
    return table, nb
