"""Errors a user can cause. Each message says what to change, on one line."""


class SwarmError(Exception):
    """A user-facing error: the CLI prints its message and exits with `exit_code`, no traceback."""

    exit_code = 1


class ModelLoadError(SwarmError):
    """A model path, file or format that cannot be loaded."""


class UnsupportedArchitectureError(ModelLoadError):
    """A model whose architecture the engine does not implement."""


class OptionError(SwarmError):
    """A value given on the command line that swarm does not take (a usage error)."""

    exit_code = 2


class SpecError(SwarmError):
    """A swarm.yaml that is broken, incomplete or names something that does not exist."""

    exit_code = 2


