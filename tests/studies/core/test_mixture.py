"""The EM of :mod:`interp.detection.mixture` against textbook EM: its SQUAREM acceleration reaches the fixed
point plain EM converges to, closer than plain EM under the same stopping rule, in fewer E-steps, and at a
likelihood at least as high."""
from __future__ import annotations

import math

import numpy as np
import pytest

from interp.detection import mixture

FLOOR = 1e-3


def plain_em(x, params, tol, max_iter=20_000):
    """Textbook EM on 1-D data from ``params`` [K, 3] (weight, mean, sigma), stopped as ``mixture.em`` stops
    (an E-step raising the log-likelihood by less than ``tol`` per value): (params, E-steps taken)."""
    w, m, s = (params[:, i].copy() for i in range(3))
    last = -np.inf
    for step in range(1, max_iter + 1):
        logp = (np.log(w) - np.log(s))[:, None] - 0.5 * ((x[None] - m[:, None]) / s[:, None]) ** 2
        top = logp.max(0)
        log_total = top + np.log(np.exp(logp - top).sum(0))
        loglik = float(log_total.sum()) - 0.5 * math.log(2 * math.pi) * x.size
        r = np.exp(logp - log_total)
        nk = r.sum(1)
        m = (r * x).sum(1) / nk
        s = np.maximum(np.sqrt((r * (x[None] - m[:, None]) ** 2).sum(1) / nk), FLOOR)
        w = nk / x.size
        if loglik - last < tol * x.size:
            break
        last = loglik
    return np.stack([w, m, s], axis=1), step


@pytest.mark.parametrize("upper_mean,upper_sigma,share,n", [(0.8, 0.2, 0.03, 4000), (0.8, 0.2, 0.03, 10_000),
                                                          (1.0, 0.15, 0.05, 4000)])
def test_accelerated_em_reaches_plain_ems_fixed_point_in_fewer_e_steps(upper_mean, upper_sigma, share, n,
                                                                       monkeypatch):
    """Log norms shaped like a bulk (log-sigma 0.3) with a minority mode overlapping its tail: slow for EM."""
    rng = np.random.default_rng(0)
    k = int(share * n)
    x = np.sort(np.concatenate([0.3 * rng.standard_normal(n - k), upper_mean + upper_sigma * rng.standard_normal(k)]))
    start = mixture._initial(x, (0.05,), FLOOR)
    fixed_point, _ = plain_em(x, start, tol=0.0)  # until the likelihood stops rising in float64
    stopped, plain_steps = plain_em(x, start, tol=mixture._TOL)

    e_steps = []
    real_e_step = mixture._e_step
    monkeypatch.setattr(mixture, "_e_step", lambda *a: e_steps.append(1) or real_e_step(*a))
    fit, loglik = mixture.em(x, start, FLOOR)

    assert len(e_steps) < plain_steps
    error, plain_error = np.abs(fit - fixed_point).max(), np.abs(stopped - fixed_point).max()
    assert error <= plain_error and error < 5e-3, (error, plain_error)
    assert loglik >= mixture.mixture_loglik(x, stopped) - 1e-9 * n
    assert fit[:, 0].sum() == pytest.approx(1.0) and fit[0, 1] < fit[1, 1]
