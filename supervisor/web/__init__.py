"""The live dashboard in a browser (`qw up --http`): the page at /, what it shows, its
controls, and the run so far as a timeline at /timeline.

html_text   rich Text (the terminal dashboard's own cells and lines) as escaped HTML
frame       one frame of the page, as JSON: built from a snapshot by the tui's builders
page        the page itself: one HTML file, its CSS and script inline (dashboard.*)
control     --http-control: the token and the kill and pause requests
routes      what `supervisor.http_api` answers on /, /events, /frame, /timeline, /control

It may import `logstore`, `queue_worker`, the shared modules at the root of `supervisor`,
`supervisor.run`, `supervisor.tui` and `supervisor.timeline`; never `supervisor.cli`
(tests/test_layers.py).
"""
