"""A failed run's sentence says what went wrong: the error's first lines with words, not its first characters."""

from __future__ import annotations

from mindwatch.analysis.state_text import ERROR_LINE_CHARS, error_headline, state_sentence


def test_the_headline_keeps_the_lines_with_words_and_drops_rules_bullets_and_the_cpp_stack() -> None:
    error = "RuntimeError: \n-----\n- Kernel error:\n=====\n\nAdd failed: out of memory\n-----\n- C++ Call Stack:\nadd.cc:42"
    assert error_headline(error) == "RuntimeError: Kernel error: Add failed: out of memory"
    # a message flattened onto one line keeps its sections apart by their rules
    assert error_headline("RuntimeError: ------ - Kernel error: ------ Add failed") == "RuntimeError: Kernel error: Add failed"


def test_the_headline_is_the_first_three_lines_and_a_long_line_is_cut_not_the_next() -> None:
    assert error_headline("ValueError: bad shape\nfirst\nsecond\nthird") == "ValueError: bad shape first second"
    long = error_headline("OSError: " + "x" * 1000 + "\nshard 7")
    assert long is not None and long.endswith("… shard 7") and len(long) == ERROR_LINE_CHARS + len(" shard 7")
    assert error_headline(None) is None and error_headline("") is None and error_headline("-----") == "-----"


def test_the_failed_sentence_names_the_headline_once_with_one_full_stop() -> None:
    error = "RuntimeError:\n-----\n- Kernel error:\n-----\nAdd failed: out of memory!\n-----\n- C++ Call Stack:\nadd.cc:42"
    said = state_sentence("failed", last_step=12, now=100.0, error=error, last_time=95.0)
    assert said == "Failed at step 12: RuntimeError: Kernel error: Add failed: out of memory! Data stopped 5.0 s ago."
    assert state_sentence("failed", last_step=3, now=1.0, error="OSError: corrupt shard 7").startswith(
        "Failed at step 3: OSError: corrupt shard 7. Data stopped"
    )
