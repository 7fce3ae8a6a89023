"""swarm.yaml and what it names: the YAML reader that keeps file, line and key for every error, the spec's schema and
checks, the `backend:` key, the KV budget, harness templates, tool schemas in canonical form, and the shipped model
configs (model_configs/)."""
