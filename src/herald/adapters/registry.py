"""Maps type ids and the spec's aliases to adapters; types are registered here, in order."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pydantic

from herald.adapters.base import SUBMITTED, Adapter, AdapterContext, DestinationConfig
from herald.config import Redactor
from herald.errors import ValidationError


def adapter_classes() -> list[type[Adapter]]:
    """Every destination type Herald ships; adding a type means adding one line here."""
    from herald.adapters.aws_eventbridge import EventBridgeAdapter
    from herald.adapters.aws_kinesis import KinesisAdapter
    from herald.adapters.aws_s3 import S3Adapter
    from herald.adapters.aws_sqs import SQSAdapter
    from herald.adapters.azure_servicebus import ServiceBusAdapter
    from herald.adapters.gcp_pubsub import PubSubAdapter
    from herald.adapters.hookdeck import HookdeckAdapter
    from herald.adapters.rabbitmq import RabbitMQAdapter
    from herald.adapters.webhook import WebhookAdapter

    return [
        WebhookAdapter,
        SQSAdapter,
        KinesisAdapter,
        S3Adapter,
        EventBridgeAdapter,
        PubSubAdapter,
        ServiceBusAdapter,
        RabbitMQAdapter,
        HookdeckAdapter,
    ]


class Registry:
    """The live adapters of one process, keyed by canonical type id."""

    def __init__(self, ctx: AdapterContext, classes: list[type[Adapter]] | None = None) -> None:
        self._adapters: dict[str, Adapter] = {}
        self._names: dict[str, str] = {}
        self.redact = Redactor.of(ctx.settings)
        """Masks the operator's secrets from what an attempt records (herald.attempt)."""
        for cls in classes if classes is not None else adapter_classes():
            self._adapters[cls.type_id] = cls(ctx)
            for name in (cls.type_id, *cls.aliases):
                self._names[name] = cls.type_id

    def __iter__(self) -> Iterator[Adapter]:
        return iter(self._adapters.values())

    def canonical(self, type_name: str) -> str:
        """The canonical id for a type name or alias; ValidationError if unknown."""
        try:
            return self._names[type_name]
        except KeyError:
            known = ", ".join(sorted(self._adapters))
            raise ValidationError(
                f"unknown destination type {type_name!r}; known types: {known}",
                field="type",
                code="destination_type_unknown",
            ) from None

    def names_of(self, canonical: str) -> tuple[str, ...]:
        """The canonical id and its aliases (the keys a body may use)."""
        return tuple(n for n, c in self._names.items() if c == canonical)

    def get(self, type_name: str) -> Adapter:
        return self._adapters[self.canonical(type_name)]

    def parse_config(
        self, type_name: str, raw: Mapping[str, Any], *, submitted: bool = False
    ) -> DestinationConfig:
        """Validate a type-keyed object; errors name the field as ``type.field``.

        ``submitted``: a caller's create or change, held to the rules for new input
        too (:data:`~herald.adapters.base.SUBMITTED`); a stored config read back is
        not, so a rule added later never makes a stored destination unreadable."""
        canonical = self.canonical(type_name)
        model = self._adapters[canonical].config_model
        try:
            return model.model_validate(dict(raw), context=SUBMITTED if submitted else None)
        except pydantic.ValidationError as exc:
            # Every field's problem at once (one per field), the first leading.
            problems: dict[str, ValidationError] = {}
            for err in exc.errors():
                loc = ".".join(str(p) for p in err["loc"])
                name = f"{type_name}.{loc}" if loc else type_name
                if name not in problems:
                    problems[name] = _config_problem(name, canonical, err)
            first, *rest = problems.values()
            first.also = tuple(rest)
            raise first from exc

    async def close(self) -> None:
        for adapter in self._adapters.values():
            await adapter.close()


def _config_problem(name: str, canonical: str, err: Any) -> ValidationError:
    if err["type"] == "missing":
        return ValidationError(f"{name} is required", field=name, code="field_required")
    if err["type"] == "extra_forbidden":
        return ValidationError(
            f"{name} is not a field of {canonical} destinations", field=name, code="unknown_field"
        )
    msg = str(err["msg"]).removeprefix("Value error, ")
    return ValidationError(f"{name}: {msg}", field=name, code="invalid_value")
