"""Helpers of the Python module's tests: the error budget of STYLE.md, torch on NumPy inputs, the
GIL probe."""
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # Debian's python3-torch: the oracle

# float64's and float32's unit roundoff: their ratio scales float32's measured error to float64.
EPS_RATIO = np.finfo(np.float64).eps / np.finfo(np.float32).eps


def max_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, f"shapes {a.shape} and {b.shape} differ"
    return float(np.abs(a - b).max()) if a.size else 0.0


def assert_within_budget(got, ref32, ref64, what, scale=None):
    """STYLE.md's rule (flash-attention's): attn's float32 result may be off torch's float64 result
    by at most twice torch float32's own error, plus a floor for results torch float32 gets almost
    exactly: 1e-6 times the result's largest magnitude (at least 1), about 8 float32 ulps of it.
    A float64 result gets the same rule with the float32 error scaled to float64's roundoff (and a
    floor scaled likewise): two float64 computations differ by about that much. `scale`, where given,
    replaces the result's largest magnitude in the floor: for a result that sums terms which cancel
    (a gradient through a softmax over one key is 0 in real arithmetic, but its terms are not)."""
    ref_err = max_err(ref32, ref64)
    if scale is None:
        scale = float(np.abs(ref64).max()) if np.asarray(ref64).size else 1.0
    scale = max(1.0, scale)
    if np.asarray(got).dtype == np.float32:
        budget = 2 * ref_err + 1e-6 * scale
    else:
        budget = 2 * ref_err * EPS_RATIO + 1e-6 * EPS_RATIO * scale
    err = max_err(got, ref64)
    assert err <= budget, f"{what}: attn error {err:.3g} exceeds the budget {budget:.3g} (torch float32 error {ref_err:.3g})"


def tensors(arrays, dtype, requires_grad=()):
    """torch tensors of the NumPy `arrays` (a dict), floating ones cast to `dtype`; the names in
    requires_grad get gradients."""
    out = {}
    for name, a in arrays.items():
        if a is None:
            out[name] = None
            continue
        t = torch.from_numpy(np.array(a))
        if t.is_floating_point():
            t = t.to(dtype)
        if name in requires_grad:
            t.requires_grad_()
        out[name] = t
    return out


def torch_both(run, arrays, requires_grad=()):
    """run(tensors) -> dict of result tensors, in torch float32 and float64 on the same inputs;
    returns {name: (float32 array, float64 array)}."""
    results = {}
    for dtype in (torch.float32, torch.float64):
        for name, t in run(tensors(arrays, dtype, requires_grad)).items():
            results.setdefault(name, []).append(t.detach().numpy())
    return {name: tuple(pair) for name, pair in results.items()}


def grads(loss, named):
    """{name: gradient} of the scalar loss with respect to each tensor of `named` (zeros where unused)."""
    gs = torch.autograd.grad(loss, list(named.values()), allow_unused=True)
    return {n: (torch.zeros_like(t) if g is None else g) for (n, t), g in zip(named.items(), gs)}


def draw_lens(rng, kind, B, n, m, zero=False):
    """valid_lens: None, (B,) ("batch") or (B, n) ("query"), values in [1, m] (with zero=True every
    third length is 0, a row with no key)."""
    if kind is None:
        return None
    lens = rng.integers(1, m + 1, size=(B,) if kind == "batch" else (B, n))
    if zero:
        lens.reshape(-1)[::3] = 0
    return lens


def longest_pause_during_a_call(call):
    """The longest stretch in which the main thread could not run Python while another thread ran
    call(), and how long call() takes alone."""
    start = time.perf_counter()
    call()
    duration = time.perf_counter() - start
    go, done = threading.Event(), threading.Event()

    def work():
        go.wait()  # start the call once the main thread is in its loop
        call()
        done.set()

    worker = threading.Thread(target=work)
    worker.start()
    last = time.perf_counter()
    longest_pause = 0.0
    go.set()
    while not done.is_set():
        now = time.perf_counter()
        longest_pause, last = max(longest_pause, now - last), now
    worker.join()
    return longest_pause, duration
