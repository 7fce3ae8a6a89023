"""One swarm run, whichever backend carries its agents' turns: the phases (phases.py) around one
agents' loop (agent_loop.py), the `RunBackend` seam (backend.py) with its two sides, swarm's own
engine (local_backend.py) and an OpenAI-compatible server (openai_backend.py, openai_client.py,
server_metrics.py), what each can know (facts.py), setting up agents from the spec, the run's KV
memory, transcripts, summary.json, the view interface and Ctrl-C."""
