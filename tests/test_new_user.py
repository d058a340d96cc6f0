"""What a new user trips on (issue 35 item 7): an empty logdir is told apart from a missing one,
and both say how to capture in every framework the Advisor reads."""

from __future__ import annotations

import pytest

from tb_gpuadvisor import service
from tb_gpuadvisor.cli import main


def test_tab_route_tells_a_missing_logdir_from_an_empty_one(tmp_path):
    empty = service.AdvisorService(service.roots_from_flags(str(tmp_path), ""))
    missing = service.AdvisorService(service.roots_from_flags(str(tmp_path / "not_yet"), ""))
    try:
        assert empty.runs() == []
        with pytest.raises(service.NotFound, match="not_yet: no such folder"):
            missing.runs()
    finally:
        empty.close()
        missing.close()


def test_cli_empty_logdir_lists_the_ways_to_capture(tmp_path, capsys):
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no profile sessions found" in err
    for way in ("AdvisorCallback", "profile_steps", "tensorboard_trace_handler"):
        assert way in err
    assert main(["analyze", str(tmp_path / "missing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
