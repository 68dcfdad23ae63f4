"""Smoke test of ``benchmarks/peers.py``: at tiny sizes every installed peer runs end to end
on a private Redis next to ``bare`` and ``streamjobs``, handles exactly N entries and is
reported; a peer whose package is missing is skipped with a note. No timing assertions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import peers
from benchmarks.hot_stream import BenchmarkError

N = 50
ROUNDS = 2
# A table row: contender, one rate per round, median rate, two ratios, commands/entry.
ROW = r"\| [\d,]+ " * (ROUNDS + 1) + r"\| \d+\.\d{3} \| \d+\.\d{3} \| \d+\.\d{4} \|$"


def _require(peer: str) -> None:
    pytest.importorskip(peers.PEER_MODULES[peer], reason=f"{peer} is not installed")


@pytest.mark.parametrize("peer", peers.PEERS)
def test_peer_runs_and_handles_exactly_n(
    peer: str, require_redis_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _require(peer)
    out_json = tmp_path / "peers.json"
    argv = ["--entries", str(N), "--rounds", str(ROUNDS), "--batch", "10"]
    assert peers.main([*argv, "--contenders", peer, "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    for index in range(1, ROUNDS + 1):
        assert re.search(rf"^round {index}/{ROUNDS}: bare [\d,]+ entries/s", out, re.M), out
    verified = re.findall(r"^  verified: (.*)$", out, re.MULTILINE)
    assert (
        verified
        == [
            f"bare handled {N}/{N}, streamjobs handled {N}/{N}, "
            f"streamjobs-group handled {N}/{N}, {peer} handled {N}/{N}"
        ]
        * ROUNDS
    ), out
    for contender in ("bare", "streamjobs", "streamjobs-group", peer):
        assert re.search(rf"^\| {re.escape(contender)} {ROW}", out, re.MULTILINE), out
    assert re.search(
        rf"^median ratio streamjobs/{re.escape(peer)}: \d+\.\d{{3}}; "
        rf"{re.escape(peer)}/bare: \d+\.\d{{3}}$",
        out,
        re.MULTILINE,
    ), out
    data = json.loads(out_json.read_text())
    assert data["contenders"] == ["bare", "streamjobs", "streamjobs-group", peer]
    assert [r["results"][peer]["entries"] for r in data["rounds"]] == [N] * ROUNDS
    assert data["median"][peer]["entries_per_s"] > 0
    assert data["skipped"] == {}


def test_a_missing_peer_is_skipped_with_a_note(
    require_redis_server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(peers, "installed", lambda contender: contender not in peers.PEERS)
    assert peers.main(["--entries", str(N), "--rounds", "1", "--contenders", "streaq"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^note: skipping streaq: package 'streaq' is not installed", out, re.M), out
    verified = f"bare handled {N}/{N}, streamjobs handled {N}/{N}, streamjobs-group handled {N}/{N}"
    assert f"verified: {verified}\n" in out, out
    assert "| streaq |" not in out, out


@pytest.mark.parametrize("peer", peers.PEERS)
def test_a_short_count_raises(
    peer: str, require_redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each peer checks its own count: a handler that misses one entry is an error."""
    _require(peer)
    real_hit = peers.Tally.hit
    short: list[peers.Tally] = []

    def hit_all_but_the_first(self: peers.Tally) -> None:
        if self in short:
            real_hit(self)
        else:
            short.append(self)

    monkeypatch.setattr(peers.Tally, "hit", hit_all_but_the_first)
    monkeypatch.setattr(peers, "MIN_TIMEOUT_S", 2.0)
    with pytest.raises(BenchmarkError, match=rf"^{re.escape(peer)}: .*handled 19/20"):
        peers.main(["--entries", "20", "--rounds", "1", "--contenders", peer])


def test_unknown_contenders_are_refused() -> None:
    with pytest.raises(SystemExit):
        peers.parse_args(["--contenders", "celery"])
