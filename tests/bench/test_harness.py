"""bench/: the reference forwarder over real HTTP, and how run.py sums up its rounds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench import run
from infra_adapters.emulators.ollama import OllamaState
from infra_adapters.emulators.server import EmulatorServer
from tests.e2e.conftest import wait_ready
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_the_reference_forwarder_swaps_the_model_and_passes_the_backend_through(
        ollama: tuple[EmulatorServer, OllamaState]) -> None:
    server, _state = ollama
    port = free_port()
    process = subprocess.Popen([sys.executable, str(ROOT / "bench" / "reference.py"), "--port", str(port),
                                "--backend", server.url, "--public", run.GATEWAY_MODEL,
                                "--backend-model", run.DIRECT_MODEL])
    try:
        wait_ready(f"http://127.0.0.1:{port}/healthz", process)
        url = f"http://127.0.0.1:{port}/v1/systemone"
        answer = httpx.post(url, content=run.request_body(run.GATEWAY_MODEL),
                            headers={"Content-Type": "application/json"}, timeout=10)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == run.GATEWAY_MODEL
        assert set(answer.json()["answers"]) == set(run.QUESTIONS)
        unknown = httpx.post(url, content=run.request_body("no-such-model"),
                             headers={"Content-Type": "application/json"}, timeout=10)
        assert unknown.status_code == 404  # the backend's own answer, as it came
    finally:
        process.terminate()
        process.wait(timeout=10)


def cell(target: str, concurrency: int, round_: int, rps: float, p50: float, cpu: float) -> dict[str, Any]:
    return {"target": target, "concurrency": concurrency, "round": round_, "requests": 100, "errors": 0,
            "throughput_rps": rps, "latency_ms": {"p50": p50, "p99": p50 * 2},
            "server_cpu_ms_per_request": {"emulator": 0.3, **({target: cpu} if target != "direct" else {})}}


def test_each_round_is_compared_with_its_own_direct_cell_and_the_medians_are_reported() -> None:
    cells = [
        cell("direct", 1, 1, 2000, 0.40, 0), cell("reference", 1, 1, 1000, 0.80, 0.4),
        cell("arbiter", 1, 1, 1100, 0.70, 0.3),
        cell("direct", 1, 2, 1000, 0.90, 0), cell("reference", 1, 2, 800, 1.20, 0.4),
        cell("arbiter", 1, 2, 900, 1.00, 0.3),
        cell("direct", 1, 3, 1500, 0.50, 0), cell("reference", 1, 3, 900, 1.00, 0.4),
        cell("arbiter", 1, 3, 1000, 0.95, 0.3),
        cell("direct", 64, 1, 3000, 20, 0), cell("reference", 64, 1, 2400, 25, 0.30),
        cell("arbiter", 64, 1, 2700, 22, 0.25),
    ]
    rows = {row["target"]: row for row in run.summarize(cells, [1, 64])}
    # Against the same round's direct cell: +0.30, +0.10, +0.45 -> median 0.30 (not a difference of medians).
    assert rows["arbiter"]["added_p50_ms_c1_rounds"] == pytest.approx([0.30, 0.10, 0.45])
    assert rows["arbiter"]["added_p50_ms_c1"] == pytest.approx(0.30)
    assert rows["reference"]["added_p50_ms_c1"] == pytest.approx(0.40)
    assert rows["arbiter"]["vs_direct"] == pytest.approx(0.9)
    assert rows["arbiter"]["gateway_cpu_ms_per_decision"] == pytest.approx(0.25)
    text = run.format_reference(list(rows.values()), [1, 64])
    assert "arbiter 0.250 ms, reference 0.300 ms (0.83x)" in text
    assert "+p50 @1: arbiter 0.300 ms, reference 0.400 ms" in text
    assert run.format_reference([rows["arbiter"]], [1, 64]) == ""  # no reference cells: no line


def test_instructions_are_summed_per_thread_across_dumps(tmp_path: Path) -> None:
    from bench import instructions

    (tmp_path / "arbiter.callgrind.7-01").write_bytes(b"events: Ir\nsummary: 0\ntotals: 1000\n")
    (tmp_path / "arbiter.callgrind.7.1-01").write_bytes(b"events: Ir\nsummary: 500\ntotals: 500\n")
    (tmp_path / "arbiter.callgrind.7.1-03").write_bytes(b"events: Ir\ntotals: 300\n")
    (tmp_path / "arbiter.callgrind.7-02").write_bytes(b"events: Ir\ntotals: 0\n")
    assert instructions.instructions(sorted(tmp_path.iterdir())) == (1500, 300)


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_instructions_counts_a_server_under_callgrind() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "instructions.py"), "--targets", "direct",
                           "--requests", "20", "--warmup", "20"],
                          check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("direct "))
    loop = float(row.split()[1])
    assert loop > 50  # the emulator runs well over 50k instructions for a decision


def paired(server_url: str, tmp_path: Path, *targets: tuple[str, str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(ROOT / "bench" / "paired.py"), "--blocks", "2", "--block-size", "5", "--warmup", "2"]
    for name, model, expect in targets:
        body = tmp_path / f"{name}.json"
        body.write_bytes(run.request_body(model))
        argv += ["--target", name, f"{server_url}/v1/systemone", str(body), expect]
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120)


def test_the_paired_client_times_every_target_block_by_block_and_checks_each_answer(
        ollama: tuple[EmulatorServer, OllamaState], tmp_path: Path) -> None:
    server, state = ollama
    before = len(state.requests)
    done = paired(server.url, tmp_path, ("direct", run.DIRECT_MODEL, run.DIRECT_MODEL),
                  ("again", run.DIRECT_MODEL, run.DIRECT_MODEL))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert list(result) == ["direct", "again"]
    for row in result.values():
        assert row["n"] == 10 and len(row["block_p50"]) == 2
        assert 0 < row["p50"] <= row["p90"] <= row["p99"]
    assert len(state.requests) - before == 2 * (2 + 2 * 6)  # per target: warm-up 2, per block 1 untimed + 5
    text = run.format_paired(result, ["direct", "again"])
    assert text.splitlines()[2].split()[3:] == ["-", "-", "-"]
    wrong = paired(server.url, tmp_path, ("direct", run.DIRECT_MODEL, "someone-else"))
    assert wrong.returncode == 1
    assert "model is 'nimble:latest', expected 'someone-else'" in json.loads(wrong.stdout)["fatal"]
    unknown = paired(server.url, tmp_path, ("direct", "no-such-model", "no-such-model"))
    assert unknown.returncode == 1 and "answered 'HTTP/1.1 404" in json.loads(unknown.stdout)["fatal"]


def test_the_paired_table_compares_each_block_with_the_same_blocks_direct() -> None:
    result = {"direct": {"p50": 0.4, "p99": 0.9, "block_p50": [0.4, 0.9, 0.5]},
              "arbiter": {"p50": 0.8, "p99": 1.5, "block_p50": [0.7, 1.0, 0.95]}}
    row = run.format_paired(result, ["direct", "arbiter"]).splitlines()[3].split()
    # 0.30, 0.10, 0.45 block by block: median 0.30, not the difference of the overall p50s alone
    assert row == ["arbiter", "0.800", "1.500", "0.400", "0.600", "0.300", "(0.100", "to", "0.450)"]
