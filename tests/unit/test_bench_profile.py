"""The benchmark's profile summary: self and inclusive shares from py-spy's collapsed stacks."""

from __future__ import annotations

from bench.profile import summarise, table


def test_self_and_inclusive_shares_from_collapsed_stacks() -> None:
    folded = "\n".join([
        "process 1:main (app.py:1);run (loop.py:9);cycle (service.py:200);sync (mirror.py:120) 30",
        "process 1:main (app.py:1);run (loop.py:9);cycle (service.py:200);place (placement.py:40) 50",
        "process 1:main (app.py:1);run (loop.py:9);select (selectors.py:468) 20",
        "garbage line",
    ])
    p = summarise("kube-ferry-scheduler", folded)
    assert p.samples == 100 and not p.error
    assert p.self_time[0] == ("place (placement.py)", 0.5)
    inclusive = dict(p.inclusive)
    assert inclusive["cycle (service.py)"] == 0.8 and "run (loop.py)" not in inclusive  # on 90 %+: no news
    assert any("`place (placement.py)` | 50%" in row for row in table([p]))
    assert summarise("x", "").error == "no samples"
