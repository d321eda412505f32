"""ServerProps: the one reader of a /props answer, whatever shape the server sends."""

from __future__ import annotations

from typing import Any

import pytest

from voice_llm.core.client.api import ServerProps

LLAMA_SERVER = {
    "default_generation_settings": {"n_ctx": 1024, "temperature": 0.8},
    "total_slots": 4,
    "model_path": "/models/qwen.gguf",
    "build_info": "b6000-abc",
}


def test_a_llama_server_answer_is_read_field_by_field() -> None:
    assert ServerProps.parse(LLAMA_SERVER) == ServerProps(n_ctx=1024, total_slots=4, model_path="/models/qwen.gguf",
                                                          build_info="b6000-abc")


def test_an_older_server_with_n_ctx_at_the_top() -> None:
    assert ServerProps.parse({"n_ctx": 2048}).n_ctx == 2048
    # the nested object wins when there is one, even without n_ctx: the top level is not guessed from
    assert ServerProps.parse({"default_generation_settings": {}, "n_ctx": 2048}).n_ctx is None


@pytest.mark.parametrize("props", [None, [], "props", 7, {"default_generation_settings": []},
                                   {"default_generation_settings": {"n_ctx": "1024"}, "total_slots": "4"},
                                   {"default_generation_settings": {"n_ctx": True}, "total_slots": False},
                                   {"default_generation_settings": {"n_ctx": -1}, "total_slots": 0},
                                   {"model_path": 3, "build_info": ["b1"]}])
def test_any_other_shape_is_not_said_never_an_error(props: Any) -> None:
    assert ServerProps.parse(props) == ServerProps()
