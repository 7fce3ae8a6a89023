"""The server tests' common fixtures: one tiny model and one plain `swarm serve` per test module, whose
sampler is the engine's own again after every test that scripted it (tests.helpers.serving.script)."""
import pytest

from tests.helpers.runs import tiny_model
from tests.helpers.serving import ServerThread, real_sampler, start_engine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def server(model_dir):
    with ServerThread(start_engine(model_dir)) as running:
        yield running


@pytest.fixture(autouse=True)
def _unscripted(request):
    if "server" not in request.fixturenames:
        yield
        return
    with real_sampler(request.getfixturevalue("server")):
        yield
