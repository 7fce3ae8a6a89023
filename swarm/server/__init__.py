"""`swarm serve`: the OpenAI-compatible HTTP app on one shared engine, its Prometheus /metrics, the request shapes and
error body, answers whole or streamed, and the chat prompt in and tool calls out."""
