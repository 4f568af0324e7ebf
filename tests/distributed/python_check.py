"""attn.distributed through mpi4py, run on every rank by mpiexec (tests/distributed.cmake): each rank
cuts the same whole float64 problem into its shard, runs the forward and backward across the ranks
for each layout, algorithm and mask, and checks its rows of out, lse and the gradients against a
float64 NumPy reference of the whole attention written from the formula (to 1e-10), and a float32 run
against it under the error budget (2x the single-process float32 result's error); then that a bad
argument on one rank raises the same ValueError on every rank. Exits 1 on any rank's failure."""
import sys

import numpy as np
from mpi4py import MPI

import attn
import attn.distributed as dist

comm = MPI.COMM_WORLD
P, me = comm.Get_size(), comm.Get_rank()
B, H, Hk, N, M, D, V = 2, 4, 2, 29, 41, 6, 5


def reference(q, k, v, g, causal, lens, window, slopes, softcap):
    """out, lse, dq, dk, dv of the whole attention in float64, from the formula."""
    group = H // Hk
    kk, vv = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = 1 / np.sqrt(D)
    raw = np.einsum("bhid,bhjd->bhij", q, kk) * scale
    s = softcap * np.tanh(raw / softcap) if softcap else raw
    shift = M - N if causal == "bottom_right" else 0
    pos = np.arange(N)[:, None] + shift
    j = np.arange(M)[None, :]
    allowed = np.ones((N, M), bool)
    if causal:
        allowed &= j <= pos
    if window is not None:
        allowed &= (j >= pos - window[0]) & (j <= pos + window[1])
    if slopes is not None:
        s = s - slopes[None, :, None, None] * np.abs(pos - j)[None, None]
    allowed = np.broadcast_to(allowed, (B, H, N, M)).copy()
    if lens is not None:  # (B,) per batch element or (B, N) per query
        allowed &= (j[None, None] < (lens[:, None, None, None] if lens.ndim == 1 else lens[:, None, :, None]))
    s = np.where(allowed, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)
    e = np.where(allowed, np.exp(s - top), 0)
    total = e.sum(-1, keepdims=True)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    out = w @ vv
    lse = np.where(total[..., 0] > 0, np.log(np.maximum(total[..., 0], 1e-300)) + top[..., 0], -np.inf)
    dw = g @ vv.transpose(0, 1, 3, 2)
    ds = w * (dw - (g * out).sum(-1, keepdims=True))
    if softcap:
        ds = ds * (1 - np.tanh(raw / softcap) ** 2)
    dq = ds @ kk * scale
    dkk = ds.transpose(0, 1, 3, 2) @ q * scale
    dvv = w.transpose(0, 1, 3, 2) @ g
    dk = dkk.reshape(B, Hk, group, M, D).sum(2)
    dv = dvv.reshape(B, Hk, group, M, V).sum(2)
    return out, lse, dq, dk, dv


failures = []


def check(name, ok, detail=""):
    if not ok:
        failures.append(f"rank {me}: {name} {detail}")


