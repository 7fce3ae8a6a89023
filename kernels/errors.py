"""The error kernels/ raises at its boundary. kernels/ imports nothing of engine/, so it has its own type."""


class KernelError(ValueError):
    """A tensor a kernel cannot take (its dtype, device, rank, shape or layout): the message names the argument."""
