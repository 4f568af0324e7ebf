"""attn.KernelReg against statsmodels' KernelReg on the same data, and plug_in_bandwidth.

statsmodels is the oracle where the two compute the same thing: fits, marginal effects, R^2 and the
criteria at given bandwidths (to 1e-9), and the bandwidths its search finds on a smooth problem.
Where attn differs on purpose (attn/kernel_reg.py's docstring), the oracle is weighted least squares
by hand (local linear fits on mixed data), or the test states the relation:
local constant marginal effects are nobs / 2 times statsmodels' (its d_gaussian is twice the
derivative, and its final quotient keeps a 1 / nobs that does not cancel).
statsmodels loops in Python, so the data are small (n <= 100).
"""
import time

import numpy as np
import pytest

import attn

sm_kr = pytest.importorskip("statsmodels.nonparametric.kernel_regression")
SMKernelReg = sm_kr.KernelReg

TOL = dict(rtol=1e-9, atol=1e-9)


def smooth_data(n, k, seed=0, noise=0.1):
    """x (n, k) uniform on [-2, 2], y a smooth function of it plus noise."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, (n, k))
    y = np.sin(1.3 * x[:, 0]) + (0.5 * x[:, 1] ** 2 if k > 1 else 0) + noise * rng.normal(size=n)
    return x, y


def mixed_data(var_type, n=60, seed=1):
    """One column per letter of var_type: 'c' uniform on [0, 3], 'u' 3 levels, 'o' 4 levels, each level
    held by at least 2 points."""
    rng = np.random.default_rng(seed)
    cols = []
    for c in var_type:
        if c == "c":
            cols.append(rng.uniform(0, 3, n))
        else:
            levels = 3 if c == "u" else 4
            cols.append(rng.permutation(np.arange(n) % levels).astype(float))
    x = np.column_stack(cols)
    y = np.cos(x[:, 0]) + sum(0.4 * (j + 1) * x[:, j] for j in range(1, len(var_type))) + 0.1 * rng.normal(size=n)
    return x, y


# Bandwidths for the letters of var_type: continuous 0.4, Aitchison-Aitken 0.3 (of at most 2/3),
# Wang-van Ryzin 0.4.
MIXED_BW = {"c": 0.4, "u": 0.3, "o": 0.4}


@pytest.mark.parametrize("k, bw", [(1, [0.35]), (2, [0.5, 0.7])])
@pytest.mark.parametrize("reg_type", ["lc", "ll"])
def test_fixed_bandwidths_match_statsmodels(k, bw, reg_type):
    x, y = smooth_data(60, k)
    var_type = "c" * k
    ours = attn.KernelReg(y, x, var_type, reg_type=reg_type, bw=bw)
    theirs = SMKernelReg(y, x, var_type, reg_type=reg_type, bw=bw)
    np.testing.assert_array_equal(ours.bw, bw)
    queries = np.random.default_rng(2).uniform(-2.5, 2.5, (17, k))  # some outside the data
    for predict in (None, queries):
        mean, mfx = ours.fit(predict)
        sm_mean, sm_mfx = theirs.fit(predict)
        assert mean.shape == sm_mean.shape and mfx.shape == sm_mfx.shape
        np.testing.assert_allclose(mean, sm_mean, **TOL)
        if reg_type == "ll":
            np.testing.assert_allclose(mfx, sm_mfx, **TOL)
    np.testing.assert_allclose(ours.r_squared(), theirs.r_squared(), **TOL)


def test_local_constant_slopes_relate_to_statsmodels():
    """statsmodels' local constant marginal effects are 2 / nobs times the derivative of the
    Nadaraya-Watson estimate: its d_gaussian is 2 (x_i - x) K / h^2, twice the Gaussian's derivative,
    and B_x = (G_numer d_fx - G_denom d_mx) / G_denom^2 divides sums that carry a 1 / nobs by
    unscaled ones. attn's are the derivative, checked here by central differences too."""
    x, y = smooth_data(50, 1)
    ours = attn.KernelReg(y, x, "c", reg_type="lc", bw=[0.3])
    theirs = SMKernelReg(y, x, "c", reg_type="lc", bw=[0.3])
    q = np.linspace(-1.9, 1.9, 11)
    _, mfx = ours.fit(q)
    np.testing.assert_allclose(mfx, theirs.fit(q)[1] * (50 / 2), **TOL)
    e = 1e-6
    numeric = (ours.fit(q + e)[0] - ours.fit(q - e)[0]) / (2 * e)
    np.testing.assert_allclose(mfx[:, 0], numeric, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("var_type", ["cu", "co", "cuo"])
def test_local_constant_mixed_data_matches_statsmodels(var_type):
    x, y = mixed_data(var_type)
    bw = [MIXED_BW[c] for c in var_type]
    ours = attn.KernelReg(y, x, var_type, reg_type="lc", bw=bw)
    theirs = SMKernelReg(y, x, var_type, reg_type="lc", bw=bw)
    queries = np.column_stack([np.linspace(0.1, 2.9, 9)] + [np.arange(9) % (3 if c == "u" else 4)
                                                            for c in var_type[1:]]).astype(float)
    for predict in (None, queries):
        mean, mfx = ours.fit(predict)
        sm_mean, sm_mfx = theirs.fit(predict)
        np.testing.assert_allclose(mean, sm_mean, **TOL)
        # One continuous column: statsmodels' marginal effect (broadcast to every column) is 2 / nobs
        # times attn's in that column; attn's discrete columns are 0.
        np.testing.assert_allclose(mfx[:, 0], sm_mfx[:, 0] * (len(y) / 2), **TOL)
        assert np.all(mfx[:, 1:] == 0)
    np.testing.assert_allclose(ours.r_squared(), theirs.r_squared(), **TOL)
    np.testing.assert_allclose(ours.loo_error, float(np.squeeze(theirs.cv_loo(np.asarray(bw), theirs._est_loc_constant))),
                               **TOL)


def local_linear_reference(x, y, var_type, bw, queries):
    """The local linear fit with the polynomial in the continuous columns only (Racine and Li), by
    weighted least squares at each point: (mean, slopes, smoother rows (nq, n))."""
    levels = [len(np.unique(x[:, j])) for j in range(x.shape[1])]
    cont = [j for j, c in enumerate(var_type) if c == "c"]
    mean, slopes, rows = [], [], []
    for q in queries:
        w = np.ones(len(y))
        for j, c in enumerate(var_type):
            d = x[:, j] - q[j]
            if c == "c":
                w *= np.exp(-0.5 * (d / bw[j]) ** 2)
            elif c == "u":
                w *= np.where(d == 0, 1 - bw[j], bw[j] / (levels[j] - 1))
            else:
                w *= np.where(d == 0, 1 - bw[j], 0.5 * (1 - bw[j]) * bw[j] ** np.abs(d))
        z = np.column_stack([np.ones(len(y))] + [x[:, j] - q[j] for j in cont])
        a = np.linalg.solve(z.T @ (w[:, None] * z), (w[:, None] * z).T)
        mean.append(a[0] @ y)
        s = np.zeros(x.shape[1])
        s[cont] = a[1:] @ y
        slopes.append(s)
        rows.append(a[0])
    return np.array(mean), np.array(slopes), np.array(rows)


@pytest.mark.parametrize("var_type", ["cu", "cuo"])
def test_local_linear_mixed_data_keeps_discrete_columns_out_of_the_design(var_type):
    """Where attn differs from statsmodels on purpose: with discrete regressors the local linear
    design holds the continuous ones only, checked against weighted least squares by hand, and the
    corrected AIC takes this fit's own hat matrix trace."""
    x, y = mixed_data(var_type)
    bw = [MIXED_BW[c] for c in var_type]
    ours = attn.KernelReg(y, x, var_type, reg_type="ll", bw=bw)
    mean, slopes, hat = local_linear_reference(x, y, var_type, bw, x)
    fit_mean, fit_slopes = ours.fit()
    np.testing.assert_allclose(fit_mean, mean, **TOL)
    np.testing.assert_allclose(fit_slopes, slopes, **TOL)
    n, trace = len(y), np.trace(hat)
    aicc = np.log(np.mean((y - mean) ** 2)) + (1 + trace / n) / (1 - (trace + 2) / n)
    np.testing.assert_allclose(ours.aicc(), aicc, **TOL)
    sm_mean = SMKernelReg(y, x, var_type, reg_type="ll", bw=bw).fit()[0]
    assert np.max(np.abs(sm_mean - mean)) > 1e-6  # statsmodels' design has the discrete columns too


@pytest.mark.parametrize("reg_type", ["lc", "ll"])
@pytest.mark.parametrize("k", [1, 2])
def test_cv_ls_matches_statsmodels_cv_loo(reg_type, k):
    x, y = smooth_data(50, k, seed=3)
    bw = np.array([0.4, 0.8][:k])
    ours = attn.KernelReg(y, x, "c" * k, reg_type=reg_type, bw=bw)
    theirs = SMKernelReg(y, x, "c" * k, reg_type=reg_type, bw=bw)
    estimator = theirs._est_loc_linear if reg_type == "ll" else theirs._est_loc_constant
    expected = theirs.cv_loo(bw, estimator)
    np.testing.assert_allclose(ours.loo_error, expected, **TOL)
    np.testing.assert_allclose(ours.cv_ls(bw * 1.5), theirs.cv_loo(bw * 1.5, estimator), **TOL)


@pytest.mark.parametrize("var_type, bw", [("c", [0.3]), ("cc", [0.5, 0.9]), ("cu", [0.4, 0.3])])
def test_aicc_matches_statsmodels_aic_hurvich_local_constant(var_type, bw):
    """statsmodels' aic_hurvich takes the local constant hat matrix's trace for every reg_type; for
    reg_type="lc" that is attn's own degree's, and the two agree."""
    x, y = (mixed_data(var_type, n=50) if "u" in var_type else smooth_data(50, len(var_type), seed=4))
    ours = attn.KernelReg(y, x, var_type, reg_type="lc", bw=bw)
    theirs = SMKernelReg(y, x, var_type, reg_type="lc", bw=bw)
    np.testing.assert_allclose(ours.aicc(), float(np.squeeze(theirs.aic_hurvich(np.asarray(bw)))), **TOL)


@pytest.mark.parametrize("reg_type", ["lc", "ll"])
def test_cv_ls_search_reaches_statsmodels_minimum(reg_type):
    """A smooth unimodal problem (n = 100): attn's criterion at its bandwidth is no higher than
    statsmodels' at its own (Nelder-Mead stops within about 1e-4 of the minimum), and the two
    bandwidths agree to 1e-3."""
    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, 100)
    y = np.exp(-x**2) + 0.1 * rng.normal(size=100)
    ours = attn.KernelReg(y, x, "c", reg_type=reg_type, bw="cv_ls")
    theirs = SMKernelReg(y, x, "c", reg_type=reg_type, bw="cv_ls")
    estimator = theirs._est_loc_linear if reg_type == "ll" else theirs._est_loc_constant
    sm_value = float(np.squeeze(theirs.cv_loo(np.abs(theirs.bw), estimator)))
    print(f"{reg_type}: attn bw {ours.bw[0]:.6f} cv {ours.loo_error:.12g}; "
          f"statsmodels bw {abs(theirs.bw[0]):.6f} cv {sm_value:.12g}")
    assert ours.loo_error <= sm_value * (1 + 1e-12)
    np.testing.assert_allclose(ours.bw, np.abs(theirs.bw), rtol=1e-3)
    np.testing.assert_allclose(ours.loo_error, ours.cv_ls(ours.bw), **TOL)  # the objective it reports


