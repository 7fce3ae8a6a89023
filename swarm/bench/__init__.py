"""`swarm bench` and `swarm bench-decode`: the workload and what is measured, swarm's own runner, the peers
(transformers, llama.cpp) each in a worker process, the report and its chart, and the decode-step bench of cascade
against plain attention."""
