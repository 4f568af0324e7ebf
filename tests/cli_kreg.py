"""cli.kreg (tests/cli.cmake): `attn kreg` on data numpy made, checked against local polynomial fits
that numpy computes itself (weighted least squares with numpy.linalg.pinv: an oracle that shares no
code with the library) at the bandwidths of a B.npy file: the fit, --slopes, the asymptotic band of
--band, for degrees 0 to 2, four kernels and mixed var_types. The bootstrap band is the fit plus the
wild bootstrap's quantiles and repeats with its seed; cv_ls finds a criterion no worse than
statsmodels' KernelReg (when statsmodels is installed); --plot draws the data, the fit and the band;
bad calls exit 2 naming the option. Last, `attn demo` shows local linear's smaller bias at the
boundary x = 0. Exits 77 without numpy.

    /usr/bin/python3 tests/cli_kreg.py build/release/attn build/release/tests/cli_kreg
"""
import os
import re
import subprocess
import sys

try:
    import numpy as np
except ImportError:
    print("numpy is not available: skipped")
    sys.exit(77)

attn, root = sys.argv[1], sys.argv[2]
os.makedirs(root, exist_ok=True)
rng = np.random.default_rng(7)
failures = []


def path(name):
    return os.path.join(root, name)


def save(name, array):
    np.save(path(name), array)
    return path(name)


def run(*args, code=0):
    result = subprocess.run([attn, "kreg", *args], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "ATTN_PROGRESS": "never"})
    if result.returncode != code:
        sys.exit(f"attn kreg {' '.join(args)} exited {result.returncode} ({code} wanted): {result.stderr.strip()}")
    return result


def check(what, got, want, tolerance):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        failures.append(f"{what}: shape {got.shape}, {want.shape} wanted")
        return
    error = float(np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want)))) if got.size else 0.0
    print(f"{what}: largest error {error:.3g} (tolerance {tolerance:.3g})")
    if not error <= tolerance:
        failures.append(f"{what}: largest error {error:.3g} above {tolerance:.3g}")


# ---- The oracle: local polynomial regression, straight from its definition -------------------------

def kernel(name, u):
    a = np.abs(u)
    return {"gaussian": np.exp(-u * u / 2), "epanechnikov": np.where(a <= 1, 1 - u * u, 0.0),
            "boxcar": np.where(a <= 1, 1.0, 0.0), "tricube": np.where(a <= 1, (1 - a ** 3) ** 3, 0.0)}[name]


def weights(x, x0, h, var_type, kernel_name):
    """The product kernel of the point x0 over the rows of x (n, k)."""
    w = np.ones(len(x))
    for c, letter in enumerate(var_type):
        if letter == "c":
            w = w * kernel(kernel_name, (x[:, c] - x0[c]) / h[c])
        elif letter == "u":
            levels = len(np.unique(x[:, c]))
            w = w * np.where(x[:, c] == x0[c], 1 - h[c], h[c] / (levels - 1))
        else:  # ordered: Wang-van Ryzin
            w = w * np.where(x[:, c] == x0[c], 1 - h[c], (1 - h[c]) * h[c] ** np.abs(x[:, c] - x0[c]) / 2)
    return w


def design(x, x0, var_type, degree):
    """The monomials of total degree <= degree in the continuous deviations; column 0 the intercept,
    then the first-order terms in the order of the continuous columns."""
    d = [x[:, c] - x0[c] for c, letter in enumerate(var_type) if letter == "c"]
    columns, terms = [np.ones(len(x))], [[]]
    for _ in range(degree):
        terms = [t + [j] for t in terms for j in range(len(d)) if not t or j >= t[-1]]
        columns += [np.prod([d[j] for j in t], axis=0) for t in terms]
    return np.stack(columns, axis=1)


def smoother_row(x, x0, h, var_type, degree, kernel_name):
    """l(x0): m(x0) = l(x0) . y, and the slopes' rows likewise, by weighted least squares."""
    w = np.sqrt(weights(x, x0, h, var_type, kernel_name))
    z = design(x, x0, var_type, degree)
    pinv = np.linalg.pinv(w[:, None] * z) * w[None, :]  # (p, n): beta = pinv @ y
    return pinv