def test_degree_overrides_reg_type():
    x, y = smooth_data(40, 1, seed=6)
    lc = attn.KernelReg(y, x, "c", reg_type="lc", bw=[0.3])
    as_lc = attn.KernelReg(y, x, "c", reg_type="ll", bw=[0.3], degree=0)
    np.testing.assert_array_equal(as_lc.fit()[0], lc.fit()[0])
    assert as_lc.degree == 0 and as_lc.reg_type == "ll"
    # Degree 2 reproduces a quadratic exactly, where degree 1 does not.
    q = 1.0 - 2.0 * x[:, 0] + 0.7 * x[:, 0] ** 2
    quad = attn.KernelReg(q, x, "c", bw=[0.5], degree=2)
    np.testing.assert_allclose(quad.fit()[0], q, rtol=0, atol=1e-10)
    np.testing.assert_allclose(quad.fit()[1][:, 0], -2.0 + 1.4 * x[:, 0], rtol=0, atol=1e-9)
    assert np.max(np.abs(attn.KernelReg(q, x, "c", bw=[0.5]).fit()[0] - q)) > 1e-3


@pytest.mark.parametrize("ckertype, kernel", [
    ("tricube", lambda u: np.where(np.abs(u) <= 1, (1 - np.abs(u) ** 3) ** 3, 0.0)),
    ("epanechnikov", lambda u: np.where(np.abs(u) <= 1, 1 - u**2, 0.0)),
    ("uniform", lambda u: np.where(np.abs(u) <= 1, 1.0, 0.0)),
    ("boxcar", lambda u: np.where(np.abs(u) <= 1, 1.0, 0.0)),
])
def test_compact_kernels_local_constant(ckertype, kernel):
    """The compact kernels are 0 outside |u| <= 1 (statsmodels' tricube is not: it gives points
    outside the window the kernel's value at 0): Nadaraya-Watson by hand."""
    x, y = smooth_data(80, 1, seed=7)
    q = np.linspace(-1.8, 1.8, 13)
    h = 0.5
    w = kernel((x[:, 0][None, :] - q[:, None]) / h)
    expected = (w @ y) / w.sum(axis=1)
    mean, _ = attn.KernelReg(y, x, "c", reg_type="lc", bw=[h], ckertype=ckertype).fit(q)
    np.testing.assert_allclose(mean, expected, rtol=1e-12, atol=1e-12)


