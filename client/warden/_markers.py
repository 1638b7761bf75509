"""Schema markings set from pydantic models: ``Annotated[str, warden.Sensitive]``.

The same markings can be written by hand in ``json_schema_extra``; these are
the short form. They apply to whatever they annotate: a scalar, a list, or a
whole nested model.
"""

from __future__ import annotations

from typing import Any

from pydantic import GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from warden.shared.schema import MODEL_VISIBLE, SENSITIVE


class SchemaMarking:
    """Adds one ``x-warden-*`` keyword to the JSON Schema of what it annotates."""

    __slots__ = ("keyword", "value")

    def __init__(self, keyword: str, value: Any) -> None:
        self.keyword = keyword
        self.value = value

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = dict(handler(core_schema))
        schema[self.keyword] = self.value
        return schema

    def __repr__(self) -> str:
        return f"SchemaMarking({self.keyword!r}, {self.value!r})"


Sensitive = SchemaMarking(SENSITIVE, True)
"""``x-warden-sensitive: true``: the value never appears in clear in the audit
store, logs or error details (SI-5)."""

ModelHidden = SchemaMarking(MODEL_VISIBLE, False)
"""``x-warden-model-visible: false``: the field is stripped from output before
a model sees it (``Envelope.model_output``)."""
