"""A run's results: the database (schema and writer), every query of it, and its readers.

- `schema`: the tables and the values their columns take;
- `db`: `ResultsDB`, the writer the drivers record a run with;
- `queries`: every read of a results database (the only module with an SQL SELECT);
- `summary`: the run's per-task and per-point summaries, computed once (`run_summary`);
- `stats`: paired ratios with bootstrap intervals, time in rounds, online, fault and selection figures;
- `figures`, `summary_figures`: the run folder's figures; `csvs`: its CSV files;
- `report`, `report_html`: ``report.md`` and ``report.html``, and the summary printed at the end of a run.

Nothing here runs an experiment: this package imports no emulation, runtime, experiment or CLI code
(tests/unit/test_layering.py). The dashboard reads through `queries` too.
"""
