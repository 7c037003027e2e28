"""bench/throughput.py's ratios to the baseline: overall, and paired round by round."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("throughput", Path(__file__).parents[1] / "bench" / "throughput.py")
throughput = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(throughput)


def row(kind, c, tok_s, rounds):
    return {"kind": kind, "concurrency": c, "output_tok_s": tok_s, "output_tok_s_rounds": rounds}


def test_ratios_pair_rounds_and_levels_and_leave_the_baseline_alone():
    rows = [row("baseline", 1, 10.0, [9.0, 11.0]), row("domino", 1, 12.0, [9.9, 14.3]),
            row("baseline", 4, 30.0, [30.0, None]), row("domino", 4, 27.0, [27.0, 33.0]),
            row("domino", 8, 50.0, [50.0, 50.0])]  # no baseline at c = 8
    throughput.add_ratios(rows)
    assert "vs_baseline" not in rows[0] and "vs_baseline" not in rows[2] and "vs_baseline" not in rows[4]
    assert rows[1]["vs_baseline"] == pytest.approx(1.2)
    assert rows[1]["vs_baseline_rounds"] == pytest.approx([1.1, 1.3])  # round r against round r, not the mean
    assert rows[3]["vs_baseline"] == pytest.approx(0.9)
    assert rows[3]["vs_baseline_rounds"][0] == pytest.approx(0.9) and rows[3]["vs_baseline_rounds"][1] is None
