"""The report's data sections: the data snapshot's lineage and the drift signal, as
markdown lines (``report.md``, the report artifact) and table rows (Prefect artifacts)."""

from __future__ import annotations


def _counts(counts: list[int]) -> str:
    return ", ".join(f"{c}: {n}" for c, n in enumerate(counts))


def _named_counts(snapshot: dict, counts: list[int]) -> str:
    names = snapshot.get("class_names")
    if not names or len(names) != len(counts):
        return _counts(counts)
    return ", ".join(f"{name}: {n}" for name, n in zip(names, counts, strict=True))


def snapshot_rows(snapshot: dict | None) -> list[dict]:
    """The lineage as table rows (``field``, ``value``): fingerprint, source, its path and
    file count (an image folder or arrays), prepared, classes, examples and class counts
    per split (by class name where the snapshot has a class map), files left out."""
    if not snapshot:
        return []
    rows = [
        {"field": "fingerprint", "value": snapshot["fingerprint"]},
        {"field": "source", "value": snapshot["source"]},
        {"field": "prepared at", "value": snapshot["prepared_at"]},
        {"field": "snapshot directory", "value": snapshot["path"]},
    ]
    if snapshot.get("source_path"):
        rows.append({"field": "source path", "value": snapshot["source_path"]})
    if snapshot.get("file_count") is not None:
        rows.append({"field": "source files", "value": str(snapshot["file_count"])})
    if snapshot.get("class_names"):
        rows.append({"field": "classes", "value": ", ".join(snapshot["class_names"])})
    for split, n in snapshot["splits"].items():
        rows.append({"field": f"{split} examples", "value": str(n)})
    for split, counts in snapshot["class_counts"].items():
        rows.append({"field": f"{split} class counts", "value": _named_counts(snapshot, counts)})
    if snapshot.get("skipped_files"):
        rows.append({"field": "files left out (undecodable)", "value": str(len(snapshot["skipped_files"]))})
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
        *(
            f"- {split} class counts: {_named_counts(snapshot, counts)}"
            for split, counts in snapshot["class_counts"].items()
        ),
        *(
            [f"- {len(snapshot['skipped_files'])} file(s) left out as undecodable (data.on_bad_image=skip)"]
            if snapshot.get("skipped_files")
            else []
        ),
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
    tests = drift.get("tests")
    if tests:
        parts = [
            f"{name} p {t['p_value']:.3g} (Holm {t['p_adjusted']:.3g})" + (" **rejected**" if t["rejected"] else "")
            for name, t in tests["tests"].items()
        ]
        lines.append(
            f"- two-sample tests, {tests['n_new']} new examples against the champion's calibration split "
            f"({tests['n_reference']}), alpha {tests['alpha']:g}: " + "; ".join(parts)
        )
    for why in drift.get("not_computed") or []:
        lines.append(f"- not computed: {why}")
    return [*lines, ""]