def local_fit(x, y, queries, h, var_type="c", degree=1, kernel_name="gaussian"):
    """The fit (nq,), the slopes (nq, k) and the smoother matrix L (nq, n)."""
    k = len(var_type)
    continuous = [c for c, letter in enumerate(var_type) if letter == "c"]
    mean, slopes, rows = [], [], []
    for x0 in queries:
        pinv = smoother_row(x, x0, h, var_type, degree, kernel_name)
        beta = pinv @ y
        mean.append(beta[0])
        rows.append(pinv[0])
        s = np.zeros(k)
        if degree >= 1:
            for j, c in enumerate(continuous):
                s[c] = beta[1 + j]
        slopes.append(s)
    return np.array(mean), np.array(slopes), np.array(rows)


def loo_cv(x, y, h, var_type="c", degree=1, kernel_name="gaussian"):
    errors = []
    for i in range(len(x)):
        keep = np.arange(len(x)) != i
        m, _, _ = local_fit(x[keep], y[keep], x[i:i + 1], h, var_type, degree, kernel_name)
        errors.append((y[i] - m[0]) ** 2)
    return float(np.mean(errors))


def summary_number(text, pattern):
    m = re.search(pattern, text)
    if not m:
        sys.exit(f"the summary does not match {pattern!r}:\n{text}")
    return float(m.group(1))


# ---- Data --------------------------------------------------------------------------------------------

n = 61
x1 = np.sort(rng.uniform(0, 5, n))
y1 = 2 * np.sin(x1) + x1 ** 0.8 + rng.normal(0, 0.4, n)
xq1 = np.linspace(-0.2, 5.2, 37)
save("X.npy", x1)
save("Y.npy", y1)
save("XQ.npy", xq1)
X1, XQ1 = x1[:, None], xq1[:, None]

# ---- Given bandwidths: exact agreement with the oracle -------------------------------------------------

# One continuous regressor, local linear (the default degree), Gaussian: fit, slopes, asymptotic band.
save("B.npy", np.array([0.45]))
r = run("--x", path("X.npy"), "--y", path("Y.npy"), "--x-query", path("XQ.npy"), "--bandwidth", path("B.npy"),
        "--out", path("YHAT.npy"), "--slopes", path("D.npy"), "--band", path("LOW.npy"), path("HIGH.npy"))
print(r.stdout, end="")
mean, slopes, L = local_fit(X1, y1, XQ1, [0.45])
check("k=1 degree 1 gaussian fit", np.load(path("YHAT.npy")), mean, 1e-9)
check("k=1 degree 1 slopes (nq,) for x (n,)", np.load(path("D.npy")), slopes[:, 0], 1e-9)
if np.load(path("YHAT.npy")).dtype != np.float64:
    failures.append("float64 inputs gave a fit of another type")
# The asymptotic band: fit -/+ z sigma ||l(x0)||, sigma^2 = RSS / (n - 2 tr(H) + tr(H'H)).
_, _, H = local_fit(X1, y1, X1, [0.45])
rss = float(np.sum((y1 - H @ y1) ** 2))
sigma2 = rss / (n - 2 * np.trace(H) + np.trace(H.T @ H))
z = 1.959963984540054  # the normal's 0.975 quantile
se = np.sqrt(sigma2 * np.sum(L * L, axis=1))
check("asymptotic band, low", np.load(path("LOW.npy")), mean - z * se, 1e-8)
check("asymptotic band, high", np.load(path("HIGH.npy")), mean + z * se, 1e-8)
check("the summary's cv_ls at the given bandwidth",
      summary_number(r.stdout, r"\ncv_ls ([0-9.eE+-]+)"), loo_cv(X1, y1, [0.45]), 1e-5)
if "given in" not in r.stdout or "R^2" not in r.stdout:
    failures.append(f"the summary does not say the bandwidth was given, or lacks R^2:\n{r.stdout}")

# float32 inputs: read into float64, written back as float32.
save("X32.npy", x1.astype(np.float32))
save("Y32.npy", y1.astype(np.float32))
run("--x", path("X32.npy"), "--y", path("Y32.npy"), "--bandwidth", path("B.npy"), "--out", path("YHAT32.npy"))
got = np.load(path("YHAT32.npy"))
m32, _, _ = local_fit(x1.astype(np.float32).astype(np.float64)[:, None], y1.astype(np.float32).astype(np.float64),
                      x1.astype(np.float32).astype(np.float64)[:, None], [0.45])
