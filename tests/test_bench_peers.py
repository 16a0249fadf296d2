"""The table ``python -m bench peers`` prints, from figures as its subprocesses write them (the bench itself is not run here)."""

from bench.bench_peers import median_figures, ratios, report


def figures(hot_us: float, cpu_us: float, **extra: float) -> dict:
    base = dict.fromkeys(
        ("hot_median_us", "hot_p99_us", "cpu_loop_us", "cpu_children_us", "close_s", "init_s", "loop_s", "whole_process_cpu_s"),
        0.0,
    )
    return {**base, "hot_mean_us": hot_us, "cpu_us": cpu_us, "version": "1.0", **extra}


def test_mindwatch_leads_the_table_and_peers_get_ratios_above_the_bare_loop():
    results = {
        "bare": figures(0.05, 1.0),
        "wandb": figures(100.0, 201.0),
        "mindwatch": figures(0.25, 21.0),
    }
    rel = ratios(results)
    assert rel["wandb"]["hot_mean"] == 400.0
    assert rel["wandb"]["cpu"] == 10.0  # (201 - 1) / (21 - 1): the bare loop's CPU is subtracted from both
    lines = report(results, steps=20_000, rounds=1).splitlines()
    assert lines[2].startswith("mindwatch") and lines[3].startswith("wandb") and lines[4].startswith("bare loop")
    assert "400x" in lines[3] and "10x" in lines[3]


def test_a_peer_that_cannot_be_installed_is_listed_with_the_reason():
    results = {
        "mindwatch": figures(0.25, 21.0),
        "aim": {"unavailable": "pip install aim==3.29.1: no wheel for this Python"},
        "bare": figures(0.05, 1.0),
    }
    assert "aim" not in ratios(results)
    assert report(results, steps=100, rounds=1).splitlines()[-1] == (
        "  aim: unavailable (pip install aim==3.29.1: no wheel for this Python)"
    )


def test_over_rounds_each_figure_is_the_median_and_one_failed_round_makes_the_logger_unavailable():
    assert median_figures([figures(1.0, 10.0), figures(3.0, 30.0), figures(2.0, 99.0)])["cpu_us"] == 30.0
    assert median_figures([figures(1.0, 10.0), {"unavailable": "failed: boom"}]) == {"unavailable": "failed: boom"}
