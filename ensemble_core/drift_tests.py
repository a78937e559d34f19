"""Drift as statistical two-sample tests on the ensemble's predictions: a reference set held
out from training (the run's calibration split) against new unlabelled data.

Where :mod:`ensemble_core.drift` compares drift figures with fixed thresholds, this module
asks whether the two samples could come from one distribution, at a chosen family-wise
error rate ``alpha``. Three tests, all on what the ensemble predicts (no labels needed):

- **predictive entropy**: Kolmogorov-Smirnov two-sample test (``scipy.stats.ks_2samp``,
  two-sided, ``method="auto"``) on the per-example entropy of the ensemble's prediction
  ``H(mean_e p_e)`` (temperature-scaled when a temperature is given), as alibi-detect's
  ``ClassifierUncertaintyDrift`` (``uncertainty_type="entropy"``) does with a classifier's
  uncertainty (https://docs.seldon.ai/alibi-detect/cd/methods/offline/modeluncdrift;
  its reference set, too, is disjoint from the training set).
- **mutual information**: the same KS test on the per-example mutual information
  ``H(mean_e p_e) - mean_e H(p_e)`` of the members (the epistemic part; Houlsby et al.
  2011, Depeweg et al. 2018), computed from the members' own, unscaled probabilities
  (:func:`ensemble_core.metrics.mutual_information`). A single member's mutual information
  is 0 on every example: with E = 1 the test is skipped and the result says so.
- **predicted classes**: Pearson's chi-square test of homogeneity on the 2 x K table of
  predicted-class counts (reference, new) over the K classes predicted in at least one of
  the two sets (``scipy.stats.chi2_contingency``, ``correction=False``: no Yates
  correction, whatever K). The black-box shift detection of Rabanser, Günnemann & Lipton
  2019 ("Failing Loudly", NeurIPS) tests predicted labels this way.
  *Small counts*: the chi-square approximation is trusted only when every expected count
  of that table is at least :data:`MIN_EXPECTED_COUNT` (5; Cochran 1954's rule in its
  strict form). Below that the p-value comes from a permutation test of the total
  variation distance ``0.5 * sum_k |a_k / n_ref - b_k / n_new|`` between the two
  predicted-class frequencies: :data:`PERMUTATIONS` relabellings of the pooled
  predictions, drawn as multivariate hypergeometric counts (exactly the distribution of a
  random split's reference counts) from ``numpy.random.default_rng(PERMUTATION_SEED)``,
  ``p = (1 + #{TV* >= TV}) / (1 + PERMUTATIONS)`` (Phipson & Smyth 2010): deterministic,
  and a few milliseconds. With one class predicted in both sets (K = 1) there is nothing
  to test: the test is skipped and the result says so.

The raw p-values are adjusted for multiple testing with Holm's step-down procedure (Holm
1979, "A simple sequentially rejective multiple test procedure", Scand. J. Statist. 6);
``drifted`` is True when any adjusted p-value is ``<= alpha``, so the chance of a false
alarm is at most ``alpha`` (up to the tests' own approximations), whatever the dependence
between the statistics.

NumPy and SciPy only: no JAX, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ensemble_core import calibration, metrics
from ensemble_core.errors import ConfigError, DataError

#: The tests' names, in report order (the keys of ``drift_tests(...)["tests"]``).
ENTROPY_TEST = "predictive_entropy"
MUTUAL_INFORMATION_TEST = "mutual_information"
CLASS_TEST = "predicted_class"
TEST_NAMES = (ENTROPY_TEST, MUTUAL_INFORMATION_TEST, CLASS_TEST)

#: The method names a result carries.
KS_METHOD = "ks_2samp"
CHI2_METHOD = "chi2_contingency"
PERMUTATION_METHOD = "permutation_total_variation"
CORRECTION = "holm"

#: The smallest expected count of the predicted-class table the chi-square test is used with.
MIN_EXPECTED_COUNT = 5.0
#: Relabellings of the permutation test that replaces it below that, and their seed.
PERMUTATIONS = 9999
PERMUTATION_SEED = 0

#: How far a row of probabilities may sum from 1 (float32 softmax outputs sum within 1e-6).
SUM_TOLERANCE = 1e-3


@dataclass(frozen=True)
class DriftReference:
    """What the tests need from the reference set (the run's calibration split), so the
    reference's member probabilities need not be kept.

    Attributes:
      entropy: per-example predictive entropy ``H(mean_e p_e)`` of the (temperature-scaled)
        ensemble prediction, n floats (nats).
      mutual_information: per-example mutual information of the members, n floats (nats;
        all 0 with one member).
      class_counts: how many reference examples the ensemble predicts as each class, C ints
        (sum n).
      members: E, the ensemble's member count (new data must come from as many).
      temperature: the temperature the ensemble prediction was scaled with, or None.
    """

    entropy: tuple[float, ...]
    mutual_information: tuple[float, ...]
    class_counts: tuple[int, ...]
    members: int
    temperature: float | None = None

    @property
    def n(self) -> int:
        """The number of reference examples."""
        return len(self.entropy)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: lists of floats (entropies, mutual informations), a list of ints
        (class counts), ``members`` and ``temperature`` (float or None). Python floats
        survive ``json.dumps``/``json.loads`` exactly, so :meth:`from_dict` gives back an
        equal reference."""
        return {
            "entropy": [float(v) for v in self.entropy],
            "mutual_information": [float(v) for v in self.mutual_information],
            "class_counts": [int(v) for v in self.class_counts],
            "members": int(self.members),
            "temperature": None if self.temperature is None else float(self.temperature),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DriftReference:
        """The reference :meth:`to_dict` wrote.

        Raises:
          DataError: a key missing, lengths that differ, non-finite or negative values,
            class counts that do not sum to the number of examples, no examples.
          ConfigError: a temperature that is not finite and > 0.
        """
        fix = "rebuild it with drift_tests.reference_from on the calibration split's member probabilities"
        if not isinstance(d, dict):
            raise DataError(f"drift reference is a {type(d).__name__}, not a dict", fix)
        missing = [k for k in ("entropy", "mutual_information", "class_counts", "members") if k not in d]
        if missing:
            raise DataError(f"drift reference lacks {', '.join(missing)}", fix)
        try:
            ent = np.asarray(d["entropy"], np.float64)
            mi = np.asarray(d["mutual_information"], np.float64)
            counts = np.asarray(d["class_counts"], np.float64)
            members = d["members"]
        except (TypeError, ValueError) as e:
            raise DataError(f"drift reference holds values that are not numbers ({e})", fix) from e
        if ent.ndim != 1 or mi.shape != ent.shape:
            raise DataError(
                f"drift reference has {ent.size} entropies and {mi.size} mutual informations, not one list each "
                "of the same length",
                fix,
            )
        if ent.size == 0:
            raise DataError("drift reference has no examples", fix)
        if not (np.isfinite(ent).all() and np.isfinite(mi).all()):
            raise DataError("drift reference holds non-finite entropies or mutual informations", fix)
        if counts.ndim != 1 or counts.size == 0 or not np.isfinite(counts).all() or (counts < 0).any():
            raise DataError(f"drift reference's class_counts {d['class_counts']!r} are not C counts >= 0", fix)
        if (counts != np.round(counts)).any() or int(counts.sum()) != ent.size:
            raise DataError(
                f"drift reference's class counts sum to {counts.sum():g}, not to its {ent.size} examples", fix
            )
        if isinstance(members, bool) or not isinstance(members, int) or members < 1:
            raise DataError(f"drift reference's members {members!r} is not an int >= 1", fix)
        temperature = _checked_temperature(d.get("temperature"))
        return cls(
            entropy=tuple(float(v) for v in ent),
            mutual_information=tuple(float(v) for v in mi),
            class_counts=tuple(int(v) for v in counts),
            members=members,
            temperature=temperature,
        )


def _checked_temperature(temperature: Any) -> float | None:
    if temperature is None:
        return None
    ok = isinstance(temperature, int | float | np.integer | np.floating) and not isinstance(temperature, bool)
    if not (ok and math.isfinite(temperature) and temperature > 0):
        raise ConfigError(
            f"temperature {temperature!r} is not finite and > 0",
            "pass the run's fitted temperature (selection.json) or None",
        )
    return float(temperature)


def _checked_member_probs(member_probs: Any, what: str) -> np.ndarray:
    p = np.asarray(member_probs, np.float64)
    fix = f"pass the ensemble's member probabilities on the {what} as float [E, N, C]"
    if p.ndim != 3:
        raise DataError(f"{what} member probabilities have shape {p.shape}, not [E, N, C]", fix)
    e, n, c = p.shape
    if e == 0 or n == 0 or c == 0:
        raise DataError(f"{what} member probabilities of shape {p.shape} are empty (E, N and C must be >= 1)", fix)
    if not np.isfinite(p).all() or (p < 0).any():
        raise DataError(f"{what} member probabilities hold negative or non-finite values", fix)
    worst = float(np.max(np.abs(p.sum(-1) - 1.0)))
    if worst > SUM_TOLERANCE:
        raise DataError(f"{what} member probabilities' rows sum up to {worst:.3g} away from 1", fix)
    return p


def _uncertainties(p: np.ndarray, temperature: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-example predictive entropy, mutual information and predicted class of ``p``."""
    mean = metrics.ensemble_probs(p)
    if temperature is not None:
        mean = calibration.apply_temperature(mean, temperature).astype(np.float64)
    return metrics.entropy(mean), metrics.mutual_information(p), np.argmax(mean, axis=-1)


def reference_from(member_probs: np.ndarray, temperature: float | None = None) -> DriftReference:
    """The :class:`DriftReference` of a reference set.

    Args:
      member_probs: float ``[E, n, C]``, the members' softmax probabilities on the
        reference set: examples held out from training, i.e. the run's calibration split.
      temperature: the ensemble's temperature (T > 0, :func:`ensemble_core.calibration.
        apply_temperature` on the mean prediction), or None for the plain mean.

    Returns:
      The per-example predictive entropy of the (scaled) mean prediction, the members'
      mutual information (unscaled), the counts of its arg-max classes ``[C]``, E and T.

    Raises:
      DataError: not ``[E, n, C]``, an empty axis, negative or non-finite values, rows not
        summing to 1 (within :data:`SUM_TOLERANCE`).
      ConfigError: a temperature that is not finite and > 0.
    """
    temperature = _checked_temperature(temperature)
    p = _checked_member_probs(member_probs, "reference set's")
    ent, mi, pred = _uncertainties(p, temperature)
    return DriftReference(
        entropy=tuple(float(v) for v in ent),
        mutual_information=tuple(float(v) for v in mi),
        class_counts=tuple(int(v) for v in np.bincount(pred, minlength=p.shape[2])),
        members=int(p.shape[0]),
        temperature=temperature,
    )


def holm(p_values: Any) -> np.ndarray:
    """Holm's step-down adjusted p-values (Holm 1979), in the input's order.

    With the m p-values sorted ascending, ``p_(1) <= ... <= p_(m)``, the adjusted value of
    the i-th is ``max_{j <= i} min(1, (m - j + 1) p_(j))``; rejecting where it is
    ``<= alpha`` controls the family-wise error rate at ``alpha`` under any dependence.
    Each adjusted value is at most Bonferroni's ``min(1, m p)`` and at least ``p``.

    Args:
      p_values: float ``[m]`` in [0, 1] (m may be 0).

    Returns:
      float64 ``[m]``.

    Raises:
      DataError: not a 1-d list of numbers in [0, 1].
    """
    p = np.asarray(p_values, np.float64)
    if p.ndim != 1 or np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise DataError(
            f"p-values {np.asarray(p_values).tolist()!r} are not a list of numbers in [0, 1]",
            "pass the raw p-values of the tests",
        )
    m = p.size
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = stepped
    return out


def _ks(reference: np.ndarray, new: np.ndarray) -> dict[str, Any]:
    from scipy import stats  # 0.6 s to import: only where a test is computed

    res = stats.ks_2samp(reference, new)
    return {"method": KS_METHOD, "statistic": float(res.statistic), "p_value": float(res.pvalue)}


def _class_test(reference_counts: np.ndarray, new_counts: np.ndarray) -> dict[str, Any] | str:
    """The predicted-class test's figures, or why it was skipped."""
    kept = np.flatnonzero((reference_counts + new_counts) > 0)
    if kept.size < 2:
        return "one class predicted in both sets: the class frequencies cannot differ"
    table = np.stack([reference_counts[kept], new_counts[kept]]).astype(np.float64)
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    out: dict[str, Any] = {"classes": kept.tolist(), "min_expected_count": float(expected.min())}
    if expected.min() >= MIN_EXPECTED_COUNT:
        from scipy import stats  # 0.6 s to import: only where a test is computed

        res = stats.chi2_contingency(table, correction=False)
        return {
            "method": CHI2_METHOD,
            "statistic": float(res.statistic),
            "p_value": float(res.pvalue),
            "dof": int(res.dof),
            **out,
        }
    n_ref, n_new = int(table[0].sum()), int(table[1].sum())
    pooled = (table[0] + table[1]).astype(np.int64)
    observed = 0.5 * float(np.abs(table[0] / n_ref - table[1] / n_new).sum())
    draws = np.random.default_rng(PERMUTATION_SEED).multivariate_hypergeometric(pooled, n_ref, size=PERMUTATIONS)
    tv = 0.5 * np.abs(draws / n_ref - (pooled - draws) / n_new).sum(axis=1)
    hits = int(np.count_nonzero(tv >= observed - 1e-12))  # ties count as at least as extreme
    return {
        "method": PERMUTATION_METHOD,
        "statistic": observed,
        "p_value": (1 + hits) / (1 + PERMUTATIONS),
        "permutations": PERMUTATIONS,
        "seed": PERMUTATION_SEED,
        **out,
    }


def drift_tests(
    reference: DriftReference, member_probs: np.ndarray, alpha: float = 0.05, temperature: float | None = None
) -> dict[str, Any]:
    """Has the data drifted from the reference set? Two-sample tests on the ensemble's
    predictions, Holm-corrected (see the module's docstring for the tests and rules).

    Args:
      reference: :func:`reference_from` of the calibration split (or :meth:`DriftReference.
        from_dict`).
      member_probs: float ``[E, N, C]``, the same members' probabilities on the new data
        (E and C as the reference's).
      alpha: the family-wise error rate, in (0, 1).
      temperature: the ensemble's temperature, the one the reference was built with (None:
        none).

    Returns:
      ``tests``: per test run (keys among :data:`TEST_NAMES`) ``method``, ``statistic``
      (KS: the largest CDF distance; chi-square: Pearson's X^2; permutation: the total
      variation distance), ``p_value`` (raw), ``p_adjusted`` (Holm), ``rejected``
      (``p_adjusted <= alpha``), and for the class test ``classes`` (the class indices
      kept), ``min_expected_count`` and ``dof`` or ``permutations``/``seed``;
      ``skipped``: {test name: why} for tests not run; ``drifted`` (any test rejected),
      ``alpha``, ``correction`` ("holm"), ``n_reference``, ``n_new``, ``members``,
      ``temperature``.

    Raises:
      DataError: ``member_probs`` not ``[E, N, C]`` probabilities, empty, or E or C not the
        reference's.
      ConfigError: ``alpha`` not in (0, 1); a temperature not finite and > 0, or not the
        reference's.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, int | float | np.floating) or not 0 < alpha < 1:
        raise ConfigError(f"alpha {alpha!r} is not in (0, 1)", "pass a family-wise error rate such as 0.05")
    temperature = _checked_temperature(temperature)
    if temperature != reference.temperature:
        raise ConfigError(
            f"the reference was built with temperature {reference.temperature}, the new data scored with {temperature}",
            "pass the temperature the reference was built with",
        )
    p = _checked_member_probs(member_probs, "new data's")
    e, n, c = p.shape
    if e != reference.members:
        raise DataError(
            f"the new data has {e} members' probabilities, the reference {reference.members}",
            "score both sets with the same ensemble (or rebuild the reference)",
        )
    if c != len(reference.class_counts):
        raise DataError(
            f"the new data has {c} classes, the reference {len(reference.class_counts)}",
            "score both sets with the same ensemble (or rebuild the reference)",
        )
    ent, mi, pred = _uncertainties(p, temperature)

    tests: dict[str, dict[str, Any]] = {ENTROPY_TEST: _ks(np.asarray(reference.entropy), ent)}
    skipped: dict[str, str] = {}
    if e == 1:
        skipped[MUTUAL_INFORMATION_TEST] = "one member: its mutual information is 0 on every example"
    else:
        tests[MUTUAL_INFORMATION_TEST] = _ks(np.asarray(reference.mutual_information), mi)
    classes = _class_test(np.asarray(reference.class_counts, np.int64), np.bincount(pred, minlength=c))
    if isinstance(classes, str):
        skipped[CLASS_TEST] = classes
    else:
        tests[CLASS_TEST] = classes

    adjusted = holm([t["p_value"] for t in tests.values()])
    for t, adj in zip(tests.values(), adjusted, strict=True):
        t["p_adjusted"] = float(adj)
        t["rejected"] = bool(adj <= alpha)
    return {
        "drifted": any(t["rejected"] for t in tests.values()),
        "alpha": float(alpha),
        "correction": CORRECTION,
        "tests": tests,
        "skipped": skipped,
        "n_reference": reference.n,
        "n_new": int(n),
        "members": int(e),
        "temperature": temperature,
    }
