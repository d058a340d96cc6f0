"""Golden outputs: the full report (JSON, text, Markdown) of every corpus capture and of a set of
synthetic scenarios, kept under tests/golden/ so that a refactor or a speed change that alters
any advice shows up as a diff.

    python tests/golden.py            # compare, print which cases differ
    python tests/golden.py --update   # rewrite the files (only for an intended change: say which in the commit)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

import synth  # noqa: E402
from tb_gpuadvisor.input.discovery import find_sessions  # noqa: E402
from tb_gpuadvisor.multihost import build_report  # noqa: E402
from tb_gpuadvisor.render import render_markdown, render_text  # noqa: E402

GOLDEN = TESTS / "golden"
CORPUS = Path(os.environ.get("TB_GPUADVISOR_CORPUS", TESTS.parent.parent / "shared" / "corpus"))

# Corpus folders analysed as a whole logdir (every session in them); the files are never written.
CORPUS_CASES = ("bert-8xv100", "jax-mi300x-amd", "jax-mi355x-amd", "jax-tpu-v6e", "keras-cnn-rtx5000",
                "keras-cnn-rtx5000-empty-gpu-trace", "keras-cpu-macbook", "keras-t4", "legacy-tool-files")


def _planted(logdir: Path) -> None:
    synth.build_training_session(steps=6, step_ms=20.0, gpus=4, marker="keras3", input_wait_frac=0.35,
                                 host_overhead_frac=0.06, launch_frac=0.08, gpu_compute_scale={0: 1.4},
                                 launch_skew_ms=1.5, kernel_us=120, fp16_frac=0.3, tensor_core_frac=0.25,
                                 host_ops_frac=0.2, memcpy_frac=0.05, h2d_bytes=8 << 20, d2h_bytes=2 << 20,
                                 allreduce_calls=3, peak_mem_frac=0.85, cc=(8, 0)).write(logdir, "train", "s1")


def _healthy(logdir: Path) -> None:
    synth.build_training_session(steps=8, gpus=2, cc=(8, 0), bf16_frac=0.7, tensor_core_frac=0.6,
                                 input_wait_frac=0.01).write(logdir, "train", "s1")


def _input_bound(logdir: Path) -> None:
    synth.build_training_session(steps=5, input_wait_frac=0.4, marker="r").write(logdir, "train", "s1")


def _launch_bound_jax(logdir: Path) -> None:
    synth.build_training_session(steps=6, framework="jax", marker="none", launch_frac=0.3,
                                 kernel_us=15).write(logdir, "train", "s1")


def _cpu_only(logdir: Path) -> None:
    synth.build_training_session(steps=4, gpus=0, marker="r", host_overhead_frac=0.2).write(logdir, "train", "s1")


def _two_hosts(logdir: Path) -> None:
    for host, scale in (("w0", None), ("w1", {1: 1.3})):
        synth.build_training_session(steps=5, gpus=2, cc=(8, 0), collective_frac=0.1, allreduce_calls=2,
                                     gpu_compute_scale=scale, host=host).write(logdir, "train", "s1")


def _fp32_turing(logdir: Path) -> None:
    synth.build_training_session(steps=5, cc=(7, 5), eligible_frac=0.8, tensor_core_frac=0.0, memcpy_frac=0.15,
                                 d2h_bytes=1 << 20).write(logdir, "train", "s1")


SYNTH_CASES: dict[str, Callable[[Path], None]] = {
    "synth-planted": _planted, "synth-healthy": _healthy, "synth-input-bound": _input_bound,
    "synth-launch-bound-jax": _launch_bound_jax, "synth-cpu-only": _cpu_only, "synth-two-hosts": _two_hosts,
    "synth-fp32-turing": _fp32_turing,
}


def _outputs(logdir: Path) -> dict[str, str]:
    report = build_report(find_sessions(str(logdir)), 1)
    return {"json": json.dumps(report, indent=1, sort_keys=True) + "\n",
            "txt": render_text(report, width=100, verbose=True), "md": render_markdown(report)}


def cases() -> list[str]:
    """Every case this machine can build (corpus cases only when the corpus is here)."""
    present = [c for c in CORPUS_CASES if (CORPUS / c).is_dir()]
    return present + list(SYNTH_CASES)


def outputs(case: str) -> dict[str, str]:
    """The current outputs of CASE, by file suffix."""
    if case in SYNTH_CASES:
        with tempfile.TemporaryDirectory() as tmp:
            SYNTH_CASES[case](Path(tmp))
            return _outputs(Path(tmp))
    return _outputs(CORPUS / case)


def stored(case: str) -> dict[str, str]:
    return {suffix: (GOLDEN / f"{case}.{suffix}").read_text(encoding="utf-8") for suffix in ("json", "txt", "md")}


def main(argv: list[str]) -> int:
    update = "--update" in argv
    wanted = [a for a in argv if not a.startswith("--")] or cases()
    GOLDEN.mkdir(exist_ok=True)
    differ = 0
    for case in wanted:
        now = outputs(case)
        if update:
            for suffix, text in now.items():
                (GOLDEN / f"{case}.{suffix}").write_text(text, encoding="utf-8")
            print(f"wrote {case}")
            continue
        changed = [s for s, text in now.items() if not (GOLDEN / f"{case}.{s}").exists() or stored(case)[s] != text]
        differ += bool(changed)
        print(f"{case}: {'differs in ' + ', '.join(changed) if changed else 'same'}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
