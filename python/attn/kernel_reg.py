"""attn.KernelReg: statsmodels' KernelReg interface over attn's local polynomial regression.

The computation is attn::KernelRegression (include/attn/kernel_regression.hpp, through the compiled
attn._attn._KernelRegression); this module reads the arguments as statsmodels reads them, maps its
names onto attn's, and shapes the results as statsmodels returns them.
"""
import numpy as np

from ._attn import _KernelRegression

__all__ = ["KernelReg"]

# Every name each kernel argument accepts (statsmodels' spellings and attn's), and attn's name for it.
_CKERTYPES = {"gaussian": "gaussian", "epanechnikov": "epanechnikov", "tricube": "tricube",
              "uniform": "boxcar", "boxcar": "boxcar"}
_UKERTYPES = {"aitchison_aitken": "aitchison_aitken", "aitchisonaitken": "aitchison_aitken"}
_OKERTYPES = {"wangvanryzin": "wangvanryzin", "wangryzin": "wangvanryzin", "wang_ryzin": "wangvanryzin"}
_REG_TYPES = {"lc": 0, "ll": 1}
_BW_METHODS = ("cv_ls", "aic")


def _adjust_shape(dat, k_vars, name):
    """An array (nobs, k_vars), as statsmodels' _adjust_shape makes one: a 1-D array is nobs points of
    one variable (k_vars = 1) or one point (k_vars > 1); a 2-D array (k_vars, nobs) is transposed."""
    try:
        dat = np.asarray(dat, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"KernelReg: {name} must be an array of numbers ({e})") from None
    if dat.ndim > 2:
        dat = np.squeeze(dat)
    if dat.ndim == 0:
        dat = dat.reshape(1)
    if dat.ndim == 1:
        nobs = len(dat) if k_vars == 1 else 1
    else:
        if dat.shape[0] == k_vars and dat.shape[1] != k_vars:
            dat = dat.T
        nobs = dat.shape[0]
    if dat.size != nobs * k_vars or dat.ndim > 2:
        raise ValueError(f"KernelReg: {name} has shape {np.shape(dat)}, which is not (nobs, {k_vars}): "
                         f"var_type has {k_vars} letters, one per column")
    return np.ascontiguousarray(np.reshape(dat, (nobs, k_vars)))


def _kernel_name(value, accepted, argument):
    if not isinstance(value, str) or value not in accepted:
        names = ", ".join(f'"{n}"' for n in accepted)
        raise ValueError(f"KernelReg: {argument} is {value!r}; it must be one of {names}")
    return accepted[value]


