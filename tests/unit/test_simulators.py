"""Trace simulators: exact reproduction of the published method, bad input, JSON output."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from scheduler.bench.philly import cell_misses, groupings, held_out, las_verdict
from scheduler.sim import openb, philly, synthetic
from scheduler.sim.gorand import GoRand
from scheduler.sim.traces import TRACES, Problems, TraceError

OPENB = TRACES / "openb"
PHILLY = TRACES / "philly"


def test_go_rand_matches_go(tmp_path: Path) -> None:
    (tmp_path / "go.mod").write_text("module chk\ngo 1.26\n")
    (tmp_path / "main.go").write_text(
        'package main\nimport ("fmt"; "math/rand")\nfunc main() {\n'
        ' r := rand.New(rand.NewSource(7)); fmt.Println(r.Int())\n'
        ' xs := []int{0,1,2,3,4,5,6,7,8,9,10,11}; r.Shuffle(len(xs), func(i, j int) { xs[i], xs[j] = xs[j], xs[i] })\n'
        ' fmt.Println(xs, r.Intn(8152), r.Int63(), r.Perm(9))\n}\n')
    out = subprocess.run(["go", "run", "."], cwd=tmp_path, capture_output=True, text=True, check=True,
                         env={"GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod", "HOME": str(Path.home()),
                              "PATH": __import__("os").environ["PATH"]}).stdout.split("\n")
    r = GoRand(7)
    assert str(r.int_()) == out[0]
    xs = list(range(12))
    r.shuffle(xs)
    expected = f"[{' '.join(map(str, xs))}] {r.intn(8152)} {r.int63()} [{' '.join(map(str, r.perm(9)))}]"
    assert expected == out[1]


def _published(policy: str, seed: int, workload: str = "openb_pod_list_default") -> float:
    with (OPENB / "fgd_published_allo_discrete.csv").open() as fh:
        for row in csv.DictReader(fh):
            if row["workload"] == workload and row["sc_policy"] == policy and int(row["seed"]) == seed:
                return float(row["130"])
    raise KeyError(policy)


@pytest.mark.parametrize(("policy", "published"), [("bestfit", "05-BestFit"), ("gpupacking", "04-GpuPacking")])
def test_openb_reproduces_published_curve_exactly(policy: str, published: str) -> None:
    problems = Problems([])
    nodes = openb.load_nodes(OPENB / "openb_node_list_gpu_node.csv", problems)
    pods = openb.load_pods(OPENB / "openb_pod_list_default.csv", problems)
    assert not problems
    res = openb.run(nodes, pods, policy, 42)
    assert res.gpu_allocation_ratio == _published(published, 42)
    with (OPENB / "fgd_published_allo_discrete.csv").open() as fh:
        row = next(r for r in csv.DictReader(fh) if r["workload"] == "openb_pod_list_default"
                   and r["sc_policy"] == published and r["seed"] == "42")
    assert res.curve == [float(row[str(c)]) for c in range(131)]


def test_bad_rows_are_reported_with_line_and_reason(tmp_path: Path) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                    "p1,1000,1024,1,500\n"
                    "p2,-5,1024,1,500\n"
                    "p3,1000,lots,1,500\n"
                    ",1000,1024,1,500\n")
    problems = Problems([])
    got = openb.load_pods(pods, problems)
    assert [p.name for p in got] == ["p1"]
    assert [str(e) for e in problems.errors] == [
        f"{pods}:3: cpu_milli=-5 is below 0",
        f"{pods}:4: memory_mib='lots' is not a number",
        f"{pods}:5: name is missing",
    ]
    with pytest.raises(TraceError, match=r"pods.csv:3: cpu_milli=-5 is below 0"):
        openb.load_pods(pods, Problems([]), strict=True)


def test_missing_columns_stop_clearly(tmp_path: Path) -> None:
    bad = tmp_path / "jobs.csv"
    bad.write_text("timestamp,duration\n1,2\n")
    with pytest.raises(TraceError, match=r"jobs.csv:1: missing column\(s\) num_gpus, cluster"):
        philly.load_jobs(bad, Problems([]))


def _jobs(rows: list[tuple[float, float, int, str]]) -> list[philly.TraceJob]:
    return [philly.TraceJob(*r) for r in rows]


def test_philly_fifo_blocks_and_ferry_backfills() -> None:
    # one 2-node cluster (16 GPUs); a 16-GPU gang arrives while a 1-GPU job runs
    jobs = _jobs([(0, 100, 1, "a"), (1, 50, 16, "a"), (2, 10, 1, "b"), (3, 10, 1, "b")])
    vc = {"a": 1, "b": 1}
    fifo = philly.simulate(jobs, vc, "fifo", nodes=2, gpus_per_node=8).metrics
    ferry = philly.simulate(jobs, vc, "ferry", nodes=2, gpus_per_node=8).metrics
    assert fifo["tenants"]["b"]["avg_wait_s"] > 90  # stuck behind the gang
    assert ferry["tenants"]["b"]["avg_wait_s"] == 0.0  # backfilled beside it
    assert ferry["tenants"]["a"]["jobs"] == 2


def test_philly_departments_deal_vcs_largest_first_and_entitle_inside_a_department_first() -> None:
    vc = {"a": 4, "b": 4, "c": 2, "d": 2, "e": 1}
    assert philly.departments_of(vc, 2) == {"a": "dept-0", "b": "dept-1", "c": "dept-0", "d": "dept-1",
                                            "e": "dept-0"}
    assert philly.departments_of(vc, 0) == {}
    weight = {"a": 1.0, "c": 1.0, "b": 1.0, "d": 1.0}
    dept_of = {"a": "x", "c": "x", "b": "y", "d": "y"}
    # c is idle: its department's half goes to a, not a quarter to each of a, b and d
    fair = philly.entitled({"a": 10.0, "c": 0.0, "b": 10.0, "d": 10.0}, weight, dept_of, 8.0)
    assert fair == {"a": 4.0, "c": 0.0, "b": 2.0, "d": 2.0}
    flat = philly.entitled({"a": 10.0, "c": 0.0, "b": 10.0, "d": 10.0}, weight, {}, 8.0)
    assert flat["a"] == pytest.approx(8 / 3)


def test_philly_groupings_of_a_seed_are_the_same_every_time_and_as_even_as_dealing_largest_first() -> None:
    vc = {f"vc{i}": 12 - i for i in range(11)}
    dealt = philly.departments_of(vc, 3)
    grouped = {seed: philly.departments_of(vc, 3, seed) for seed in range(1, 9)}
    assert grouped[1] == philly.departments_of(dict(reversed(vc.items())), 3, 1)  # the seed, not the input order
    for g in grouped.values():
        assert set(g) == set(vc)
        assert sorted(Counter(g.values()).values()) == sorted(Counter(dealt.values()).values())  # 4, 4, 3
    # different seeds give different groupings, and not all of them the largest-first one
    assert len({tuple(sorted(g.items())) for g in grouped.values()}) > 1
    assert any(g != dealt for g in grouped.values())


def test_philly_with_departments_reports_fairness_per_department() -> None:
    jobs = _jobs([(0, 100, 8, "a"), (0, 100, 8, "b"), (1, 100, 8, "c"), (1, 100, 8, "d")])
    vc = {"a": 1, "b": 1, "c": 1, "d": 1}
    res = philly.simulate(jobs, vc, "ferry", nodes=2, gpus_per_node=8, departments=2).metrics
    assert set(res["departments"]) == {"dept-0", "dept-1"}
    assert res["department_teams"] == {"dept-0": ["a", "c"], "dept-1": ["b", "d"]}
    assert res["jain_departments"] > 0.99  # each department ran one of its two jobs at a time
    assert philly.simulate(jobs, vc, "ferry", nodes=2, gpus_per_node=8).metrics["departments"] == {}


def test_philly_reports_impossible_jobs() -> None:
    notes: list[str] = []
    res = philly.simulate(_jobs([(0, 10, 1, "a"), (1, 10, 64, "a")]), {"a": 1}, "ferry", nodes=2, gpus_per_node=8,
                          notes=notes)
    assert res.metrics["jobs"] == 1
    assert any("asks 64 GPUs, more than the cluster's 16: impossible, skipped" in n for n in notes)


def test_simulate_cli_prints_json(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("timestamp,duration,num_gpus,cluster\n0,10,1,a\n5,20,2,b\n7,x,1,a\n")
    vc = tmp_path / "vc.csv"
    vc.write_text("vc,node num\na,1\nb,1\n")
    out = subprocess.run([sys.executable, "-m", "ferry", "simulate", "philly", "--jobs", str(jobs),
                          "--vc-nodes", str(vc), "--nodes", "1", "--policy", "ferry", "--json"],
                         capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    for key in ("avg_wait_s", "p50_wait_s", "p99_wait_s", "max_wait_s", "avg_jct_s", "gpu_utilization",
                "jain_fairness", "preemptions", "notices_withdrawn", "most_notices_one_run", "wasted_gpu_s", "tenants"):
        assert key in data
    assert data["jobs"] == 2
    assert data["bad_rows"] == 1
    assert "jobs.csv:4: duration='x' is not a number" in out.stderr


def test_simulate_cli_runs_the_services_configuration_file_and_refuses_a_bad_one(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("timestamp,duration,num_gpus,cluster\n0,100,8,a\n5,50,8,b\n6,50,8,a\n")
    vc = tmp_path / "vc.csv"
    vc.write_text("vc,node num\na,1\nb,1\n")
    conf = tmp_path / "config.yaml"
    conf.write_text("preset: ferry\nplugins: [priority, fair-over-time, capacity, binpack]\n"
                    "usageHalfLifeSeconds: 3600\n")
    base = [sys.executable, "-m", "ferry", "simulate", "philly", "--jobs", str(jobs), "--vc-nodes", str(vc),
            "--nodes", "1", "--json", "--config", str(conf)]
    data = json.loads(subprocess.run(base, capture_output=True, text=True, check=True).stdout)
    assert data["jobs"] == 3 and "jain_daily_mean" in data
    conf.write_text("plugins: [priority, fairness-over-time]\n")
    bad = subprocess.run(base, capture_output=True, text=True)
    assert bad.returncode != 0
    assert "fairness-over-time" in bad.stderr and str(conf) in bad.stderr


def test_the_las_line_of_a_matrix_cell_names_what_it_misses() -> None:
    base = {"avg_wait_s": 100.0, "avg_first_wait_s": 80.0, "p99_wait_s": 1000.0, "gpu_utilization": 95.0,
            "jain_fairness": 1.0, "big_jobs_p99_wait_s": 5000.0, "preemptions": 3, "wasted_gpu_s": 120.0}
    line = las_verdict({**base, "avg_wait_s": 70.0, "avg_first_wait_s": 20.0}, base, base)
    assert line.endswith("avg 0.70x volcano (before first runs 0.25x), big p99 5000.0, 3 preemptions, 120 GPU-s "
                         "lost  ok")
    line = las_verdict({**base, "avg_wait_s": 71.0, "big_jobs_p99_wait_s": 5001.0}, base, base)
    assert line.endswith("MISS avg,big p99")
    assert "avg n/a volcano" in las_verdict(base, {**base, "avg_wait_s": 0.0}, None)


def _reclaim_wait(tmp_path: Path, *flags: str) -> float:
    """Tenant b borrows all of a 2-node cluster; a 1-GPU job of tenant a (guaranteed one node) arrives when
    b's jobs are past their minimum run and must take its guarantee back; tenant c's arrivals every 10 s, off
    the round moments the rules fall due at, are the events an event-only replay cycles on."""
    rows = ["0,10000,8,b", "0,10000,8,b", "1000,10,1,a", *(f"{t},5,1,c" for t in range(1015, 2000, 10))]
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("timestamp,duration,num_gpus,cluster\n" + "\n".join(rows) + "\n")
    vc = tmp_path / "vc.csv"
    vc.write_text("vc,node num\na,1\nb,1\n")
    out = subprocess.run([sys.executable, "-m", "ferry", "simulate", "philly", "--jobs", str(jobs), "--vc-nodes",
                          str(vc), "--nodes", "2", "--json", *flags], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)["tenants"]["a"]["avg_wait_s"])


def test_simulate_cli_sets_the_tenants_preemptor_delay_and_victim_grace(tmp_path: Path) -> None:
    default = _reclaim_wait(tmp_path)  # the simulated tenants' 300 s delay, then the victim's 60 s grace
    assert default == philly.PREEMPTOR_DELAY_S + philly.VICTIM_GRACE_S  # to the second, as the service
    assert _reclaim_wait(tmp_path, "--event-only") > default  # each waited for the next arrival
    at_once = _reclaim_wait(tmp_path, "--preemptor-delay", "0")
    assert philly.VICTIM_GRACE_S <= at_once < default
    assert _reclaim_wait(tmp_path, "--preemptor-delay", "0", "--victim-grace", "5") < philly.VICTIM_GRACE_S
    bad = subprocess.run([sys.executable, "-m", "ferry", "simulate", "philly", "--jobs", str(tmp_path / "jobs.csv"),
                          "--vc-nodes", str(tmp_path / "vc.csv"), "--victim-grace", "-1"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "must not be negative" in bad.stderr


def test_simulate_cli_replays_one_month_and_writes_why_each_job_waited(tmp_path: Path) -> None:
    # January: b borrows the whole 2-node cluster and a's job takes its guarantee back at once; February:
    # two jobs of c on an idle cluster
    month = 31 * 86400
    rows = ["0,10000,8,b", "0,10000,8,b", "1000,10,1,a", f"{month + 100},10,1,c", f"{month + 200},10,1,c"]
    (tmp_path / "jobs.csv").write_text("timestamp,duration,num_gpus,cluster\n" + "\n".join(rows) + "\n")
    (tmp_path / "vc.csv").write_text("vc,node num\na,1\nb,1\n")

    def run(*flags: str, as_json: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ferry", "simulate", "philly", "--jobs",
                               str(tmp_path / "jobs.csv"), "--vc-nodes", str(tmp_path / "vc.csv"), "--nodes", "2",
                               *(["--json"] if as_json else []), "--preemptor-delay", "0", *flags],
                              capture_output=True, text=True)

    log = tmp_path / "decisions.jsonl"
    january = run("--month", "1", "--decisions", str(log))
    assert january.returncode == 0, january.stderr
    result = json.loads(january.stdout)
    assert result["jobs"] == 3
    # what the eviction cost, by rule: its victim's new run is all the wait beyond the first runs'
    (cost,) = result["evictions_by_rule"].items()
    assert cost[0] == "reclaim" and cost[1]["evictions"] == 1 and cost[1]["new_run_wait_s"] > 0
    beyond_first_runs = result["avg_wait_s"] - result["avg_first_wait_s"]
    assert cost[1]["per_job_s"] == pytest.approx(beyond_first_runs, abs=0.1)  # each figure rounded
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    notices = [d for d in lines if d["kind"] == "NotifyWillEvict"]
    assert len(notices) == 1 and notices[0]["preemptor"] == "j000002.0" and notices[0]["t"] == 1000.0
    assert notices[0]["rule"] == "reclaim" and "reclaim by j000002.0" in notices[0]["reason"]
    evicted = [d for d in lines if d["kind"] == "Evict"]
    assert [(d["job"], d["t"]) for d in evicted] == [(notices[0]["job"], 1000.0 + philly.VICTIM_GRACE_S)]
    assert {d["job"] for d in lines if d["kind"] == "Bind"} == {"j000000.0", "j000001.0", "j000002.0",
                                                              f"{notices[0]['job'].split('.')[0]}.1"}
    written = log.read_text()
    refused = run("--month", "1", "--victim-grace", "-1", "--decisions", str(log))
    assert refused.returncode != 0 and "must not be negative" in refused.stderr
    assert log.read_text() == written and sorted(p.name for p in tmp_path.iterdir()) == [
        "decisions.jsonl", "jobs.csv", "vc.csv"]  # the last good log stays; no partial one is left
    february = run("--month", "2")
    assert february.returncode == 0 and json.loads(february.stdout)["jobs"] == 2
    assert json.loads(february.stdout)["preemptions"] == 0 and json.loads(february.stdout)["evictions_by_rule"] == {}
    printed = run("--month", "1", as_json=False).stdout.splitlines()
    text = [line for line in printed if line.startswith("evictions by rule")]
    assert len(text) == 1 and text[0].endswith(f"reclaim 1 ({cost[1]['per_job_s']} s)")
    for month_flag, words in (("13", "a month is 1-12, got 13"), ("3", "no usable jobs in month 3")):
        bad = run("--month", month_flag)
        assert bad.returncode != 0 and words in bad.stderr


def test_simulate_cli_replays_a_window_of_consecutive_jobs_from_a_day(tmp_path: Path) -> None:
    day = 86400
    rows = ["0,10,1,a", f"{day - 1},10,1,a", f"{day},10,1,b", f"{day + 5},10,2,b", f"{2 * day},10,1,a"]
    (tmp_path / "jobs.csv").write_text("timestamp,duration,num_gpus,cluster\n" + "\n".join(rows) + "\n")
    (tmp_path / "vc.csv").write_text("vc,node num\na,1\nb,1\n")
    jobs = philly.load_jobs(tmp_path / "jobs.csv", Problems([]))
    start = datetime(1970, 1, 2, tzinfo=UTC)
    assert [(j.submit, j.gpus) for j in philly.window(jobs, start, 2)] == [(day, 1), (day + 5, 2)]
    assert len(philly.window(jobs, start, 10)) == 3  # the rest of the trace when it holds fewer
    with pytest.raises(ValueError, match="at least one job"):
        philly.window(jobs, start, 0)

    def run(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ferry", "simulate", "philly", "--jobs",
                               str(tmp_path / "jobs.csv"), "--vc-nodes", str(tmp_path / "vc.csv"), "--nodes", "1",
                               "--json", *flags], capture_output=True, text=True)

    two = run("--from", "1970-01-02", "--count", "2")
    assert two.returncode == 0, two.stderr
    assert json.loads(two.stdout)["jobs"] == 2
    for flags, words in ((("--from", "1970-01-02"), "--from and --count go together"),
                         (("--from", "1970-1-2x", "--count", "2"), "a day is YYYY-MM-DD, got '1970-1-2x'"),
                         (("--from", "1970-01-02", "--count", "0"), "at least one job, got 0"),
                         (("--from", "1970-01-04", "--count", "2"), "no usable jobs from 1970-01-04 on"),
                         (("--month", "2", "--from", "1970-01-02", "--count", "2"),
                          "no usable jobs in month 2 from 1970-01-02 on"),
                         (("--grouping-seed", "3"), "--grouping-seed groups the VCs into departments")):
        bad = run(*flags)
        assert bad.returncode != 0 and words in bad.stderr, bad.stderr
    # another grouping of the VCs, and the grouping said where the figures are
    text = subprocess.run([sys.executable, "-m", "ferry", "simulate", "philly", "--jobs", str(tmp_path / "jobs.csv"),
                           "--vc-nodes", str(tmp_path / "vc.csv"), "--nodes", "1", "--departments", "2",
                           "--grouping-seed", "1"], capture_output=True, text=True)
    assert text.returncode == 0, text.stderr
    assert sorted(text.stdout.split("departments: ")[1].split("; ")[i].split(" ")[1] for i in (0, 1)) == [
        "(a)", "(b)"]


def test_a_slice_misses_each_check_it_fails() -> None:
    volcano = {"avg_wait_s": 100.0, "p99_wait_s": 1000.0, "gpu_utilization": 95.0, "jain_fairness": 0.9}
    assert cell_misses(volcano, volcano) == ["jain"]  # Jain is an absolute floor, not a comparison
    fair = {**volcano, "jain_fairness": 0.95}
    assert cell_misses({**fair, "gpu_utilization": 94.5}, volcano) == []  # half a point below is allowed
    assert cell_misses({**fair, "avg_wait_s": 100.1, "p99_wait_s": 1001.0, "gpu_utilization": 94.4}, volcano) == [
        "avg", "p99", "util"]
    idle = {**fair, "gpu_utilization": None}  # no job waited under either: no utilisation to compare
    assert cell_misses(idle, {**volcano, "gpu_utilization": None}) == []


def test_held_out_slices_are_checked_and_counted(tmp_path: Path) -> None:
    # January: b's 8-GPU job fills the 1-node cluster for a day and a's job waits it out under both presets
    # (taking b's only job back would leave b below its own guarantee), so the two tie on waits and both
    # miss Jain; February: one job on an idle cluster, where nobody waits
    month = 31 * 86400
    rows = ["0,86400,8,b", "600,10,1,a", f"{month + 100},10,1,c"]
    (tmp_path / "jobs.csv").write_text("timestamp,duration,num_gpus,cluster\n" + "\n".join(rows) + "\n")
    jobs = philly.load_jobs(tmp_path / "jobs.csv", Problems([]))
    lines = held_out(jobs, {"a": 1, "b": 1}, sizes={1: (1,), 2: (1,)}, windows=(("1970-02-01", 5, 1),))
    assert [line.split()[:2] for line in lines[2:5]] == [["Jan", "x1"], ["Feb", "x1"], ["02-01", "5"]]
    assert lines[2].endswith("MISS jain") and lines[3].endswith("ok") and lines[4].endswith("ok")
    assert lines[-1] == "held-out slices where ferry misses a check: 1 of 3" and len(lines) == 6
    # replays in worker processes, several at a time: the same lines in the same order
    assert held_out(jobs, {"a": 1, "b": 1}, sizes={1: (1,), 2: (1,)}, windows=(("1970-02-01", 5, 1),),
                    workers=2) == lines


def test_groupings_compare_each_grouping_of_the_departments_with_flat_queues() -> None:
    # one node: four tenants' 8-GPU jobs queue; each grouping is replayed and set beside flat queues
    jobs = _jobs([(t, 100 * (1 + i), 8, tenant) for t, (i, tenant) in enumerate(
        [(0, "a"), (1, "b"), (2, "c"), (3, "d"), (0, "a"), (3, "d"), (1, "b"), (2, "c")])])
    vc = {"a": 4, "b": 3, "c": 2, "d": 1}
    lines = groupings(jobs, vc, seeds=3, nodes=1)
    assert lines[1].startswith("groupings: flat queues avg ")
    assert [line.split()[0] for line in lines[2:6]] == ["largest", "seed", "seed", "seed"]
    assert lines[2].endswith("[a d; b; c]")  # dealt largest first to three departments in turn
    assert all(line.count(";") == 2 for line in lines[2:6])  # every grouping: three departments
    assert lines[-1].startswith("random groupings: avg ") and lines[-1].endswith(" of 3")
    assert groupings(jobs, vc, seeds=3, nodes=1, workers=2) == lines


def test_philly_cycles_when_a_rule_falls_due_not_only_on_the_next_event() -> None:
    # tenant b borrows the whole cluster; a's job reclaims at once (no delay) and its victim's grace ends at
    # t=1060, while the next arrival is at t=3000
    jobs = _jobs([(0, 10000, 8, "b"), (0, 10000, 8, "b"), (1000, 10, 1, "a"), (3000, 10, 1, "c")])
    vc = {"a": 1, "b": 1}
    late = philly.simulate(jobs, vc, "ferry", nodes=2, preemptor_delay_s=0, cycle_when_due=False).metrics
    due = philly.simulate(jobs, vc, "ferry", nodes=2, preemptor_delay_s=0).metrics  # the default
    assert late["tenants"]["a"]["avg_wait_s"] == 2000.0  # evicted only when c arrived
    assert due["tenants"]["a"]["avg_wait_s"] == philly.VICTIM_GRACE_S
    assert due["wasted_gpu_s"] < late["wasted_gpu_s"]  # the victim stopped at its deadline
    # b's jobs started at once; the victim's new run waited again, which only the wait over all runs counts
    assert due["tenants"]["b"]["avg_first_wait_s"] == 0.0 < due["tenants"]["b"]["avg_wait_s"]


def test_philly_counts_notices_withdrawn_when_the_preemptor_starts_elsewhere() -> None:
    # b borrows both nodes; a's job (its VC is the whole cluster) reclaims after the tenants' 300 s and
    # notifies b's younger job (least work lost), whose 60 s grace outlasts b's other job: that one ends
    # first, a starts on its node, and the notice is withdrawn; nobody is evicted
    jobs = _jobs([(0, 320, 8, "b"), (1, 10_000, 8, "b"), (10, 100, 8, "a")])
    res = philly.simulate(jobs, {"a": 2}, "ferry", nodes=2, gpus_per_node=8).metrics
    assert res["notices_withdrawn"] == 1 and res["most_notices_one_run"] == 1
    assert res["preemptions"] == 0
    quiet = philly.simulate(jobs, {"a": 2}, "volcano", nodes=2, gpus_per_node=8).metrics
    assert quiet["notices_withdrawn"] == 0 and quiet["most_notices_one_run"] == 0


def test_a_jittered_trace_moves_each_duration_by_at_most_a_second_and_keeps_the_slices() -> None:
    jobs = [philly.TraceJob(float(i), d, 1, "t") for i, d in enumerate((0.5, 1.0, 30.0, 3600.0) * 50)]
    one, again, other = philly.jittered(jobs, 1), philly.jittered(jobs, 1), philly.jittered(jobs, 2)
    assert one == again and one != other  # a seed is a replay anyone can repeat
    assert [j.submit for j in one] == [j.submit for j in jobs]
    assert all(abs(a.duration - b.duration) <= 1.0 and a.duration >= 1.0 for a, b in zip(one, jobs, strict=True))
    assert {round(a.duration - b.duration) for a, b in zip(one, jobs, strict=True) if b.duration > 2} == {-1, 0, 1}


def test_a_synthetic_workload_is_its_seed_and_its_load_only_stretches_time() -> None:
    a, again = synthetic.generate(7, 300, 16, 0.9), synthetic.generate(7, 300, 16, 0.9)
    assert a.jobs == again.jobs and a.vc_nodes == again.vc_nodes
    assert synthetic.generate(8, 300, 16, 0.9).jobs != a.jobs
    light = synthetic.generate(7, 300, 16, 0.45)
    assert Counter((j.gpus, j.duration, j.tenant) for j in light.jobs) == Counter((j.gpus, j.duration, j.tenant)
                                                                          for j in a.jobs)
    assert light.span_s == pytest.approx(2 * a.span_s)
    work = sum(j.gpus * j.duration for j in a.jobs)
    assert work / (16 * 8 * a.span_s) == pytest.approx(0.9, rel=0.01)  # the offered load asked for
    assert all(j.gpus in synthetic.SIZES and j.gpus <= 16 * 8 // 2 for j in a.jobs)
    assert {j.tenant for j in a.jobs} >= set(a.vc_nodes) and sum(a.vc_nodes.values()) >= 1
    with pytest.raises(ValueError, match="positive load"):
        synthetic.generate(7, 300, 16, 0)


def test_synthetic_report_replays_both_presets_and_counts_the_checks_per_load() -> None:
    from scheduler.bench.synthetic import report
    lines = report(range(1, 3), (0.5,), 120, 4, workers=1)
    assert len([ln for ln in lines if "ferry" in ln and "volcano" in ln and "borrowers (" in ln]) == 2
    summary = lines[-1]
    assert summary.startswith("  load 0.5: ") and " of 2 (avg " in summary and "borrowers " in summary


def test_synthetic_borrowers_ask_a_larger_share_of_the_work_than_of_the_guarantees() -> None:
    from scheduler.bench.synthetic import borrowers, split_waits
    w = synthetic.Workload(0, 1.0, 4, [philly.TraceJob(0.0, 100.0, 8, "big"), philly.TraceJob(1.0, 10.0, 1, "small"),
                                       philly.TraceJob(2.0, 50.0, 1, "free")], {"big": 1, "small": 3}, 100.0)
    assert borrowers(w) == {"big", "free"}  # 800 of 860 GPU-s on a quarter of the nodes; no guarantee at all
    res = philly.PhillyResult("ferry", {}, [], {"big": [30.0, 10.0], "small": [4.0], "free": [2.0]})
    assert split_waits(res, {"big", "free"}) == (4.0, 14.0)
    assert split_waits(res, set()) == (11.5, None)