def test_confidence_bands():
    x, y = smooth_data(80, 1, seed=8)
    model = attn.KernelReg(y, x, "c", bw=[0.4])
    q = np.linspace(-1.9, 1.9, 15)
    mean = model.fit(q)[0]
    low, high = model.confidence_band(q)
    assert low.shape == high.shape == (15,)
    assert np.all(low < mean) and np.all(mean < high)
    np.testing.assert_allclose((low + high) / 2, mean, rtol=1e-12, atol=1e-12)  # symmetric about the fit
    low99, high99 = model.confidence_band(q, level=0.99)
    assert np.all(high99 - low99 > high - low)
    b1 = model.confidence_band(q, method="bootstrap", seed=3, replicates=199)
    b2 = model.confidence_band(q, method="bootstrap", seed=3, replicates=199)
    b3 = model.confidence_band(q, method="bootstrap", seed=4, replicates=199)
    np.testing.assert_array_equal(b1[0], b2[0])
    np.testing.assert_array_equal(b1[1], b2[1])
    assert not np.array_equal(b1[0], b3[0])
    assert np.all(b1[0] <= b1[1])
    # The wild bootstrap's band is about as wide as the asymptotic one.
    ratio = np.median((b1[1] - b1[0]) / (high - low))
    assert 0.6 < ratio < 1.4, ratio
    with pytest.raises(ValueError, match="method"):
        model.confidence_band(q, method="jackknife")
    with pytest.raises(ValueError, match="level"):
        model.confidence_band(q, level=1.5)


