"""attn.nadaraya_watson against the d2l chapter's estimator written in torch (d2l_torch.nadaraya_watson):
the d2l chapter's 1-D regression, vectors, batches, every kernel and width."""
import numpy as np
import pytest

import attn
import d2l_torch
from helpers import assert_within_budget, torch_both

KERNELS = ["gaussian", "boxcar", "epanechnikov", "constant"]
# u = |x - x_i| / width must stay this far from 1 for the compact kernels: at 1 the boxcar jumps, and
# float32 and float64 may fall on different sides of it (as tests/torch/make_cases.py).
EDGE = 1e-5


def regression(rng):
    """d2l's toy data: 50 sorted uniform(0, 5) points, y = 2 sin(x) + x^0.8 + noise, queries 0..4.9."""
    x_train = np.sort(rng.random(50) * 5).astype(np.float32)
    y_train = (2 * np.sin(x_train) + x_train**0.8 + rng.normal(0.0, 0.5, 50)).astype(np.float32)
    return x_train, y_train, np.arange(0, 5, 0.1).astype(np.float32)


def away_from_edges(x_train, x_query, width):
    """True when no |x - x_i| / width is near 1 and every query has a training point inside it."""
    xt = x_train.reshape(*x_train.shape[:-2], -1, x_train.shape[-1]) if x_train.ndim > 1 else x_train[:, None]
    xq = x_query.reshape(*x_query.shape[:-2], -1, x_query.shape[-1]) if x_query.ndim > 1 else x_query[:, None]
    u = np.linalg.norm(xq[..., :, None, :].astype(np.float64) - xt[..., None, :, :], axis=-1) / width
    return np.abs(u - 1).min() > EDGE and (u < 1).any(axis=-1).all()


def torch_results(x_train, y_train, x_query, kernel, width):
    """torch float32 and float64 of the d2l chapter's estimator, on the arrays as (B, len, features) (heads
    folded into the batch)."""
    def batch(a):
        return a.reshape(1, -1, 1) if a.ndim == 1 else a[None] if a.ndim == 2 else a.reshape(-1, *a.shape[-2:])

    arrays = {"xt": batch(x_train), "yt": batch(y_train), "xq": batch(x_query)}

    def run(t):
        y_hat, weights = d2l_torch.nadaraya_watson(t["xq"], t["xt"], t["yt"], kernel, width)
        return {"y_hat": y_hat, "weights": weights}

    return torch_both(run, arrays)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel,width", [(k, 1.0) for k in KERNELS] + [("gaussian", 0.1), ("gaussian", 0.5),
                                                                           ("boxcar", 0.5), ("epanechnikov", 2.0)])
def test_the_d2l_regression(rng, kernel, width, dtype):
    for _ in range(100):  # redraw until the compact kernels' edges are out of the way
        x_train, y_train, x_query = regression(rng)
        if kernel in ("gaussian", "constant") or away_from_edges(x_train, x_query, width):
            break
    else:
        pytest.fail(f"no draw keeps the {kernel} kernel's edges out of the way")
    refs = torch_results(x_train, y_train, x_query, kernel, width)
    y_hat, weights = attn.nadaraya_watson(x_train.astype(dtype), y_train.astype(dtype), x_query.astype(dtype),
                                          kernel=kernel, width=width, return_weights=True)
    assert y_hat.shape == (50,) and weights.shape == (50, 50) and y_hat.dtype == dtype
    assert_within_budget(y_hat, refs["y_hat"][0].reshape(50), refs["y_hat"][1].reshape(50), "y_hat")
    assert_within_budget(weights, refs["weights"][0][0], refs["weights"][1][0], "weights")


