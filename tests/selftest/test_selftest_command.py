"""``loopd selftest`` without a real server: arguments, exit statuses, output shapes."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import httpx
import pytest
import respx

from loopd.cli.parser import build_parser
from loopd.cli.selftest import cmd_selftest, selftest
from loopd.config import EndpointSettings, load_settings
from loopd.selftest.expected import DEFAULT_DIR


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def test_the_parser_has_selftest_with_its_options() -> None:
    args = parse(["selftest", "--record", "--json", "--model", "smollm2-think"])
    assert (args.record, args.json, args.model) == (True, True, "smollm2-think")
    assert args.expected_dir == DEFAULT_DIR
    assert args.handler.handler() is cmd_selftest
    plain = parse(["selftest"])
    assert (plain.record, plain.json, plain.model, plain.tools) == (False, False, None, None)


def test_unreachable_server_exits_2_and_says_so(tmp_path: Path) -> None:
    settings = load_settings(infer_url=f"unix:{tmp_path / 'absent.sock'}", model="m", connect_s=1.0)
    out = io.StringIO()
    status = selftest(settings, out=out, expected_dir=tmp_path)
    text = out.getvalue()
    assert status == 2
    assert "FAIL  server: expected healthy, build " in text
    assert "got unreachable" in text
    assert "is unreachable" in text


def test_unreachable_with_record_writes_nothing(tmp_path: Path) -> None:
    settings = load_settings(infer_url=f"unix:{tmp_path / 'absent.sock'}", model="m", connect_s=1.0)
    status = selftest(settings, record=True, out=io.StringIO(), expected_dir=tmp_path)
    assert status == 2
    assert list(tmp_path.glob("*.json")) == []


def test_a_broken_tools_file_exits_2_naming_it(tmp_path: Path) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text("{")
    err = io.StringIO()
    status = selftest(load_settings(), tools_path=tools, out=io.StringIO(), err=err)
    assert status == 2
    assert str(tools) in err.getvalue()


@respx.mock
def test_a_model_the_router_does_not_serve_fails_naming_what_it_serves(tmp_path: Path) -> None:
    url = "http://llama.test:8080"
    respx.get(f"{url}/health").mock(return_value=httpx.Response(200, json={"status": "ok"}))
    listing = {"data": [{"id": "other", "aliases": [], "status": {"value": "loaded"}}]}
    respx.get(f"{url}/models").mock(return_value=httpx.Response(200, json=listing))
    out = io.StringIO()
    status = selftest(
        load_settings(infer_url=url, model="wanted"), as_json=True, out=out, expected_dir=tmp_path
    )
    report = json.loads(out.getvalue())
    checks = {c["name"]: c for c in report["checks"]}
    assert status == 1
    assert report["ok"] is False
    assert checks["model served"]["actual"] == "not served; the server serves other"
    # Nothing further was asked of the router: every later call would have named the model.
    assert checks["context per slot"]["detail"] == "wanted is not served"
    assert report["template"]["keeps_past_reasoning"] == "unknown"
    assert report["pool"] == {"idle_slots_cleared": None}


@pytest.mark.parametrize("as_json", [False, True])
def test_output_goes_to_out_only(tmp_path: Path, as_json: bool) -> None:
    settings = load_settings(infer_url=f"unix:{tmp_path / 'absent.sock'}", model="m", connect_s=1.0)
    out, err = io.StringIO(), io.StringIO()
    selftest(settings, as_json=as_json, out=out, err=err, expected_dir=tmp_path)
    assert err.getvalue() == ""
    if as_json:
        assert json.loads(out.getvalue())["exit_status"] == 2
    else:
        assert out.getvalue().splitlines()[-1].startswith("FAIL: 0 of ")


def two_endpoints(tmp_path: Path) -> dict[str, object]:
    return {
        "endpoint": tuple(
            EndpointSettings(name=name, url=f"unix:{tmp_path / name}.sock", model="smollm2")
            for name in ("gpu1", "gpu2")
        ),
        "connect_s": 1.0,
    }


def test_every_endpoint_is_tested_and_named(tmp_path: Path) -> None:
    out = io.StringIO()
    status = selftest(
        load_settings(**two_endpoints(tmp_path)), as_json=True, out=out, expected_dir=tmp_path
    )
    reports = json.loads(out.getvalue())
    assert status == 2
    assert [(r["endpoint"], r["url"], r["exit_status"]) for r in reports] == [
        ("gpu1", f"unix:{tmp_path / 'gpu1'}.sock", 2),
        ("gpu2", f"unix:{tmp_path / 'gpu2'}.sock", 2),
    ]
    # Nothing recorded for either: a record would write each endpoint's own file.
    assert [r["expectations"] for r in reports] == [
        str(tmp_path / "endpoints" / "gpu1.json"),
        str(tmp_path / "endpoints" / "gpu2.json"),
    ]


def test_one_endpoint_is_tested_by_name_and_an_unknown_name_is_one_line(tmp_path: Path) -> None:
    settings = load_settings(**two_endpoints(tmp_path))
    out = io.StringIO()
    assert selftest(settings, endpoint="gpu2", out=out, expected_dir=tmp_path) == 2
    assert out.getvalue().startswith(f"loopd selftest: endpoint gpu2: smollm2 at unix:{tmp_path}")
    assert "gpu1" not in out.getvalue()
    err = io.StringIO()
    assert selftest(settings, endpoint="gpu3", out=io.StringIO(), err=err) == 2
    assert err.getvalue() == "loopd selftest: no endpoint named 'gpu3' (endpoints: gpu1, gpu2)\n"
