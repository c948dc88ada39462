"""The live dashboard and the replay of finished runs (see docs/dashboard.md).

`view.RunView` reads what a run's database holds at any time on its clock; `server.Dashboard`
serves the page, its data, a live stream and Prometheus metrics on 127.0.0.1.
"""
