"""attn.KVCache as a server drives it: attend_batch over a mixed batch (decodes and prompt chunks,
random traces over a paged cache whose blocks are freed and reused), tree attention for speculative
decoding (attend with tree_parents) and commit_tree, each against a NumPy float64 reference over the
cache's stored keys and values (keys() and values()): the error at most twice that of the same
reference in float32, plus 1e-6. Bad input named.
"""
import numpy as np
import pytest

import attn

HEADS, KV_HEADS, D = 4, 2, 32


def reference(q, k, v, allowed, scale=None, bias=None, sinks=None, dtype=np.float64):
    """Attention of q (H, n, D) over k, v (Hk, L, D) where allowed (n, L) is True, in `dtype`; bias
    (H, n, L) added to the scores; sinks (H,) join each row's softmax; an empty row outputs 0."""
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    group = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
    s = np.einsum("hnd,hld->hnl", q, k) * dtype(scale if scale is not None else 1 / np.sqrt(q.shape[-1]))
    if bias is not None:
        s = s + bias.astype(dtype)
    s = np.where(allowed[None], s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    if sinks is not None:
        top = np.maximum(top, sinks.astype(dtype)[:, None, None])
    top = np.where(np.isfinite(top), top, 0)
    e = np.exp(s - top)
    total = e.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total = total + np.exp(sinks.astype(dtype)[:, None, None] - top)
    w = np.where(total > 0, e / np.where(total > 0, total, 1), 0)
    return np.einsum("hnl,hld->hnd", w, v)


def close(got, q, k, v, allowed, **kw):
    ref = reference(q, k, v, allowed, **kw)
    f32 = reference(q, k, v, allowed, dtype=np.float32, **kw)
    return np.abs(got - ref).max() <= 2 * np.abs(f32 - ref).max() + 1e-6


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "float8_e4m3", "float8_e5m2", "int4", "int4_kivi"])
@pytest.mark.parametrize("trial", range(3))
def test_attend_batch_matches_each_sequence_on_random_traces(dtype, trial):
    rng = np.random.default_rng(trial)
    batch = 7
    scales = {"k_scale": 0.5, "v_scale": 0.25} if dtype.startswith("float8") else {}
    block = 32 if dtype == "int4_kivi" else 8  # KIVI's groups of 32 tokens lie in one block
    cache = attn.KVCache(batch, KV_HEADS, D, dtype=dtype, block_size=block, **scales)
    for s in range(batch):  # lengths from 1, ending mid-block; some cut and regrown over freed blocks
        L = int(rng.integers(1, 40))
        cache.append(rng.standard_normal((KV_HEADS, L, D), dtype=np.float32),
                     rng.standard_normal((KV_HEADS, L, D), dtype=np.float32), seq=s)
        if s % 3 == 0:
            cache.truncate(s, int(rng.integers(0, L)))
            extra = int(rng.integers(1, 20))
            cache.append(rng.standard_normal((KV_HEADS, extra, D), dtype=np.float32),
                         rng.standard_normal((KV_HEADS, extra, D), dtype=np.float32), seq=s)
    seqs = rng.permutation(batch)[: batch - 1]  # one sequence left out, the others in another order
    counts = [int(rng.choice([0, 1, 1, 2, 4, 5, 13])) for _ in seqs]
    counts = [min(c, cache.length(int(s))) for c, s in zip(counts, seqs)]
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    q = rng.standard_normal((int(cu[-1]), HEADS, D), dtype=np.float32)
    sinks = rng.standard_normal(HEADS).astype(np.float32)
    for kw in ({}, {"causal": False}, {"sinks": sinks}, {"scale": 0.3}):
        out = cache.attend_batch(q, cu, seqs, **kw)
        assert out.shape == q.shape and out.dtype == np.float32
        for b, s in enumerate(seqs):
            n, L = counts[b], cache.length(int(s))
            if n == 0:
                continue
            qb = q[cu[b] : cu[b + 1]].transpose(1, 0, 2)
            own = cache.attend(np.ascontiguousarray(qb), int(s), **kw)
            pos = np.arange(L - n, L)[:, None]
            allowed = np.ones((n, L), bool) if kw.get("causal") is False else np.arange(L)[None] <= pos
            k, v = cache.keys(int(s)), cache.values(int(s))
            got = out[cu[b] : cu[b + 1]].transpose(1, 0, 2)
            if dtype in ("int8", "int4"):  # queries rounded to 16 bits for these keys: compare with attend
                assert np.abs(got - own).max() <= 1e-5, (b, kw)
            else:
                assert close(got, qb, k, v, allowed, scale=kw.get("scale"), sinks=kw.get("sinks")), (b, kw)


