"""The shared prompt trunk: its canonical build (rules and tools rendered byte-identically for every agent), each
agent's suffix (everything volatile), the volatile patterns and prefix lint that keep the trunk identical, the
`inspect-prefix` report and the memory table of what sharing saves."""
