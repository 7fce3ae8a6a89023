"""What several test modules share: tiny random models and GGUF files, portable builds of the C kernels, chat templates,
spec files, scripted runs and servers. Test modules import from here or from a conftest.py, never from one another."""