class KernelReg:
    """Nonparametric kernel regression, statsmodels' ``KernelReg`` computed by attn.

    ``KernelReg(endog, exog, var_type, reg_type="ll", bw="cv_ls", ckertype="gaussian",
    ukertype="aitchison_aitken", okertype="wangvanryzin", degree=None)`` estimates E[y | x] by a
    local polynomial fit at each point, weighted by a product kernel over the regressors (continuous,
    unordered and ordered ones, Racine and Li).

    Parameters
    ----------
    endog : array_like (nobs,)
        The response y. Lists and (1, nobs) arrays are read as statsmodels reads them.
    exog : array_like (nobs, k_vars), (nobs,) when k_vars is 1, or (k_vars, nobs)
        The regressors, one column a regressor.
    var_type : str
        One letter per regressor: 'c' continuous, 'u' unordered discrete, 'o' ordered discrete
        (discrete values are integers).
    reg_type : {"lc", "ll"}
        Local constant (Nadaraya-Watson, degree 0) or local linear (degree 1).
    bw : "cv_ls", "aic" or array_like (k_vars,)
        "cv_ls" chooses the bandwidths by leave-one-out least-squares cross-validation, "aic" by the
        corrected AIC of Hurvich, Simonoff and Tsai; an array gives them. A continuous bandwidth is
        the kernel's scale (the Gaussian's standard deviation, the compact kernels' half-width); a
        discrete one is the kernel's lambda.
    ckertype : {"gaussian", "epanechnikov", "tricube", "uniform" (also "boxcar")}
        The kernel of the continuous regressors.
    ukertype : {"aitchison_aitken" (also "aitchisonaitken")}
        The kernel of the unordered regressors.
    okertype : {"wangvanryzin" (also "wangryzin", "wang_ryzin")}
        The kernel of the ordered regressors.
    degree : None or int in 0..3
        The local polynomial's degree (in the continuous regressors); overrides reg_type when given.

    Attributes
    ----------
    bw : ndarray (k_vars,)
        The bandwidths.
    loo_error : float
        The cv_ls criterion at ``bw``.
    bw_selection : str or None
        How the search went (the method, its starts, the criterion before and after); None for
        bandwidths given.
    endog (nobs, 1), exog (nobs, k_vars), k_vars, nobs, var_type, reg_type, degree, ckertype,
    ukertype, okertype : as given (arrays in statsmodels' shapes).

    Where it differs from statsmodels
    ---------------------------------
    - Discrete regressors enter through their kernel only: the local linear (and higher) design holds
      the continuous regressors, as in Racine and Li's estimator and R's np package. statsmodels also
      puts discrete columns in its local linear design; the two agree when every regressor is
      continuous, and the local constant fit agrees for any var_type.
    - bw="aic" minimises the corrected AIC with the trace of this degree's own hat matrix;
      statsmodels' aic_hurvich uses the local constant trace for every reg_type (the two agree for
      reg_type="lc").
    - Local constant marginal effects are the exact derivative of the Nadaraya-Watson estimate;
      statsmodels' are 2 / nobs times that (its d_gaussian kernel is twice the Gaussian's derivative,
      and its quotient keeps a 1 / nobs that does not cancel), and with several continuous regressors
      the same number in every column. Local linear ones are the local fit's slopes in both.
    - tricube is (1 - |u|^3)^3 inside the window |u| <= 1 and 0 outside; statsmodels' tricube gives
      points outside the window the kernel's value at 0.
    - The Aitchison-Aitken kernel's number of levels is counted in the whole data, also in the
      leave-one-out fits (statsmodels counts it in the data left, which differs only where leaving a
      point out removes a level).
    - The bandwidth search is a quasi-Newton one with exact gradients from several starts, not
      statsmodels' Nelder-Mead from the rule of thumb: it finds the criterion's minimum to float64's
      precision (a criterion at least as low as statsmodels'), in a fraction of the time.
    - Extras: ``degree`` up to 3, the epanechnikov and uniform kernels, ``confidence_band``.
      statsmodels' ``sig_test`` and ``defaults`` (EstimatorSettings) are not offered.
    """

    def __init__(self, endog, exog, var_type, reg_type="ll", bw="cv_ls", ckertype="gaussian",
                 ukertype="aitchison_aitken", okertype="wangvanryzin", degree=None):
        """Reads the data, checks every argument, and chooses the bandwidths when ``bw`` names a
        method (see the class's docstring)."""
        if not isinstance(var_type, str) or not var_type or any(c not in "cuo" for c in var_type):
            raise ValueError(f"KernelReg: var_type is {var_type!r}; it must be a str of one letter per "
                             "regressor, each 'c' (continuous), 'u' (unordered) or 'o' (ordered)")
        if reg_type not in _REG_TYPES:
            raise ValueError(f"KernelReg: reg_type is {reg_type!r}; it must be \"lc\" (local constant) or "
                             "\"ll\" (local linear)")
        if degree is None:
            degree = _REG_TYPES[reg_type]
        elif isinstance(degree, bool) or not isinstance(degree, (int, np.integer)) or not 0 <= degree <= 3:
            raise ValueError(f"KernelReg: degree is {degree!r}; it must be None (from reg_type) or an int "
                             "from 0 to 3")
        self.var_type = var_type
        self.data_type = var_type
        self.reg_type = reg_type
        self.degree = int(degree)
        self.ckertype = _kernel_name(ckertype, _CKERTYPES, "ckertype")
        self.ukertype = _kernel_name(ukertype, _UKERTYPES, "ukertype")
        self.okertype = _kernel_name(okertype, _OKERTYPES, "okertype")
        self.k_vars = len(var_type)
        self.endog = _adjust_shape(endog, 1, "endog")
        self.exog = _adjust_shape(exog, self.k_vars, "exog")
        if self.endog.shape[0] != self.exog.shape[0]:
            raise ValueError(f"KernelReg: endog has {self.endog.shape[0]} points but exog has "
                             f"{self.exog.shape[0]}; they must match")
        self.data = np.column_stack((self.endog, self.exog))
        self.nobs = self.exog.shape[0]
        self._engine = _KernelRegression(self.exog, self.endog[:, 0], var_type, self.degree, self.ckertype)
        self._loo_error = None
        self.bw_selection = None
        if isinstance(bw, str):
            if bw not in _BW_METHODS:
                raise ValueError(f"KernelReg: bw is {bw!r}; it must be \"cv_ls\", \"aic\" or an array of "
                                 f"{self.k_vars} bandwidths")
            h, objective, how = self._engine.select_bandwidth(bw)
            self._bw_method = bw
            self.bw = h
            self.bw_selection = how
            if bw == "cv_ls":
                self._loo_error = objective
        else:
            try:
                h = np.asarray(bw, dtype=np.float64).ravel() if bw is not None else None
            except (TypeError, ValueError):
                h = None
            if h is None:
                raise ValueError(f"KernelReg: bw is {bw!r}; it must be \"cv_ls\", \"aic\" or an array of "
                                 f"{self.k_vars} bandwidths")
            if h.size != self.k_vars:
                raise ValueError(f"KernelReg: bw has {h.size} value{'s' if h.size != 1 else ''}; it must have "
                                 f"{self.k_vars}, one per regressor (var_type {var_type!r})")
            self._bw_method = "user-specified"
            self.bw = h
            try:  # attn's checks of the bandwidths' values, by a fit at one point
                self._engine.fit(self.bw, self.exog[:1])
            except ValueError as e:
                raise ValueError(str(e).replace("KernelReg.fit: ", "KernelReg: ", 1)) from None

    @property
    def loo_error(self):
        """The leave-one-out least-squares criterion (statsmodels' cv_loo) at ``bw``:
        1/n sum_i (y_i - m_{-i}(x_i))^2."""
        if self._loo_error is None:
            self._loo_error = self._engine.cv_ls(self.bw)[0]
        return self._loo_error

    def fit(self, data_predict=None):
        """The mean and the marginal effects at ``data_predict`` (default: the data points exog).

        Returns ``(mean, mfx)``: mean (nq,), mfx (nq, k_vars), the partial derivatives of the mean
        (0 in the discrete columns; see the class's docstring for the local constant ones)."""
        queries = None if data_predict is None else _adjust_shape(data_predict, self.k_vars, "data_predict")
        return self._engine.fit(self.bw, queries)

    def r_squared(self):
        """statsmodels' R-squared: [sum (y - ybar)(yhat - ybar)]^2 / (sum (y - ybar)^2 sum (yhat - ybar)^2),
        ybar the mean of the fitted values yhat at the data points."""
        return self._engine.r_squared(self.bw)

    def cv_ls(self, bw=None):
        """The leave-one-out least-squares criterion at ``bw`` (default: ``self.bw``)."""
        return self._engine.cv_ls(self.bw if bw is None else bw)[0]

    def aicc(self, bw=None):
        """The corrected AIC at ``bw`` (default: ``self.bw``), with this degree's hat matrix:
        log(sigma^2) + (1 + tr(H)/n) / (1 - (tr(H) + 2)/n); +inf where tr(H) + 2 >= n."""
        return self._engine.aicc(self.bw if bw is None else bw)[0]

    def confidence_band(self, data_predict=None, level=0.95, method="asymptotic", seed=0, replicates=999):
        """Pointwise confidence bands of the regression curve at ``data_predict`` (default: exog).

        Returns ``(low, high)``, each (nq,).
        method="asymptotic": mean -/+ z se, se^2 = sigma^2 sum_j l_j(x0)^2 with the smoother's weights
        l(x0) and the residual variance sigma^2 = RSS / (n - 2 tr(H) + tr(H'H)) (homoscedastic errors).
        method="bootstrap": the wild bootstrap, y*_j = m(x_j) + e_j v_j with Rademacher v drawn from
        ``seed`` (the same band for the same seed), ``replicates`` refits; the fit plus the quantiles
        of m*(x0) - E* m*(x0).
        Both cover the smoothed curve E m(x0), not m(x0): there is no bias correction."""
        if method not in ("asymptotic", "bootstrap"):
            raise ValueError(f"KernelReg.confidence_band: method is {method!r}; it must be \"asymptotic\" or "
                             "\"bootstrap\"")
        queries = None if data_predict is None else _adjust_shape(data_predict, self.k_vars, "data_predict")
        _, low, high, _ = self._engine.confidence_band(self.bw, queries, float(level), method, seed, replicates)
        return low, high

    def __repr__(self):
        """What statsmodels prints."""
        return (f"KernelReg instance\nNumber of variables: k_vars = {self.k_vars}\n"
                f"Number of samples:   N = {self.nobs}\nVariable types:      {self.var_type}\n"
                f"BW selection method: {self._bw_method}\nEstimator type: {self.reg_type}\n")