if got.dtype != np.float32:
    failures.append(f"float32 inputs gave a fit of {got.dtype}")
check("float32 inputs, the fit at the data points", got, m32, 1e-6)

# Degree 0 (Nadaraya-Watson) and degree 2, Gaussian; degree 1 with each compact kernel (wide enough
# that every window holds points of two distinct x).
for degree, kernel_name, h in ((0, "gaussian", 0.3), (2, "gaussian", 0.7), (1, "epanechnikov", 1.2),
                               (1, "tricube", 1.5), (1, "boxcar", 1.5)):
    save("Bd.npy", np.array([h]))
    run("--x", path("X.npy"), "--y", path("Y.npy"), "--x-query", path("XQ.npy"), "--bandwidth", path("Bd.npy"),
        "--degree", str(degree), "--kernel", kernel_name, "--out", path("YHATd.npy"), "--slopes", path("Dd.npy"))
    m, s, _ = local_fit(X1, y1, XQ1, [h], "c", degree, kernel_name)
    check(f"k=1 degree {degree} {kernel_name} fit", np.load(path("YHATd.npy")), m, 1e-8)
    if degree >= 1:
        check(f"k=1 degree {degree} {kernel_name} slopes", np.load(path("Dd.npy")), s[:, 0], 1e-7)

# Two continuous regressors (n, 2), and a continuous one beside an unordered and an ordered one.
n2 = 80
x2 = np.column_stack([rng.uniform(-1, 1, n2), rng.uniform(0, 2, n2)])
y2 = np.sin(2 * x2[:, 0]) + x2[:, 1] ** 2 + rng.normal(0, 0.2, n2)
xq2 = np.column_stack([rng.uniform(-1, 1, 13), rng.uniform(0, 2, 13)])
save("X2.npy", x2)
save("Y2.npy", y2)
save("XQ2.npy", xq2)
save("B2.npy", np.array([0.35, 0.5]))
run("--x", path("X2.npy"), "--y", path("Y2.npy"), "--x-query", path("XQ2.npy"), "--var-type", "cc",
    "--bandwidth", path("B2.npy"), "--out", path("YHAT2.npy"), "--slopes", path("D2.npy"))
m, s, _ = local_fit(x2, y2, xq2, [0.35, 0.5], "cc")
check("k=2 cc fit", np.load(path("YHAT2.npy")), m, 1e-9)
check("k=2 cc slopes (nq,2)", np.load(path("D2.npy")), s, 1e-8)

xm = np.column_stack([rng.uniform(0, 3, n2), rng.integers(0, 3, n2), rng.integers(0, 4, n2)]).astype(np.float64)
ym = np.cos(xm[:, 0]) + 0.5 * xm[:, 1] - 0.3 * xm[:, 2] + rng.normal(0, 0.2, n2)
xqm = np.column_stack([np.linspace(0.1, 2.9, 9), np.arange(9) % 3, np.arange(9) % 4]).astype(np.float64)
save("XM.npy", xm)
save("YM.npy", ym)
save("XQM.npy", xqm)
save("BM.npy", np.array([0.6, 0.3, 0.4]))
run("--x", path("XM.npy"), "--y", path("YM.npy"), "--x-query", path("XQM.npy"), "--var-type", "cuo",
    "--bandwidth", path("BM.npy"), "--out", path("YHATM.npy"), "--slopes", path("DM.npy"))
m, s, _ = local_fit(xm, ym, xqm, [0.6, 0.3, 0.4], "cuo")
check("k=3 cuo fit (discrete columns through their kernels only)", np.load(path("YHATM.npy")), m, 1e-9)
check("k=3 cuo slopes, 0 in the discrete columns", np.load(path("DM.npy")), s, 1e-8)

# ---- Chosen bandwidths ------------------------------------------------------------------------------

