"""Paired timings for the benchmarks: two variants measured one after the other, the order
alternating from pair to pair, so that drift in a shared machine's load falls on both alike."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def alternating(pairs: int, first: Callable[[], float], second: Callable[[], float],
                say: Callable[[int, float, float], None]) -> tuple[list[float], list[float], list[float]]:
    """`pairs` pairs of `first` and `second` (seconds each), `first` ahead in the odd pairs and
    `second` in the even ones; `say(i, a, b)` after each. Their times, and first / second per pair."""
    a_times, b_times, ratios = [], [], []
    for i in range(pairs):
        if i % 2 == 0:
            a, b = first(), second()
        else:
            b, a = second(), first()
        a_times.append(a)
        b_times.append(b)
        ratios.append(a / b)
        say(i + 1, a, b)
    return a_times, b_times, ratios


def summary(a_name: str, b_name: str, a_times: list[float], b_times: list[float], ratios: list[float], *,
            digits: int = 2) -> str:
    """One line: each variant's median, and the median of the paired ratios with their range."""
    return (f"{a_name} median {statistics.median(a_times):.{digits}f} s, {b_name} median "
            f"{statistics.median(b_times):.{digits}f} s; {a_name} / {b_name} (paired) median "
            f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]")
