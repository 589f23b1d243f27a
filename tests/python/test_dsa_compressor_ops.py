"""The DeepSeek-V4 (DSA) compressor operators of vllm-ascend (issue 12) through the dispatcher: the CPU twins
(``torch.ops.ascend_cpu_va``) of ``compressor``, ``compressor_metadata`` / ``compressor_metadata_out``,
``kv_compress_epilog`` and ``indexer_compress_epilog_v2`` against float64 / brute-force references written here
from docs/design/dsa.md §1.2, §1.4, §2.2, §4.1 and docs/design/ops.md §4.6, and the no-compute kernels (``ascend_noop_va``) for shapes.

The compressor is driven like a serving engine drives it: several requests, each a fixed stream of hidden
states, processed in steps (one prefill step, or a prefill chunked over many steps, then decode steps), with the
paged fp32 state cache carried between steps; every emitted row is compared with the float64 reference of its
group, and a chunked prefill must give the very rows of a one-step prefill."""

import math

import pytest
import torch

import ascend_attn_rt  # noqa: F401  (registers the namespaces)

CPU = torch.ops.ascend_cpu_va
NOOP = torch.ops.ascend_noop_va


@pytest.fixture(autouse=True)
def _inference():
    with torch.inference_mode():
        yield


def i32(v):
    return torch.tensor(v, dtype=torch.int32)


# ------------------------------------------------------------------------------------------- references


def rope_tables(max_pos, rd, base=10000.0):
    """Repeat-interleaved cos/sin tables (max_pos, rd) fp32, as DSV4 builds them (docs/design/sparse.md §2)."""
    inv = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().repeat_interleave(2, 1).float(), ang.sin().repeat_interleave(2, 1).float()


class Weights:
    def __init__(self, g, h, d, r, coff, dtype):
        self.h, self.d, self.r, self.coff, self.dtype = h, d, r, coff, dtype
        self.wkv = (torch.randn(coff * d, h, generator=g) / math.sqrt(h)).to(dtype)
        self.wgate = (torch.randn(coff * d, h, generator=g) / math.sqrt(h)).to(dtype)
        self.ape = torch.randn(r, coff * d, generator=g) * 0.5
        self.nw = (1.0 + 0.1 * torch.randn(d, generator=g)).float()


def ref_rows(w, xs, c_lo, c_hi, cos, sin, rd, eps):
    """Float64 rows c in [c_lo, c_hi) of one request whose raw hidden states are xs (S, H) (docs/design/dsa.md §1.2)."""
    d, r, coff = w.d, w.r, w.coff
    x = xs.double()
    kv = x @ w.wkv.double().T
    pos = torch.arange(xs.shape[0])
    sc = x @ w.wgate.double().T + w.ape.double()[pos % r]
    out = []
    for c in range(c_lo, c_hi):
        cur = slice(c * r, (c + 1) * r)
        if coff == 1:
            kvs, scs = kv[cur, :d], sc[cur, :d]
        else:
            if c == 0:
                pk = torch.zeros(r, d, dtype=torch.float64)
                ps = torch.full((r, d), -math.inf, dtype=torch.float64)
            else:
                prev = slice((c - 1) * r, c * r)
                pk, ps = kv[prev, :d], sc[prev, :d]
            kvs = torch.cat([pk, kv[cur, d:2 * d]])
            scs = torch.cat([ps, sc[cur, d:2 * d]])
        a = torch.softmax(scs, 0)
        y = (a * kvs).sum(0)
        y = y / torch.sqrt((y * y).mean() + eps) * w.nw.double()
        cs, sn = cos[c * r].double(), sin[c * r].double()
        z = y.clone()
        for i in range(d - rd, d, 2):
            j = i - (d - rd)
            x0, x1 = y[i], y[i + 1]
            z[i] = x0 * cs[j] - x1 * sn[j]
            z[i + 1] = x1 * cs[j + 1] + x0 * sn[j + 1]
        out.append(z)
    return torch.stack(out) if out else torch.zeros(0, d, dtype=torch.float64)


# ------------------------------------------------------------------------------------------- a serving loop


