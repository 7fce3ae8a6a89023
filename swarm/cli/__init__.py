"""The `swarm` command line: `main.py` wires the commands together; one module per command (generate, inspect_prefix,
bench, bench_decode, run, serve); and the two views of a run, the live dashboard and the plain one-line-per-event
view."""
