import warnings

import pytest

from engine import LLMEngine, OptionError
from engine.loading.context_length import with_context_length
from engine.loading.loader import load_model_config, resolve_model
from engine.options import EngineOptions
from tests.helpers.runs import tiny_model


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return load_model_config(resolve_model(str(tiny_model(tmp_path_factory.getbasetemp()))))


def test_a_shorter_context_is_taken_quietly_and_none_keeps_the_trained_one(config):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert with_context_length(config, 64).max_position_embeddings == 64
        assert with_context_length(config, None) is config


def test_a_longer_context_warns_and_a_tiny_one_is_refused(config):
    trained = config.max_position_embeddings
    with pytest.warns(UserWarning, match=f"beyond the {trained} tokens"):
        assert with_context_length(config, trained + 1).max_position_embeddings == trained + 1
    with pytest.raises(OptionError, match="too small"):
        with_context_length(config, 1)


def test_the_engine_serves_the_context_it_was_given(tmp_path):
    engine = LLMEngine(str(tiny_model(tmp_path)), EngineOptions(device="cpu", dtype="float32", max_model_len=48))
    assert engine.config.max_position_embeddings == 48
