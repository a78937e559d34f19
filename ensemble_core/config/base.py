"""The base of every config section."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class Section(BaseModel):
    """The base of every section: unknown keys are errors, instances are frozen.

    A sub-section given in part (``{"sorted_init": 2}`` for ``ensemble.selection``) keeps
    the field's own defaults for the keys it leaves out: the default the schema documents
    for that field (``ensemble.selection`` defaults to bagged selection without
    replacement, ``ensemble.first_selection`` to greedy with replacement), not the
    sub-section class's defaults.
    """

    # allow_inf_nan=False: every float field refuses inf and NaN (also '.inf'/'nan' strings).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _partial_sections_keep_the_field_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        merged = None
        for name, field in cls.model_fields.items():
            given = data.get(name)
            if not isinstance(given, dict) or field.default_factory is None:
                continue
            default = field.default_factory()  # type: ignore[call-arg]  # no-argument factories here
            if not isinstance(default, Section):
                continue
            merged = merged if merged is not None else dict(data)
            merged[name] = {**default.model_dump(exclude_defaults=True), **given}
        return data if merged is None else merged
