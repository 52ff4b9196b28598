"""The demo's parts: what the page is told (who it acts as, where, which reactions), that
nothing in it can end the page's script element early, and the approval brokerd asks for."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx
import pytest

from brokerd.approval import approval_mode
from brokerd.config import load_settings
from brokerd.tools.builtins import BUILTINS
from brokerd.tools.catalogue import load_catalogue
from loopd.chatsettings import ChatSettings
from loopd_dev.demo.page import PageOptions, page_config, page_routes, render_index, script_json
from loopd_dev.fakes.mattermost import FakeMattermost, build_app

DEMO_BROKERD_CONFIG = Path(__file__).parents[2] / "dev" / "loopd_dev" / "demo" / "brokerd.toml"


def config_in(html: str) -> dict[str, object]:
    found = re.search(r'<script id="demo-config" type="application/json">(.*?)</script>', html)
    assert found is not None, html
    config: dict[str, object] = json.loads(found.group(1))
    return config


def test_the_page_acts_as_the_person_in_the_channel_with_loopds_reactions() -> None:
    fake = FakeMattermost()
    chat = ChatSettings(stop_reaction="stop_sign", allow_reaction="thumbsup")
    config = page_config(
        fake, PageOptions(person="bob", channel="dev", status_url="http://x/", chat=chat)
    )
    bob = fake.user("bob")
    assert config["person"] == {"id": bob.id, "username": "bob", "token": bob.token}
    assert config["channel"] == {"id": fake.channel("dev").id, "name": "dev"}
    assert config["bot"] == {"id": fake.bot.id, "username": "loopd"}
    assert config["users"] == {u.id: u.username for u in fake.world.users.values()}
    assert [(r["emoji"], r["glyph"]) for r in config["reactions"]] == [
        ("thumbsup", "✅"),
        ("x", "❌"),
        ("stop_sign", "🛑"),
        ("repeat", "🔁"),
    ]
    assert config["status_url"] == "http://x/"


def test_a_name_that_closes_the_script_element_stays_text() -> None:
    hostile = {"name": "</script><script>alert(1)</script><!-- & -->"}
    text = script_json(hostile)
    assert not {"<", ">", "&"} & set(text)
    assert json.loads(text) == hostile
    html = render_index('<script type="application/json">__DEMO_CONFIG__</script>', hostile)
    assert html.count("</script>") == 1


def test_a_template_without_its_one_mark_is_refused() -> None:
    with pytest.raises(ValueError, match="__DEMO_CONFIG__ once"):
        render_index("<html></html>", {})


@pytest.mark.anyio
async def test_the_fake_serves_the_page_its_script_and_style_beside_its_api() -> None:
    fake = FakeMattermost()
    fake.add_user("carol")
    app = build_app(fake, page_routes(PageOptions(person="carol")))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://demo") as client:
        page = await client.get("/")
        script = await client.get("/demo/app.js")
        style = await client.get("/demo/style.css")
        ping = await client.get("/api/v4/system/ping")
        missing = await client.get("/demo/nothing.js")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert config_in(page.text)["person"] == {
        "id": fake.user("carol").id,
        "username": "carol",
        "token": "carol-token",
    }
    assert script.status_code == 200
    assert "authentication_challenge" in script.text
    assert style.status_code == 200
    assert ping.status_code == 200
    assert missing.status_code == 404


def test_the_demos_brokerd_asks_before_host_uptime_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in [n for n in os.environ if n.startswith("BROKERD_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("BROKERD_CONFIG", str(DEMO_BROKERD_CONFIG))
    # As scripts/run.sh gives it.
    monkeypatch.setenv("BROKERD_BROKER__AUDIT_DB", str(tmp_path / "audit.db"))
    broker = load_settings().broker
    assert broker is not None
    catalogue = load_catalogue(broker.catalogue_dir, BUILTINS.keys())
    asking = [spec.name for spec in catalogue if approval_mode(spec, broker.approval) == "ask"]
    assert asking == ["host_uptime"]