rng = np.random.default_rng(7)
q = rng.uniform(-2, 2, (B, H, N, D))
k = rng.uniform(-2, 2, (B, Hk, M, D))
v = rng.uniform(-1, 1, (B, Hk, M, V))
g = rng.uniform(-1, 1, (B, H, N, V))
slopes = rng.uniform(0.05, 0.5, H)
lens = np.array([33, 9])
query_lens = (np.arange(N)[None, :] * 5 + np.arange(B)[:, None] * 11) % (M + 1)  # (B, N): 0 to M
cases = {
    "none": {},
    "causal": {"causal": True},
    "bottom_right_window": {"causal": "bottom_right", "window": (7, 0)},
    "lens_alibi_softcap": {"valid_lens": lens, "alibi_slopes": slopes, "softcap": 2.0},
    "query_lens_causal": {"valid_lens": query_lens, "causal": True},
}
for case, options in cases.items():
    truth = reference(q, k, v, g, options.get("causal", False), options.get("valid_lens"), options.get("window"),
                      options.get("alibi_slopes"), options.get("softcap"))
    for layout in ("contiguous", "zigzag"):
        for algorithm in ("ring", "ulysses"):
            tag = f"{case} {layout} {algorithm}"
            mine = [dist.shard(x, comm=comm, layout=layout) for x in (q, k, v, g)]
            expect = [dist.shard(x, comm=comm, layout=layout, axis=2) for x in truth]
            kw = dict(comm=comm, layout=layout, algorithm=algorithm, **options)
            if kw.get("valid_lens") is not None and kw["valid_lens"].ndim == 2:  # per query: this rank's rows
                kw["valid_lens"] = dist.shard(kw["valid_lens"], comm=comm, layout=layout, axis=1)
            out, lse = dist.scaled_dot_product_attention(*mine[:3], return_lse=True, **kw)
            grads = dist.backward(mine[3], *mine[:3], out, lse, **kw)
            for what, got, want in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads), expect):
                finite = np.isfinite(want)
                check(f"{tag} {what}", np.array_equal(finite, np.isfinite(got)) and
                      np.allclose(got[finite], want[finite], rtol=0, atol=1e-10),
                      f"max diff {np.max(np.abs(np.where(finite, got, 0) - np.where(finite, want, 0)))}")
            # float32 across the ranks against the single-process float32 result, both against float64.
            out32 = dist.scaled_dot_product_attention(*[x.astype(np.float32) for x in mine[:3]], **kw)
            single32 = attn.scaled_dot_product_attention(
                q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                **({"valid_lens": options["valid_lens"]} if "valid_lens" in options else {}),
                **({"causal": options["causal"]} if "causal" in options else {}),
                **({"window": options["window"]} if "window" in options else {}),
                **({"alibi_slopes": slopes.astype(np.float32)} if "alibi_slopes" in options else {}),
                **({"softcap": options["softcap"]} if "softcap" in options else {}))
            single32 = dist.shard(single32, comm=comm, layout=layout)
            budget = 2 * np.max(np.abs(single32 - expect[0])) + 1e-6
            check(f"{tag} out float32", out32.dtype == np.float32 and np.max(np.abs(out32 - expect[0])) <= budget,
                  f"error {np.max(np.abs(out32 - expect[0]))} over budget {budget}")

# Dropout: the weights one process drops with the same seed (attn's own single-process result).
for layout in ("contiguous", "zigzag"):
    for algorithm in ("ring", "ulysses"):
        mine = [dist.shard(x, comm=comm, layout=layout) for x in (q, k, v)]
        got = dist.scaled_dot_product_attention(*mine, comm=comm, layout=layout, algorithm=algorithm, causal=True,
                                                dropout_p=0.3, seed=5)
        whole = attn.scaled_dot_product_attention(q, k, v, causal=True, dropout_p=0.3, seed=5)
        want = dist.shard(whole, comm=comm, layout=layout)
        check(f"dropout {layout} {algorithm}", np.allclose(got, want, rtol=0, atol=1e-10),
              f"max diff {np.max(np.abs(got - want))}")

# causal=numpy.bool_(True), as attn.torch's and attn.flash's take it: the same as True.
mine = [dist.shard(x, comm=comm, layout="contiguous") for x in (q, k, v)]
as_bool = dist.scaled_dot_product_attention(*mine, comm=comm, causal=True)
check("causal numpy.bool_", np.array_equal(dist.scaled_dot_product_attention(*mine, comm=comm, causal=np.bool_(True)),
                                           as_bool))

# A window aligned bottom-right without a causal mask, and attention sinks: out and lse against attn's
# single-process result, the gradients (d(sinks) summed over the ranks) against attn.torch's.
import torch  # noqa: E402

import attn.torch  # noqa: E402

sinks = rng.uniform(-1, 2, H)
tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
tsinks = torch.tensor(sinks, requires_grad=True)
tout = attn.torch.scaled_dot_product_attention(tq, tk, tv, window=(5, 2), align="bottom_right", sinks=tsinks,
                                               enable_gqa=True)
tout.backward(torch.tensor(g))
whole_grads = [x.grad.numpy() for x in (tq, tk, tv)]
for layout in ("contiguous", "zigzag"):
    for algorithm in ("ring", "ulysses"):
        tag = f"aligned sinks {layout} {algorithm}"
        mine = [dist.shard(x, comm=comm, layout=layout) for x in (q, k, v, g)]
        kw = dict(comm=comm, layout=layout, algorithm=algorithm, window=(5, 2), align="bottom_right", sinks=sinks)
        out, lse = dist.scaled_dot_product_attention(*mine[:3], return_lse=True, **kw)
        want = dist.shard(tout.detach().numpy(), comm=comm, layout=layout)
        check(f"{tag} out", np.allclose(out, want, rtol=0, atol=1e-10), f"max diff {np.max(np.abs(out - want))}")
        dq, dk, dv, dsinks = dist.backward(mine[3], *mine[:3], out, lse, **kw)
        for what, got, full in zip(("dq", "dk", "dv"), (dq, dk, dv), whole_grads):
            exp = dist.shard(full, comm=comm, layout=layout)
            check(f"{tag} {what}", np.allclose(got, exp, rtol=0, atol=1e-10), f"max diff {np.max(np.abs(got - exp))}")
        check(f"{tag} dsinks", np.allclose(dsinks, tsinks.grad.numpy(), rtol=0, atol=1e-10),
              f"max diff {np.max(np.abs(dsinks - tsinks.grad.numpy()))}")