def test_errors_name_the_argument():
    x, y = smooth_data(30, 2, seed=9)
    with pytest.raises(ValueError, match="var_type"):
        attn.KernelReg(y, x, "cx", bw=[1, 1])
    with pytest.raises(ValueError, match="var_type"):
        attn.KernelReg(y, x, "", bw=[1, 1])
    with pytest.raises(ValueError, match="var_type"):
        attn.KernelReg(y, x, "ccc", bw=[1, 1, 1])  # 3 letters, 2 columns
    with pytest.raises(ValueError, match="ckertype.*gaussian"):
        attn.KernelReg(y, x, "cc", bw=[1, 1], ckertype="cosine")
    with pytest.raises(ValueError, match="ukertype.*aitchison_aitken"):
        attn.KernelReg(y, x, "cc", bw=[1, 1], ukertype="liracine")
    with pytest.raises(ValueError, match="okertype.*wangvanryzin"):
        attn.KernelReg(y, x, "cc", bw=[1, 1], okertype="liracine")
    with pytest.raises(ValueError, match="bw"):
        attn.KernelReg(y, x, "cc", bw=[1, 1, 1])
    with pytest.raises(ValueError, match="bw"):
        attn.KernelReg(y, x, "cc", bw="silverman")
    with pytest.raises(ValueError, match="bw"):
        attn.KernelReg(y, x, "cc", bw=[1, -1])
    with pytest.raises(ValueError, match="reg_type"):
        attn.KernelReg(y, x, "cc", reg_type="lq", bw=[1, 1])
    with pytest.raises(ValueError, match="degree"):
        attn.KernelReg(y, x, "cc", bw=[1, 1], degree=4)
    with pytest.raises(ValueError, match="endog"):
        attn.KernelReg(y[:-1], x, "cc", bw=[1, 1])
    xd = x.copy()
    xd[:, 1] = np.round(xd[:, 1])
    xd[0, 1] = 0.5
    with pytest.raises(ValueError, match="exog"):
        attn.KernelReg(y, xd, "cu", bw=[1, 0.2])  # a discrete column with a non-integer value
    model = attn.KernelReg(y, x, "cc", bw=[1, 1])
    with pytest.raises(ValueError, match="data_predict"):
        model.fit(np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"replicates is 1099511627776; it must be at most 2147483647"):
        model.confidence_band(method="bootstrap", replicates=2**40)
    with pytest.raises(TypeError, match="replicates must be an integer; got float"):
        model.confidence_band(method="bootstrap", replicates=99.5)


