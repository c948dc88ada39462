"""Two parts of a run's report (`orchestrator.results.report`): the answer it leads with (the
paper's two claims with their intervals, and the fidelity verdict of the points they rest on) and the
environment it ends with, as a table of plain values (no Python reprs: a mapping's entries become
rows of their own, a list its items)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.results.dilation import k_suffix
from orchestrator.results.stats import paired_ratio
from orchestrator.results.summary import RunSummary

#: The claims' figures: (key of `RunSummary.claims`, the words, the task figure of the paired ratio).
CLAIMS = (("bandwidth", "reserved bandwidth", "reserved_mbps"), ("latency", "mean round latency", "mean_latency_s"))


def fmt(x: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def lower_word(low: float, high: float) -> str:
    """Whether the flexible scheduler's figure is lower, as its 95 % interval says."""
    if high < 1:
        return "yes"
    return "no" if low >= 1 else "not decided (the interval spans 1)"


def claims_section(summary: RunSummary) -> list[str]:
    """The paper's two claims at the run's headline number of locals: each as a paired ratio mst /
    spff over the tasks both ran, with its 95 % bootstrap interval and whether it says mst is lower;
    the ratio of the means and each side's spread; the verdict of the two points they rest on."""
    c = summary.claims()
    if c is None:
        return []
    n, flexible, fixed = c["n_locals"], c["flexible"], c["fixed"]
    lines = ["", f"## The paper's two claims, at {n} local models", ""]
    bad = [v for v in summary.unfaithful if v.n_locals == n and v.scheduler in (flexible, fixed)]
    if bad:
        lines += [f"**Not faithful:** {', '.join(v.scheduler for v in bad)} at {n} locals measured the "
                  "host as well as the emulated network and sites (see \"Fidelity\"): these ratios are the "
                  "instrument's too.", ""]
    lines += [f"| claim | {flexible} / {fixed} (paired, mean over tasks) | 95 % CI | tasks | {flexible} is lower |",
              "| --- | --- | --- | --- | --- |"]
    for _, words, figure in CLAIMS:
        pr = paired_ratio(summary.tasks, n_locals=n, numerator=flexible, denominator=fixed, figure=figure)
        lines.append(f"| {words} | - | - | 0 | not measured |" if pr is None else
                     f"| {words} | {pr.mean:.3f} | [{pr.low:.3f}, {pr.high:.3f}] | {pr.tasks} "
                     f"| {lower_word(pr.low, pr.high)} |")
    lines.append("")
    for key, words, _ in CLAIMS:
        ratio = c[f"{key}_ratio"]
        if ratio is None:
            lines.append(f"- {words}: not measured (no data for both schedulers)")
            continue
        lines.append(f"- {words}: {flexible} / {fixed} = {ratio:.3f} ({flexible} is "
                     f"{'lower' if ratio < 1 else 'not lower'}; ratio of the point means); spread over tasks "
                     f"(std/mean): {flexible} {fmt(c[f'{key}_cv_{flexible}'], 1, 3)}, "
                     f"{fixed} {fmt(c[f'{key}_cv_{fixed}'], 1, 3)}")
    return lines + verdict_lines(summary, n, (flexible, fixed))


def verdict_lines(summary: RunSummary, n_locals: int, schedulers: tuple[str, ...]) -> list[str]:
    """The fidelity verdict of the claims' points, and how many of the run's points are faithful."""
    if not summary.verdicts:
        return []
    lines = [f"- verdict: {v.scheduler} at {n_locals} locals{k_suffix(summary.environment, n_locals)} {v.word}, "
             f"latency / bound {v.bound_text}"
             for v in summary.verdicts if v.n_locals == n_locals and v.scheduler in schedulers]
    faithful = len(summary.verdicts) - len(summary.unfaithful)
    return [*lines, f"- faithful points: {faithful} of {len(summary.verdicts)} (see \"Fidelity\")"]


def plain(value: Any) -> str:
    """A value as a report shows it: no quotes, brackets or braces of Python's reprs."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {plain(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else list(value)
        return ", ".join(plain(v) for v in items) or "-"
    return str(value)


def environment_rows(env: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """(key, value) rows of the environment, in key order: a mapping's entries are rows of their
    own (``background_view.max_cv``), a list of mappings one row per item (``trials[1]``)."""
    rows: list[tuple[str, str]] = []
    for key in sorted(env, key=str):
        value, name = env[key], f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            rows += environment_rows(value, f"{name}.")
        elif isinstance(value, list | tuple) and value and all(isinstance(v, Mapping) for v in value):
            rows += [(f"{name}[{i}]", plain(v)) for i, v in enumerate(value, 1)]
        else:
            rows.append((name, plain(value)))
    return rows


def environment_section(env: Mapping[str, Any]) -> list[str]:
    """The report's last section: the run's environment as a two-column table."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["", "## Environment", "", "| setting | value |", "| --- | --- |"]
    shown = {k: v for k, v in env.items() if k not in ("site_peak_rss_mb", "site_peak_model_mb")}  # memory_section
    return lines + [f"| {cell(k)} | {cell(v)} |" for k, v in environment_rows(shown)] + [""]


def memory_section(env: Mapping[str, Any]) -> list[str]:
    """Each site server's peak resident memory against the model's size (``site_peak_rss_mb``;
    nothing when the run recorded none)."""
    peaks, model_mb = env.get("site_peak_rss_mb"), env.get("site_peak_model_mb")
    if not isinstance(peaks, Mapping) or not peaks:
        return []
    per = f"the model's {float(model_mb):g} MB" if model_mb else "the model's size"
    lines = ["", "## Site servers' memory", "",
             f"Each site server's peak resident memory over the run, its own included, against {per} "
             "(what admission counts per role: docs/long-runs.md, \"A site's memory\").", ""]
    lines += ["| site | peak MB | peak / model |", "| --- | --- | --- |"]
    for site, mb in sorted(peaks.items()):
        lines.append(f"| {site} | {float(mb):.1f} | {float(mb) / float(model_mb):.1f} |" if model_mb else
                     f"| {site} | {float(mb):.1f} | - |")
    return [*lines, ""]


def validation_line(env: Mapping[str, Any]) -> str | None:
    """What a simulated run's figures rest on: the `netai validate` covering its regime (config, date,
    host, worst error), or, plainly, that none does and why (None: a run recorded before either was)."""
    v = env.get("validation")
    if isinstance(v, Mapping):
        return (f"**Validated:** this regime is covered by `netai validate` of {v.get('config')} (config "
                f"{v.get('config_hash')}) of {v.get('created')} on host {v.get('host')}: simulated over emulated mean "
                f"round latency off by {float(v.get('worst_error', 0.0)):.1%} at worst, "
                f"{float(v.get('geomean_error', 0.0)):.2%} geometric mean ({v.get('regime')}).")
    gap = env.get("validation_gap")
    if gap:
        return (f"**Not validated:** {gap}. Nothing says how far these simulated figures are from a faithful "
                "emulation in this regime: run `netai validate` on a config of it (docs/simulation.md).")
    return None
