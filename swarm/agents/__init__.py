"""One agent, whatever runs it: its state machine and the progress it records, the tools it may call (confined to its
workspace), tool calls parsed out of its text, the tokens that carry tool results back, and tokens per second."""