# A bad argument on the last rank only: every rank raises the same ValueError.
mine = [dist.shard(x, comm=comm) for x in (q, k, v)]
if me == P - 1:
    mine[0] = mine[0][..., :-1]
try:
    dist.scaled_dot_product_attention(*mine, comm=comm)
    message = ""
except ValueError as e:
    message = str(e)
messages = comm.allgather(message)
check("bad argument", all(m == messages[0] for m in messages) and "but queries has last dimension 5" in messages[0]
      and f"(on rank {P - 1} of {P})" in messages[0], f"{messages}")
try:
    dist.scaled_dot_product_attention(*mine, comm=comm, layout="diagonal")
    check("bad layout", False)
except ValueError as e:
    check("bad layout", "layout is 'diagonal'" in str(e), str(e))

# Arguments the Python layer itself refuses, on the last rank only: every rank raises, naming that
# rank, and the next call pairs with the next call (the others had hung, or been matched with it).
mine = [dist.shard(x, comm=comm) for x in (q, k, v)]
good = dist.scaled_dot_product_attention(*mine, comm=comm)
for bad, kind, words in (({"layout": "diagonal"}, ValueError, "layout is 'diagonal'"),
                         ({"window": (1,)}, ValueError, "window is (1,); it must be a pair"),
                         ({"valid_lens": np.array([2.9] * q.shape[0])}, TypeError, "valid lengths are integers"),
                         ({"seed": 0.5}, TypeError, "seed is 0.5"),
                         ({"window": (float("inf"), 0)}, TypeError, "window[0] must be an integer or None; got inf"),
                         ({"window": (2.5, 0)}, TypeError, "window[0] must be an integer or None; got 2.5"),
                         ({"scale": 10**400}, ValueError, "int too large to convert to float")):
    try:
        dist.scaled_dot_product_attention(*mine, comm=comm, **(bad if me == P - 1 else {}))
        message = "no error"
    except kind as e:
        message = str(e)
    check(f"{bad} on one rank", words in message and f"(on rank {P - 1} of {P})" in message, message)
    check(f"{bad}: the call after it", np.array_equal(dist.scaled_dot_product_attention(*mine, comm=comm), good))

for seed, kind in ((-1, ValueError), (2**64, ValueError), (0.5, TypeError)):
    try:
        dist.scaled_dot_product_attention(*mine, comm=comm, dropout_p=0.5, seed=seed)
        check(f"seed {seed}", False)
    except kind as e:
        check(f"seed {seed}", f"seed is {seed}" in str(e), str(e))

# attn's memory limit, set on the last rank only, reached mid-call (the MPI part takes it from attn):
# every rank raises MemoryError, naming that rank, and the next call is right again.
if P > 1:
    mine = [dist.shard(x, comm=comm) for x in (q, k, v)]
    for algorithm in ("ring", "ulysses"):
        good = dist.scaled_dot_product_attention(*mine, comm=comm, algorithm=algorithm)
        if me == P - 1:
            attn.set_memory_limit(1)
        try:
            dist.scaled_dot_product_attention(*mine, comm=comm, algorithm=algorithm)
            message = "no error"
        except MemoryError as e:
            message = str(e)
        finally:
            if me == P - 1:
                attn.set_memory_limit(0)
        check(f"{algorithm}: one rank's memory limit", "more than attn may use" in message
              and (me == P - 1 or f"(on rank {P - 1} of {P})" in message), message)
        again = dist.scaled_dot_product_attention(*mine, comm=comm, algorithm=algorithm)
        check(f"{algorithm}: the call after it", np.array_equal(again, good))

failures = comm.allgather(failures)
if me == 0:
    flat = [f for per_rank in failures for f in per_rank]
    print("\n".join(flat) if flat else f"attn.distributed on {P} ranks: every check passed")
sys.exit(1 if any(failures) else 0)
