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

import orjson

from herald.adapters.base import MASK
from herald.adapters.registry import Registry
from herald.errors import HeraldError

CONFIG_PREFIX = "config."
BLANK_ROWS = 2
"""Empty rows a key/value field offers after its filled ones (the form works without
JavaScript, so a row more is a reload away: save, and two new ones appear)."""


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
    pairs: bool = False
    """A JSON object of names to strings (a webhook's ``custom_headers``), edited as
    name/value rows: ``config.<name>.<row>.name`` and ``….value``."""
    multiline: bool = False
    """Text of several lines (a PEM), edited in a textarea: a browser posts its line
    breaks as CRLF, which :func:`field_value` turns back into LF."""

    @property
    def input_name(self) -> str:
        return CONFIG_PREFIX + self.name

    def row_input(self, row: int, part: str) -> str:
        """The input of a row's ``name`` or ``value`` (a pairs field)."""
        return f"{self.input_name}.{row}.{part}"


@dataclass(frozen=True, slots=True)
class Row:
    """One name/value row of a pairs field as the form shows it."""

    index: int
    name: str
    value: str


def config_fields(registry: Registry, type_name: str) -> list[FormField]:
    """The inputs of a type's config, required ones first, as its model declares them;
    not the fields the type accepts without using them (``unused_fields``)."""
    model = registry.get(type_name).config_model
    secret = model.sensitive_fields()
    target = model.marked("target")
    pairs = model.marked("pairs")
    multiline = model.marked("multiline")
    out = []
    for name, info in model.model_fields.items():
        if name in model.unused_fields:
            continue
        out.append(
            FormField(
                name=name,
                label=name.replace("_", " "),
                required=info.is_required(),
                sensitive=name in secret,
                help=info.description or "",
                target=name in target,
                pairs=name in pairs,
                multiline=name in multiline,
            )
        )
    return sorted(out, key=lambda f: not f.required)


EVENTS_ADD = "events_add"
"""The input beside the events textarea that offers the tenant's catalog types (a
datalist, free text allowed): what it holds joins the events typed."""


def split_events(text: str) -> list[str]:
    """Event patterns typed one per line or separated by commas."""
    return [p.strip() for p in text.replace(",", "\n").splitlines() if p.strip()]


def form_events(form: Mapping[str, str]) -> list[str]:
    """The events of a create or edit form: those typed in the textarea, then the one
    picked (or typed) in the catalog input, each once."""
    typed = split_events(form.get("events", "")) + split_events(form.get(EVENTS_ADD, ""))
    return list(dict.fromkeys(typed))


def field_value(f: FormField, posted: str) -> str:
    """A config field's value as posted: a textarea's CRLF line breaks (HTML's form
    encoding) back to LF, so a PEM pasted in comes out as it went in."""
    return posted.replace("\r\n", "\n") if f.multiline else posted


