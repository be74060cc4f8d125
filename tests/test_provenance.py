"""Provenance sidecars: credentials redacted, directories digested file by file."""

import json

from stillroom.io import read_json
from stillroom.provenance import digest, now, redact, sidecar_path, write_sidecars


def test_redact_and_directory_digest(tmp_path):
    assert redact({"a": {"token": "t", "n": 1}, "list": [{"password": "p"}]}) == {
        "a": {"token": "<redacted>", "n": 1},
        "list": [{"password": "<redacted>"}],
    }
    counts = {
        "max_tokens": 5,
        "max_new_tokens": 6,
        "completion_tokens": 7,
        "daily_output_tokens": 8,
    }
    assert redact(counts) == counts  # token counts are not credentials
    assert redact({"hf_token": "x", "OPENAI_API_KEY": "y", "api_key_env": "OPENAI_API_KEY"}) == {
        "hf_token": "<redacted>",
        "OPENAI_API_KEY": "<redacted>",
        "api_key_env": "OPENAI_API_KEY",
    }
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.bin").write_bytes(b"1")
    first = digest(tmp_path / "d")
    assert set(first["files"]) == {"x.bin"}
    (tmp_path / "d" / "x.bin").write_bytes(b"2")
    assert digest(tmp_path / "d")["sha256"] != first["sha256"]


def test_sidecars_redact_credential_params(tmp_path, monkeypatch):
    """What no stage's typed params let through the CLI any more: a credential-like param is never
    written to a sidecar, nor a credential-like STILLROOM_* environment variable."""
    monkeypatch.setenv("STILLROOM_API_KEY", "sk-secret")
    out = tmp_path / "t.md"
    out.write_text("table")
    params = {"seed": 0, "api_key": "sk-secret", "api_key_env": "OPENAI_API_KEY"}
    write_sidecars({"markdown": out}, {}, stage="tables", params=params, started=now())
    prov = read_json(sidecar_path(out))
    assert "sk-secret" not in json.dumps(prov) and prov["params"]["api_key"] == "<redacted>"
    assert prov["params"]["api_key_env"] == "OPENAI_API_KEY"