def test_a_query_no_point_weighs_takes_the_nearest_points_response():
    # Distances in bandwidths past float64's range (1e200 away, or a bandwidth of 1e-300): every
    # weight is 0, and the fit is the response of the nearest point along the regressor.
    x, y = np.array([0.0, 1.0, 2.0]), np.array([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(attn.KernelReg(y, x, "c", bw=[0.5]).fit(np.array([-1e200, 1e6, 1e200]))[0], [1, 3, 3])
    np.testing.assert_array_equal(attn.KernelReg(y, x, "c", bw=[1e-300]).fit(np.array([0.1, 1.9]))[0], [1, 3])


def test_code_written_for_statsmodels_runs():
    """statsmodels' list-style inputs (_adjust_shape): endog=[y], exog=[x] for one regressor, and a
    list of columns for several."""

    def fit_with(KernelReg, x, y, x2):
        one = KernelReg(endog=[y], exog=[x], var_type="c", reg_type="ll", bw=[0.4])
        two = KernelReg(endog=[y], exog=[x, x2], var_type="cc", reg_type="lc", bw=[0.4, 0.6])
        mean, mfx = one.fit(data_predict=[0.0, 0.5, 1.0])
        return mean, mfx, two.fit()[0], one.r_squared(), one.k_vars, one.nobs, one.endog.shape, one.exog.shape

    x, y = smooth_data(40, 1, seed=10)
    x2 = np.random.default_rng(11).uniform(-1, 1, 40)
    ours = fit_with(attn.KernelReg, x[:, 0].tolist(), y.tolist(), x2.tolist())
    theirs = fit_with(SMKernelReg, x[:, 0].tolist(), y.tolist(), x2.tolist())
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, **TOL)
    default = attn.KernelReg(endog=[y], exog=[x[:, 0]], var_type="c")  # bw="cv_ls", reg_type="ll"
    assert default.bw.shape == (1,) and default.bw[0] > 0 and default.bw_selection
    assert "KernelReg instance" in repr(default)


def test_aic_search():
    x, y = smooth_data(80, 1, seed=12)
    model = attn.KernelReg(y, x, "c", reg_type="lc", bw="aic")
    # A minimum: the criterion rises on both sides.
    for f in (0.97, 1.03):
        assert model.aicc(model.bw * f) > model.aicc()


def test_plug_in_bandwidth():
    x, y = smooth_data(200, 1, seed=13)
    h = attn.plug_in_bandwidth(x[:, 0], y)
    assert isinstance(h, float) and 0.02 < h < 2.0
    model = attn.KernelReg(y, x, "c", bw=[h])  # usable as the local linear bandwidth
    assert model.r_squared() > 0.8
    with pytest.raises(ValueError, match="x"):
        attn.plug_in_bandwidth(x[:3, 0], y[:3])
    with pytest.raises(ValueError):
        attn.plug_in_bandwidth(x[:, 0], y[:-1])


def test_large_cv_ls_search_is_fast():
    """n = 2000, local linear, bw="cv_ls": the time is printed (pytest -s), not asserted."""
    x, y = smooth_data(2000, 1, seed=14)
    start = time.perf_counter()
    model = attn.KernelReg(y, x, "c", reg_type="ll", bw="cv_ls")
    mean, _ = model.fit()
    seconds = time.perf_counter() - start
    print(f"n=2000 ll cv_ls search and fit: {seconds:.3f} s, bw {model.bw[0]:.5f}, {model.bw_selection}")
    assert np.all(np.isfinite(mean)) and model.r_squared() > 0.9
