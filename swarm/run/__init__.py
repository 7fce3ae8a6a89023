"""One swarm run: its phases (load, set up, prefill and pin the trunk, drive the agents), setting up agents from the
spec, the run's KV memory, transcripts, summary.json and Ctrl-C. remote_run, remote_agent, openai_client and
server_memory are the OpenAI-server twins, to fold into one run over a RunBackend."""
