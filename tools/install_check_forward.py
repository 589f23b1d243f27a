"""One GQA decode step through the installed package, checked against a float64 reference written
here (tools/check_install_cuda_torch.sh runs it from a directory outside the source tree).

Usage: python install_check_forward.py SITE_PACKAGES
Fails unless ascend_attn_rt is imported from SITE_PACKAGES and the output and the KV-cache write
agree with the reference.
"""

import math
import pathlib
import sys

import torch

import ascend_attn_rt as aar

SITE = pathlib.Path(sys.argv[1]).resolve()
where = pathlib.Path(aar.__file__).resolve()
if SITE not in where.parents:
    sys.exit(f"install check: imported {where}, not the installed package under {SITE}")
print(f"install check: ascend_attn_rt from {where.parent}; torch {torch.__version__} "
      f"(CUDA build: {torch.version.cuda or 'no'})")

# 8 query heads over 2 KV heads of size 64, paged cache of 16-token blocks; three decoding requests
# whose contexts (36, 4, 59 tokens) sit in shuffled blocks.
N, NKV, D, BS = 8, 2, 64, 16
SEQ = [37, 5, 60]
gen = torch.Generator().manual_seed(26)
blocks_per_req = [math.ceil(s / BS) for s in SEQ]
num_blocks = sum(blocks_per_req) + 3
perm = torch.randperm(num_blocks, generator=gen).tolist()
width = max(blocks_per_req)
block_table = torch.zeros(len(SEQ), width, dtype=torch.int32)
ids = iter(perm)
for r, nb in enumerate(blocks_per_req):
    for j in range(nb):
        block_table[r, j] = next(ids)

key_cache = torch.randn(num_blocks, BS, NKV, D, generator=gen)
value_cache = torch.randn(num_blocks, BS, NKV, D, generator=gen)
k_full = [torch.randn(s, NKV, D, generator=gen) for s in SEQ]
v_full = [torch.randn(s, NKV, D, generator=gen) for s in SEQ]


def slot(r, pos):
    return int(block_table[r, pos // BS]) * BS + pos % BS


for r, s in enumerate(SEQ):
    for pos in range(s - 1):  # the context; the new token's K/V is the forward's to write
        b, o = divmod(slot(r, pos), BS)
        key_cache[b, o] = k_full[r][pos]
        value_cache[b, o] = v_full[r][pos]
query = torch.randn(len(SEQ), N, D, generator=gen)
key = torch.stack([k[-1] for k in k_full])
value = torch.stack([v[-1] for v in v_full])

builder = aar.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=width, block_size=BS,
                              num_blocks=num_blocks)
md = builder.build(torch.arange(len(SEQ) + 1, dtype=torch.int32), torch.tensor(SEQ, dtype=torch.int32),
                   block_table)
impl = aar.AttentionImpl(N, D, num_kv_heads=NKV)
out = torch.full((len(SEQ), N, D), float("nan"))
impl.forward(query, key, value, key_cache, value_cache, md, out)

# Reference: each query head h attends, in float64, over its request's whole sequence in KV head
# h // (N / NKV), scaled by 1/sqrt(D).
worst = 0.0
for r in range(len(SEQ)):
    for h in range(N):
        kv = h // (N // NKV)
        k = k_full[r][:, kv].double()
        v = v_full[r][:, kv].double()
        p = torch.softmax(k @ query[r, h].double() / math.sqrt(D), dim=0)
        worst = max(worst, (out[r, h].double() - p @ v).abs().max().item())
for r, s in enumerate(SEQ):
    b, o = divmod(slot(r, s - 1), BS)
    if not (torch.equal(key_cache[b, o], key[r]) and torch.equal(value_cache[b, o], value[r])):
        sys.exit(f"install check: the new token of request {r} is not in its cache slot {slot(r, s - 1)}")
print(f"install check: GQA decode ({impl.last_path}) max |out - float64 reference| = {worst:.2e}")
if not worst < 1e-4:
    sys.exit("install check: the forward disagrees with the reference")
