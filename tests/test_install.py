"""Installing into one's own environment (issue 35 item 1), as the README says: build the wheel
from the checkout, install it into a fresh virtual environment, and run the CLI there.

Offline and fast: the wheel is built without build isolation (this environment's setuptools) and
installed with --no-deps; the fresh environment then sees exactly the distributions the wheel's
Requires-Dist names, and what they require in turn, linked in from this environment, and nothing
else: no TensorFlow, PyTorch or JAX. So the CLI analysing a PyTorch trace there shows that a user's
PyTorch-only (or TensorFlow-only) training environment needs nothing more than the install line.
"""

from __future__ import annotations

import email
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from synth_kineto import kineto_trace, write_trace

REPO = Path(__file__).resolve().parent.parent
# What a build reads from the checkout (setup.py's packages, package_dir and README).
SOURCES = ("setup.py", "README.md", "tb_gpuadvisor", "frontend")
FRAMEWORKS = ("tensorflow", "torch", "jax", "lightning", "pytorch_lightning", "transformers")


def _run(*command: str, env: dict | None = None, timeout: int = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


def _requirement_names(requires: list[str] | None, extra: str | None = None) -> list[str]:
    """Distribution names of REQUIRES whose markers hold here (only EXTRA's when given)."""
    from packaging.requirements import Requirement

    out = []
    for line in requires or []:
        req = Requirement(line)
        env = {"extra": extra or ""}
        if req.marker is None and extra is None or req.marker is not None and req.marker.evaluate(env):
            out.append(req.name)
    return out


def _closure(names: list[str]) -> list[md.Distribution]:
    """NAMES and everything they require (without extras), as installed here."""
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue        # a marker-less optional dependency this environment lacks
        seen[name] = dist
        todo += _requirement_names(dist.requires)
    return list(seen.values())


def _link_distributions(dists: list[md.Distribution], target: Path) -> None:
    """Symlink the top-level files and folders of DISTS (and their .dist-info) into TARGET."""
    target.mkdir()
    for dist in dists:
        root = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            if top in ("..", "bin", "__pycache__") or not (root / top).exists() or (target / top).exists():
                continue
            (target / top).symlink_to(root / top)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools")
    pytest.importorskip("packaging")
    source = tmp_path_factory.mktemp("checkout")
    for name in SOURCES:        # a clean copy: no build output or compiled extensions of this tree
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, source / name)
    out = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(out), str(source), timeout=300)
    (found,) = out.glob("tb_gpuadvisor-*.whl")
    return found


def test_wheel_declares_its_requirements_and_extras(wheel: Path):
    """The install line's extras exist and bring what the README says; no framework is required."""
    with zipfile.ZipFile(wheel) as archive:
        meta_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(archive.read(meta_name))
        names = archive.namelist()
    requires = meta.get_all("Requires-Dist")
    assert {"remote", "dask", "demo", "test"} <= set(meta.get_all("Provides-Extra"))
    base = _requirement_names(requires)
    assert {"tensorboard", "numpy", "protobuf", "msgspec", "werkzeug"} <= set(base)
    assert not set(FRAMEWORKS) & set(base) and "tensorflow-cpu" not in base
    assert "fsspec" in _requirement_names(requires, "remote")
    assert "dask" in _requirement_names(requires, "dask")
    # The Profile tab the evidence links open is an extra, as the README's install lines say.
    assert "xprof" in _requirement_names(requires, "profile") and "xprof" not in base
    readme = (REPO / "README.md").read_text()
    assert 'pip install "./tb-gpuadvisor[profile]"' in readme and "pip install xprof" in readme
    # the tab's files and the schema ship with it
    assert any(n.endswith("frontend/index.js") for n in names)
    assert any(n.endswith("schema/report.schema.json") for n in names)


def test_fresh_venv_runs_the_cli_on_a_pytorch_trace_without_any_framework(wheel: Path, tmp_path: Path):
    started = time.monotonic()
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", str(venv))
    python = venv / "bin" / "python"
    _run(str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel))
    site = Path(_run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    with zipfile.ZipFile(wheel) as archive:
        meta = email.message_from_bytes(archive.read(next(n for n in archive.namelist()
                                                          if n.endswith(".dist-info/METADATA"))))
    deps = tmp_path / "deps"
    _link_distributions(_closure(_requirement_names(meta.get_all("Requires-Dist"))), deps)
    (site / "zz_declared_requirements.pth").write_text(f"{deps}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    here = {"env": env, "cwd": tmp_path}     # never this checkout on the path

    frameworks = _run(str(python), "-c", "import importlib.util as u; print([m for m in %r if u.find_spec(m)])"
                      % (FRAMEWORKS,), **here).stdout.strip()
    assert frameworks == "[]", frameworks
    cli = str(venv / "bin" / "tb-gpuadvisor")
    assert "PyTorch" in _run(cli, "--help", **here).stdout
    # The in-loop helpers import without their frameworks, and say which one a callback needs.
    helpers = _run(str(python), "-c", "import tb_gpuadvisor.torch, tb_gpuadvisor.lightning, tb_gpuadvisor.transformers\n"
                   "for name in ('lightning', 'transformers'):\n"
                   "    try:\n"
                   "        getattr(getattr(tb_gpuadvisor, name), 'AdvisorCallback')\n"
                   "    except ImportError as err:\n"
                   "        print(err)", **here).stdout.splitlines()
    assert helpers == ["tb_gpuadvisor.lightning.AdvisorCallback needs PyTorch Lightning: pip install lightning",
                       "tb_gpuadvisor.transformers.AdvisorCallback needs Transformers: pip install transformers"]
    plugins = _run(str(python), "-c", "import importlib.metadata as m; "
                   "print([e.value for e in m.entry_points(group='tensorboard_plugins')])", **here).stdout
    assert "tb_gpuadvisor.loader:GpuAdvisorLoader" in plugins

    write_trace(tmp_path / "logs" / "run1" / "worker0.1700000000000.pt.trace.json", kineto_trace(steps=4))
    done = subprocess.run([cli, "analyze", str(tmp_path / "logs"), "--format", "json"], capture_output=True,
                          text=True, timeout=120, **here)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    (session,) = json.loads(done.stdout)["sessions"]
    assert session["framework"] == "pytorch" and session["steps"]["count"] >= 3 and not session["errors"]
    installed = _run(str(python), "-c", "import tb_gpuadvisor; print(tb_gpuadvisor.__file__)", **here).stdout
    assert installed.startswith(str(venv))          # the wheel's copy, not this checkout
    assert time.monotonic() - started < 60
