"""cli_numpy.py ATTN DIR: `attn` on files that numpy itself wrote, in the forms numpy may write
them (Fortran order, format versions 2.0 and 3.0, int32 and int64 lengths), checked against the
seeds' formulas computed in numpy: an oracle independent of the library. Exits 77 without numpy.
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
    """The keep-mask of valid lengths (B,) or (B, n) for scores (B, n, m), as the seeds' sequence_mask."""
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

# additive: the seeds' formula w_v^T tanh(W_q q + W_k k) with nn.Linear weight layouts.
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
print("attn agrees with numpy")
