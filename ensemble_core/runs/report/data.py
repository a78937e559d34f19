"""The report's data sections: the data snapshot's lineage and the drift signal, as
markdown lines (``report.md``, the report artifact) and table rows (Prefect artifacts)."""

from __future__ import annotations


def _counts(counts: list[int]) -> str:
    return ", ".join(f"{c}: {n}" for c, n in enumerate(counts))


def snapshot_rows(snapshot: dict | None) -> list[dict]:
    """The lineage as table rows (``field``, ``value``): fingerprint, source, prepared,
    examples and class counts per split."""
    if not snapshot:
        return []
    rows = [
        {"field": "fingerprint", "value": snapshot["fingerprint"]},
        {"field": "source", "value": snapshot["source"]},
        {"field": "prepared at", "value": snapshot["prepared_at"]},
        {"field": "snapshot directory", "value": snapshot["path"]},
    ]
    for split, n in snapshot["splits"].items():
        rows.append({"field": f"{split} examples", "value": str(n)})
    for split, counts in snapshot["class_counts"].items():
        rows.append({"field": f"{split} class counts", "value": _counts(counts)})
    return rows


def snapshot_lines(snapshot: dict | None) -> list[str]:
    """``report.md``'s data snapshot section."""
    if not snapshot:
        return []
    splits = ", ".join(f"{n} {split}" for split, n in snapshot["splits"].items())
    return [
        f"**Data snapshot** `{snapshot['fingerprint']}` of `{snapshot['name']}`: {splits} examples, from "
        f"{snapshot['source']}, prepared {snapshot['prepared_at']}.",
        "",
        *(f"- {split} class counts: {_counts(counts)}" for split, counts in snapshot["class_counts"].items()),
        "",
    ]


def drift_rows(drift: dict | None) -> list[dict]:
    """The drift figures as table rows (``figure``, ``value``, ``reference``)."""
    if not drift:
        return []
    rows = []
    labels, unc = drift.get("label_shift"), drift.get("uncertainty")
    if labels:
        rows.append(
            {
                "figure": "class frequencies' total variation",
                "value": round(labels["total_variation"], 4),
                "reference": 0,
            }
        )
    if unc:
        for key, label in (
            ("mean_predictive_entropy", "mean predictive entropy (nats)"),
            ("mean_mutual_information", "mean mutual information (nats)"),
        ):
            rows.append(
                {"figure": label, "value": round(unc["new"][key], 4), "reference": round(unc["reference"][key], 4)}
            )
    return rows


def drift_lines(drift: dict | None) -> list[str]:
    """``report.md``'s drift section: the figures, the thresholds exceeded, what was not computed."""
    if not drift:
        return []
    if drift.get("champion_run") is None:
        return [f"**Drift**: not computed ({'; '.join(drift.get('not_computed') or [])}).", ""]
    verdict = "**drift**: " + "; ".join(drift["exceeded"]) if drift["exceeded"] else "no threshold exceeded"
    lines = [
        f"**Drift against champion {drift['champion_run']}** (snapshot {drift.get('champion_snapshot') or 'unknown'} "
        f"-> {drift.get('snapshot') or 'unknown'}): {verdict}.",
        "",
    ]
    labels, unc = drift.get("label_shift"), drift.get("uncertainty")
    if labels:
        worst = labels["largest_change"]
        lines.append(
            f"- class frequencies: total variation {labels['total_variation']:.4f}; class {worst['class']} moved "
            f"most ({worst['delta']:+.4f})"
        )
    if unc:
        lines.append(
            f"- champion on the new training split ({unc['new']['examples']} examples) vs its own test split "
            f"({unc['reference']['examples']}): mean predictive entropy {unc['new']['mean_predictive_entropy']:.4f} vs "
            f"{unc['reference']['mean_predictive_entropy']:.4f} nats, mean mutual information "
            f"{unc['new']['mean_mutual_information']:.4f} vs {unc['reference']['mean_mutual_information']:.4f} nats"
        )
    for why in drift.get("not_computed") or []:
        lines.append(f"- not computed: {why}")
    return [*lines, ""]