def random_tree(rng, t, kind):
    if kind == "chain":
        return np.arange(-1, t - 1)
    if kind == "star":
        return np.full(t, -1)
    if kind == "wide":
        return np.array([-1] + [int(rng.integers(0, max(1, i // 4 + 1))) if i > 0 else -1 for i in range(1, t)])
    return np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, t)])


@pytest.mark.parametrize("kind", ["chain", "star", "wide", "random"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_tree_attention_matches_the_dense_mask_and_commit_keeps_the_path(kind, dtype):
    rng = np.random.default_rng(len(kind))
    t, P = 11, 21
    parents = random_tree(rng, t, kind)
    cache = attn.KVCache(1, KV_HEADS, D, dtype=dtype, block_size=8)
    cache.append(rng.standard_normal((KV_HEADS, P + t, D), dtype=np.float32),
                 rng.standard_normal((KV_HEADS, P + t, D), dtype=np.float32), seq=0)
    k, v = cache.keys(0), cache.values(0)
    q = rng.standard_normal((HEADS, t, D), dtype=np.float32)
    allowed = np.zeros((t, P + t), bool)
    allowed[:, :P] = True
    depth = np.zeros(t, int)
    for i in range(t):
        depth[i] = 0 if parents[i] < 0 else depth[parents[i]] + 1
        a = i
        while a >= 0:
            allowed[i, P + a] = True
            a = parents[a]
    out = cache.attend(q, 0, tree_parents=parents)
    assert close(out, q, k, v, allowed)
    # ALiBi measures positions by depth: draft i at P + depth[i].
    slopes = rng.uniform(0.05, 0.4, HEADS).astype(np.float32)
    position = np.concatenate([np.arange(P), P + depth])
    bias = -slopes[:, None, None].astype(np.float64) * np.abs((P + depth)[:, None] - position[None])[None]
    out = cache.attend(q, 0, tree_parents=parents, alibi_slopes=slopes)
    assert close(out, q, k, v, allowed, bias=bias)
    # The longest root-to-leaf path accepted.
    leaf = int(np.argmax(depth))
    path = []
    while leaf >= 0:
        path.insert(0, leaf)
        leaf = int(parents[leaf])
    cache.commit_tree(0, path)
    assert cache.length(0) == P + len(path)
    rows = list(range(P)) + [P + i for i in path]
    assert np.array_equal(cache.keys(0), k[:, rows]) and np.array_equal(cache.values(0), v[:, rows])


def test_bad_input_is_named():
    cache = attn.KVCache(2, KV_HEADS, D)
    cache.append(np.zeros((2, KV_HEADS, 3, D), np.float32), np.zeros((2, KV_HEADS, 3, D), np.float32))
    q = np.zeros((4, HEADS, D), np.float32)
    with pytest.raises(TypeError, match="cu_seqlens_q has dtype float64; it must hold integers"):
        cache.attend_batch(q, np.array([0.0, 4.0]))
    with pytest.raises(ValueError, match="entry 0 has 4 queries for sequence 0, which holds 3 tokens"):
        cache.attend_batch(q, [0, 4])
    with pytest.raises(ValueError, match="sequence 1 is given twice in seqs"):
        cache.attend_batch(q, [0, 2, 4], seqs=[1, 1])
    with pytest.raises(ValueError, match="cu_seqlens_q runs from 0 to 3; it must run from 0 to total_q = 4"):
        cache.attend_batch(q, [0, 3])
    with pytest.raises(ValueError, match=r"tree_parents\[1\] is 1; a draft's parent is -1"):
        cache.attend(np.zeros((HEADS, 2, D), np.float32), 0, tree_parents=[-1, 1])
    with pytest.raises(ValueError, match="tree_parents is given without seq"):
        cache.attend(np.zeros((2, HEADS, 2, D), np.float32), tree_parents=[-1, 0])
    with pytest.raises(ValueError, match="sequence 0 has no draft tree"):
        cache.commit_tree(0, [0])
    cache.attend(np.zeros((HEADS, 2, D), np.float32), 0, tree_parents=[-1, -1])
    with pytest.raises(ValueError, match="accepted\\[1\\] is draft 1, whose parent is -1, not 0"):
        cache.commit_tree(0, [0, 1])
    with pytest.raises(TypeError, match="accepted has dtype float64; it must hold integers"):
        cache.commit_tree(0, [0.5])
    cache.commit_tree(0, [])  # no draft accepted: the accepted prefix alone
    assert cache.length(0) == 1


def test_attend_batch_rotates_each_entry_at_its_own_positions():
    rng = np.random.default_rng(5)
    angles = rng.standard_normal((100, 8))
    cache = attn.KVCache(3, KV_HEADS, D, block_size=8, rotary_cos=np.cos(angles), rotary_sin=np.sin(angles))
    for s, L in enumerate([20, 7, 33]):
        cache.append(rng.standard_normal((KV_HEADS, L, D), dtype=np.float32),
                     rng.standard_normal((KV_HEADS, L, D), dtype=np.float32), seq=s)
    counts, seqs = [5, 1, 2], [2, 0, 1]
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    q = rng.standard_normal((int(cu[-1]), HEADS, D), dtype=np.float32)
    out = cache.attend_batch(q, cu, seqs)
    for b, s in enumerate(seqs):  # the same bits as the sequence's own attend (the same paths)
        own = cache.attend(np.ascontiguousarray(q[cu[b] : cu[b + 1]].transpose(1, 0, 2)), s)
        assert np.array_equal(out[cu[b] : cu[b + 1]], own.transpose(1, 0, 2))


def float8_values(mantissa, bias):
    """Every finite non-negative value of an 8-bit float, from its bit layout."""
    top, out = (1 << (7 - mantissa)) - 1, []
    for code in range(0x80):
        e, m = code >> mantissa, code & ((1 << mantissa) - 1)
        if (mantissa == 3 and code == 0x7F) or (mantissa == 2 and e == top):
            continue
        out.append(m * 2.0 ** (1 - bias - mantissa) if e == 0 else (m + (1 << mantissa)) * 2.0 ** (e - bias - mantissa))
    return np.array(out)


@pytest.mark.parametrize("dtype,mantissa,bias,largest", [("float8_e4m3", 3, 7, 448.0), ("float8_e5m2", 2, 15, 57344.0)])
def test_float8_cache_stores_the_nearest_value_times_its_scale(dtype, mantissa, bias, largest):
    values = float8_values(mantissa, bias)
    assert values.max() == largest
    rng = np.random.default_rng(mantissa)
    x = (rng.standard_normal((1, 64, D)) * rng.choice([1e-4, 1e-2, 1, 50], (1, 64, 1))).astype(np.float32)
    x[0, 0, :] = 0
    scale = 0.75
    cache = attn.KVCache(1, 1, D, dtype=dtype, k_scale=scale, v_scale=2 * scale)
    cache.append(x, x, seq=0)
    for got, s in ((cache.keys(0), scale), (cache.values(0), 2 * scale)):
        over = (x / np.float32(s)).astype(np.float64)
        # nearest representable magnitude (a tie to the even code), with the sign
        gaps = np.abs(np.abs(over)[..., None] - values)
        best = gaps.min(axis=-1, keepdims=True)
        codes = np.where(gaps == best, np.arange(len(values)), 1 << 30)
        even = np.where(codes % 2 == 0, codes, 1 << 30).min(axis=-1)
        pick = np.where(even < (1 << 30), even, codes.min(axis=-1))
        want = np.copysign(values[pick], over) * s
        assert np.array_equal(got, want.astype(np.float32))
    # The stated bound: within 2^-(mantissa+1) relatively, or half the subnormal step.
    rel = 2.0 ** -(mantissa + 1)
    step = 2.0 ** (1 - bias - mantissa) / 2 * scale
    assert np.all(np.abs(cache.keys(0) - x) <= rel * np.abs(x) + step + 1e-12)
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip(f"this PyTorch ({torch.__version__}) has no float8 types: the cache checked against its bit layout only")
    ttype = torch.float8_e4m3fn if dtype == "float8_e4m3" else torch.float8_e5m2
    ref = (torch.from_numpy(x) / scale).to(ttype).float() * scale
    assert np.array_equal(cache.keys(0), ref.numpy())


def test_trees_inside_a_mixed_batch_as_each_sequence():
    """attend_batch with tree_parents (total_q,): each entry's drafts attended as attend with its
    parents attends them (the same values), a decode as [-1] and a chunk as a chain equal to the
    causal attend; then commit_tree keeps each entry's path."""
    rng = np.random.default_rng(5)
    cache = attn.KVCache(3, KV_HEADS, D, dtype="bfloat16", block_size=8)
    for s, L in enumerate([20, 33, 41]):
        x = rng.standard_normal((KV_HEADS, L, D), dtype=np.float32)
        cache.append(x, x, seq=s)
    trees = {2: [-1, 0, 0, 1, -1, 2], 0: [-1], 1: [-1, 0, 1, 2]}  # sequence: its entry's parents
    seqs = np.array(list(trees), np.int32)
    cu = np.concatenate([[0], np.cumsum([len(p) for p in trees.values()])]).astype(np.int32)
    parents = np.concatenate([np.array(p) for p in trees.values()])
    q = rng.standard_normal((int(cu[-1]), HEADS, D), dtype=np.float32)
    out = cache.attend_batch(q, cu, seqs, tree_parents=parents)
    for b, s in enumerate(seqs):
        qb = np.ascontiguousarray(q[cu[b] : cu[b + 1]].transpose(1, 0, 2))
        got = out[cu[b] : cu[b + 1]].transpose(1, 0, 2)
        assert np.array_equal(got, cache.attend(qb, int(s), tree_parents=np.array(trees[int(s)])))
        if int(s) != 2:
            assert np.abs(got - cache.attend(qb, int(s))).max() <= 1e-5
    cache.attend_batch(q, cu, seqs, tree_parents=parents)
    cache.commit_tree(2, [0, 2, 5])
    assert cache.length(2) == 41 - 6 + 3
    with pytest.raises(ValueError, match=r"tree_parents has shape \(3,\); it must be \(total_q,\) = \(11,\)"):
        cache.attend_batch(q, cu, seqs, tree_parents=parents[:3])
    # An entry of no rows is a tree of no drafts: its commit keeps the sequence as it is, as a server
    # that commits every entry of a step calls it.
    cache.attend_batch(q[:1], np.array([0, 0, 1], np.int32), np.array([1, 0], np.int32), tree_parents=np.array([-1]))
    keys = cache.keys(1)
    cache.commit_tree(1, [])
    assert cache.length(1) == 33 and np.array_equal(cache.keys(1), keys)
    cache.commit_tree(0, [0])
    assert cache.length(0) == 20
    with pytest.raises(ValueError, match="sequence 1 has no draft tree"):
        cache.commit_tree(1, [])


# The lowest cosine similarity measured over seeds 0-5 (docs/python.md quotes them), less a margin:
# bfloat16 0.9999, int8 0.9960, float8_e4m3 0.969, float8_e5m2 0.951, int4_kivi 0.975, int4 0.752
# (one scale and minimum for 32 channels of a token, two of them outliers: the other 30 channels
# keep one or two of their 16 codes; KIVI quantizes keys per channel instead).
FLOORS = {"bfloat16": 0.9998, "int8": 0.994, "float8_e4m3": 0.96, "float8_e5m2": 0.94, "int4_kivi": 0.965, "int4": 0.70}


@pytest.mark.parametrize("dtype", ["float8_e4m3", "float8_e5m2", "int8", "bfloat16", "int4_kivi", "int4"])
def test_end_to_end_error_on_keys_with_outlier_channels(dtype):
    """Attention over the quantized cache against the unquantized attention, on keys whose channels
    3 and 17 are 30 times the rest (as real models' keys) and scores of a few units: cosine
    similarity of each output row at least FLOORS[dtype]; and against the float64 attention over the
    dequantized cache (keys(), values()) within 1e-5 (1e-4 for int8 and int4, whose queries are
    rounded to 16 bits): the error is the format's, not the kernel's."""
    for seed in range(6):
        rng = np.random.default_rng(seed)
        L = 300
        k = rng.standard_normal((KV_HEADS, L, D)).astype(np.float32)
        k[:, :, [3, 17]] *= 30
        v = rng.standard_normal((KV_HEADS, L, D)).astype(np.float32)
        q = rng.standard_normal((HEADS, 1, D)).astype(np.float32) * 0.3
        scales = {"k_scale": float(np.abs(k).max() / 448), "v_scale": float(np.abs(v).max() / 448)} if dtype == "float8_e4m3" else {}
        cache = attn.KVCache(1, KV_HEADS, D, dtype=dtype, **scales)
        cache.append(k, v, seq=0)
        got = cache.attend(q, 0).astype(np.float64)
        exact = reference(q, k, v, np.ones((1, L), bool))
        cos = (got * exact).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(exact, axis=-1)
        assert cos.min() >= FLOORS[dtype], (dtype, seed, cos.min())
        tol = 1e-4 if dtype in ("int8", "int4") else 1e-5  # these round the queries to 16 bits (kv_cache.hpp)
        assert np.abs(got - reference(q, cache.keys(0), cache.values(0), np.ones((1, L), bool))).max() <= tol


def test_float8_scales_per_key_head():
    rng = np.random.default_rng(11)
    k = rng.standard_normal((KV_HEADS, 40, D)).astype(np.float32) * np.array([1, 20], np.float32)[:, None, None]
    v = rng.standard_normal((KV_HEADS, 40, D)).astype(np.float32)
    per_head = attn.KVCache(1, KV_HEADS, D, dtype="float8_e4m3", k_scale=[0.01, 0.2], v_scale=np.array([0.01, 0.02]))
    per_head.append(k, v, seq=0)
    for h, (ks, vs) in enumerate([(0.01, 0.01), (0.2, 0.02)]):  # each head as a cache of its own scale
        alone = attn.KVCache(1, 1, D, dtype="float8_e4m3", k_scale=ks, v_scale=vs)
        alone.append(k[h : h + 1], v[h : h + 1], seq=0)
        assert np.array_equal(per_head.keys(0)[h], alone.keys(0)[0]) and np.array_equal(per_head.values(0)[h], alone.values(0)[0])
    q = rng.standard_normal((HEADS, 1, D)).astype(np.float32)
    assert close(per_head.attend(q, 0), q, per_head.keys(0), per_head.values(0), np.ones((1, 40), bool))
    with pytest.raises(ValueError, match="k_scale has 3 values; it must have 1 \\(every head\\) or kv_heads = 2"):
        attn.KVCache(1, KV_HEADS, D, dtype="float8_e4m3", k_scale=[1, 2, 3])


def test_a_cache_with_rotary_tables_refuses_a_tree():
    angles = np.random.default_rng(1).standard_normal((20, D // 2))
    cache = attn.KVCache(1, KV_HEADS, D, rotary_cos=np.cos(angles), rotary_sin=np.sin(angles))
    cache.append(np.ones((KV_HEADS, 4, D), np.float32), np.ones((KV_HEADS, 4, D), np.float32), seq=0)
    with pytest.raises(ValueError, match="tree_parents is given to a cache with rotary tables"):
        cache.attend(np.ones((HEADS, 2, D), np.float32), 0, tree_parents=[-1, 0])


def test_calls_from_two_threads_run_one_at_a_time():
    """A cache's calls release the GIL: one thread appending (its blocks growing and moving) while
    another attends run one at a time, each attend over the tokens held when it ran."""
    import threading
    import time
    cache = attn.KVCache(1, 1, 32, block_size=1)
    k = np.ones((1, 64, 32), np.float32)
    cache.append(k, k, seq=0)
    q = np.ones((1, 1, 32), np.float32)
    stop = time.time() + 1.0
    errors = []

    def writer():
        while time.time() < stop:
            cache.append(k, k, seq=0)
            if cache.length(0) > 2000:
                cache.truncate(0, 64)

    def reader():
        while time.time() < stop:
            out = cache.attend(q, 0)
            if not np.allclose(out, 1.0):  # every value row is ones
                errors.append(out)
            cache.nbytes

    threads = [threading.Thread(target=f) for f in (writer, reader, reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_rotary_tables_are_copied():
    """The cache keeps its own float32 copy of the rotary tables: changing the caller's arrays later
    changes nothing."""
    angles = np.random.default_rng(2).standard_normal((8, D // 2)).astype(np.float32)
    cos, sin = np.cos(angles), np.sin(angles)
    keys = np.random.default_rng(3).standard_normal((KV_HEADS, 3, D)).astype(np.float32)
    caches = [attn.KVCache(1, KV_HEADS, D, rotary_cos=cos, rotary_sin=sin) for _ in range(2)]
    caches[0].append(keys, keys, seq=0)
    cos[:], sin[:] = 0, 0
    caches[1].append(keys, keys, seq=0)
    np.testing.assert_array_equal(caches[0].keys(0), caches[1].keys(0))


def test_more_bad_input_is_named():
    cache = attn.KVCache(2, KV_HEADS, D)
    cache.append(np.zeros((2, KV_HEADS, 3, D), np.float32), np.zeros((2, KV_HEADS, 3, D), np.float32))
    q = np.zeros((5, HEADS, D), np.float32)
    # Integers past int64 as any other out of range entry, named.
    with pytest.raises(ValueError, match="cu_seqlens_q has an entry outside int32's range"):
        cache.attend_batch(q, np.array([0, 2**64 - 1], np.uint64))
    with pytest.raises(ValueError, match="seqs has an entry outside int32's range"):
        cache.attend_batch(q[:2], [0, 2], seqs=np.array([2**63], np.uint64))
    with pytest.raises(TypeError, match="tree_parents has dtype float64; it must hold integers"):
        cache.attend(np.zeros((HEADS, 2, D), np.float32), 0, tree_parents=[-1.0, 0.0])
    with pytest.raises(ValueError, match=r"tree_parents holds 18446744073709551615; its entries must lie in \[-1, t\)"):
        cache.attend(np.zeros((HEADS, 2, D), np.float32), 0, tree_parents=np.array([2**64 - 1, 0], np.uint64))
    # A tree's bad parent in a mixed batch named by its packed row and its entry.
    with pytest.raises(ValueError, match=r"tree_parents\[3\] is 2; it is draft 0 of entry 1 \(rows 3 to 5\)"):
        cache.attend_batch(q, [0, 3, 5], tree_parents=[-1, 0, 0, 2, 3])
    cache.attend(np.zeros((HEADS, 2, D), np.float32), 0, tree_parents=[-1, 0])
    with pytest.raises(ValueError, match="accepted has an entry outside int32's range"):
        cache.commit_tree(0, [2**63])
    # A number is not a list of drafts (it had been read as [3]: one draft kept).
    with pytest.raises(ValueError, match="accepted has 0 dimensions; it must be a list of draft indices"):
        cache.commit_tree(0, 1)
    with pytest.raises(ValueError, match=r"cu_seqlens_q has shape \(\); it must be \(B \+ 1,\)"):
        cache.attend_batch(q, 5)
    # An empty batch: no entry, no sequence named.
    assert cache.attend_batch(np.zeros((0, HEADS, D), np.float32), [0], seqs=np.zeros(0, np.int64)).shape == (0, HEADS, D)
    # A float8 scale whose largest value overflows float32.
    with pytest.raises(ValueError, match="k_scale holds 1e\\+38; a float8_e4m3 cache's scale times its largest value"):
        attn.KVCache(1, 1, 32, dtype="float8_e4m3", k_scale=1e38)
