"""The Fréchet distance between two Gaussians, in float64, with no matrix square root and no complex numbers.

    d^2 = |mu1 - mu2|^2 + tr(S1) + tr(S2) - 2 tr((S1 S2)^(1/2))

``tr((S1 S2)^(1/2))`` is the sum of the square roots of the eigenvalues of S1 S2. With A = S1^(1/2) (symmetric,
from ``eigh``), S1 S2 = A (A S2) has the eigenvalues of (A S2) A = A S2 A, which is symmetric positive
semi-definite: its eigenvalues come from ``eigvalsh`` (real by construction), clipped at 0 against rounding.
No ``scipy.linalg.sqrtm`` (whose complex parts, ``disp`` argument and fallbacks changed between SciPy versions),
no eps retry: singular covariances (fewer samples than dimensions) are handled as they are.
"""
from __future__ import annotations

import numpy as np

from vgen.errors import VGenError

IMPLEMENTATION = "vgen.eval.frechet: float64, tr sqrt(S1 S2) from eigvalsh(S1^1/2 S2 S1^1/2)"


def gaussian_stats(features) -> tuple[np.ndarray, np.ndarray]:
    """(mean, covariance) of (N, D) features in float64; the covariance divides by N - 1 (``np.cov``, as the
    ADM evaluator, torch-fidelity and clean-fid do)."""
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or len(x) < 2:
        raise VGenError(f"statistics need (N >= 2, D) features, got shape {x.shape}")
    return x.mean(axis=0), np.cov(x, rowvar=False)


def _psd_sqrt(s: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh(s)
    return (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T


def frechet_distance(mu1, sigma1, mu2, sigma2) -> float:
    """Squared Fréchet distance between N(mu1, sigma1) and N(mu2, sigma2) (what FID / sFID / FVD report)."""
    mu1, mu2 = np.atleast_1d(np.asarray(mu1, np.float64)), np.atleast_1d(np.asarray(mu2, np.float64))
    s1, s2 = np.atleast_2d(np.asarray(sigma1, np.float64)), np.atleast_2d(np.asarray(sigma2, np.float64))
    if mu1.shape != mu2.shape or s1.shape != s2.shape or s1.shape != (len(mu1), len(mu1)):
        raise VGenError(f"Fréchet distance of statistics that do not match: mu {mu1.shape} / {mu2.shape}, "
                        f"sigma {s1.shape} / {s2.shape} (were they made with the same extractor?)")
    if not (np.isfinite(mu1).all() and np.isfinite(mu2).all() and np.isfinite(s1).all() and np.isfinite(s2).all()):
        raise VGenError("Fréchet distance of statistics with NaN or inf values: recompute them")
    s1, s2 = (s1 + s1.T) / 2, (s2 + s2.T) / 2
    a = _psd_sqrt(s1)
    m = a @ s2 @ a
    ev = np.linalg.eigvalsh((m + m.T) / 2)
    tr_covmean = np.sqrt(np.clip(ev, 0.0, None)).sum()
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(s1) + np.trace(s2) - 2.0 * tr_covmean)