class Engine:
    """Requests with fixed hidden-state streams, a paged state cache and per-step compressor calls."""

    def __init__(self, g, w, lens, sbs, rd=8, eps=1e-6, rope_mode="direct"):
        self.g, self.w, self.lens, self.sbs, self.rd, self.eps = g, w, lens, sbs, rd, eps
        self.xs = [torch.randn(n, w.h, generator=g).to(w.dtype) for n in lens]
        cols = max(-(-n // sbs) for n in lens) + 1
        nb = cols * len(lens) + 3
        perm = torch.randperm(nb, generator=g)
        self.table = perm[: len(lens) * cols].view(len(lens), cols).to(torch.int32).contiguous()
        self.state = torch.full((nb, sbs, 2 * w.coff * w.d), float("nan"))  # garbage: never read before written
        self.done = [0] * len(lens)
        self.cos, self.sin = rope_tables(max(lens) + 1, rd)
        self.rope_mode = rope_mode

    def step(self, chunk):
        """Process chunk[b] more tokens of request b; returns (output, expected rows per request)."""
        w = self.w
        xs, cu, start, rope_rows = [], [0], [], []
        for b, q in enumerate(chunk):
            s = self.done[b]
            xs.append(self.xs[b][s:s + q])
            cu.append(cu[-1] + q)
            start.append(s)
            rope_rows += [c * w.r for c in range(s // w.r, (s + q) // w.r)]
        x = torch.cat(xs) if xs else torch.zeros(0, w.h, dtype=w.dtype)
        t, bsz = x.shape[0], len(chunk)
        rows = min(t, t // w.r + bsz)
        if self.rope_mode == "metadata":  # the rows compressor_metadata supplies
            cos, sin, _ = CPU.compressor_metadata(self.cos, self.sin, i32(cu), i32(start), self.table, 4, 1, w.r,
                                                  rows, bsz)
        else:
            idx = torch.tensor(rope_rows + [0] * (rows - len(rope_rows)), dtype=torch.long)
            cos, sin = self.cos[idx], self.sin[idx]
        out = CPU.compressor(x, w.wkv, w.wgate, self.state, w.ape, w.nw, sin, cos, self.table, i32(cu), None,
                             i32(start), self.rd, w.r, w.coff, self.eps, 2, 1)
        expect = []
        for b, q in enumerate(chunk):
            s = self.done[b]
            expect.append(ref_rows(w, self.xs[b][: s + q], s // w.r, (s + q) // w.r, self.cos, self.sin, self.rd,
                                   self.eps))
            self.done[b] += q
        return out, expect


def tol(dtype):
    return (1e-5, 1e-5) if dtype == torch.float32 else (2e-2, 2e-2)


def check_step(out, expect, w, dtype):
    exp = torch.cat(expect)
    t_rows = out.shape[0]
    assert out.dtype == dtype and out.shape[1] == w.d
    assert exp.shape[0] <= t_rows
    atol, rtol = tol(dtype)
    torch.testing.assert_close(out[: exp.shape[0]].double(), exp, atol=atol, rtol=rtol)
    assert torch.count_nonzero(out[exp.shape[0]:]) == 0  # padding rows are zero


CASES = [(4, 2, 16), (4, 1, 16), (128, 1, 16), (128, 2, 16)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("r,coff,d", CASES)
def test_prefill_one_step_then_decode_matches_reference(r, coff, d, dtype):
    g = torch.Generator().manual_seed(7 + r + coff)
    w = Weights(g, 24, d, r, coff, dtype)
    lens = [3 * r + 3, 2 * r, r + 3, 5 * r // 2 + 1] if r == 4 else [2 * r + 5, r + 3, 40]
    sbs = 8 if r == 4 else 32
    e = Engine(g, w, lens, sbs)
    prefill = [n - 6 for n in lens]
    out, expect = e.step(prefill)
    assert out.shape == (min(sum(prefill), sum(prefill) // r + len(lens)), d)
    assert sum(x.shape[0] for x in expect) > 0
    check_step(out, expect, w, dtype)
    emitted = 0
    for _ in range(6):  # decode: one token per request, some complete a group
        out, expect = e.step([1] * len(lens))
        assert out.shape == (min(len(lens), len(lens) // r + len(lens)), d)
        emitted += sum(x.shape[0] for x in expect)
        check_step(out, expect, w, dtype)
    assert emitted > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("r,coff,d", CASES)
def test_chunked_prefill_gives_the_rows_of_one_step(r, coff, d, dtype):
    g = torch.Generator().manual_seed(11 + r * coff)
    w = Weights(g, 16, d, r, coff, dtype)
    lens = [4 * r + 3, 3 * r - 1, r + 1] if r == 4 else [3 * r + 7, 2 * r + 1]
    sbs = 8 if r == 4 else 16
    whole = Engine(torch.Generator().manual_seed(5), w, lens, sbs)
    chunked = Engine(torch.Generator().manual_seed(5), w, lens, sbs)
    # The chunked run's state cache is a strided view into a wider buffer (caller-owned caches may be views).
    wide = torch.full(chunked.state.shape[:2] + (chunked.state.shape[2] + 5,), -7.0)
    chunked.state = wide[..., 3:3 + chunked.state.shape[2]]
    assert not chunked.state.is_contiguous()
    out, expect = whole.step(lens)
    check_step(out, expect, w, dtype)
    rows_whole = [out[sum(x.shape[0] for x in expect[:b]):][: expect[b].shape[0]] for b in range(len(lens))]
    got = [[] for _ in lens]
    sizes = [1, 2, 3, r - 1, r, r + 1, 5, 7, 2 * r + 3]
    k = 0
    while any(chunked.done[b] < lens[b] for b in range(len(lens))):
        chunk = []
        for b in range(len(lens)):
            chunk.append(min(sizes[(k + 3 * b) % len(sizes)], lens[b] - chunked.done[b]))
        k += 1
        out, expect = chunked.step(chunk)
        check_step(out, expect, w, dtype)
        off = 0
        for b in range(len(lens)):
            n = expect[b].shape[0]
            got[b].append(out[off:off + n])
            off += n
    assert k > 3
    assert bool((wide[..., :3] == -7.0).all()) and bool((wide[..., -2:] == -7.0).all())  # outside the view: untouched
    for b in range(len(lens)):
        assert torch.equal(torch.cat(got[b]), rows_whole[b]), b  # identical rows, not merely close


def test_compressor_with_seqused_and_metadata_rope_rows():
    """seqused (= S) instead of start_pos gives the same rows; rope rows straight from compressor_metadata."""
    g = torch.Generator().manual_seed(3)
    w = Weights(g, 16, 16, 4, 2, torch.float32)
    e = Engine(g, w, [13, 9], 8, rope_mode="metadata")
    out, expect = e.step([13, 9])
    check_step(out, expect, w, torch.float32)
    e2 = Engine(torch.Generator().manual_seed(3), w, [13, 9], 8)
    e2.xs, e2.table, e2.state = e.xs, e.table, torch.zeros_like(e.state)
    x = torch.cat(e.xs)
    cos_i = torch.tensor([c * 4 for c in range(3)] + [c * 4 for c in range(2)])
    rows = min(22, 22 // 4 + 2)
    cos, sin = e.cos[cos_i], e.sin[cos_i]
    cos = torch.cat([cos, torch.ones(rows - 5, 8)]).view(rows, 1, 1, 8)
    sin = torch.cat([sin, torch.zeros(rows - 5, 8)]).view(rows, 1, 1, 8)
    out2 = CPU.compressor(x, w.wkv, w.wgate, e2.state, w.ape, w.nw, sin, cos, e.table, i32([0, 13, 22]),
                          i32([13, 9]), None, 8, 4, 2, 1e-6, 2, 1)
    assert torch.equal(out2, out)
    out3 = CPU.compressor(x, w.wkv, w.wgate, e2.state.clone(), w.ape, w.nw, sin, cos, e.table, i32([0, 13, 22]),
                          i32([13, 9]), i32([0, 0]), 8, 4, 2, 1e-6, 2, 1)
    assert torch.equal(out3, out)


def test_state_cache_holds_raw_entries_at_the_table_geometry():
    """Position p of request b is at state[table[b][p // sbs], p % sbs] = [x W_kv^T | x W_gate^T + ape[p % r]]."""
    g = torch.Generator().manual_seed(9)
    w = Weights(g, 8, 8, 4, 2, torch.float32)
    e = Engine(g, w, [11, 6], 4, rd=4)
    e.step([7, 6])
    e.step([4, 0])
    for b, n in enumerate([11, 6]):
        x = e.xs[b].double()
        for p in range(n):
            row = e.state[e.table[b, p // 4], p % 4].double()
            kv = x[p] @ w.wkv.double().T
            sc = x[p] @ w.wgate.double().T + w.ape.double()[p % 4]
            torch.testing.assert_close(row, torch.cat([kv, sc]), atol=1e-5, rtol=1e-5)


def test_rolled_back_tokens_are_recomputed():
    """A step that re-processes positions (speculative tokens rejected) reads the earlier positions it still
    needs from the state: the rows equal those of a request that never saw the rejected tokens."""
    g = torch.Generator().manual_seed(21)
    w = Weights(g, 8, 8, 4, 1, torch.float32)
    e = Engine(g, w, [12], 4, rd=4)
    e.step([6])
    rejected = e.xs[0].clone()
    accepted = torch.cat([rejected[:7], torch.randn(5, 8, generator=g)])
    e.step([3])  # positions 6, 7, 8 (7, 8 are drafts that get rejected): emits group 1 from a wrong token
    e.xs[0], e.done[0] = accepted, 7  # position 6 accepted; 7.. recomputed from their true values
    out, expect = e.step([5])
    check_step(out, expect, w, torch.float32)


def test_decode_only_padding_and_empty_requests():
    """Requests with q = 0 (graph padding) emit nothing and touch no state; T rows beyond cu_seqlens[B] are
    ignored; output rows min(T, T // r + B)."""
    g = torch.Generator().manual_seed(4)
    w = Weights(g, 8, 8, 4, 2, torch.float32)
    e = Engine(g, w, [8, 5], 4, rd=4)
    out, expect = e.step([8, 0])
    check_step(out, expect, w, torch.float32)
    assert torch.isnan(e.state[e.table[1, 0]]).all()  # request 1 untouched
    x = torch.cat([e.xs[1][:3], torch.randn(2, 8)])  # 2 padding tokens after cu_seqlens[B]
    cos, sin = e.cos[[0]].expand(5, 4), e.sin[[0]].expand(5, 4)
    out = CPU.compressor(x, w.wkv, w.wgate, e.state, w.ape, w.nw, sin, cos, e.table, i32([0, 0, 3]), None,
                         i32([8, 0]), 4, 4, 2, 1e-6, 2, 1)
    assert out.shape == (min(5, 5 // 4 + 2), 8) and torch.count_nonzero(out) == 0


# ------------------------------------------------------------------------------------------- compressor_metadata


def brute_metadata(cos_full, sin_full, cu, start, table, bs, fmt, r, rows, nra):
    """Slots by the geometry rule (docs/design/dsa.md §2.2): compressed row c of request b -> table[b][c // bs] * bs + c % bs."""
    ents = []
    for b in range(nra):
        q, s = cu[b + 1] - cu[b], start[b]
        if s < 0 or q <= 0:
            continue
        ents += [(b, c) for c in range(s // r, (s + q) // r)]
    rd = cos_full.shape[1]
    cos = torch.ones(rows, 1, 1, rd, dtype=cos_full.dtype)
    sin = torch.zeros(rows, 1, 1, rd, dtype=cos_full.dtype)
    slots = []
    for i in range(rows):
        ok = False
        if i < len(ents):
            b, c = ents[i]
            if c // bs < len(table[b]) and c * r < cos_full.shape[0] and table[b][c // bs] >= 0:
                ok = True
                cos[i, 0, 0], sin[i, 0, 0] = cos_full[c * r], sin_full[c * r]
                blk, off = table[b][c // bs], c % bs
        if fmt == 2:
            slots.append([blk, off] if ok else [-1, bs - 1])
        else:
            slots.append(blk * bs + off if ok else -1)
    return cos, sin, torch.tensor(slots, dtype=torch.int32)


@pytest.mark.parametrize("fmt", [1, 2])
def test_compressor_metadata_spec_examples(fmt):
    # C4: start 508, q 8, table [10, 11], bs 128 -> (10, 127), (11, 0).
    cos, sin = rope_tables(4096, 8)
    c, s, slots = CPU.compressor_metadata(cos, sin, i32([0, 8]), i32([508]), i32([[10, 11]]), 128, fmt, 4, 4, 1)
    want = [[10, 127], [11, 0], [-1, 127], [-1, 127]] if fmt == 2 else [10 * 128 + 127, 11 * 128, -1, -1]
    assert slots.tolist() == want and slots.dtype == torch.int32
    assert torch.equal(c[0, 0, 0], cos[127 * 4]) and torch.equal(s[1, 0, 0], sin[128 * 4])
    assert torch.equal(c[2:], torch.ones(2, 1, 1, 8)) and torch.equal(s[2:], torch.zeros(2, 1, 1, 8))
    # C128: start 16256, q 256, table [20, 21] -> (20, 127), (21, 0).
    cos, sin = rope_tables(16512, 4)
    _, _, slots = CPU.compressor_metadata(cos, sin, i32([0, 256]), i32([16256]), i32([[20, 21]]), 128, fmt, 128,
                                          3, 1)
    assert slots.tolist()[:2] == ([[20, 127], [21, 0]] if fmt == 2 else [20 * 128 + 127, 21 * 128])


@pytest.mark.parametrize("fmt", [1, 2])
@pytest.mark.parametrize("r,bs", [(4, 4), (4, 128), (128, 2)])
def test_compressor_metadata_matches_brute_force_geometry(fmt, r, bs):
    g = torch.Generator().manual_seed(r * 3 + bs + fmt)
    for trial in range(25):
        bsz = int(torch.randint(1, 6, (1,), generator=g))
        nra = int(torch.randint(0, bsz + 1, (1,), generator=g))
        q = torch.randint(0, 3 * r, (bsz,), generator=g).tolist()
        start = torch.randint(-2, 5 * r * bs // 4 + 3, (bsz,), generator=g).tolist()
        cu = [0]
        for n in q:
            cu.append(cu[-1] + n)
        cols = int(torch.randint(1, 4, (1,), generator=g))
        table = torch.randint(-1, 50, (bsz, cols), generator=g).tolist()
        t = cu[-1]
        rows = min(t, t // r + bsz) + int(torch.randint(-1, 3, (1,), generator=g))
        rows = max(rows, 0)
        cos, sin = rope_tables(int(torch.randint(1, 4 * r * bs, (1,), generator=g)), 4)
        got = CPU.compressor_metadata(cos, sin, i32(cu), i32(start), i32(table), bs, fmt, r, rows, nra)
        want = brute_metadata(cos, sin, cu, start, table, bs, fmt, r, rows, nra)
        for a, b in zip(got, want):
            assert a.shape == b.shape and torch.equal(a, b), (trial, a, b)
        # The _out form writes the same into caller buffers (strided views allowed).
        oc = torch.full((rows, 1, 1, 4), 7.0)
        osn = torch.full((rows, 2, 1, 4), 7.0)[:, :1]
        osl = torch.full((rows, 2) if fmt == 2 else (rows,), 99, dtype=torch.int32)
        res = CPU.compressor_metadata_out(cos, sin, i32(cu), i32(start), i32(table), bs, fmt, r, nra, oc, osn, osl)
        assert res[0] is oc and res[2] is osl
        assert torch.equal(oc, want[0]) and torch.equal(osn, want[1]) and torch.equal(osl, want[2])


# ------------------------------------------------------------------------------------------- epilogs


def ref_mx_exponent(amax):
    """Smallest e with 448 * 2^e >= amax (exact rational arithmetic), clamped to [-127, 127]."""
    if amax == 0:
        return -127
    from fractions import Fraction
    a = Fraction(amax)
    e = math.ceil(math.log2(amax / 448.0))
    while Fraction(448) * Fraction(2) ** e < a:
        e += 1
    while Fraction(448) * Fraction(2) ** (e - 1) >= a:
        e -= 1
    return max(-127, min(127, e))


def test_kv_compress_epilog_round_trip():
    g = torch.Generator().manual_seed(17)
    n, rows = 6, 10
    x = torch.randn(n, 512, generator=g) * torch.logspace(-3, 3, n)[:, None]
    x[2, 64:128] = 0.0  # an all-zero group
    x[3, 0] = 448.0 * 4  # a power-of-two boundary: e exactly 2
    x = x.to(torch.bfloat16)
    cache = torch.full((rows, 1, 640), 0x5A, dtype=torch.uint8).view(torch.float8_e4m3fn)
    before = cache.clone()
    slots = [7, -1, 0, 3, 9, 5]
    CPU.kv_compress_epilog(cache, x, i32(slots), 64, 2, True, 1)
    b = cache.view(torch.uint8).view(rows, 640)
    untouched = [r for r in range(rows) if r not in slots]
    assert torch.equal(b[untouched], before.view(torch.uint8).view(rows, 640)[untouched])
    for i, s in enumerate(slots):
        if s < 0:
            continue
        row = b[s]
        xf = x[i].float().double()
        for grp in range(7):
            seg = xf[grp * 64:(grp + 1) * 64]
            e = ref_mx_exponent(float(seg.abs().max()))
            assert int(row[576 + grp]) == e + 127, (i, grp)
            deq = row[grp * 64:(grp + 1) * 64].view(torch.float8_e4m3fn).double() * 2.0 ** e
            err = (deq - seg).abs()
            # e4m3: 3 mantissa bits (relative 2^-4), subnormal step 2^-9 at the scale 2^e
            assert bool((err <= torch.clamp(seg.abs() * 2.0 ** -4, min=2.0 ** (e - 10)) + 1e-30).all()), (i, grp)
            assert float(deq.abs().max()) <= 448.0 * 2.0 ** e
        assert torch.equal(row[448:576].view(torch.bfloat16), x[i, 448:])  # rope bytes verbatim
        assert torch.count_nonzero(row[583:]) == 0  # pad
    assert int(b[3][576 + 0]) == 2 + 127  # 1792 = 448 * 2^2 -> e = 2
    assert int(b[0][576 + 1]) == 0  # the zero group: ue8m0 0


def test_indexer_compress_epilog_v2_round_trip_through_the_page_views():
    """The raw pages are [k: bs x Di fp8][scale: bs fp32] (+ page padding); the full byte view is the write
    handle, the k view and the scale view (page stride) read the result back."""
    g = torch.Generator().manual_seed(23)
    nb, bs, di, pad = 5, 8, 128, 64
    page = bs * (di + 4) + pad
    raw = torch.full((nb * page,), 0x33, dtype=torch.uint8)
    full = raw.as_strided((nb, bs, 1, di + 4), (page, di + 4, di + 4, 1))
    kview = raw.as_strided((nb, bs, 1, di), (page, di, di, 1)).view(torch.float8_e4m3fn)
    sview = raw.view(torch.float32).as_strided((nb, bs, 1), (page // 4, 1, 1), (bs * di) // 4)
    n = 7
    x = (torch.randn(n, di, generator=g) * torch.logspace(-2, 2, n)[:, None]).to(torch.bfloat16)
    x[4] = 0
    slots = [3, -1, 17, 39, 8, 20, 0]
    before = raw.clone()
    CPU.indexer_compress_epilog_v2(full, x, i32(slots), 2)
    written = set()
    for i, s in enumerate(slots):
        if s < 0:
            continue
        blk, off = s // bs, s % bs
        written.add((blk, off))
        scale = float(sview[blk, off, 0])
        xf = x[i].double()
        amax = float(xf.abs().max())
        assert scale == pytest.approx(amax / 448.0, rel=1e-6, abs=0)
        deq = kview[blk, off, 0].double() * scale
        assert bool(((deq - xf).abs() <= xf.abs() * 2.0 ** -4 + scale * 2.0 ** -9 + 1e-30).all()), i
    # nothing else in the pages (other rows, page padding) changed
    mask = torch.ones(nb * page, dtype=torch.bool)
    for blk, off in written:
        mask[blk * page + off * di: blk * page + (off + 1) * di] = False
        mask[blk * page + bs * di + off * 4: blk * page + bs * di + (off + 1) * 4] = False
    assert torch.equal(raw[mask], before[mask])


# ------------------------------------------------------------------------------------------- bad input


def _comp_args(**over):
    g = torch.Generator().manual_seed(1)
    w = Weights(g, 8, 8, 4, 2, torch.float32)
    a = dict(x=torch.randn(6, 8), wkv=w.wkv, wgate=w.wgate, state=torch.zeros(6, 4, 32), ape=w.ape, nw=w.nw,
             sin=torch.zeros(3, 4), cos=torch.ones(3, 4), table=i32([[0, 1], [2, 3]]), cu=i32([0, 5, 6]),
             used=None, start=i32([0, 3]), rd=4, r=4, coff=2, eps=1e-6, rot=2, cm=1)
    a.update(over)
    return a


def _comp(a):
    return CPU.compressor(a["x"], a["wkv"], a["wgate"], a["state"], a["ape"], a["nw"], a["sin"], a["cos"],
                          a["table"], a["cu"], a["used"], a["start"], a["rd"], a["r"], a["coff"], a["eps"], a["rot"],
                          a["cm"])


@pytest.mark.parametrize("over,match", [
    (dict(table=i32([[0, 9], [2, 3]])), "state_block_table"),
    (dict(table=i32([[0], [2]])), "state_block_table"),
    (dict(table=None), "state_block_table"),
    (dict(cu=i32([0, 5, 4])), "cu_seqlens"),
    (dict(cu=i32([0, 5, 7])), "cu_seqlens"),
    (dict(cu=None), "cu_seqlens"),
    (dict(start=i32([0, -1])), "start_pos"),
    (dict(start=i32([0])), "start_pos"),
    (dict(start=None), "start_pos or seqused"),
    (dict(used=i32([5, 5])), "seqused"),
    (dict(rot=1), "rotary_mode"),
    (dict(cm=0), "cache_mode"),
    (dict(coff=3), "coff"),
    (dict(rd=5), "rope_head_dim"),
    (dict(cos=torch.ones(1, 4), sin=torch.zeros(1, 4)), "rope_cos"),
    (dict(state=torch.zeros(6, 4, 32, dtype=torch.float64)), "state_cache"),
    (dict(state=torch.zeros(6, 4, 16)), "state_cache"),
    (dict(ape=torch.zeros(3, 16)), "ape"),
    (dict(wkv=torch.zeros(16, 7)), "wkv"),
])
def test_compressor_rejects_bad_input_by_name_and_leaves_the_state(over, match):
    a = _comp_args(**over)
    st = a["state"]
    before = st.clone()
    with pytest.raises(Exception, match=match):
        _comp(a)
    assert torch.equal(st, before)


def test_compressor_good_call_of_the_bad_input_fixture_works():
    a = _comp_args()
    out = _comp(a)  # the fixture itself is valid: the rejections above are the overrides'
    assert out.shape == (min(6, 6 // 4 + 2), 8) and torch.count_nonzero(a["state"]) > 0


@pytest.mark.parametrize("args,match", [
    (dict(fmt=3), "slot_mapping_format"),
    (dict(cu=i32([1, 5])), "cu_seqlens"),
    (dict(nra=2), "num_reqs_actual"),
    (dict(start=i32([0, 1])), "start_pos"),
    (dict(bs=0), "kv_block_size"),
    (dict(rows=-1), "num_compressed_tokens"),
    (dict(table=torch.zeros(1, 2)), "kv_block_table"),
])
def test_compressor_metadata_rejects_bad_input_by_name(args, match):
    a = dict(fmt=2, cu=i32([0, 5]), nra=1, start=i32([0]), bs=4, rows=2, table=i32([[1, 2]]))
    a.update(args)
    cos, sin = rope_tables(64, 4)
    with pytest.raises(Exception, match=match):
        CPU.compressor_metadata(cos, sin, a["cu"], a["start"], a["table"], a["bs"], a["fmt"], 4, a["rows"], a["nra"])


def test_compressor_metadata_out_rejects_bad_buffers_before_writing():
    cos, sin = rope_tables(64, 4)
    oc, osn, osl = torch.full((2, 1, 1, 4), 7.0), torch.full((2, 1, 1, 4), 7.0), torch.zeros(3, 2, dtype=torch.int32)
    with pytest.raises(Exception, match="slot_mapping"):
        CPU.compressor_metadata_out(cos, sin, i32([0, 5]), i32([0]), i32([[1, 2]]), 4, 2, 4, 1, oc, osn, osl)
    assert bool((oc == 7).all()) and bool((osn == 7).all())


@pytest.mark.parametrize("over,match", [
    (dict(slots=i32([0, 10])), "slot_mapping"),
    (dict(slots=i32([0, -2])), "slot_mapping"),
    (dict(slots=i32([0])), "slot_mapping"),
    (dict(gs=32), "quant_group_size"),
    (dict(qm=1), "quant_mode"),
    (dict(rs=False), "round_scale_flag"),
    (dict(layout=2), "layout"),
    (dict(x=torch.randn(2, 512)), "bfloat16"),
    (dict(cache=torch.zeros(10, 1, 580, dtype=torch.uint8)), "kv_compress_cache"),
    (dict(cache=torch.zeros(10, 1, 640)), "kv_compress_cache"),
])
def test_kv_compress_epilog_rejects_bad_input_and_leaves_the_cache(over, match):
    a = dict(cache=torch.full((10, 1, 640), 3, dtype=torch.uint8), x=torch.randn(2, 512).bfloat16(),
             slots=i32([0, 1]), gs=64, qm=2, rs=True, layout=1)
    a.update(over)
    before = a["cache"].clone()
    with pytest.raises(Exception, match=match):
        CPU.kv_compress_epilog(a["cache"], a["x"], a["slots"], a["gs"], a["qm"], a["rs"], a["layout"])
    assert torch.equal(a["cache"], before)


@pytest.mark.parametrize("over,match", [
    (dict(slots=i32([0, 16])), "slot_mapping"),
    (dict(layout=1), "layout"),
    (dict(x=torch.randn(2, 64)), "x must be"),
    (dict(cache=torch.zeros(2, 8, 1, 132)), "indexer_compress_cache"),
    (dict(cache=torch.zeros(2, 8, 1, 264, dtype=torch.uint8)[..., :132]), "contiguous"),
])
def test_indexer_compress_epilog_rejects_bad_input_and_leaves_the_cache(over, match):
    a = dict(cache=torch.full((2, 8, 1, 132), 3, dtype=torch.uint8), x=torch.randn(2, 128), slots=i32([0, 15]),
             layout=2)
    a.update(over)
    before = a["cache"].clone()
    with pytest.raises(Exception, match=match):
        CPU.indexer_compress_epilog_v2(a["cache"], a["x"], a["slots"], a["layout"])
    assert torch.equal(a["cache"], before)


# ------------------------------------------------------------------------------------------- no-compute kernels


def _t(shape, dtype, device):
    if device == "meta":
        return torch.empty(shape, dtype=dtype, device="meta")
    return torch.zeros(shape, dtype=dtype)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_noop_shapes(device):
    t, h, d, r, coff, b = 13, 32, 16, 4, 2, 3
    st = _t((4, 8, 4 * d), torch.float32, device)
    out = NOOP.compressor(_t((t, h), torch.bfloat16, device), _t((coff * d, h), torch.bfloat16, device),
                          _t((coff * d, h), torch.bfloat16, device), st, _t((r, coff * d), torch.float32, device),
                          _t((d,), torch.float32, device), _t((6, 8), torch.float32, device),
                          _t((6, 8), torch.float32, device), _t((b, 2), torch.int32, device),
                          _t((b + 1,), torch.int32, device), None, _t((b,), torch.int32, device), 8, r, coff, 1e-6,
                          2, 1)
    assert out.shape == (min(t, t // r + b), d) and out.dtype == torch.bfloat16 and out.device.type == device
    out = NOOP.compressor(_t((t, h), torch.float32, device), _t((d, h), torch.float32, device),
                          _t((d, h), torch.float32, device), st, _t((128, d), torch.float32, device),
                          _t((d,), torch.float32, device), _t((6, 8), torch.float32, device),
                          _t((6, 8), torch.float32, device), None, _t((b + 1,), torch.int32, device), None, None, 8,
                          128, 1, 1e-6, 2, 1)
    assert out.shape == (min(t, t // 128 + b), d)
    cos = _t((64, 8), torch.float32, device)
    for fmt, sshape in [(1, (6,)), (2, (6, 2))]:
        c, s, sl = NOOP.compressor_metadata(cos, cos, _t((b + 1,), torch.int32, device), _t((b,), torch.int32, device),
                                            _t((b, 2), torch.int32, device), 128, fmt, 4, 6, b)
        assert c.shape == s.shape == (6, 1, 1, 8) and c.dtype == torch.float32
        assert sl.shape == sshape and sl.dtype == torch.int32 and sl.device.type == device
    oc, osl = _t((6, 1, 1, 8), torch.float32, device), _t((6, 2), torch.int32, device)
    res = NOOP.compressor_metadata_out(cos, cos, _t((b + 1,), torch.int32, device), _t((b,), torch.int32, device),
                                       _t((b, 2), torch.int32, device), 128, 2, 4, b, oc, oc, osl)
    assert res[0] is oc and res[2] is osl
    cache = _t((10, 1, 640), torch.float8_e4m3fn, device)
    assert NOOP.kv_compress_epilog(cache, _t((2, 512), torch.bfloat16, device), _t((2,), torch.int32, device), 64,
                                   2, True, 1) is None
    full = _t((2, 8, 1, 132), torch.uint8, device)
    assert NOOP.indexer_compress_epilog_v2(full, _t((2, 128), torch.bfloat16, device),
                                           _t((2,), torch.int32, device)) is None
    if device == "cpu":
        assert torch.count_nonzero(cache.view(torch.uint8)) == 0 and torch.count_nonzero(full) == 0
        assert torch.count_nonzero(st) == 0


def test_no_compute_and_cpu_twin_agree_on_shapes():
    a = _comp_args()
    out = _comp(a)
    b = _comp_args()
    noop = NOOP.compressor(b["x"], b["wkv"], b["wgate"], b["state"], b["ape"], b["nw"], b["sin"], b["cos"],
                           b["table"], b["cu"], b["used"], b["start"], b["rd"], b["r"], b["coff"], b["eps"], b["rot"],
                           b["cm"])
    assert noop.shape == out.shape and noop.dtype == out.dtype


# ------------------------------------------------------------------------------------------- the A5 pipeline


def test_a5_pipeline_metadata_compressor_epilog():
    """One C4 step as the A5 path runs it: compressor_metadata (FLAT slots, logical table, physical block size)
    supplies the rope rows of the compressor and the slots of kv_compress_epilog; the cache rows dequantise to
    the compressor's rows at table[b][c // bs] * bs + c % bs, and the padding rows (slot -1) write nothing."""
    g = torch.Generator().manual_seed(31)
    d, rd, r, bs = 512, 64, 4, 2
    w = Weights(g, 16, d, r, 2, torch.bfloat16)
    lens, start = [9, 6], [3, 0]
    kv_table = i32([[5, 2, 7], [0, 4, 6]])
    e = Engine(g, w, [s + q for s, q in zip(start, lens)], 4, rd=rd)
    e.step(start)  # request 0's first 3 tokens (no group yet)
    t, b = sum(lens), len(lens)
    rows = min(t, t // r + b)
    cu = i32([0, lens[0], t])
    cos, sin, slots = CPU.compressor_metadata(e.cos, e.sin, cu, i32(start), kv_table, bs, 1, r, rows, b)
    _, _, blocks = CPU.compressor_metadata(e.cos, e.sin, cu, i32(start), kv_table, bs, 2, r, rows, b)
    valid = slots >= 0
    assert torch.equal(slots[valid], blocks[valid, 0] * bs + blocks[valid, 1])
    x = torch.cat([e.xs[0][3:12], e.xs[1][:6]])
    out = CPU.compressor(x, w.wkv, w.wgate, e.state, w.ape, w.nw, sin, cos, e.table, cu, None, i32(start), rd, r, 2,
                         e.eps, 2, 1)
    exp = [ref_rows(w, e.xs[0][:12], 0, 3, e.cos, e.sin, rd, e.eps), ref_rows(w, e.xs[1][:6], 0, 1, e.cos, e.sin,
                                                                                rd, e.eps)]
    check_step(out, exp, w, torch.bfloat16)
    cache = torch.zeros(8 * bs, 1, 640, dtype=torch.float8_e4m3fn)
    CPU.kv_compress_epilog(cache, out, slots, 64, 2, True, 1)
    cb = cache.view(torch.uint8).view(8 * bs, 640)
    want_slots = [5 * bs + 0, 5 * bs + 1, 2 * bs + 0, 0 * bs + 0]  # request 0 rows 0..2, request 1 row 0
    assert slots.tolist()[:4] == want_slots and all(s == -1 for s in slots.tolist()[4:])
    for i, s in enumerate(want_slots):
        scales = cb[s, 576:583].double() - 127
        deq = (cb[s, :448].view(torch.float8_e4m3fn).double().view(7, 64) * 2.0 ** scales[:, None]).flatten()
        ref = out[i, :448].double()
        assert bool(((deq - ref).abs() <= ref.abs() * 2.0 ** -4 + 2.0 ** (scales.max() - 10)).all()), i
        assert torch.equal(cb[s, 448:576].view(torch.bfloat16), out[i, 448:])
    assert torch.count_nonzero(cb[[r_ for r_ in range(8 * bs) if r_ not in want_slots]]) == 0