def create_body(form: Mapping[str, str], fields: list[FormField]) -> dict[str, Any]:
    """A create request body from the create form's fields (a pairs field as the JSON
    object its rows make, left out without a row)."""
    type_name = form.get("type", "")
    config: dict[str, Any] = {}
    for f in fields:
        if f.pairs:
            rows = pair_rows(form, f)
            if rows:
                config[f.name] = _json(rows)
        elif form.get(f.input_name, "") != "":
            config[f.name] = field_value(f, form[f.input_name])
    # An input of no field of the type (a stale page) is passed on: the service names it.
    config.update(
        {
            key.removeprefix(CONFIG_PREFIX): value
            for key, value in form.items()
            if key.startswith(CONFIG_PREFIX)
            and value != ""
            and key.removeprefix(CONFIG_PREFIX).partition(".")[0] not in {f.name for f in fields}
        }
    )
    return {
        "name": form.get("name", ""),
        "type": type_name,
        "events": form_events(form),
        type_name: config,
        **flow_body(form),
        **ordering_body(form),
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
    return {
        "rate_limit_per_second": rate,
        "circuit_breaker": form.get("circuit_breaker") == "on",
    }


def ordering_body(form: Mapping[str, str]) -> dict[str, Any]:
    """The order per key (docs/ordering.md) of a create or edit form: a checkbox."""
    return {"ordering": "key" if form.get("ordering") == "key" else "none"}


def edit_body(
    form: Mapping[str, str],
    type_name: str,
    fields: list[FormField],
    stored: Mapping[str, Any],
) -> dict[str, Any]:
    """An update body from the edit form: its name, events and the type's config. A
    credential comes back as shown (masked), which the service reads as "unchanged";
    a field emptied is removed (the service says if it is required). ``stored`` is the
    destination's config with its credentials, for the values a pairs field's rows
    leave masked (see :func:`pairs_value`)."""
    body: dict[str, Any] = {
        "name": form.get("name", ""),
        "events": form_events(form),
        **flow_body(form),
        **ordering_body(form),
    }
    repointed = any(
        f.target and form.get(f.input_name, "") != str(stored.get(f.name) or "")
        for f in fields
        if f.input_name in form
    )
    config: dict[str, Any] = {}
    for f in fields:
        if f.pairs:
            if any(key.startswith(f.input_name + ".") for key in form):
                config[f.name] = pairs_value(
                    pair_rows(form, f), stored.get(f.name), repointed=repointed
                )
        elif f.input_name in form:
            value = field_value(f, form[f.input_name])
            config[f.name] = value if value != "" else None
    if config:
        body[type_name] = config
    return body


def pair_rows(form: Mapping[str, str], field: FormField) -> list[tuple[str, str]]:
    """The filled rows of a pairs field, in order (a row without name and value is
    skipped; one with only a value keeps its empty name, which the service refuses)."""
    rows = []
    row = 0
    while field.row_input(row, "name") in form or field.row_input(row, "value") in form:
        name = form.get(field.row_input(row, "name"), "").strip()
        value = form.get(field.row_input(row, "value"), "")
        if name or value:
            rows.append((name, value))
        row += 1
    return rows


def stored_pairs(stored: object) -> dict[str, str]:
    """A pairs field's stored JSON object ({} for none, or for one that is not)."""
    if not isinstance(stored, str):
        return {}
    try:
        value = orjson.loads(stored)
    except orjson.JSONDecodeError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def pairs_value(rows: list[tuple[str, str]], stored: object, *, repointed: bool) -> str | None:
    """What an edited pairs field sends: ``********`` (unchanged) when its rows are the
    stored ones with every value left masked; None (removed) without a row; else the
    JSON object of its rows, a value left masked being the stored value of that name.
    When the change re-points the destination a masked value is never filled in: the
    field is then sent as unchanged, and the service asks for it again (the re-point
    rule, docs/security.md)."""
    old = stored_pairs(stored)
    masked = [name for name, value in rows if value == MASK]
    if not rows:
        return None
    if not masked:
        return _json(rows)
    if repointed or ([name for name, _ in rows] == list(old) and len(masked) == len(rows)):
        return MASK
    return _json([(name, old.get(name, value) if value == MASK else value) for name, value in rows])


def shown_rows(
    field: FormField, form: Mapping[str, str] | None, stored: list[str], *, retype: bool = False
) -> list[Row]:
    """The rows a pairs field shows: those of a form sent back (its values gone but
    the ones left masked), else the stored names with their values masked; then
    :data:`BLANK_ROWS` empty ones. A value is shown masked only where it stays the
    stored one if sent back so: never with ``retype`` (it must be typed again), never
    where one was typed (a typed credential is not sent back, and a masked one would
    silently keep the old value)."""
    if form is not None and any(k.startswith(field.input_name + ".") for k in form):
        shown = [
            (name, MASK if value == MASK and name in stored else "")
            for name, value in pair_rows(form, field)
        ]
    else:
        shown = [(name, MASK) for name in stored]
    rows = [Row(i, name, "" if retype else value) for i, (name, value) in enumerate(shown)]
    return rows + [Row(len(rows) + i, "", "") for i in range(BLANK_ROWS)]


def _json(rows: list[tuple[str, str]]) -> str:
    return orjson.dumps(dict(rows)).decode()


def without_credentials(form: Mapping[str, str], fields: list[FormField]) -> dict[str, str]:
    """A form to show again without what was typed in a credential's input (the values
    of a credential pairs field's rows included, but those left masked)."""
    secret = {f.input_name for f in fields if f.sensitive}
    return {
        k: v
        for k, v in form.items()
        if k not in secret
        and not (
            k.endswith(".value") and k.rpartition(".")[0].rpartition(".")[0] in secret and v != MASK
        )
    }


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
