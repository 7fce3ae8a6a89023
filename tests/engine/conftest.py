import pytest

from tests.engine.tiny_models import VARIANTS, make_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Builds each tiny random model once per session; returns a folder per variant."""
    root = tmp_path_factory.mktemp("tiny_models")
    built = {}

    def get(variant: str):
        if variant not in built:
            built[variant] = make_tiny_model(root / variant, variant)
        return built[variant]

    return get


ALL_VARIANTS = list(VARIANTS)