r = run("--x", path("X.npy"), "--y", path("Y.npy"), "--bandwidth", "cv_ls", "--out", path("YHATcv.npy"))
print(r.stdout, end="")
h_cv = summary_number(r.stdout, r"bandwidths ([0-9.eE+-]+)")
cv = summary_number(r.stdout, r"\ncv_ls ([0-9.eE+-]+)")
check("cv_ls: the summary's criterion is the leave-one-out error at its bandwidth", cv, loo_cv(X1, y1, [h_cv]), 1e-4)
# A minimum: no better at 0.8 h or 1.25 h.
for factor in (0.8, 1.25):
    if loo_cv(X1, y1, [h_cv * factor]) < cv * (1 - 1e-6):
        failures.append(f"cv_ls chose {h_cv}, but {factor} times it has the lower leave-one-out error")
check("cv_ls: the fit at the data points (the default queries)", np.load(path("YHATcv.npy")),
      local_fit(X1, y1, X1, [h_cv])[0], 1e-4)
try:
    from statsmodels.nonparametric.kernel_regression import KernelReg

    h_sm = float(KernelReg(y1, x1, "c", reg_type="ll", bw="cv_ls").bw[0])
    cv_sm = loo_cv(X1, y1, [h_sm])
    print(f"cv_ls: attn h {h_cv:.6g} (CV {cv:.6g}), statsmodels h {h_sm:.6g} (CV {cv_sm:.6g})")
    if cv > cv_sm * (1 + 1e-4):
        failures.append(f"cv_ls: attn's bandwidth {h_cv} has CV {cv}, above statsmodels' {h_sm} with {cv_sm}")
except ImportError:
    print("statsmodels is not available: attn's cv_ls is not compared with KernelReg's")

r = run("--x", path("X.npy"), "--y", path("Y.npy"), "--bandwidth", "aic", "--out", path("YHATaic.npy"))
print(r.stdout, end="")
if not re.search(r"\nAICc [0-9.eE+-]+", r.stdout) or summary_number(r.stdout, r"bandwidths ([0-9.eE+-]+)") <= 0:
    failures.append(f"--bandwidth aic: the summary lacks its bandwidth or its AICc:\n{r.stdout}")

r = run("--x", path("X.npy"), "--y", path("Y.npy"), "--x-query", path("XQ.npy"), "--bandwidth", "dpi",
        "--out", path("YHATdpi.npy"))
print(r.stdout, end="")
h_dpi = summary_number(r.stdout, r"bandwidths ([0-9.eE+-]+)")
if "plug-in" not in r.stdout or not 0.05 < h_dpi < 5:
    failures.append(f"--bandwidth dpi: the summary does not name the plug-in rule or gives {h_dpi}:\n{r.stdout}")
check("dpi: the fit at its bandwidth", np.load(path("YHATdpi.npy")), local_fit(X1, y1, XQ1, [h_dpi])[0], 1e-4)

# ---- Bands -------------------------------------------------------------------------------------------

def band(*extra, name="b"):
    run("--x", path("X.npy"), "--y", path("Y.npy"), "--x-query", path("XQ.npy"), "--bandwidth", path("B.npy"),
        "--out", path(f"YHAT{name}.npy"), "--band", path(f"LOW{name}.npy"), path(f"HIGH{name}.npy"), *extra)
    return np.load(path(f"YHAT{name}.npy")), np.load(path(f"LOW{name}.npy")), np.load(path(f"HIGH{name}.npy"))


# The wild bootstrap as attn/kernel_regression.hpp defines it: y*_j = m(x_j) + e_j v_j with Rademacher
# v, refitted; the band is the fit m(x0) plus the quantiles of m*(x0) - E* m*(x0). numpy draws its own
# signs, so the ends agree within the Monte Carlo error of the 2.5% and 97.5% quantiles (below a tenth
# of the band's width at 999 replicates; a quarter allowed).
fit, low, high = band("--band-method", "bootstrap", "--seed", "3", "--replicates", "999", name="boot")
fitted = H @ y1
signs = np.random.default_rng(11).choice([-1.0, 1.0], size=(4000, n))
deviations = L @ ((y1 - fitted)[None, :] * signs).T  # (nq, 4000)
quantiles = np.quantile(deviations, [0.025, 0.975], axis=1)  # (2, nq)
want_low, want_high = L @ y1 + quantiles[0], L @ y1 + quantiles[1]
width = want_high - want_low
if not (np.all(low < high) and np.all(np.abs(low - want_low) < 0.25 * width)
        and np.all(np.abs(high - want_high) < 0.25 * width)):
    failures.append(f"the bootstrap band is not the wild bootstrap's percentile interval: largest differences "
                    f"{np.max(np.abs(low - want_low) / width):.3g} and {np.max(np.abs(high - want_high) / width):.3g} "
                    "of its width")