@pytest.mark.parametrize("form", ["vectors", "vector_points_scalar_targets", "batch", "heads"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_vectors_and_batches(rng, kernel, form):
    p, v, n, m, width = 3, 4, 37, 53, 2.5
    lead = {"batch": (2,), "heads": (2, 3)}.get(form, ())
    for _ in range(100):
        x_train = rng.standard_normal((*lead, m, p)).astype(np.float32)
        x_query = rng.standard_normal((*lead, n, p)).astype(np.float32)
        if kernel in ("gaussian", "constant") or away_from_edges(x_train, x_query, width):
            break
    else:
        pytest.fail(f"no draw keeps the {kernel} kernel's edges out of the way")
    y_train = rng.standard_normal((m,) if form == "vector_points_scalar_targets" else (*lead, m, v)).astype(np.float32)
    refs = torch_results(x_train, y_train, x_query, kernel, width)
    y_hat, weights = attn.nadaraya_watson(x_train, y_train, x_query, kernel, width, return_weights=True)
    expected = (n,) if form == "vector_points_scalar_targets" else (*lead, n, v)
    assert y_hat.shape == expected and weights.shape == (*lead, n, m)
    assert_within_budget(y_hat, refs["y_hat"][0].reshape(expected), refs["y_hat"][1].reshape(expected), "y_hat")
    assert_within_budget(weights, refs["weights"][0].reshape(weights.shape), refs["weights"][1].reshape(weights.shape),
                         "weights")


def test_a_query_outside_every_support_predicts_zero():
    y_hat, weights = attn.nadaraya_watson(np.array([0.0, 1.0]), np.array([5.0, 7.0]), np.array([0.5, 10.0]),
                                          kernel="boxcar", return_weights=True)
    assert y_hat[0] == 6.0 and y_hat[1] == 0.0 and np.all(weights[1] == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_gaussian_at_a_tiny_width_or_far_away_is_the_nearest_points_value(dtype):
    # The softmax's limit: the nearest training point's value (the mean of two equally near ones),
    # with and without the weights (two paths), on every SIMD target.
    x, y = np.array([0, 1, 2], dtype), np.array([1, 2, 3], dtype)
    tiny, far = (dtype(1e-10), dtype(1e20)) if dtype == np.float32 else (1e-100, 1e155)
    before = attn.simd_target()
    try:
        for target in attn.simd_targets():
            attn.set_simd_target(target)
            for weights in (False, True):
                near = attn.nadaraya_watson(x, y, np.array([0.4, 0.6, 1.5], dtype), width=tiny, return_weights=weights)
                away = attn.nadaraya_watson(x, y, np.array([far, -far], dtype), width=0.5, return_weights=weights)
                near, away = (near[0], away[0]) if weights else (near, away)
                np.testing.assert_array_equal(near, [1, 2, 2.5], err_msg=target)
                np.testing.assert_array_equal(away, [3, 1], err_msg=target)
    finally:
        attn.set_simd_target(before)


def test_a_query_or_key_of_no_dimensions_is_named():
    with pytest.raises(ValueError, match=r"x_query has shape \(\); it must have 1 to 4 dimensions"):
        attn.nadaraya_watson(np.array([1.0, 2.0]), np.array([1.0, 2.0]), np.array(1.5))


def test_the_gaussian_is_the_d2l_softmax_formula(rng):
    # f(x) = sum_i softmax(-1/2 (x - x_i)^2) y_i, in NumPy, in float64.
    x_train, y_train, x_query = (a.astype(np.float64) for a in regression(rng))
    s = -0.5 * (x_query[:, None] - x_train[None, :]) ** 2
    w = np.exp(s - s.max(1, keepdims=True))
    w /= w.sum(1, keepdims=True)
    np.testing.assert_allclose(attn.nadaraya_watson(x_train, y_train, x_query), w @ y_train, rtol=1e-12, atol=1e-12)


def loo_error_by_refits(x, y, width):
    """The leave-one-out squared error by brute force: N fits, each without one point."""
    errors = []
    for i in range(len(x)):
        keep = np.arange(len(x)) != i
        errors.append((attn.nadaraya_watson(x[keep], y[keep], x[i:i + 1], "gaussian", width)[0] - y[i]) ** 2)
    return float(np.mean(errors))


def test_width_auto_uses_the_leave_one_out_width(rng):
    x = np.sort(rng.uniform(0, 5, 40))
    y = 2 * np.sin(x) + x ** 0.8 + rng.normal(0, 0.5, 40)
    widths, loo_error = attn.select_width(x, y, "gaussian")
    assert widths.shape == (1,) and widths[0] > 0
    assert loo_error == pytest.approx(loo_error_by_refits(x, y, float(widths[0])), rel=1e-9)
    # Nearby widths do no better by the criterion it minimises.
    for factor in (0.8, 1.25):
        assert loo_error <= loo_error_by_refits(x, y, float(widths[0]) * factor) + 1e-12
    xq = np.arange(0, 5, 0.1)
    np.testing.assert_array_equal(attn.nadaraya_watson(x, y, xq, width="auto"),
                                  attn.nadaraya_watson(x, y, xq, width=float(widths[0])))
    with pytest.raises(TypeError, match="width must be a number"):
        attn.nadaraya_watson(x, y, xq, width="wide")
