"""No credential in any output: generation through the real workflow against a local
OpenAI-compatible server, with keys in variables of several names (the teacher's ``api_key_env``
among them), and every file the run wrote scanned for each key's value."""

from __future__ import annotations

import json

import pytest

from ..conftest import run_snakemake, small_config
from ..fault_server import FaultServer

SECRETS = {
    "STILLROOM_OPENAI_KEY": "sk-live-stillroom-openai-4242",  # the teacher's api_key_env
    "MY_TOKEN": "tok-my-own-token-4343",
    "HF_TOKEN": "hf_tokenvalue4444abcdef",
    "OPENAI_API_KEY": "sk-openai-api-key-4545",
    "STILLROOM_SECRET_THING": "the-stillroom-secret-4646",
}


@pytest.mark.slow
def test_no_key_reaches_any_file_of_a_generation_run(tmp_path):
    cfg = small_config()
    cfg["experiment"] = "keys"
    with FaultServer() as server:
        cfg["teachers"] = {
            "api": {
                "backend": "openai",
                "model": "m",
                "base_url": server.base_url,
                "api_key_env": "STILLROOM_OPENAI_KEY",
                "concurrency": 8,
                "sampling": {"max_tokens": 64},
            }
        }
        cfg["generation"]["teacher"] = "api"
        target = "results/keys/gen/api/low/shard-00000.jsonl"
        run_snakemake(tmp_path, cfg, target, env=SECRETS)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "config.yaml"]
    assert (tmp_path / ".snakemake" / "log").is_dir() and any("logs" in p.parts for p in written)
    leaks = [
        (str(p.relative_to(tmp_path)), name)
        for p in written
        for name, value in SECRETS.items()
        if value.encode() in p.read_bytes()
    ]
    assert leaks == []
    # (the job had the key: without it the teacher refuses to start); the server's own name for its
    # model reached the sidecar
    prov = json.loads((tmp_path / f"{target}.prov.json").read_text())
    (served,) = [r for r in prov["resolved"] if r["role"] == "teacher:api"]
    assert served == {"role": "teacher:api", "configured": "m", "served": ["m-served"]}
    assert prov["env"].keys().isdisjoint(SECRETS)