_, low_again, high_again = band("--band-method", "bootstrap", "--seed", "3", "--replicates", "999", name="boot2")
if not (np.array_equal(low, low_again) and np.array_equal(high, high_again)):
    failures.append("the bootstrap band differs between two runs with --seed 3")
_, low_other, _ = band("--band-method", "bootstrap", "--seed", "4", "--replicates", "199", name="boot3")
if np.array_equal(low, low_other):
    failures.append("the bootstrap band is the same for --seed 3 and --seed 4")
fit, low50, high50 = band("--level", "0.5", name="half")
_, low95, high95 = band(name="full")
if not (np.all(low95 < low50) and np.all(low50 <= fit) and np.all(fit <= high50) and np.all(high50 < high95)):
    failures.append("the 50% asymptotic band does not lie inside the 95% band around the fit")

# ---- Plots ---------------------------------------------------------------------------------------------

run("--x", path("X.npy"), "--y", path("Y.npy"), "--x-query", path("XQ.npy"), "--bandwidth", path("B.npy"),
    "--out", path("YHATp.npy"), "--band", path("LOWp.npy"), path("HIGHp.npy"), "--plot", path("fit.svg"))
svg = open(path("fit.svg")).read()
wanted = {"the end": "</svg>", "the title": "local linear, gaussian, h 0.45 (given)",
          "the band's legend entry": "95% band (asymptotic)", "the fit's legend entry": ">fit<",
          "the data's legend entry": ">data<", "a dashed line": "stroke-dasharray"}
for what, text in wanted.items():
    if text not in svg:
        failures.append(f"fit.svg lacks {what} ({text!r})")
if svg.count("<circle") < n:
    failures.append(f"fit.svg has {svg.count('<circle')} circles; each of the {n} data points wanted one")
if svg.count("stroke-dasharray") < 2:
    failures.append("fit.svg should draw the band's two ends as dashed lines")
run("--x", path("X.npy"), "--y", path("Y.npy"), "--bandwidth", "cv_ls", "--out", path("YHATq.npy"),
    "--plot", path("fit.png"))
if open(path("fit.png"), "rb").read(8) != b"\x89PNG\r\n\x1a\n":
    failures.append("fit.png is not a PNG file")
run("--x", path("X.npy"), "--y", path("Y.npy"), "--bandwidth", path("B.npy"), "--out", path("YHATr.npy"),
    "--plot", path("plain.svg"))
if "stroke-dasharray" in open(path("plain.svg")).read():
    failures.append("plain.svg (no --band) draws a dashed line")

# ---- Bad calls: exit 2, the option named -------------------------------------------------------------

save("X3.npy", np.zeros((4, 3, 2)))
save("Y60.npy", y1[:60])
save("XI.npy", np.arange(n))
save("YNAN.npy", np.where(np.arange(n) == 5, np.nan, y1))
save("B3.npy", np.array([0.3, 0.4, 0.5]))
save("BNEG.npy", np.array([-0.3]))
save("XU.npy", np.column_stack([x1, x1]))  # an unordered column of non-integers
base = ["--x", path("X.npy"), "--y", path("Y.npy"), "--out", path("bad.npy")]


def replace(args, flag, *values):
    """args with flag's value(s) replaced (or flag added)."""
    out = list(args)
    if flag in out:
        i = out.index(flag)
        out[i + 1:i + 2] = list(values)
    else:
        out += [flag, *values]
    return out


