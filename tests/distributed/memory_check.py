"""Memory per rank of attn.distributed, run on every rank by mpiexec (tests/distributed.cmake): the
peak resident memory one call adds (Linux's VmHWM, reset through /proc/self/clear_refs, over VmRSS
before the call; glibc's mmap threshold fixed by the test so that freed buffers leave) against the
bounds stated in the README. The ring's in units of one shard array (B, H, n/P, d): the forward holds
its output, two key/value blocks in flight and a block's partial output (6 shards); the backward its
three gradients, five key/value-sized buffers (two blocks and two gradient blocks in flight, the block
being summed; the last receives the rank's own gradients home) and a block's gradients (16). The all-to-all's in units of
the rank's heads over the whole sequence (B, H_t, n, d): 7 forward; 14 backward, plus the local
backward's partial dQ of its about 16 key chunks (16 n d). Both fall as 1/P (ranks 2 to 4: the test
prints MiB). Exits 77 where the peak cannot be reset, 1 on a failure."""
import sys

import numpy as np
from mpi4py import MPI

import attn.distributed as dist

comm = MPI.COMM_WORLD
P, me = comm.Get_size(), comm.Get_rank()
B, H, N, D = 1, 4, 4096, 64
BOUND = {("ring", "forward"): 6, ("ring", "backward"): 16, ("ulysses", "forward"): 7, ("ulysses", "backward"): 14}


def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    return None


try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    resettable = status("VmHWM") is not None
except OSError:
    resettable = False
if not all(comm.allgather(resettable)):
    if me == 0:
        print("SKIPPED: this kernel cannot reset the peak resident size (/proc/self/clear_refs)")
    sys.exit(77)

rng = np.random.default_rng(me)
rows = dist.shard_rows(N, P, me, "contiguous")[0]
q, k, v, g = (rng.standard_normal((B, H, rows[1] - rows[0], D), dtype=np.float32) for _ in range(4))
heads_here = (me + 1) * H // P - me * H // P  # the all-to-all's head split, attn's
unit = {"ring": q.nbytes, "ulysses": B * heads_here * N * D * 4}
failures = []
for algorithm in ("ring", "ulysses"):
    out, lse = dist.scaled_dot_product_attention(q, k, v, comm=comm, algorithm=algorithm, return_lse=True)
    dist.backward(g, q, k, v, out, lse, comm=comm, algorithm=algorithm)  # MPI's own buffers come up once
    for which in ("forward", "backward"):
        comm.Barrier()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = status("VmRSS")
        if which == "forward":
            result = dist.scaled_dot_product_attention(q, k, v, comm=comm, algorithm=algorithm)
        else:
            result = dist.backward(g, q, k, v, out, lse, comm=comm, algorithm=algorithm)
        added = status("VmHWM") - before
        del result
        chunk_partials = 16 * N * D * 4 if (algorithm, which) == ("ulysses", "backward") else 0
        bound = BOUND[(algorithm, which)] * unit[algorithm] + chunk_partials + (1 << 20)  # + lse, MPI's small messages
        line = (f"P = {P}, rank {me}: {algorithm} {which} added {added / 2**20:.1f} MiB, bound "
                f"{BOUND[(algorithm, which)]} x {unit[algorithm] / 2**20:.2f} MiB"
                + (f" + {chunk_partials / 2**20:.0f} MiB" if chunk_partials else "") + f" + 1 MiB")
        if me == 0:
            print(line)
        if added > bound:
            failures.append(line)
failures = [f for rank_failures in comm.allgather(failures) for f in rank_failures]
for failure in failures if me == 0 else []:
    print("FAIL:", failure)
sys.exit(1 if failures else 0)
