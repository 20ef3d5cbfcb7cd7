"""No configured secret in any log of the whole test run.

Runs last (conftest moves tests marked `after_everything` to the end, and `make test` runs them in a second
pytest once the two-process run of everything else has ended): by then every gateway, worker,
simulator, engine and Stream process of the session has written its log under the artifacts folder,
including the ones that were fed hostile input, wrong tokens and broken configurations.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic import BaseModel, SecretStr

from bots.registry import PLATFORMS
from gateway.config import Settings
from tests.conftest import ARTIFACTS

MIN_SECRET_LEN = 6  # shorter values ("x") would match by accident and are no secret worth the name


def secret_field_names(model: type[BaseModel], seen: set[type] | None = None) -> set[str]:
    """Every field name typed SecretStr in `model` and the models it nests (the configuration's own word
    for what is secret, so a new secret field is checked without touching this test)."""
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    names: set[str] = set()
    for name, field in model.model_fields.items():
        types = [field.annotation, *get_args(field.annotation)]
        for kind in types:
            for inner in (kind, *get_args(kind)):
                if inner is SecretStr:
                    names.add(name)
                elif isinstance(inner, type) and issubclass(inner, BaseModel):
                    names |= secret_field_names(inner, seen)
    return names


def values_under(data: Any, names: set[str]) -> Iterator[str]:
    if isinstance(data, dict):
        for key, value in data.items():
            if key in names and isinstance(value, str) and len(value) >= MIN_SECRET_LEN:
                yield value
            else:
                yield from values_under(value, names)
    elif isinstance(data, list):
        for item in data:
            yield from values_under(item, names)


def redis_passwords(config: Any) -> Iterator[str]:
    """The password inside a `redis_url` (a plain str field, but a secret all the same)."""
    url = config.get("redis_url") if isinstance(config, dict) else None
    password = urlsplit(url).password if isinstance(url, str) else None
    if password and len(password) >= MIN_SECRET_LEN:
        yield password


@pytest.mark.after_everything
def test_no_configured_secret_appears_in_any_log() -> None:
    names = secret_field_names(Settings)
    for platform in PLATFORMS.values():
        names |= secret_field_names(platform.config)
    assert {"secret", "token", "encoding_aes_key", "app_secret", "password"} <= names

    secrets: set[str] = set()
    for path in ARTIFACTS.rglob("*.yaml"):
        try:
            config = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError:
            continue  # a test's deliberately broken file
        secrets |= set(values_under(config, names))
        secrets |= set(redis_passwords(config))
    logs = [path for path in ARTIFACTS.rglob("*.log") if path.is_file()]
    assert secrets and logs, "the run wrote no configuration or no log: this test would prove nothing"

    leaks: list[str] = []
    for path in logs:
        text = path.read_text(encoding="utf-8", errors="replace")
        leaks += [f"{path.relative_to(ARTIFACTS)}: a {len(s)}-character secret" for s in secrets if s in text]
    assert not leaks, "\n".join(sorted(set(leaks))[:20])
