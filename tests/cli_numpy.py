"""cli_numpy.py ATTN DIR: `attn` on files that numpy itself wrote, in the forms numpy may write
them (Fortran order, format versions 2.0 and 3.0, int32 and int64 lengths), checked against the
d2l chapter's formulas computed in numpy: an oracle independent of the library. Exits 77 without numpy.
"""
import os
import subprocess
import sys

try:
    import numpy as np
    from numpy.lib import format as npformat
except ImportError:
    print("numpy is not available: skipped")
    sys.exit(77)

attn, root = sys.argv[1], sys.argv[2]
os.makedirs(root, exist_ok=True)
rng = np.random.default_rng(0)


def path(name):
    return os.path.join(root, name)


def save(name, array, version=None, fortran=False):
    """np.save, or numpy's writer with an explicit format version and memory order."""
    array = np.asfortranarray(array) if fortran else np.ascontiguousarray(array)
    with open(path(name), "wb") as f:
        npformat.write_array(f, array, version=version)
    return path(name)


def run(*args):
    result = subprocess.run([attn, *args], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"attn {' '.join(args)} failed with {result.returncode}: {result.stderr}")
    return result


def masked_softmax(scores, keep):
    """Softmax over the last axis of the kept entries; rows with none kept are 0 (attn's rule)."""
    x = np.where(keep, scores, -np.inf)
    m = np.max(x, axis=-1, keepdims=True)
    e = np.where(keep, np.exp(x - np.where(np.isfinite(m), m, 0)), 0)
    s = e.sum(axis=-1, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


def lengths_keep(lens, shape):
    """The keep-mask of valid lengths (B,) or (B, n) for scores (B, n, m), as the d2l chapter's sequence_mask."""
    B, n, m = shape
    lens = np.broadcast_to(lens.reshape(B, -1), (B, n))
    return np.arange(m)[None, None, :] < lens[:, :, None]


def check(name, got, want, tol):
    err = np.max(np.abs(got - want)) if got.size else 0.0
    if got.shape != want.shape or got.dtype != want.dtype or not err <= tol:
        sys.exit(f"{name}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}, max error {err}")
    print(f"{name}: {got.dtype}{got.shape}, max error {err:.2e}")


# softmax: Fortran-order float64 scores in format 2.0, (B, n) int32 lengths including a 0.
scores = rng.normal(size=(3, 4, 7)) * 5
lens = np.array([[1, 0, 7, 3], [2, 2, 5, 6], [7, 4, 1, 0]], dtype=np.int32)
run("softmax", "--scores", save("S.npy", scores, (2, 0), fortran=True), "--valid-lens", save("L.npy", lens),
    "--out", path("W.npy"))
check("softmax", np.load(path("W.npy")), masked_softmax(scores, lengths_keep(lens, scores.shape)), 1e-12)

# sdpa in float32 with (B,) int64 lengths and a causal mask, files in format 3.0.
q = rng.normal(size=(2, 5, 8)).astype(np.float32)
k = rng.normal(size=(2, 6, 8)).astype(np.float32)
v = rng.normal(size=(2, 6, 3)).astype(np.float32)
lens = np.array([4, 6])
run("sdpa", "--queries", save("Q.npy", q, (3, 0)), "--keys", save("K.npy", k, (3, 0)), "--values",
    save("V.npy", v, (3, 0), fortran=True), "--valid-lens", save("LB.npy", lens), "--causal", "--out", path("O.npy"),
    "--weights", path("SW.npy"))
keep = lengths_keep(lens, (2, 5, 6)) & (np.arange(6)[None, :] <= np.arange(5)[:, None])
weights = masked_softmax(q.astype(np.float64) @ k.astype(np.float64).transpose(0, 2, 1) / np.sqrt(8), keep)
check("sdpa weights", np.load(path("SW.npy")).astype(np.float64), weights, 1e-6)
check("sdpa out", np.load(path("O.npy")), (weights @ v.astype(np.float64)).astype(np.float32), 1e-5)

# additive: the d2l chapter's formula w_v^T tanh(W_q q + W_k k) with nn.Linear weight layouts.
q = rng.normal(size=(2, 3, 5))
k = rng.normal(size=(2, 4, 2))
v = rng.normal(size=(2, 4, 3))
wq, wk, wv = rng.normal(size=(6, 5)), rng.normal(size=(6, 2)), rng.normal(size=6)
run("additive", "--queries", save("AQ.npy", q), "--keys", save("AK.npy", k), "--values", save("AV.npy", v),
    "--wq", save("WQ.npy", wq, fortran=True), "--wk", save("WK.npy", wk), "--wv", save("WV.npy", wv),
    "--out", path("AO.npy"))
features = np.tanh((q @ wq.T)[:, :, None, :] + (k @ wk.T)[:, None, :, :])
check("additive", np.load(path("AO.npy")), masked_softmax(features @ wv, np.ones((2, 3, 4), bool)) @ v, 1e-12)

# nw: the Gaussian kernel's f(x) = sum_i softmax(-(x - x_i)^2 / (2 w^2)) y_i.
x = np.sort(rng.uniform(0, 5, 50))
y = 2 * np.sin(x) + x**0.8 + rng.normal(0, 0.5, 50)
xq = np.arange(0, 5, 0.1)
run("nw", "--x-train", save("X.npy", x), "--y-train", save("Y.npy", y), "--x-query", save("XQ.npy", xq),
    "--kernel", "gaussian", "--width", "0.5", "--out", path("YHAT.npy"))
w = masked_softmax(-((xq[:, None] - x[None, :]) ** 2) / (2 * 0.5**2), np.ones((50, 50), bool))
check("nw", np.load(path("YHAT.npy")), w @ y, 1e-12)
# sdpa on float16 files: float16 out; and float32 files through --compute bf16: float32 out. Each
# within twice the error of float32 on the same (rounded) values rounded to the 16-bit type.
def bf16(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)


def attention(q, k, v):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    return masked_softmax(q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1]), np.ones((q.shape[0], q.shape[1], k.shape[1]), bool)) @ v


