"""The portal's branding settings, the CSP they open, and who a tenant is told made a
replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from herald.config import ConsoleSettings, load_settings
from herald.console.portal import portal_face
from herald.console.replays import made_by
from herald.errors import ConfigError

PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4"
    "DwABBAEAfbLI3wAAAABJRU5ErkJggg=="
)


def load(tmp_path: Path, text: str) -> ConsoleSettings:
    path = tmp_path / "herald.toml"
    path.write_text(f"[console]\n{text}\n")
    return load_settings(path).console


@pytest.mark.parametrize("logo", ["/brand/logo.svg", "/portal/static/x.png?v=2", PNG])
def test_a_same_origin_path_or_an_image_data_url_is_a_logo(tmp_path: Path, logo: str) -> None:
    assert load(tmp_path, f'portal_logo_url = "{logo}"').portal_logo_url == logo


@pytest.mark.parametrize(
    "logo",
    [
        "https://cdn.example.com/logo.png",
        "//cdn.example.com/logo.png",
        "logo.png",
        "javascript:alert(1)",
        "data:text/html;base64,PHNjcmlwdD4=",
        "data:image/png,not-base64",
        "/a b.png",
        "/\\\\evil.example/x.png",
    ],
)
def test_any_other_logo_is_refused_naming_the_setting(tmp_path: Path, logo: str) -> None:
    with pytest.raises(ConfigError, match=r"console\.portal_logo_url: must be a path on Herald"):
        load(tmp_path, f"portal_logo_url = {logo!r}".replace("'", '"'))


@pytest.mark.parametrize("colour", ["red", "#12345", "#1234567", "#ggg", "#fff; color: red"])
def test_an_accent_is_a_hex_colour(tmp_path: Path, colour: str) -> None:
    with pytest.raises(ConfigError, match=r"console\.portal_accent_color: must be a colour"):
        load(tmp_path, f'portal_accent_color = "{colour}"')
    assert load(tmp_path, 'portal_accent_color = "#C2185B"').portal_accent_color == "#C2185B"


def test_tenant_names_are_a_table_of_non_empty_names(tmp_path: Path) -> None:
    names = load(tmp_path, 'tenant_names = { acme = "Acme Corp" }').tenant_names
    assert names == {"acme": "Acme Corp"}
    with pytest.raises(ConfigError, match=r"console\.tenant_names\.acme"):
        load(tmp_path, 'tenant_names = { acme = "" }')


def test_the_csp_opens_only_what_the_brand_uses() -> None:
    plain = portal_face(ConsoleSettings()).csp("N")
    assert "style-src 'self';" in plain
    assert "img-src 'self';" in plain
    branded = portal_face(ConsoleSettings(portal_logo_url=PNG, portal_accent_color="#abc"))
    csp = branded.csp("N")
    assert "style-src 'self' 'nonce-N';" in csp
    assert "img-src 'self' data:;" in csp
    same_origin = portal_face(ConsoleSettings(portal_logo_url="/brand/logo.svg")).csp("N")
    assert "img-src 'self';" in same_origin


@pytest.mark.parametrize(
    ("by", "shown"),
    [
        ("cli:root", "the operator"),
        ("console:k_0123", "the operator"),
        ("service", "the operator"),
        ("portal:globex", "the operator"),
        ("portal:acme", "you, in this portal"),
        ("api:acme", "your API key"),
    ],
)
def test_a_tenant_is_never_told_an_operator_identity(by: str, shown: str) -> None:
    assert made_by(by, "acme") == shown
    assert made_by(by, None) == by  # an operator reads the audit actor
