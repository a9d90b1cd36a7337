"""HTML forms to and from the service layer's request bodies.

A form posts flat fields; the service takes the API's JSON shape. These functions
translate, and map the field a service error names (``name``, ``events[2]``,
``webhook.url``) back to the form field it belongs beside. No rule is checked
here: the service checks everything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from herald.adapters.registry import Registry
from herald.errors import HeraldError

CONFIG_PREFIX = "config."


@dataclass(frozen=True, slots=True)
class FormField:
    """One input of a destination type's config."""

    name: str
    label: str
    required: bool
    sensitive: bool
    help: str
    target: bool = False
    """Where messages go: a new value needs every credential given again."""

    @property
    def input_name(self) -> str:
        return CONFIG_PREFIX + self.name


def config_fields(registry: Registry, type_name: str) -> list[FormField]:
    """The inputs of a type's config, required ones first, as its model declares them."""
    model = registry.get(type_name).config_model
    secret = model.sensitive_fields()
    target = model.marked("target")
    out = []
    for name, info in model.model_fields.items():
        out.append(
            FormField(
                name=name,
                label=name.replace("_", " "),
                required=info.is_required(),
                sensitive=name in secret,
                help=info.description or "",
                target=name in target,
            )
        )
    return sorted(out, key=lambda f: not f.required)


def split_events(text: str) -> list[str]:
    """Event patterns typed one per line or separated by commas."""
    return [p.strip() for p in text.replace(",", "\n").splitlines() if p.strip()]


def create_body(form: Mapping[str, str]) -> dict[str, Any]:
    """A create request body from the create form's fields."""
    type_name = form.get("type", "")
    config = {
        key.removeprefix(CONFIG_PREFIX): value
        for key, value in form.items()
        if key.startswith(CONFIG_PREFIX) and value != ""
    }
    return {
        "name": form.get("name", ""),
        "type": type_name,
        "events": split_events(form.get("events", "")),
        type_name: config,
        **flow_body(form),
    }


def flow_body(form: Mapping[str, str]) -> dict[str, Any]:
    """The flow-control fields (docs/flow-control.md) of a create or edit form: the rate
    typed (empty: no limit; not a number: as typed, for the service to refuse), and
    the breaker's checkbox (absent when unticked)."""
    typed = form.get("rate_limit_per_second", "").strip()
    rate: Any = None
    if typed:
        try:
            rate = float(typed)
        except ValueError:
            rate = typed
    return {"rate_limit_per_second": rate, "circuit_breaker": form.get("circuit_breaker") == "on"}


def edit_body(form: Mapping[str, str], type_name: str) -> dict[str, Any]:
    """An update body from the edit form: its name, events and the type's config. A
    credential comes back as shown (masked), which the service reads as "unchanged";
    a field emptied is removed (the service says if it is required)."""
    body: dict[str, Any] = {
        "name": form.get("name", ""),
        "events": split_events(form.get("events", "")),
        **flow_body(form),
    }
    config = {
        key.removeprefix(CONFIG_PREFIX): value if value != "" else None
        for key, value in form.items()
        if key.startswith(CONFIG_PREFIX)
    }
    if config:
        body[type_name] = config
    return body


def form_errors(exc: HeraldError, type_name: str) -> tuple[dict[str, str], str | None]:
    """A service error and the ones riding with it (``also``), as the form shows them:
    each beside its input (the first for an input wins), and the message of one that
    belongs to no input above the form."""
    errors: dict[str, str] = {}
    above = None
    for problem in (exc, *exc.also):
        field = form_field_of(problem.field, type_name)
        if field is None:
            above = above or problem.message
        else:
            errors.setdefault(field, problem.message)
    return errors, above


def form_field_of(error_field: str | None, type_name: str) -> str | None:
    """The form input a service error names, or None (the error goes above the form)."""
    if not error_field:
        return None
    if error_field.startswith("events"):
        return "events"
    if error_field in ("name", "type", "rate_limit_per_second", "circuit_breaker"):
        return error_field
    head, dot, rest = error_field.partition(".")
    if dot and head == type_name:
        return CONFIG_PREFIX + rest.split(".")[0]
    if error_field == type_name:
        return "type"
    return None