q, k, v = (rng.normal(size=s) for s in [(2, 9, 16), (2, 11, 16), (2, 11, 4)])
q16, k16, v16 = (x.astype(np.float16) for x in (q, k, v))
run("sdpa", "--queries", save("Q16.npy", q16), "--keys", save("K16.npy", k16), "--values", save("V16.npy", v16),
    "--out", path("O16.npy"))
exact = attention(q16, k16, v16)
got = np.load(path("O16.npy"))
check("sdpa float16", got.astype(np.float64), exact, 2 * np.abs(exact.astype(np.float16) - exact).max() + 1e-6)
assert got.dtype == np.float16, got.dtype
# float16 ALiBi slopes with float16 files (the inputs' type, widened exactly), bottom-right causal.
slopes16 = np.array([[0.3], [0.75]], np.float16)  # (B, H): H = 1 for 3-d inputs
run("sdpa", "--queries", path("Q16.npy"), "--keys", path("K16.npy"), "--values", path("V16.npy"), "--alibi",
    save("A16.npy", slopes16), "--causal", "--bottom-right", "--out", path("O16A.npy"))
n16, m16 = q16.shape[1], k16.shape[1]
pos = np.arange(n16)[:, None] + (m16 - n16)
bias = -slopes16.astype(np.float64)[:, :, None] * np.abs(pos - np.arange(m16)[None, :])
qd, kd, vd = (np.asarray(x, np.float64) for x in (q16, k16, v16))
exact = masked_softmax(qd @ kd.transpose(0, 2, 1) / np.sqrt(qd.shape[-1]) + bias,
                       np.broadcast_to(np.arange(m16)[None, :] <= pos, (2, n16, m16))) @ vd
got = np.load(path("O16A.npy"))
check("sdpa float16 alibi", got.astype(np.float64), exact, 2 * np.abs(exact.astype(np.float16) - exact).max() + 1e-6)
q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
run("sdpa", "--queries", save("Q32.npy", q32), "--keys", save("K32.npy", k32), "--values", save("V32.npy", v32),
    "--compute", "bf16", "--out", path("OB.npy"))
exact = attention(bf16(q32), bf16(k32), bf16(v32))
got = np.load(path("OB.npy"))
check("sdpa --compute bf16", got.astype(np.float64), exact, 2 * np.abs(bf16(exact) - exact).max() + 1e-6)
assert got.dtype == np.float32, got.dtype
# --compute int8 on float32 files: float32 out and lse, close to float64 attention on the true
# values (an approximation: cosine similarity above 0.999, each element within 5% of the largest).
run("sdpa", "--queries", path("Q32.npy"), "--keys", path("K32.npy"), "--values", path("V32.npy"), "--compute", "int8",
    "--out", path("O8.npy"), "--lse", path("L8.npy"))
exact = attention(q32, k32, v32)
got = np.load(path("O8.npy"))
assert got.dtype == np.float32 and np.load(path("L8.npy")).dtype == np.float32, got.dtype
cos = float((got.ravel() @ exact.ravel()) / np.sqrt((got.ravel() @ got.ravel()) * (exact.ravel() @ exact.ravel())))
if cos < 0.999:
    sys.exit(f"sdpa --compute int8: cosine similarity {cos} with float64 attention, below 0.999")
check("sdpa --compute int8", got.astype(np.float64), exact, 0.05 * np.abs(exact).max())
for args, expected in [(["--keys", path("K32.npy")], "holds float32; with float16 inputs all of queries, keys and values must be float16"),
                       (["--compute", "int8"], "--compute int8 takes float32 queries, keys and values; float16 files run in float16"),
                       (["--weights", path("W16.npy")], "--weights and --heatmap need float32 or float64"),
                       (["--compute", "bf16"], "--compute bf16 takes float32 queries, keys and values; float16 files run in float16")]:
    flags = {"--queries": path("Q16.npy"), "--keys": path("K16.npy"), "--values": path("V16.npy")}
    extra = []
    for i in range(0, len(args), 2):
        if args[i] in flags:
            flags[args[i]] = args[i + 1]
        else:
            extra += args[i:i + 2]
    result = subprocess.run([attn, "sdpa", *sum(([f, p] for f, p in flags.items()), []), "--out", path("X.npy"), *extra],
                            capture_output=True, text=True)
    if result.returncode != 2 or expected not in result.stderr:
        sys.exit(f"attn sdpa {args}: expected exit 2 and '{expected}', got {result.returncode}: {result.stderr}")
print("attn agrees with numpy")
