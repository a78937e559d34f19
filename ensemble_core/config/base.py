"""The base of every config section."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """The base of every section: unknown keys are errors, instances are frozen."""

    # allow_inf_nan=False: every float field refuses inf and NaN (also '.inf'/'nan' strings).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
