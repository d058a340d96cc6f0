"""``tb_gpuadvisor.torch.profile_steps`` and ``tb_gpuadvisor.advise`` on real PyTorch runs on the CPU.

The README's plain-loop and notebook examples run as written (each in its own process, in a
temporary folder, one thread per process on the shared machine); their fixed twins are the same
programs without the planted 1 ms sleep per sample. Both examples make 16-sample batches in the
training process (num_workers=0), so a slow step waits about 16 ms for its batch beside a few ms
of compute: the input pipeline is the first thing to fix, and without the sleep the batch is
made in well under 1 ms, too little for a warning.

Run as a script (``python tests/test_torch_advisor.py OUT PORT``), this file is the two-rank DDP job.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from advice_runs import (
    REPO, ONE_THREAD, assert_failed_on_input, example_runs, fixed_twin, printed_checks, readme_example, run_example,
)

from tb_gpuadvisor.cli import main

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")

PLAIN = "from tb_gpuadvisor.torch import profile_steps"
NOTEBOOK = "import tb_gpuadvisor\n"
DDP_STEPS = 3


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """The plain-loop example as written, its fixed twin and the example failing on critical."""
    return example_runs(readme_example(PLAIN), tmp_path_factory.mktemp("torch_plain"),
                        'profile_steps("logs/plain", steps=5)', **ONE_THREAD)


def test_readme_loop_prints_the_slow_dataloader_first(plain):
    result, _ = plain["slow"]
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout
    assert printed_checks(printed)[0] == "input_bound", printed
    assert "note:" not in printed       # no GPU on this machine at all: context, not a note (issue 44)
    assert "num_workers=0" in printed


def test_readme_loop_writes_a_trace_the_cli_reads(plain, capsys):
    _, cwd = plain["slow"]
    (trace,) = (cwd / "logs" / "plain").glob("*.pt.trace.json")
    assert f"capture: {trace}" in plain["slow"][0].stdout
    assert main(["analyze", str(cwd / "logs"), "--format", "json"]) == 0
    (session,) = json.loads(capsys.readouterr().out)["sessions"]
    assert session["run"] == "plain" and session["framework"] == "pytorch"
    # Five marked steps after warm-up and one unmarked lead-in step.
    assert session["steps"]["source"] == "profiler_step" and session["trust"]["candidate_steps"] == 5
    first = next(f for f in session["findings"] if f["check"] != "profile_quality")
    assert first["check"] == "input_bound" and first["severity"] == "critical"


def test_fixed_twin_has_no_input_finding(plain):
    result, _ = plain["fixed"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "advice from the profiled steps" in result.stdout
    assert "input_bound" not in printed_checks(result.stdout)


def test_fail_on_critical_fails_the_slow_run(plain):
    assert_failed_on_input(plain["slow_fail"][0])


@pytest.fixture(scope="module")
def notebook(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("torch_notebook")
    code = readme_example(NOTEBOOK)
    return {name: run_example(program, root / name, **ONE_THREAD)
            for name, program in (("slow", code), ("fixed", fixed_twin(code)))}


def _text_checks(printed: str, severities: tuple[str, ...] = ("CRIT", "WARN")) -> list[str]:
    """The checks of the CLI text's findings of those severities, in order."""
    return [line.split()[1] for line in printed.splitlines() if line.strip().startswith(tuple(f"[{s}]" for s in severities))]


def test_readme_notebook_advice_is_the_cli_text(notebook):
    slow, fixed = notebook["slow"], notebook["fixed"]
    assert slow.returncode == 0 and fixed.returncode == 0, slow.stderr[-3000:] + fixed.stderr[-3000:]
    assert "[pytorch; hosts: " in slow.stdout
    # The input pipeline first: no GPU exists here, so that the model ran on the CPU is context (issue 44).
    assert _text_checks(slow.stdout)[0] == "input_bound", slow.stdout
    assert "input_bound" not in _text_checks(fixed.stdout), fixed.stdout


def _profile_a_few_steps(torch) -> object:
    model = torch.nn.Linear(8, 8)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for step in range(3):
            with torch.profiler.record_function(f"ProfilerStep#{step}"):
                model(torch.randn(4, 8)).sum().backward()
    return prof


def test_advise_takes_a_profile_a_trace_file_or_a_folder(tmp_path):
    import torch

    import tb_gpuadvisor

    advice = tb_gpuadvisor.advise(_profile_a_few_steps(torch))
    (trace,) = Path(advice.path).glob("*.pt.trace.json")
    (session,) = advice.report["sessions"]
    assert session["framework"] == "pytorch" and session["trust"]["candidate_steps"] == 3
    for source in (trace, str(trace.parent)):
        again = tb_gpuadvisor.advise(source)
        assert [f["check"] for f in again.findings] == [f["check"] for f in advice.findings]
    html = advice._repr_html_()
    assert html.startswith('<div class="tb-gpuadvisor">') and "<table>" in html and "profile_quality" in html
    assert str(advice).startswith("=" * 10) and "[pytorch; hosts: " in str(advice)


