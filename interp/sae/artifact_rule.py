"""The artifact-feature rule (docs/methods.md section 8): which SAE features are concentrated on a kind of token
beyond chance, and which group of them reconstructs the high-norm tokens' excess (the *artifact subspace*).

A feature is **enriched** on a kind of token (high-norm patches among the patches; register or CLS tokens among
all tokens) when all three hold:

- it fires on at least ``MIN_COUNT`` tokens of that kind (too few tokens cannot show anything);
- its **precision** (the kind's share of the tokens it fires on) is at least ``MIN_PRECISION``: most of its
  firing is on that kind, whatever the kind's base rate;
- the precision is above the kind's **base rate** beyond chance: the one-sided binomial p-value of its count
  among the tokens it fires on, bounded by Chernoff's ``exp(-n KL(precision || base))`` (conservative), is below
  ``ALPHA`` divided by the number of features (Bonferroni).

A feature is also a candidate for the artifact subspace when its code *mass* is concentrated on the high-norm
tokens (:func:`mass_enriched`): a dense feature whose code is small on normal tokens and large on the high-norm
ones has a count precision at the base rate but carries the artifacts.

The **artifact subspace** is grown greedily from these candidates: at each step the feature that most raises
the **coverage** joins it. Coverage of a set ``S`` is the share of the high-norm tokens' excess over the mean
normal patch token, ``e_i = x_i - mean_normal``, that the features' contributions remove: ``1 - sum_i ||e_i -
sum_{f in S} a_f(x_i) d_f||^2 / sum_i ||e_i||^2``, over up to ``MAX_COVERAGE_TOKENS`` high-norm tokens (a seeded
reservoir sample). The search runs while a feature still adds coverage (``MIN_GAIN``, a floor against rounding,
not a size a feature must reach) up to ``MAX_SUBSPACE`` features; the subspace is the shortest start of that path
reaching ``COVER_SHARE`` of the best coverage the path reaches. So the rule does not depend on how finely an
objective splits the artifact direction: one feature covering it all, or 300 covering 0.3 % each, give the same
subspace span (a fixed per-feature gain stops early on the second). An enriched feature that describes something
else than the excess adds no coverage and stays out.

The subspace is **isolated** (:func:`removal`) when removing its features' contributions at the hook, what the
ablation ``SAEFeatureAblation`` does there, brings at least ``ISOLATION_MARGIN`` more of the sampled high-norm
tokens under their image's cut than any of ``N_ISOLATION_CONTROLS`` random matched feature sets of the same size
(``interp.sae.controls``; the ablation study's ``SPECIFIC_MARGIN``); otherwise the report says the artifact was not
isolated instead of naming artifact features.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional

import numpy as np
import torch

MIN_COUNT = 5
MIN_PRECISION = 0.5
ALPHA = 0.01
MIN_GAIN = 1e-4  # a feature adding less coverage than this ends the search (rounding, not a size of feature)
COVER_SHARE = 0.95  # the subspace: the shortest start of the search reaching this share of its best coverage
MAX_SUBSPACE = 512
N_ISOLATION_CONTROLS = 3
ISOLATION_MARGIN = 0.5  # removed share of high-norm tokens beyond every control (ablate's SPECIFIC_MARGIN)
MAX_COVERAGE_TOKENS = 4096

RULE = {"candidates": "enriched (count) or magnitude-enriched (code mass)", "min_count": MIN_COUNT, "min_precision": MIN_PRECISION, "alpha": ALPHA, "test": "binomial, Chernoff bound, "
        "Bonferroni over features", "stop": "shortest start of the greedy path reaching cover_share of its best coverage",
        "min_coverage_gain": MIN_GAIN, "cover_share": COVER_SHARE, "max_subspace": MAX_SUBSPACE,
        "isolation": "removal at the hook beyond every matched control by isolation_margin",
        "isolation_margin": ISOLATION_MARGIN, "isolation_controls": N_ISOLATION_CONTROLS,
        "max_coverage_tokens": MAX_COVERAGE_TOKENS}


def _kl(q: np.ndarray, p: float) -> np.ndarray:
    """KL(Bernoulli(q) || Bernoulli(p)) elementwise, 0 log 0 = 0."""
    q = np.clip(q, 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(q > 0, q * np.log(q / p), 0.0)
        b = np.where(q < 1, (1 - q) * np.log((1 - q) / (1 - p)), 0.0)
    return a + b


def enrichment(count_kind: np.ndarray, count_all: np.ndarray, base_rate: float, n_features: int) -> Dict[str, np.ndarray]:
    """Per feature: ``precision`` (count_kind / count_all), ``p_value`` (Chernoff bound on P(X >= count_kind), X
    ~ Binomial(count_all, base_rate)) and ``enriched`` (the three conditions of the module docstring).

    Args:
        count_kind: [n] tokens of the kind each feature fires on; count_all: [n] tokens of the population
            (the kind and the others it is compared with) each fires on; base_rate: the kind's share of the
            population's tokens; n_features: the Bonferroni divisor.
    """
    count_kind = np.asarray(count_kind, np.float64)
    count_all = np.asarray(count_all, np.float64)
    precision = np.divide(count_kind, count_all, out=np.zeros_like(count_kind), where=count_all > 0)
    if not 0 < base_rate < 1:
        p_value = np.ones_like(precision)
    else:
        above = precision > base_rate
        p_value = np.where(above, np.exp(-count_all * _kl(precision, base_rate)), 1.0)
    enriched = (count_kind >= MIN_COUNT) & (precision >= MIN_PRECISION) & (p_value < ALPHA / max(1, n_features))
    return {"precision": precision, "p_value": p_value, "enriched": enriched}


def mass_enriched(mass_kind, mass_all, count_kind, base_rate: float) -> Dict[str, np.ndarray]:
    """Per feature: its code mass concentrated on a kind of token: ``precision`` (the kind's share of the
    feature's summed codes) at least ``MIN_PRECISION`` and above ``base_rate``, on at least ``MIN_COUNT`` tokens
    of the kind. Catches a feature that fires weakly elsewhere but strongly there (the count precision misses it:
    a dense feature whose code carries the artifacts' magnitude)."""
    mass_kind = np.asarray(mass_kind, np.float64)
    mass_all = np.asarray(mass_all, np.float64)
    precision = np.divide(mass_kind, mass_all, out=np.zeros_like(mass_kind), where=mass_all > 0)
    enriched = ((np.asarray(count_kind) >= MIN_COUNT) & (precision >= MIN_PRECISION) & (precision > base_rate))
    return {"precision": precision, "enriched": enriched}


class ExcessSample:
    """A seeded reservoir of up to ``MAX_COVERAGE_TOKENS`` high-norm tokens: their activations (hook units) and
    sparse codes, for the coverage of the artifact subspace (memory bounded whatever the data size)."""

    def __init__(self, capacity: int = MAX_COVERAGE_TOKENS, seed: int = 0):
        self.capacity, self.seen = capacity, 0
        self.rng = np.random.default_rng(seed)
        self.x: List[torch.Tensor] = []
        self.codes: List[torch.Tensor] = []
        self.error: List[float] = []  # ||x - x_hat||^2 of each sampled token (the SAE's own reconstruction)
        self.cut: List[float] = []  # the detection's cut on each sampled token's image (the isolation check)

    def add(self, x: torch.Tensor, codes: torch.Tensor, recon: Optional[torch.Tensor] = None,
            cuts: Optional[np.ndarray] = None) -> None:
        """x [m, d], codes [m, n] of high-norm tokens (in order of reading); recon [m, d]: the SAE's x_hat; cuts
        [m]: the norm above which each token's image counts a token high-norm."""
        err = (x - recon).double().square().sum(-1) if recon is not None else torch.full((len(x),), math.nan)
        cuts = np.full(len(x), math.nan) if cuts is None else np.asarray(cuts, np.float64)
        for i in range(len(x)):
            self.seen += 1
            item = (x[i].double().clone(), codes[i].to_sparse(), float(err[i]), float(cuts[i]))
            if len(self.x) < self.capacity:
                self.x.append(item[0])
                self.codes.append(item[1])
                self.error.append(item[2])
                self.cut.append(item[3])
            else:
                j = int(self.rng.integers(0, self.seen))
                if j < self.capacity:
                    self.x[j], self.codes[j], self.error[j], self.cut[j] = item

    def reconstruction_coverage(self, mean_normal: torch.Tensor) -> Optional[float]:
        """The share of the sampled tokens' excess the SAE's whole reconstruction holds: ``1 - sum ||x - x_hat||^2 /
        sum ||x - mean_normal||^2`` (the most any set of its features can remove)."""
        if not self.x:
            return None
        total = float((torch.stack(self.x) - mean_normal.double()).square().sum())
        return 1.0 - sum(self.error) / total if total > 0 else None

    def columns(self, features: np.ndarray) -> torch.Tensor:
        """Dense codes [m, len(features)] of the sampled tokens."""
        if not self.codes:
            return torch.zeros(0, len(features), dtype=torch.float64)
        idx = torch.as_tensor(features, dtype=torch.long)  # one token densified at a time: memory m x len(features)
        return torch.stack([c.to_dense()[idx] for c in self.codes]).double()


def coverage(excess: torch.Tensor, codes: torch.Tensor, directions: torch.Tensor) -> float:
    """``1 - sum ||e - codes @ directions||^2 / sum ||e||^2``: excess [m, d], codes [m, s], directions [s, d]."""
    total = float(excess.square().sum())
    if total <= 0:
        return 0.0
    return 1.0 - float((excess - codes @ directions).square().sum()) / total


def artifact_subspace(sample: ExcessSample, mean_normal: torch.Tensor, candidates: np.ndarray,
                      directions: torch.Tensor) -> Dict[str, object]:
    """The group of ``candidates`` (feature indices) covering the sampled high-norm tokens' excess: the shortest
    start of the greedy path reaching ``COVER_SHARE`` of the path's best coverage (module docstring).

    Returns:
        {"features": [f, ...] in the order they joined, "coverage": of the group, "gains": coverage added by each,
        "single_coverage": {f: coverage of f alone} for every candidate, "n_tokens": sampled tokens,
        "path_coverage": the best coverage of the search (the group reaches ``COVER_SHARE`` of it),
        "path_length": features on the search's path}.
    """
    candidates = np.asarray(candidates, dtype=np.int64)
    if not sample.x or not len(candidates):
        return {"features": [], "coverage": 0.0, "gains": [], "single_coverage": {}, "n_tokens": len(sample.x),
                "path_coverage": 0.0, "path_length": 0}
    excess = torch.stack(sample.x) - mean_normal.double()  # [m, d]
    a = sample.columns(candidates)  # [m, c]
    dirs = directions[torch.as_tensor(candidates)].double()  # [c, d]
    total = max(float(excess.square().sum()), 1e-300)
    # ||r - a_f d_f^T||^2 = ||r||^2 - 2 a_f^T r d_f + ||a_f||^2 ||d_f||^2, with r = e - sum_{g chosen} a_g d_g^T:
    # a_f^T r d_f = a_f^T e d_f - sum_g (a_f . a_g)(d_g . d_f), updated by one rank-one term per joining feature
    cross = ((excess @ dirs.T) * a).sum(0)  # [c]: a_f^T r d_f for the current residual
    square = a.square().sum(0) * dirs.square().sum(1)  # [c]
    single = (2 * cross - square) / total
    chosen: List[int] = []
    added: List[float] = []
    free = torch.ones(len(candidates), dtype=torch.bool)
    while len(chosen) < MAX_SUBSPACE and bool(free.any()):
        g = ((2 * cross - square) / total).masked_fill(~free, -math.inf)
        best = int(g.argmax())
        if float(g[best]) < MIN_GAIN:
            break
        chosen.append(best)
        added.append(float(g[best]))
        free[best] = False
        cross = cross - (a.T @ a[:, best]) * (dirs @ dirs[best])
    path = np.cumsum(added) if added else np.zeros(0)
    best_cover = float(path.max()) if len(path) else 0.0
    keep = int(np.argmax(path >= COVER_SHARE * best_cover)) + 1 if best_cover > 0 else 0
    return {"features": [int(candidates[i]) for i in chosen[:keep]],
            "coverage": float(path[keep - 1]) if keep else 0.0, "gains": added[:keep],
            "single_coverage": {int(f): float(v) for f, v in zip(candidates, single)},
            "n_tokens": len(sample.x), "path_coverage": best_cover, "path_length": len(chosen)}


def removal(sample: ExcessSample, features, directions: torch.Tensor) -> Optional[float]:
    """The share of the sampled high-norm tokens whose norm falls to their image's cut or below once the
    contributions ``a_f(x) d_f`` of ``features`` are removed (the zero ablation at the hook; the SAE's error
    stays): None without sampled tokens or cuts."""
    cuts = torch.tensor(sample.cut, dtype=torch.float64)
    if not sample.x or not bool(torch.isfinite(cuts).all()):
        return None
    ids = np.asarray(sorted(int(f) for f in features), dtype=np.int64)
    x = torch.stack(sample.x)
    if len(ids):
        x = x - sample.columns(ids) @ directions[torch.as_tensor(ids)].double()
    return float((x.norm(dim=-1) <= cuts).double().mean())


def isolation(sample: ExcessSample, features, controls: List[List[int]], directions: torch.Tensor) -> Dict[str, object]:
    """Whether removing ``features`` at the hook removes the high-norm tokens beyond random ``controls`` (sets of
    the same size): ``{"removed", "controls_removed", "margin", "isolated"}``; ``isolated`` is None without
    controls or tokens (untested)."""
    target = removal(sample, features, directions)
    against = [removal(sample, c, directions) for c in controls]
    tested = target is not None and bool(against) and None not in against
    return {"removed": target, "controls_removed": against, "margin": ISOLATION_MARGIN,
            "isolated": bool(target - max(against) >= ISOLATION_MARGIN) if tested else None}


def span_cosine(directions: torch.Tensor, target: torch.Tensor) -> Optional[float]:
    """cos between unit ``target`` [d] and its projection on the span of ``directions`` [s, d] (None if s = 0)."""
    if len(directions) == 0:
        return None
    u, sv, _ = torch.linalg.svd(directions.double().T, full_matrices=False)
    q = u[:, sv > 1e-8 * sv.max()]  # [d, rank] orthonormal basis of the span
    t = target.double() / target.double().norm().clamp_min(1e-12)
    return float((q.T @ t).norm())