bad_calls = [
    (replace(base, "--x", path("missing.npy")), "--x"),
    (replace(base, "--x", path("X3.npy")), "--x"),
    (replace(base, "--x", path("XI.npy")), "--x"),
    (replace(base, "--y", path("Y60.npy")), "--y"),
    (replace(base, "--y", path("YNAN.npy")), "--y"),
    (replace(base, "--x-query", path("XQ2.npy")), "--x-query"),
    (replace(base, "--var-type", "z"), "--var-type"),
    (replace(base, "--var-type", "cc"), "--var-type"),
    (replace(replace(base, "--x", path("XU.npy")), "--var-type", "cu"), "--var-type"),
    (replace(base, "--degree", "4"), "--degree"),
    (replace(base, "--degree", "-1"), "--degree"),
    (replace(base, "--kernel", "triangle"), "--kernel"),
    (replace(base, "--bandwidth", "cvls"), "--bandwidth"),
    (replace(base, "--bandwidth", path("missing.npy")), "--bandwidth"),
    (replace(base, "--bandwidth", path("B3.npy")), "--bandwidth"),
    (replace(base, "--bandwidth", path("BNEG.npy")), "--bandwidth"),
    (replace(replace(base, "--bandwidth", "dpi"), "--degree", "0"), "--bandwidth"),
    (replace(replace(base, "--bandwidth", "dpi"), "--kernel", "epanechnikov"), "--bandwidth"),
    (replace(replace(replace(base, "--x", path("X2.npy")), "--y", path("Y2.npy")), "--bandwidth", "dpi"), "--bandwidth"),
    (replace(base, "--band", path("LOW.npy")), "--band"),
    (replace(base, "--level", "0.9"), "--level"),  # without --band
    (replace(base, "--band", path("LOW.npy"), path("HIGH.npy")) + ["--level", "1.5"], "--level"),
    (replace(base, "--band-method", "jackknife"), "--band-method"),
    (replace(base, "--band", path("LOW.npy"), path("HIGH.npy")) + ["--band-method", "bootstrap", "--replicates", "1"],
     "--replicates"),
    (replace(base, "--band", path("LOW.npy"), path("HIGH.npy")) + ["--band-method", "bootstrap", "--seed", "-3"],
     "--seed"),  # CLI11 alone read it as 2^64 - 3
    (replace(base, "--plot", path("fit.jpg")), "--plot"),
    (replace(replace(replace(base, "--x", path("X2.npy")), "--y", path("Y2.npy")), "--plot", path("f.svg")), "--plot"),
    ([a for a in base if a not in ("--out", path("bad.npy"))], "--out"),
]
for args, named in bad_calls:
    result = subprocess.run([attn, "kreg", *args], capture_output=True, text=True, timeout=60)
    if result.returncode != 2 or named not in result.stderr or "attn kreg: error: " not in result.stderr:
        failures.append(f"attn kreg {' '.join(args)} exited {result.returncode} (2 wanted), stderr "
                        f"{result.stderr.strip()!r} (naming {named} wanted)")
# An output that cannot be written: a failed run, exit 1.
result = subprocess.run([attn, "kreg", *replace(base, "--out", path("no-such-dir/out.npy")), "--bandwidth",
                         path("B.npy")], capture_output=True, text=True, timeout=60)
if result.returncode != 1:
    failures.append(f"an --out in a missing directory exited {result.returncode} (1 wanted): {result.stderr.strip()!r}")

# ---- The demo: local linear's bias at the boundary is the smaller -------------------------------------------

demo = subprocess.run([attn, "demo"], capture_output=True, text=True, timeout=120)
rows = {m.group(1): [float(v) for v in m.group(2).split()]
        for m in re.finditer(r"^(nadaraya-watson|local linear) +([-0-9.e+ ]+)$", demo.stdout, re.MULTILINE)}
if demo.returncode != 0 or set(rows) != {"nadaraya-watson", "local linear"}:
    failures.append(f"attn demo exited {demo.returncode} without its table of the two fits")
else:  # bandwidth, MSE, MSE x<0.5, f(0), E f(0) (the truth is 0 there), bias^2 x<0.5
    nw_row, ll_row = rows["nadaraya-watson"], rows["local linear"]
    print(f"attn demo near x = 0: bias^2 Nadaraya-Watson {nw_row[5]}, local linear {ll_row[5]}; "
          f"E f(0) {nw_row[4]} and {ll_row[4]}")
    if not (ll_row[5] < nw_row[5] and abs(ll_row[4]) < abs(nw_row[4])):
        failures.append(f"attn demo: local linear's bias near x = 0 is not the smaller: {ll_row} against {nw_row}")

if failures:
    sys.exit("FAILED:\n" + "\n".join(failures))
print("attn kreg agrees with numpy's weighted least squares; bands, plots and errors as documented")
