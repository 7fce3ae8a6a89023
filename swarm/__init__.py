"""swarm: a launcher and orchestrator for a local agent swarm that shares its prompt trunk."""