def test_advise_refuses_what_it_cannot_read(tmp_path):
    import torch

    import tb_gpuadvisor
    from tb_gpuadvisor.input.discovery import DiscoveryError

    with pytest.raises(ValueError, match="no finished trace"):
        tb_gpuadvisor.advise(torch.profiler.profile())
    with pytest.raises(ValueError, match="no profile sessions found"):
        tb_gpuadvisor.advise(tmp_path)
    with pytest.raises(DiscoveryError, match="no such file"):
        tb_gpuadvisor.advise(tmp_path / "missing")
    with pytest.raises(ValueError, match="not int"):
        tb_gpuadvisor.advise(3)


def test_notebook_html_makes_capture_names_inert():
    from tb_gpuadvisor.render import render_html

    finding = {"check": "input_bound", "severity": "critical", "estimated_savings_ms_per_step": 1.0,
               "title": "<script>x</script>", "summary": "a & b", "fixes": [{"text": "t", "code": "if a < b:\n  c"}],
               "evidence": [], "metrics": {}}
    session = {"run": "<b>r</b>", "session": "s", "hosts": ["h"], "framework": "pytorch", "errors": [],
               "steps": {"count": 1, "source": "profiler_step", "mean_ms": 1.0, "min_ms": 1.0, "max_ms": 1.0},
               "findings": [finding], "devices": []}
    html = render_html({"sessions": [session]})
    assert "<script>" not in html and "&lt;script&gt;" in html and "&lt;b&gt;r&lt;/b&gt;" in html
    assert "<pre>if a &lt; b:\n  c</pre>" in html


# --- DDP: two CPU processes (gloo) ---------------------------------------------------------------

def _rank(rank: int, out: str) -> None:
    """One rank of the job: DDP over gloo, a slow DataLoader, the helper around the loop."""
    import time

    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset

    from tb_gpuadvisor.torch import profile_steps

    class Samples(Dataset):
        def __len__(self) -> int:
            return 256

        def __getitem__(self, i: int):
            time.sleep(0.001)
            return torch.randn(64), i % 10

    torch.set_num_threads(1)
    # The ranks meet through a file in the run's fresh folder: no TCP port another process can take.
    store = Path(out, "rendezvous").as_uri()
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with profile_steps(os.path.join(out, "logs"), steps=DDP_STEPS, warmup_steps=2) as advisor:
        for x, y in DataLoader(Samples(), batch_size=16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            advisor.step()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"report": advisor.report,
                                                          "numbers": advisor.window.profiled_numbers}))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("torch_ddp")
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, __file__, str(out)], capture_output=True,
                            text=True, timeout=300, env={**os.environ, "PYTHONPATH": path, **ONE_THREAD})
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return {"printed": result.stdout, "ranks": ranks, "logs": out / "logs"}


def test_ddp_every_rank_records_and_rank_0_prints_one_report_of_both(ddp):
    assert ddp["printed"].count("tb-gpuadvisor: advice from the profiled steps") == 1
    host = socket.gethostname()
    traces = sorted(p.name.split(".")[0] for p in ddp["logs"].glob("*.pt.trace.json"))
    assert traces == [f"{host}_rank0", f"{host}_rank1"]
    rank0, rank1 = ddp["ranks"]
    assert rank1["report"] is None and rank0["numbers"] == rank1["numbers"] == [3, 4, 5]
    (session,) = rank0["report"]["sessions"]
    assert sorted(session["hosts"]) == traces
    assert "input_bound" in printed_checks(ddp["printed"])


def test_importing_the_helpers_loads_no_framework():
    code = ("import sys, tb_gpuadvisor, tb_gpuadvisor.torch, tb_gpuadvisor.lightning, tb_gpuadvisor.transformers; "
            "print(sorted(m for m in ('torch', 'lightning', 'pytorch_lightning', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_helper_modules_do_not_shadow_the_frameworks():
    """tb_gpuadvisor/torch.py and transformers.py are named as the packages they help: inside the
    package (absolute imports) and outside it, ``import torch`` is PyTorch's."""
    code = ("import tb_gpuadvisor.torch as helper, torch; "
            "print(torch.__file__ != helper.__file__, hasattr(torch, 'profiler'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0 and out.stdout.split() == ["True", "True"], out.stderr


if __name__ == "__main__":
    import torch.multiprocessing

    torch.multiprocessing.spawn(_rank, args=(sys.argv[1],), nprocs=2)
